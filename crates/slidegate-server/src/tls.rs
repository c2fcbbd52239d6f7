//! TLS on the HTTP and gRPC listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`; `[server]`
//! `tls_cert`, `tls_key`, `tls_client_ca`): the files read and checked into the rustls server
//! configurations in force, which [`watch`] replaces whole when the files change.
//!
//! rustls on ring, as TLS to Redis: nothing to build against. With a client CA, a client must
//! present a certificate that chains to it, or the handshake fails (mutual TLS); with a client
//! SAN too (`--tls-client-san`), one valid for that name. The HTTP
//! listener offers HTTP/1.1 by ALPN, the gRPC one HTTP/2 (gRPC clients require it). The
//! listeners bound the handshake as they bound a request head: see [`crate::http`] and
//! [`crate::grpc`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tokio_rustls::TlsAcceptor;

use slidegate::redis::{pem_certificates, pem_private_key};

pub use crate::config::ListenerTlsFiles;
use crate::config::client_san;
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
    client_san: Option<String>,
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
            .field("client_san", &self.client_san)
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
            client_san: files.client_san.clone(),
            current: RwLock::new(Arc::new(Configs::read(
                cert,
                key,
                files.client_ca.as_deref(),
                files.client_san.as_deref(),
            )?)),
        };
        Ok(Some(tls))
    }

    /// Reads the files again and puts what they hold in force for new connections; on a
    /// problem, the configurations in force stay.
    pub fn reload(&self) -> Result<(), TlsFileError> {
        let configs = Configs::read(&self.cert, &self.key, self.client_ca.as_deref(), self.client_san.as_deref())?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(configs);
        Ok(())
    }

    /// The files read, to watch them.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten()
    }

    /// What is asked of clients' certificates, for a log line: `required`, `required, for
    /// <name>`, or `not asked for`.
    pub fn client_certificates(&self) -> String {
        match (&self.client_ca, &self.client_san) {
            (Some(_), Some(name)) => format!("required, for {name}"),
            (Some(_), None) => "required".to_owned(),
            (None, _) => "not asked for".to_owned(),
        }
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
    fn read(cert: &Path, key: &Path, client_ca: Option<&Path>, client_san: Option<&str>) -> Result<Self, TlsFileError> {
        let chain = certificates(cert, &read(cert)?)?;
        let pem = read(key)?;
        let private = pem_private_key(&pem).map_err(|reason| problem(key, reason))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| problem(cert, e.to_string()))?;
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, client_san, provider)?),
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

/// The check of client certificates: they chain to the CA certificates in `ca` and, with
/// `san`, are valid for that name.
fn client_verifier(
    ca: &Path,
    san: Option<&str>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca, &read(ca)?)? {
        roots.add(c).map_err(|e| problem(ca, format!("not a usable CA certificate: {e}")))?;
    }
    let chain = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| problem(ca, e.to_string()))?;
    Ok(match san {
        // Checked when the settings were read; a name that fails here fails the start all the same.
        Some(name) => Arc::new(NamedClients { chain, name: client_san(name).map_err(|m| problem(ca, m))? }),
        None => chain,
    })
}

/// Client certificates that chain to the CA and name `name` among their subject alternative
/// names (envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`): any other is refused at the handshake.
#[derive(Debug)]
struct NamedClients {
    chain: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClients {
    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.chain.verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
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
