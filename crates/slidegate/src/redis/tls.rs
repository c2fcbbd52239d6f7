//! TLS to Redis (`rediss://` URLs): the [`TlsFiles`] an operator gives, read and checked once
//! into a [`RedisTls`] that every path connecting to Redis takes — slidegate's own pipelined
//! connection (through the rustls configuration built here) and redis-rs' clients for Cluster,
//! Sentinel and pub/sub (through the same PEM bytes and hostname setting, in redis-rs' form).
//!
//! rustls on ring: nothing to build against (no system OpenSSL, no cmake or nasm as aws-lc-rs
//! needs). Without a CA file the system's certificate store is trusted, as managed Redis with
//! public certificates needs. A URL's `#insecure` (redis-rs' switch that turns every check
//! off) is refused: the one check that may be skipped is the hostname's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, TlsCertificates, TlsMode,
};
use rustls::client::WebPkiServerVerifier;
use rustls::{ClientConfig, RootCertStore};

use crate::Error;

mod files;
mod hostname;

pub use files::{MAX_PEM_BYTES, pem_certificates, pem_private_key};

/// What TLS to Redis is set up with: each file PEM, at most [`MAX_PEM_BYTES`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The CA certificates that Redis' certificate must chain to; `None`: the system's store.
    pub ca: Option<PathBuf>,
    /// A client certificate (chain) to present, for Redis' `tls-auth-clients yes`.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
    /// Accept a certificate that does not name the host connected to (providers whose
    /// certificates name no endpoint); its chain and dates are still checked.
    pub skip_hostname_verification: bool,
}

impl TlsFiles {
    /// Whether anything is set beyond the defaults.
    pub fn is_set(&self) -> bool {
        *self != Self::default()
    }
}

/// [`TlsFiles`] read and checked: cheap to clone. The default trusts the system's store and
/// presents no client certificate.
#[derive(Clone, Default)]
pub struct RedisTls {
    loaded: Option<Arc<Loaded>>,
}

struct Loaded {
    config: Arc<ClientConfig>,
    certificates: TlsCertificates,
    skip_hostname_verification: bool,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let loaded = self.loaded.as_deref();
        f.debug_struct("RedisTls")
            .field("ca", &loaded.is_some_and(|l| l.certificates.root_cert.is_some()))
            .field("client_cert", &loaded.is_some_and(|l| l.certificates.client_tls.is_some()))
            .field("skip_hostname_verification", &self.skips_hostname_verification())
            .finish()
    }
}

