//! One pipelined connection to a standalone Redis, kept lean so that the client's work per
//! decision stays small beside Redis' own. This file owns the socket I/O — the queue, the
//! writer and reader tasks, the bounds and the silence deadline; packing commands and cutting
//! replies from the bytes read is `resp.rs`'s.
//!
//! redis-rs' multiplexed connection hands every command to a driver task through a channel,
//! which writes each one with its own system call and answers through a second task hop: one
//! write per command under load, and one at a time a channel hop and a second task per request
//! beside a bare socket (BENCHMARKS.md, "the client's CPU"). This connection:
//! - writes a command from the calling task when nothing else is in flight: one `write`, no
//!   task hop;
//! - under concurrency, appends commands to one buffer that a writer task sends whole, after
//!   letting the other ready tasks add theirs: one `write` per batch;
//! - reads with one task that hands each reply to its caller, in order;
//! - over TLS, keeps at most two writes in flight ([`MAX_TLS_WRITES_IN_FLIGHT`]), so that the
//!   commands that come meanwhile go out as one record: Redis reads one record per pass.
//!
//! Both ways are bounded. At most [`MAX_IN_FLIGHT`] commands are written and unanswered at
//! once; the others wait in this process, where a command whose callers have all given up
//! (their deadline passed) is dropped instead of being sent — so a Redis that stalls and comes
//! back is not handed the work of callers long gone. At most [`DEFAULT_MAX_QUEUED`] commands
//! ([`PipelinedConnection::with_max_queued`]) are queued and in flight together; past that a
//! call fails at once with a timeout, as it would at its deadline, and the failure policy
//! answers it.
//!
//! When the socket fails or closes, every caller waiting on it gets the error and the next call
//! connects again (within the backend's deadline, as every call is). A connection that stays
//! silent for [`SILENCE_LIMIT`] while its oldest caller has given up counts as failed too: a
//! partition without a reset, a host gone, a NAT entry dropped on the way would otherwise leave
//! it waiting until the kernel gives up on it (many minutes), queueing every command sent
//! meanwhile. RESP2 over TCP, TLS (`rediss://`, see [`RedisTls`]) or a Unix socket; `AUTH` and
//! `SELECT` from the URL. Over TLS the session is driven by hand over the socket's two halves
//! (`tls_io.rs`), so writes go out as over TCP and the reader never waits on a writer.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture, RedisResult, Value};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpStream, UnixStream, tcp, unix};
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::RedisTls;

mod resp;
mod tls_io;

/// How long a connection may send nothing back while the caller first in line has given up
/// (its deadline passed) before it is presumed dead. Redis answers a decision in microseconds;
/// a second of silence past a caller's deadline is a network that drops packets or a server
/// stalled for that long, and a new connection is the way out of the first and costs little in
/// the second.
const SILENCE_LIMIT: Duration = Duration::from_secs(1);

/// The most commands written to Redis and not answered yet. A command written is out of reach:
/// if Redis stalls, it runs when Redis comes back even though its caller has given up. Redis
/// runs a decision in about 5–20 µs, so 256 in flight are a few milliseconds of its work —
/// deep enough that batches never leave it idle, shallow enough that a stall strands little.
pub const MAX_IN_FLIGHT: usize = 256;

/// The most commands one connection holds — waiting to be written and in flight together —
/// unless [`PipelinedConnection::with_max_queued`] says otherwise. Redis answers about 5,000
/// decisions within the backend's default 50 ms deadline ([`super::DEFAULT_TIMEOUT`]); a
/// caller queued behind more would miss its deadline anyway, so it is told at once. A
/// decision's command is a few hundred bytes, about 10 KB at most (16 keys of 512 bytes and
/// their arguments): a full queue holds about a megabyte, 40 MB at worst.
pub const DEFAULT_MAX_QUEUED: usize = 4096;

/// The most writes a TLS connection has in flight (sent, not all answered). Redis reads one TLS
/// record per pass of its event loop and answers each pass with a write of its own, so records
/// sent one after another are never merged there as bytes sent over TCP are: holding the
/// commands that come meanwhile until a write is answered sends them as one record instead.
/// Two keep Redis busy: it reads one while the other's answers travel.
const MAX_TLS_WRITES_IN_FLIGHT: usize = 2;

