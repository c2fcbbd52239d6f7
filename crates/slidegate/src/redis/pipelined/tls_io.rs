//! A TLS session driven by hand over the two owned halves of one TCP socket, so that the reader
//! task and the writers never wait on each other's socket half: the session alone is shared,
//! under a mutex held to encrypt or decrypt one batch. (`tokio::io::split` of a TLS stream locks
//! the whole stream for each read and each write, and a task that finds it locked yields and
//! polls again.)
//!
//! Writes go out as the TCP half does: what the socket takes now from any task
//! ([`TlsWriter::try_write`]: the plaintext is taken whole, its records sent as far as the
//! socket takes them), the rest from the writer task once the socket is writable
//! ([`TlsWriter::write_all`]); [`TlsWriter::pending`] tells that task there is such a rest.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use rustls::ClientConnection;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_rustls::client::TlsStream;

/// Splits an established TLS stream into its reading and its writing side.
pub(super) fn split(stream: TlsStream<TcpStream>) -> (TlsReader, TlsWriter) {
    let (socket, mut session) = stream.into_inner();
    // Bounded by the connection's own bounds: at most MAX_IN_FLIGHT commands are handed over.
    session.set_buffer_limit(None);
    let session = Arc::new(Mutex::new(session));
    let (read, write) = socket.into_split();
    (TlsReader { socket: read, session: Arc::clone(&session) }, TlsWriter { socket: write, session })
}

fn lock(session: &Mutex<ClientConnection>) -> MutexGuard<'_, ClientConnection> {
    session.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The writing side: the socket's write half and the shared session.
pub(super) struct TlsWriter {
    socket: OwnedWriteHalf,
    session: Arc<Mutex<ClientConnection>>,
}

impl TlsWriter {
    /// Takes all of `plaintext` into the session and sends its records as far as the socket
    /// takes them now; what it does not take, [`TlsWriter::write_all`] sends.
    pub(super) fn try_write(&self, plaintext: &[u8]) -> io::Result<usize> {
        let mut session = lock(&self.session);
        session.writer().write_all(plaintext)?;
        self.send(&mut session)?;
        Ok(plaintext.len())
    }

    /// Whether records wait for the socket.
    pub(super) fn pending(&self) -> bool {
        lock(&self.session).wants_write()
    }

    /// Takes `plaintext` into the session and sends every record waiting, as the socket
    /// becomes writable.
    pub(super) async fn write_all(&self, plaintext: &[u8]) -> io::Result<()> {
        let mut more = {
            let mut session = lock(&self.session);
            session.writer().write_all(plaintext)?;
            self.send(&mut session)?
        };
        while more {
            self.socket.writable().await?;
            more = self.send(&mut lock(&self.session))?;
        }
        Ok(())
    }

    /// Sends the session's records while the socket takes them: whether some are left.
    fn send(&self, session: &mut ClientConnection) -> io::Result<bool> {
        while session.wants_write() {
            match session.write_tls(&mut NowOrNever(&self.socket)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

/// A socket half as a blocking-style writer that never blocks: what it takes now, or
/// `WouldBlock`.
struct NowOrNever<'a>(&'a OwnedWriteHalf);

impl Write for NowOrNever<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading side: the socket's read half and the shared session.
pub(super) struct TlsReader {
    socket: OwnedReadHalf,
    session: Arc<Mutex<ClientConnection>>,
}

impl AsyncRead for TlsReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            {
                let mut session = lock(&this.session);
                let state = session.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let ready = state.plaintext_bytes_to_read().min(out.remaining());
                if ready > 0 {
                    let read = session.reader().read(out.initialize_unfilled_to(ready))?;
                    out.advance(read);
                    return Poll::Ready(Ok(()));
                }
                if state.peer_has_closed() {
                    // close_notify: the end, read as nothing more.
                    return Poll::Ready(Ok(()));
                }
                match session.read_tls(&mut NowOrNeverRead(&this.socket)) {
                    Ok(0) => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the TLS connection to Redis closed without close_notify",
                        )));
                    }
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            // Nothing to read now: wait for the socket, the session free meanwhile.
            ready!(this.socket.as_ref().poll_read_ready(cx))?;
        }
    }
}

/// A socket half as a blocking-style reader that never blocks: what it holds now, or
/// `WouldBlock`.
struct NowOrNeverRead<'a>(&'a OwnedReadHalf);

impl Read for NowOrNeverRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}
