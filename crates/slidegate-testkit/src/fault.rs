//! A loopback TCP fault proxy: a network between a client and a real server that a test can
//! switch at run time to the ways networks fail — added latency with jitter, lost packets, a
//! partition (blackhole), a half-open connection, a reset.
//!
//! [`FaultProxy::start`] listens on a free port of 127.0.0.1 and forwards every connection it
//! accepts to the target, one thread per direction reading and one writing, so that a delayed
//! chunk never holds back the reading of the next. [`FaultProxy::set`] applies a [`Fault`] to
//! every connection, open or new. Bounded: each direction holds at most [`MAX_HELD_CHUNKS`]
//! chunks of [`CHUNK`] bytes (past that it stops reading, as a full send buffer would), every
//! wait lasts at most [`TICK`] before it looks at the fault and the stop flag again, and
//! dropping the proxy stops and joins every thread.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

mod pump;

/// The longest any of the proxy's threads waits before it looks at the fault and the stop flag
/// again: how late a switch of fault, a reset or the proxy's drop can take effect.
pub const TICK: Duration = Duration::from_millis(10);

/// The most bytes read in one go, and so the unit a fault delays or holds.
pub const CHUNK: usize = 16 * 1024;

/// The most chunks one direction holds unforwarded (4 MiB): past that it stops reading, and the
/// sender's writes block as they would on a full send buffer.
pub const MAX_HELD_CHUNKS: usize = 256;

/// How long the proxy waits for the target to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What the network does to the bytes between client and server.
///
/// TCP never loses bytes silently: a lost segment is sent again, and the bytes behind it wait.
/// So nothing here drops bytes from a connection that stays open; what a client sees is delay,
/// silence or a reset, as on a real network.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Fault {
    /// Every byte forwarded at once.
    Pass,
    /// Each chunk, each direction, held for `delay` ± up to `jitter` (uniform), in order: a
    /// chunk never overtakes the one before it. A round trip takes twice the delay.
    Latency {
        /// The mean delay, one way.
        delay: Duration,
        /// The most a chunk's delay strays from `delay`, either way (never below zero).
        jitter: Duration,
    },
    /// Each chunk, each direction, is lost with probability `ratio` and arrives after
    /// `retransmit` (as TCP sends it again after its retransmission timeout, 200 ms at least
    /// on Linux), holding back every chunk behind it.
    Loss {
        /// The share of chunks lost, 0 to 1.
        ratio: f64,
        /// How late a lost chunk arrives.
        retransmit: Duration,
    },
    /// A partition: connections stay open and nothing is forwarded either way. What is sent
    /// meanwhile is held and arrives once healed, as TCP's retransmissions deliver it when a
    /// partition ends before the connection gives up. A new connection is accepted (the
    /// kernel completes the handshake before the proxy sees it), and nothing passes on it
    /// either.
    Blackhole,
    /// A half-open connection: one direction forwarded, the other held as in a blackhole.
    HalfOpen(Direction),
    /// Every connection, open or new, reset (RST: `SO_LINGER` 0, then closed) on both sides.
    Reset,
}

/// One direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server: requests.
    ToServer,
    /// From the server to the client: replies.
    ToClient,
}

impl Fault {
    /// Whether bytes flow in `direction` now (once their delay, if any, has passed).
    fn forwards(self, direction: Direction) -> bool {
        match self {
            Self::Blackhole | Self::Reset => false,
            Self::HalfOpen(open) => open == direction,
            Self::Pass | Self::Latency { .. } | Self::Loss { .. } => true,
        }
    }
}

/// A fault proxy on a free port of 127.0.0.1; stops and joins its threads when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    fault: Mutex<Fault>,
    stop: AtomicBool,
    accepted: AtomicU64,
    /// The connections open now, to reset them and to join their threads.
    conns: Mutex<Vec<pump::Conn>>,
    /// A xorshift state: the draws of jitter and loss.
    random: Mutex<u64>,
}

impl FaultProxy {
    /// Starts a proxy to `target` in [`Fault::Pass`].
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().expect("bound").port();
        let shared = Arc::new(Shared {
            target,
            fault: Mutex::new(Fault::Pass),
            stop: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            conns: Mutex::default(),
            random: Mutex::new(0x9E37_79B9_7F4A_7C15 ^ u64::from(port)),
        });
        let accepting = Arc::clone(&shared);
        let acceptor = std::thread::spawn(move || accept(&listener, &accepting));
        Self { port, shared, acceptor: Some(acceptor) }
    }

    /// A proxy to the Redis on `port` of 127.0.0.1.
    pub fn to_port(port: u16) -> Self {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`: where a Redis client goes through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The connections accepted so far: a test tells a client that kept its connection from
    /// one that connected again.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Applies `fault` to every connection from now on; [`Fault::Reset`] resets those open now
    /// (within [`TICK`]).
    pub fn set(&self, fault: Fault) {
        *lock(&self.shared.fault) = fault;
        let mut conns = lock(&self.shared.conns);
        if fault == Fault::Reset {
            conns.iter().for_each(pump::Conn::reset);
        }
        // Reap the connections whose threads have ended, so that the list stays short.
        let (ended, open): (Vec<_>, Vec<_>) = conns.drain(..).partition(pump::Conn::ended);
        *conns = open;
        drop(conns);
        ended.into_iter().for_each(pump::Conn::join);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let conns = std::mem::take(&mut *lock(&self.shared.conns));
        conns.into_iter().for_each(pump::Conn::join);
    }
}

impl Shared {
    fn fault(&self) -> Fault {
        *lock(&self.fault)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// A uniform draw in [0, 1) (xorshift64*: enough for faults, no dependency).
    fn draw(&self) -> f64 {
        let mut x = lock(&self.random);
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        let bits = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        bits as f64 / (1u64 << 53) as f64
    }

    /// How long the fault holds one chunk before forwarding it, drawn now.
    fn delay(&self) -> Duration {
        match self.fault() {
            Fault::Latency { delay, jitter } => {
                let spread = jitter.mul_f64(2.0 * self.draw());
                (delay + spread).saturating_sub(jitter)
            }
            Fault::Loss { ratio, retransmit } if self.draw() < ratio => retransmit,
            _ => Duration::ZERO,
        }
    }
}

/// Accepts connections until the proxy stops; each gets its target connection and pumps, or a
/// reset when the fault is [`Fault::Reset`] or the target refuses.
fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                let server = TcpStream::connect_timeout(&shared.target, CONNECT_TIMEOUT);
                match server {
                    Ok(server) if shared.fault() != Fault::Reset => match pump::Conn::open(client, server, shared) {
                        Ok(conn) => lock(&shared.conns).push(conn),
                        Err(_) => continue,
                    },
                    Ok(server) => {
                        pump::reset_now(server);
                        pump::reset_now(client);
                    }
                    Err(_) => pump::reset_now(client),
                }
            }
            Err(_) => std::thread::sleep(TICK),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