/// A pipelined connection to one standalone Redis that connects again after a failure — after
/// the socket fails or closes, and after a second of silence while the caller first in line has
/// given up. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct PipelinedConnection {
    shared: Arc<Shared>,
}

struct Shared {
    info: ConnectionInfo,
    /// Set for a `rediss://` URL.
    tls: Option<TlsConnector>,
    max_queued: AtomicUsize,
    link: Mutex<Option<Arc<Link>>>,
    /// Held while connecting, so that a burst of calls after a failure opens one socket.
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for PipelinedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelinedConnection").field("addr", self.shared.info.addr()).finish_non_exhaustive()
    }
}

impl PipelinedConnection {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port[/db]`,
    /// `rediss://…` over TLS trusting the system's certificate store, or `unix:///path`).
    pub async fn connect(url: &str) -> RedisResult<Self> {
        Self::connect_tls(url, &RedisTls::default()).await
    }

    /// As [`PipelinedConnection::connect`], a `rediss://` URL over TLS as `tls` sets it up.
    pub async fn connect_tls(url: &str, tls: &RedisTls) -> RedisResult<Self> {
        let info = tls.connection_info(url)?;
        let tls = match info.addr() {
            ConnectionAddr::Tcp(..) | ConnectionAddr::Unix(_) => None,
            ConnectionAddr::TcpTls { .. } => {
                let config =
                    tls.rustls_config().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                Some(TlsConnector::from(config))
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "only redis://, rediss:// and unix:// addresses",
                )
                .into());
            }
        };
        let shared = Shared {
            info,
            tls,
            max_queued: AtomicUsize::new(DEFAULT_MAX_QUEUED),
            link: Mutex::new(None),
            connecting: Default::default(),
        };
        let conn = Self { shared: Arc::new(shared) };
        conn.link().await?;
        Ok(conn)
    }

    /// Holds at most `max` commands (at least 1) queued and in flight together (default
    /// [`DEFAULT_MAX_QUEUED`]); a call beyond fails at once with an I/O `TimedOut` error, which
    /// [`crate::RedisBackend`] reports as [`crate::Error::Timeout`]. Applies to every clone.
    #[must_use]
    pub fn with_max_queued(self, max: usize) -> Self {
        self.shared.max_queued.store(max.max(1), Ordering::Relaxed);
        self
    }

    /// The commands queued and in flight now (at most the bound of
    /// [`PipelinedConnection::with_max_queued`]): a gauge of how far Redis is behind.
    pub fn queued(&self) -> usize {
        self.current().map_or(0, |link| lock(&link.queue).len())
    }

    /// The live link, connecting when there is none or the last one failed.
    async fn link(&self) -> RedisResult<Arc<Link>> {
        if let Some(link) = self.current() {
            return Ok(link);
        }
        let _connecting = self.shared.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(link) = self.current() {
            return Ok(link);
        }
        let link = Link::open(&self.shared.info, self.shared.tls.as_ref()).await?;
        *lock(&self.shared.link) = Some(Arc::clone(&link));
        Ok(link)
    }

    fn current(&self) -> Option<Arc<Link>> {
        lock(&self.shared.link).as_ref().filter(|l| !l.failed.load(Ordering::Relaxed)).cloned()
    }

    async fn request(&self, write: impl FnOnce(&mut Vec<u8>), replies: usize) -> RedisResult<Vec<Value>> {
        let max_queued = self.shared.max_queued.load(Ordering::Relaxed);
        self.link().await?.request(write, replies, max_queued).await
    }
}

impl ConnectionLike for PipelinedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut values = self.request(|out| resp::pack_command(cmd, out), 1).await?;
            values.pop().ok_or_else(|| closed().into())
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut values = self.request(|out| resp::pack_pipeline(pipeline, out), offset + count).await?;
            Ok(values.split_off(offset))
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.info.redis_settings().db()
    }
}

/// One open socket: its write side, the commands queued on it, and the writer task's signal.
/// The reader task owns the read side.
struct Link {
    writer: WriteHalf,
    queue: Mutex<Queue>,
    wake_writer: mpsc::Sender<()>,
    failed: AtomicBool,
    /// Why it failed, for the calls that come after: a TLS refusal (Redis' alert for a missing
    /// client certificate) can fail the link before the first command is sent.
    failure: std::sync::OnceLock<(io::ErrorKind, String)>,
}