impl RedisTls {
    /// Reads `files` and builds the TLS client configuration from them. A file that is missing,
    /// not a regular file, larger than [`MAX_PEM_BYTES`], holds no certificate or key, or a key
    /// that does not match its certificate fails with [`Error::Tls`] naming it.
    pub fn load(files: &TlsFiles) -> Result<Self, Error> {
        let ca = files.ca.as_deref().map(|f| Ok::<_, Error>((f, files::read(f)?))).transpose()?;
        let roots = match &ca {
            Some((file, pem)) => roots(file, pem)?,
            None => system_roots()?,
        };
        let client = match (&files.cert, &files.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                Some(ClientTlsConfig { client_cert: files::read(cert)?, client_key: files::read(key)? })
            }
            (Some(cert), None) => return Err(files::problem(cert, "a client certificate needs its private key")),
            (None, Some(key)) => return Err(files::problem(key, "a private key needs its client certificate")),
        };
        let config = client_config(roots, client.as_ref(), files)?;
        let certificates = TlsCertificates { client_tls: client, root_cert: ca.map(|(_, pem)| pem) };
        let skip_hostname_verification = files.skip_hostname_verification;
        Ok(Self { loaded: Some(Arc::new(Loaded { config, certificates, skip_hostname_verification })) })
    }

    /// Whether a certificate that names another host is accepted.
    pub fn skips_hostname_verification(&self) -> bool {
        self.loaded.as_ref().is_some_and(|l| l.skip_hostname_verification)
    }

    /// The rustls configuration of slidegate's own connection.
    pub(super) fn rustls_config(&self) -> Result<Arc<ClientConfig>, Error> {
        match &self.loaded {
            Some(l) => Ok(Arc::clone(&l.config)),
            None => Ok(Self::load(&TlsFiles::default())?.rustls_config()?),
        }
    }

    /// `url` parsed, with this TLS set-up on a `rediss://` address. Refuses `#insecure`.
    pub fn connection_info(&self, url: &str) -> RedisResult<ConnectionInfo> {
        let info = url.into_connection_info()?;
        let ConnectionAddr::TcpTls { insecure, .. } = info.addr() else { return Ok(info) };
        if *insecure {
            return Err(insecure_refused());
        }
        let Some(l) = &self.loaded else { return Ok(info) };
        let info = redis::Client::build_with_tls(info, l.certificates.clone())?.get_connection_info().clone();
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(l.skip_hostname_verification);
        Ok(info.set_addr(addr))
    }

    /// A redis-rs client for `url` (pub/sub, one-off commands) with this TLS set-up.
    pub fn client(&self, url: &str) -> RedisResult<redis::Client> {
        redis::Client::open(self.connection_info(url)?)
    }

    /// A redis-rs Cluster client builder starting from `urls`, with this TLS set-up on every
    /// node when they are `rediss://` (nodes found later, after `MOVED` or a failover, too).
    pub fn cluster_builder(&self, urls: &[&str]) -> RedisResult<ClusterClientBuilder> {
        let nodes = urls.iter().map(|u| self.connection_info(u)).collect::<RedisResult<Vec<_>>>()?;
        let tls = nodes.first().is_some_and(|n| matches!(n.addr(), ConnectionAddr::TcpTls { .. }));
        let builder = ClusterClientBuilder::new(nodes);
        Ok(match (&self.loaded, tls) {
            (Some(l), true) => {
                builder.certs(l.certificates.clone()).danger_accept_invalid_hostnames(l.skip_hostname_verification)
            }
            _ => builder,
        })
    }

    /// A redis-rs Sentinel client asking `sentinels` for the master of `service`, with this
    /// TLS set-up towards the sentinels and, when they are `rediss://`, towards the master they
    /// name. Skipping hostname verification is refused here: redis-rs cannot skip it for the
    /// master alone, only every check.
    pub fn sentinel_client(&self, sentinels: &[&str], service: &str) -> RedisResult<SentinelClient> {
        let infos = sentinels.iter().map(|u| self.connection_info(u)).collect::<RedisResult<Vec<_>>>()?;
        let tls = infos.first().is_some_and(|n| matches!(n.addr(), ConnectionAddr::TcpTls { .. }));
        if !tls {
            return SentinelClient::build(infos, service, None, SentinelServerType::Master);
        }
        if self.skips_hostname_verification() {
            let message = "skipping hostname verification is not offered with Sentinel: give a CA and certificates that name the hosts";
            return Err((redis::ErrorKind::InvalidClientConfig, "TLS", message.to_owned()).into());
        }
        let first = infos.first().map(|i| i.redis_settings().clone()).unwrap_or_default();
        let mut builder =
            SentinelClientBuilder::new(infos.iter().map(|i| i.addr().clone()), service, SentinelServerType::Master)?
                .set_client_to_redis_tls_mode(TlsMode::Secure);
        if let Some(password) = first.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(user) = first.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(l) = &self.loaded {
            builder = builder.set_client_to_redis_certificates(l.certificates.clone());
        }
        builder.build()
    }
}

fn insecure_refused() -> redis::RedisError {
    let message = "#insecure turns every certificate check off and is not offered: give the CA file, or skip hostname verification only";
    (redis::ErrorKind::InvalidClientConfig, "TLS", message.to_owned()).into()
}

/// The CA certificates in `file`.
fn roots(file: &Path, pem: &[u8]) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    for cert in files::certificates(file, pem)? {
        store.add(cert).map_err(|e| files::problem(file, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(store)
}

/// The system's trusted certificates.
fn system_roots() -> Result<RootCertStore, Error> {
    let system = |reason: String| Error::Tls { what: "the system's certificate store".into(), reason };
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found.errors.first().map_or_else(|| "no certificates".to_owned(), ToString::to_string);
        return Err(system(format!("{why}: give a CA file")));
    }
    Ok(store)
}

/// The one rustls client configuration: `roots` trusted, `client` presented, hostnames
/// checked unless `files` says otherwise.
fn client_config(
    roots: RootCertStore,
    client: Option<&ClientTlsConfig>,
    files: &TlsFiles,
) -> Result<Arc<ClientConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = Arc::new(roots);
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls { what: "rustls".into(), reason: e.to_string() })?
        .with_root_certificates(Arc::clone(&roots));
    let mut config = match (client, &files.cert, &files.key) {
        (Some(c), Some(cert_file), Some(key_file)) => {
            let chain = files::certificates(cert_file, &c.client_cert)?;
            let key = files::private_key(key_file, &c.client_key)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| files::problem(key_file, format!("not the key of {}: {e}", cert_file.display())))?
        }
        _ => builder.with_no_client_auth(),
    };
    if files.skip_hostname_verification {
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| Error::Tls { what: "rustls".into(), reason: e.to_string() })?;
        config.dangerous().set_certificate_verifier(Arc::new(hostname::AnyHostname(webpki)));
    }
    Ok(Arc::new(config))
}
