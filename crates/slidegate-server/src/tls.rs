//! TLS on the HTTP and gRPC listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`; `[server]`
//! `tls_cert`, `tls_key`, `tls_client_ca`): the files read and checked into the rustls server
//! configurations in force, which [`watch`] replaces whole when the files change.
//!
//! rustls on ring, as TLS to Redis: nothing to build against. With a client CA, a client must
//! present a certificate that chains to it, or the handshake fails (mutual TLS). The HTTP
//! listener offers HTTP/1.1 by ALPN, the gRPC one HTTP/2 (gRPC clients require it). The
//! listeners bound the handshake as they bound a request head: see [`crate::http`] and
//! [`crate::grpc`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use tokio_rustls::TlsAcceptor;

use slidegate::redis::{pem_certificates, pem_private_key};

pub use crate::config::ListenerTlsFiles;
use crate::file;

pub mod watch;

/// The largest certificate, key or CA file read: Redis' TLS files' bound
/// ([`slidegate::redis::MAX_PEM_BYTES`]), which a CA bundle of a few hundred certificates is well under.
pub const MAX_PEM_BYTES: usize = slidegate::redis::MAX_PEM_BYTES as usize;

/// A listener TLS file that cannot be used: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct TlsFileError {
    /// The file.
    pub file: PathBuf,
    /// Why.
    pub reason: String,
}

fn problem(file: &Path, reason: impl Into<String>) -> TlsFileError {
    TlsFileError { file: file.to_owned(), reason: reason.into() }
}

/// The server configurations in force for each listener, and the files they come from.
pub struct ListenerTls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    current: RwLock<Arc<Configs>>,
}

/// One configuration per listener, from the same files: they differ in ALPN only.
struct Configs {
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

impl ListenerTls {
    /// Reads `files` into the listeners' configurations; `None` when no certificate is given.
    /// Each file is a regular one of at most [`MAX_PEM_BYTES`]; a problem names the file.
    pub fn load(files: &ListenerTlsFiles) -> Result<Option<Self>, TlsFileError> {
        let (Some(cert), Some(key)) = (&files.cert, &files.key) else { return Ok(None) };
        let tls = Self {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: files.client_ca.clone(),
            current: RwLock::new(Arc::new(Configs::read(cert, key, files.client_ca.as_deref())?)),
        };
        Ok(Some(tls))
    }

    /// Reads the files again and puts what they hold in force for new connections; on a
    /// problem, the configurations in force stay.
    pub fn reload(&self) -> Result<(), TlsFileError> {
        let configs = Configs::read(&self.cert, &self.key, self.client_ca.as_deref())?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(configs);
        Ok(())
    }

    /// The files read, to watch them.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten()
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca.is_some()
    }

    /// The acceptor of a new HTTP connection, with the configuration in force now.
    pub fn http(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.configs().http))
    }

    /// The acceptor of a new gRPC connection, with the configuration in force now.
    pub fn grpc(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.configs().grpc))
    }

    fn configs(&self) -> Arc<Configs> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Configs {
    fn read(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsFileError> {
        let chain = certificates(cert, &read(cert)?)?;
        let pem = read(key)?;
        let private = pem_private_key(&pem).map_err(|reason| problem(key, reason))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| problem(cert, e.to_string()))?;
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(chain, private)
            .map_err(|e| problem(key, format!("not the key of {}: {e}", cert.display())))?;
        let with_alpn = |protocol: &[u8]| {
            let mut c = config.clone();
            c.alpn_protocols = vec![protocol.to_vec()];
            Arc::new(c)
        };
        Ok(Self { http: with_alpn(b"http/1.1"), grpc: with_alpn(b"h2") })
    }
}

/// The check of client certificates: they chain to the CA certificates in `ca`.
fn client_verifier(
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca, &read(ca)?)? {
        roots.add(c).map_err(|e| problem(ca, format!("not a usable CA certificate: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| problem(ca, e.to_string()))
}

/// The bytes of `path`, read as every configuration file is ([`file::read`]).
fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    file::read(path, MAX_PEM_BYTES).map_err(|e| match e {
        file::FileError::Io(e) => problem(path, format!("cannot read it: {e}")),
        e => problem(path, e.to_string()),
    })
}

/// The certificates in `pem` (`file`'s bytes): at least one.
fn certificates(file: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    pem_certificates(pem).map_err(|reason| problem(file, reason))
}