type Caller = oneshot::Sender<RedisResult<Value>>;
type Reply = oneshot::Receiver<RedisResult<Value>>;

/// The commands of one link: in flight (written, or committed to be written next) and queued
/// behind them.
#[derive(Default)]
struct Queue {
    /// One per reply expected, in the order the commands were written: Redis answers these.
    in_flight: VecDeque<Caller>,
    /// Bytes of the commands in flight not written yet; they go out before anything else.
    unwritten: Vec<u8>,
    /// Commands not committed yet, oldest first: their packed length and number of replies.
    queued: VecDeque<(usize, usize)>,
    /// The queued commands' bytes, one after another.
    queued_bytes: Vec<u8>,
    /// One per reply the queued commands expect.
    queued_callers: VecDeque<Caller>,
    /// The writer task has been woken and owns the socket's write side until it finds nothing
    /// to write.
    writing: bool,
    /// Replies each write in flight still waits for, oldest first (their sum: `in_flight`'s
    /// length).
    writes: VecDeque<usize>,
    /// The most writes in flight at once: see [`MAX_TLS_WRITES_IN_FLIGHT`].
    max_writes: usize,
}

impl Queue {
    /// Commands (replies expected) held, in flight and queued.
    fn len(&self) -> usize {
        self.in_flight.len() + self.queued_callers.len()
    }

    /// Moves queued commands in flight, oldest first, while there is room for them (a command
    /// larger than the room goes alone), dropping those whose callers have all given up:
    /// nothing asked for them any more.
    fn commit(&mut self) {
        if self.writes.len() >= self.max_writes {
            return;
        }
        let (mut at, mut committed) = (0, 0);
        while let Some(&(len, replies)) = self.queued.front() {
            let abandoned = self.queued_callers.iter().take(replies).all(oneshot::Sender::is_closed);
            let full = !self.in_flight.is_empty() && self.in_flight.len() + replies > MAX_IN_FLIGHT;
            if full && !abandoned {
                break;
            }
            self.queued.pop_front();
            let callers = self.queued_callers.drain(..replies);
            if !abandoned {
                self.unwritten.extend_from_slice(&self.queued_bytes[at..at + len]);
                self.in_flight.extend(callers);
                committed += replies;
            }
            at += len;
        }
        self.queued_bytes.drain(..at);
        if committed > 0 {
            self.writes.push_back(committed);
        }
    }

    /// The caller first in line, its reply come: the write it was in done once it is the last.
    fn answered(&mut self) -> Option<Caller> {
        let tx = self.in_flight.pop_front()?;
        if let Some(left) = self.writes.front_mut() {
            *left -= 1;
            if *left == 0 {
                self.writes.pop_front();
            }
        }
        Some(tx)
    }

    /// Wakes the writer task unless it is awake or has nothing to do (`pending`: the socket
    /// did not take all that was written to it).
    fn wake_writer(&mut self, wake: &mpsc::Sender<()>, pending: bool) {
        let work = !self.unwritten.is_empty() || !self.queued.is_empty() || pending;
        if work && !self.writing {
            self.writing = true;
            // The channel holds one signal; a full one means the writer is already woken.
            let _ = wake.try_send(());
        }
    }
}

