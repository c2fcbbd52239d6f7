//! One proxied connection: per direction, a thread that reads chunks and stamps each with the
//! time the fault releases it, and a thread that writes them in order once released and the
//! fault lets that direction flow. An end of stream is passed on (after what was held); an
//! error on either side resets both.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{CHUNK, Direction, MAX_HELD_CHUNKS, Shared, TICK, lock};

/// A chunk read and the time it may be written.
type Chunk = (Instant, Vec<u8>);

/// A proxied connection's threads and what resets it.
#[derive(Debug)]
pub(super) struct Conn {
    link: Arc<Link>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Link {
    shared: Arc<Shared>,
    reset: AtomicBool,
    /// Both sockets, client's and server's, kept only to reset them: the threads hold their
    /// own handles, so the last one to end closes each socket.
    sockets: Mutex<Option<[TcpStream; 2]>>,
}

impl Link {
    fn alive(&self) -> bool {
        !self.reset.load(Ordering::Relaxed) && !self.shared.stopped()
    }

    /// Resets both sockets: `SO_LINGER` 0 makes their close send RST; the threads see the
    /// flag within a tick and close them.
    fn reset(&self) {
        self.reset.store(true, Ordering::Relaxed);
        if let Some(sockets) = lock(&self.sockets).take() {
            sockets.into_iter().for_each(reset_now);
        }
    }
}

/// Closes `socket` with a reset (RST) instead of an orderly end (FIN), once every handle to it
/// is closed: this one now.
pub(super) fn reset_now(socket: TcpStream) {
    let _ = socket2::SockRef::from(&socket).set_linger(Some(Duration::ZERO));
    drop(socket);
}

impl Conn {
    /// Starts the four threads that forward `client` ⇄ `server`.
    pub(super) fn open(client: TcpStream, server: TcpStream, shared: &Arc<Shared>) -> std::io::Result<Self> {
        for s in [&client, &server] {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(TICK))?;
            s.set_write_timeout(Some(TICK))?;
        }
        let sockets = [client.try_clone()?, server.try_clone()?];
        let link = Arc::new(Link {
            shared: Arc::clone(shared),
            reset: AtomicBool::new(false),
            sockets: Mutex::new(Some(sockets)),
        });
        let mut threads = Vec::with_capacity(4);
        for (from, to, direction) in
            [(client.try_clone()?, server.try_clone()?, Direction::ToServer), (server, client, Direction::ToClient)]
        {
            let (tx, rx) = std::sync::mpsc::sync_channel(MAX_HELD_CHUNKS);
            let (reading, writing) = (Arc::clone(&link), Arc::clone(&link));
            threads.push(std::thread::spawn(move || read(from, &tx, &reading)));
            threads.push(std::thread::spawn(move || write(&to, &rx, direction, &writing)));
        }
        Ok(Self { link, threads })
    }

    /// Resets the connection on both sides (within a tick).
    pub(super) fn reset(&self) {
        self.link.reset();
    }

    /// Whether every thread of the connection has ended.
    pub(super) fn ended(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Waits for the threads (each ends within a tick of the proxy's stop).
    pub(super) fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Reads chunks from `from`, each released no earlier than the one before it, until the end
/// of the stream (dropping `tx` tells the writer), an error (a reset) or the stop.
fn read(mut from: TcpStream, tx: &SyncSender<Chunk>, link: &Link) {
    let mut buf = vec![0; CHUNK];
    let mut last = Instant::now();
    while link.alive() {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue;
            }
            Err(_) => return link.reset(),
        };
        last = last.max(Instant::now() + link.shared.delay());
        let mut chunk = (last, buf[..n].to_vec());
        // A full channel is a full send buffer: stop reading until the writer takes some.
        loop {
            match tx.try_send(chunk) {
                Ok(()) => break,
                Err(TrySendError::Full(c)) if link.alive() => {
                    chunk = c;
                    std::thread::sleep(TICK);
                }
                Err(_) => return,
            }
        }
    }
}

/// Writes each chunk to `to` once its time has come and the fault lets `direction` flow; at
/// the end of the stream read, ends the write side too.
fn write(mut to: &TcpStream, rx: &Receiver<Chunk>, direction: Direction, link: &Link) {
    while link.alive() {
        let (release, chunk) = match rx.recv_timeout(TICK) {
            Ok(chunk) => chunk,
            Err(RecvTimeoutError::Timeout) => continue,
            // The reader ended: at an end of stream, pass it on; at a reset (the flag is set
            // before the reader sees it), a FIN now would reach the peer before the RST.
            Err(RecvTimeoutError::Disconnected) => {
                if link.alive() {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
        };
        if !held(release, direction, link) {
            return;
        }
        let mut at = 0;
        while at < chunk.len() {
            match to.write(&chunk[at..]) {
                Ok(0) => return link.reset(),
                Ok(n) => at += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    if !link.alive() {
                        return;
                    }
                }
                Err(_) => return link.reset(),
            }
        }
    }
}

/// Waits until `release` has passed and the fault forwards `direction`; false when the link is
/// reset or the proxy stops first.
fn held(release: Instant, direction: Direction, link: &Link) -> bool {
    while link.alive() {
        let now = Instant::now();
        if now < release {
            std::thread::sleep((release - now).min(TICK));
        } else if link.shared.fault().forwards(direction) {
            return true;
        } else {
            std::thread::sleep(TICK);
        }
    }
    false
}
