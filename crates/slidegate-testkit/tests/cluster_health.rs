//! `RedisCluster::is_ok`, which tests wait on after a failover, against real processes: a node
//! that dies behind the test's back, and a cluster with no node left, are not "ok".

use std::process::Command;

use slidegate_testkit::RedisCluster;

#[test]
fn a_node_dead_without_kill_or_every_node_killed_is_not_ok() {
    let mut cluster = RedisCluster::start(3, 0);
    assert!(cluster.is_ok(), "a new cluster is ok");
    // The attack on the check: a node dies without the test asking for it.
    let victim = &cluster.nodes()[0];
    let status = Command::new("kill").args(["-9", &victim.pid().to_string()]).status().expect("run kill");
    assert!(status.success(), "kill -9 {}", victim.pid());
    let port = victim.port();
    assert!(!cluster.is_ok(), "a node died unasked and the cluster still counted as ok");
    // Every node killed: nothing answers, nothing is ok.
    let ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    for p in ports {
        cluster.kill(p);
    }
    assert!(!cluster.is_ok(), "no node left (the first on port {port})");
}
