-- slidegate: does nothing and answers 1, once Redis runs scripts that may write: what a
-- write-back asks before it writes (Backend::accepts_writes). Redis holds it as it holds those
-- writes, through a stall and a CLIENT PAUSE WRITE (a FAILOVER sends one), where a read would be
-- answered. KEYS[1], the key the writes go to, routes it to that key's node on a Cluster.
return 1