impl Link {
    async fn open(info: &ConnectionInfo, tls: Option<&TlsConnector>) -> RedisResult<Arc<Self>> {
        let (writer, reader): (_, Box<dyn AsyncRead + Send + Unpin>) = match (info.addr(), tls) {
            (ConnectionAddr::Tcp(host, port), _) => {
                let (r, w) = tcp(host, *port).await?.into_split();
                (WriteHalf::Tcp(w), Box::new(r))
            }
            (ConnectionAddr::TcpTls { host, port, .. }, Some(tls)) => {
                let (r, w) = tls_io::split(handshake(tls, host, *port).await?);
                (WriteHalf::Tls(w), Box::new(r))
            }
            (ConnectionAddr::Unix(path), _) => {
                let (r, w) = UnixStream::connect(path).await?.into_split();
                (WriteHalf::Unix(w), Box::new(r))
            }
            _ => return Err(io::Error::new(io::ErrorKind::Unsupported, "only TCP and Unix sockets").into()),
        };
        let (wake_writer, woken) = mpsc::channel(1);
        let max_writes = if matches!(writer, WriteHalf::Tls(_)) { MAX_TLS_WRITES_IN_FLIGHT } else { usize::MAX };
        let this = Arc::new(Self {
            writer,
            queue: Mutex::new(Queue { max_writes, ..Queue::default() }),
            wake_writer,
            failed: AtomicBool::new(false),
            failure: std::sync::OnceLock::new(),
        });
        tokio::spawn(read_replies(reader, Arc::downgrade(&this)));
        tokio::spawn(write_batches(woken, Arc::downgrade(&this)));
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            this.handshake(auth.arg(password)).await?;
        }
        if settings.db() != 0 {
            this.handshake(redis::cmd("SELECT").arg(settings.db())).await?;
        }
        Ok(this)
    }

    async fn handshake(&self, cmd: &Cmd) -> RedisResult<()> {
        for value in self.request(|out| resp::pack_command(cmd, out), 1, DEFAULT_MAX_QUEUED).await? {
            value.extract_error()?;
        }
        Ok(())
    }

    /// Sends what `write` packs, which `replies` replies answer, and returns those replies.
    async fn request(
        &self,
        write: impl FnOnce(&mut Vec<u8>),
        replies: usize,
        max_queued: usize,
    ) -> RedisResult<Vec<Value>> {
        let waiting = self.send(write, replies, max_queued)?;
        let mut values = Vec::with_capacity(replies);
        for rx in waiting {
            values.push(rx.await.unwrap_or_else(|_| Err(closed().into()))?);
        }
        Ok(values)
    }

    /// Queues what `write` packs and `replies` callers' places for its replies; writes it at
    /// once when the connection is idle, else leaves it to the writer task. Fails at once when
    /// the link already holds `max_queued` commands.
    fn send(&self, write: impl FnOnce(&mut Vec<u8>), replies: usize, max_queued: usize) -> RedisResult<Vec<Reply>> {
        let mut guard = lock(&self.queue);
        if self.failed.load(Ordering::Relaxed) {
            let (kind, why) = self.failure.get().cloned().unwrap_or_else(|| (closed().kind(), closed().to_string()));
            return Err(io::Error::new(kind, why).into());
        }
        let q = &mut *guard;
        if q.len() > 0 && q.len() + replies > max_queued {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the Redis connection's queue is full").into());
        }
        let idle = q.len() == 0 && !q.writing;
        let (bytes, callers) =
            if idle { (&mut q.unwritten, &mut q.in_flight) } else { (&mut q.queued_bytes, &mut q.queued_callers) };
        let start = bytes.len();
        write(bytes);
        let rx = (0..replies)
            .map(|_| {
                let (tx, rx) = oneshot::channel();
                callers.push_back(tx);
                rx
            })
            .collect();
        if idle {
            q.writes.push_back(replies);
        } else {
            q.queued.push_back((q.queued_bytes.len() - start, replies));
            q.wake_writer(&self.wake_writer, false);
            return Ok(rx);
        }
        // Nothing in flight, so nothing to batch with: write now, from this task.
        match self.writer.try_write(&q.unwritten) {
            Ok(n) => drop(q.unwritten.drain(..n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                drop(guard);
                self.fail(&e);
                return Err(e.into());
            }
        }
        q.wake_writer(&self.wake_writer, self.writer.pending());
        Ok(rx)
    }

    /// Marks the link failed and answers every caller in flight or queued with `e`.
    fn fail(&self, e: &io::Error) {
        let _ = self.failure.set((e.kind(), e.to_string()));
        self.failed.store(true, Ordering::Relaxed);
        let q = std::mem::take(&mut *lock(&self.queue));
        for tx in q.in_flight.into_iter().chain(q.queued_callers) {
            let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string()).into()));
        }
    }

    /// Hands each whole reply at the start of `buf` to the caller first in line, and returns
    /// the bytes they took. An error is a stream out of step: not RESP2, or a reply nobody
    /// asked for.
    fn hand_out(&self, buf: &[u8]) -> io::Result<usize> {
        let mut q = lock(&self.queue);
        let mut at = 0;
        let taken = loop {
            match resp::next_reply(&buf[at..]) {
                Ok(Some((reply, len))) => {
                    at += len;
                    match q.answered() {
                        // A caller that gave up (its deadline passed) dropped its receiver.
                        Some(tx) => drop(tx.send(reply)),
                        None => break Err(resp::protocol("a reply nobody asked for")),
                    }
                }
                Ok(None) => break Ok(at),
                Err(e) => break Err(e),
            }
        };
        if at > 0 {
            // Replies made room in flight for queued commands.
            q.wake_writer(&self.wake_writer, self.writer.pending());
        }
        taken
    }
}

/// Writes the committed commands in batches each time it is woken, committing queued ones as
/// room in flight allows, until the link is gone.
async fn write_batches(mut woken: mpsc::Receiver<()>, link: Weak<Link>) {
    let mut batch = Vec::new();
    while woken.recv().await.is_some() {
        // Let the tasks that are ready now (woken by the same burst of replies) queue their
        // commands first: they go out in this one write.
        tokio::task::yield_now().await;
        let Some(link) = link.upgrade() else { return };
        loop {
            {
                let mut q = lock(&link.queue);
                q.commit();
                if q.unwritten.is_empty() && !link.writer.pending() {
                    // Queued commands left wait for replies to make room: the reader wakes
                    // this task again.
                    q.writing = false;
                    break;
                }
                std::mem::swap(&mut q.unwritten, &mut batch);
            }
            if let Err(e) = link.writer.write_all(&batch).await {
                link.fail(&e);
                return;
            }
            batch.clear();
        }
    }
}

/// Hands each reply to the caller first in line, until the socket fails or the link is gone;
/// fails the link when it stays silent past [`SILENCE_LIMIT`] with its first caller gone.
async fn read_replies(mut reader: impl AsyncRead + Unpin, link: Weak<Link>) {
    let mut buf = Vec::with_capacity(16 * 1024);
    let error = loop {
        match tokio::time::timeout(SILENCE_LIMIT, reader.read_buf(&mut buf)).await {
            Ok(Ok(0)) => break closed(),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => break e,
            Err(_silent) => {
                let Some(link) = link.upgrade() else { return };
                // A caller still waiting (a blocking command, no deadline) keeps the link.
                if lock(&link.queue).in_flight.front().is_some_and(oneshot::Sender::is_closed) {
                    break io::Error::new(io::ErrorKind::TimedOut, "Redis sent nothing back: connection presumed dead");
                }
                continue;
            }
        }
        let Some(link) = link.upgrade() else { return };
        match link.hand_out(&buf) {
            Ok(taken) => drop(buf.drain(..taken)),
            Err(e) => {
                link.fail(&e);
                return;
            }
        }
    };
    if let Some(link) = link.upgrade() {
        link.fail(&error);
    }
}

async fn tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let stream = TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A TLS session with `host:port`. A refused certificate fails here, with rustls' reason (an
/// unknown issuer, an expired certificate, another host's name); a client certificate Redis
/// refuses shows on the first reply instead (TLS 1.3 has the server check it after the
/// client's handshake is done).
async fn handshake(tls: &TlsConnector, host: &str, port: u16) -> io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is no TLS server name: {e}")))?;
    let stream = tcp(host, port).await?;
    tls.connect(name, stream)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {host}:{port} failed: {e}")))
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "the connection to Redis closed")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
    Tls(tls_io::TlsWriter),
}

impl WriteHalf {
    /// Writes what the socket takes now (over TLS: takes it all, its records sent as far as
    /// the socket takes them, the rest [`WriteHalf::pending`]).
    fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(w) => w.try_write(buf),
            Self::Unix(w) => w.try_write(buf),
            Self::Tls(w) => w.try_write(buf),
        }
    }

    /// Whether written bytes still wait for the socket (a TLS session's records).
    fn pending(&self) -> bool {
        match self {
            Self::Tcp(_) | Self::Unix(_) => false,
            Self::Tls(w) => w.pending(),
        }
    }

    async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self {
                Self::Tcp(w) => w.writable().await?,
                Self::Unix(w) => w.writable().await?,
                Self::Tls(w) => return w.write_all(buf).await,
            }
            match self.try_write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if let Self::Tls(w) = self {
            // Nothing new: the records still waiting.
            return w.write_all(&[]).await;
        }
        Ok(())
    }
}
