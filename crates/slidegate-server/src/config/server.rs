//! The `[server]` table: the listeners' deadlines and connection cap, and their TLS files.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{HttpLimit, HttpLimits};
use super::{Invalid, parse_duration};
use crate::trace::export::{OtlpOptions, OtlpProtocol};

/// `[server]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerSpec {
    header_read_timeout: Option<Spanned<String>>,
    request_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<usize>>,
    tls_cert: Option<Spanned<String>>,
    tls_key: Option<Spanned<String>>,
    tls_client_ca: Option<Spanned<String>>,
    tls_client_san: Option<Spanned<String>>,
    otlp_endpoint: Option<Spanned<String>>,
    otlp_protocol: Option<Spanned<OtlpProtocol>>,
    otlp_sampling_ratio: Option<Spanned<f64>>,
}

impl ServerSpec {
    /// The table over the defaults, for a backend whose calls take up to `backend_timeout`
    /// (written at `timeout_span`, when the file sets it).
    pub(super) fn validate(
        &self,
        backend_timeout: Duration,
        timeout_span: Option<Range<usize>>,
    ) -> Result<HttpLimits, Invalid> {
        let mut limits = HttpLimits::default();
        let duration = |d: &Spanned<String>, name: &str| {
            parse_duration(d.get_ref()).map_err(|m| Invalid::new(format!("server.{name}"), d.span(), m))
        };
        if let Some(d) = &self.header_read_timeout {
            limits.header_read_timeout = duration(d, "header_read_timeout")?;
        }
        if let Some(d) = &self.request_timeout {
            limits.request_timeout = duration(d, "request_timeout")?;
        }
        if let Some(n) = &self.max_connections {
            limits.max_connections = *n.get_ref();
        }
        limits.validate().map_err(|e| {
            let span = match e.field {
                HttpLimit::HeaderReadTimeout => self.header_read_timeout.as_ref().map(Spanned::span),
                HttpLimit::RequestTimeout => self.request_timeout.as_ref().map(Spanned::span),
                HttpLimit::MaxConnections => self.max_connections.as_ref().map(Spanned::span),
            };
            // The defaults are in range: an error is about a value the table sets.
            Invalid::new(format!("server.{}", e.field), span.unwrap_or(0..0), e.message)
        })?;
        limits.outlasts(backend_timeout).map_err(|m| {
            // Either value can be the one to change: point at the one the file sets.
            let span = self.request_timeout.as_ref().map(Spanned::span).or(timeout_span);
            Invalid::new("server.request_timeout", span.unwrap_or(0..0), m)
        })?;
        Ok(limits)
    }

    /// The listeners' TLS files (`tls_cert`, `tls_key`, `tls_client_ca`), as written: relative
    /// to the rules file's directory once [`super::Config::load`] knows it.
    pub(super) fn tls(&self) -> Result<ListenerTlsFiles, Invalid> {
        let path = |f: &Option<Spanned<String>>| f.as_ref().map(|f| f.get_ref().into());
        let files = ListenerTlsFiles {
            cert: path(&self.tls_cert),
            key: path(&self.tls_key),
            client_ca: path(&self.tls_client_ca),
            client_san: self.tls_client_san.as_ref().map(|s| s.get_ref().clone()),
        };
        files.check().map_err(|m| {
            let given = [&self.tls_cert, &self.tls_key, &self.tls_client_ca, &self.tls_client_san];
            let given = given.into_iter().flatten().next();
            Invalid::new("server", given.map_or(0..0, Spanned::span), m)
        })?;
        Ok(files)
    }
}

impl ServerSpec {
    /// The tracing fields (`otlp_endpoint`, `otlp_protocol`, `otlp_sampling_ratio`), checked
    /// as their flags are.
    pub(super) fn tracing(&self) -> Result<OtlpOptions, Invalid> {
        let tracing = OtlpOptions {
            otlp_endpoint: self.otlp_endpoint.as_ref().map(|s| s.get_ref().clone()),
            otlp_protocol: self.otlp_protocol.as_ref().map(|s| *s.get_ref()),
            otlp_sampling_ratio: self.otlp_sampling_ratio.as_ref().map(|s| *s.get_ref()),
        };
        tracing.checked().map_err(|e| {
            let span = match e.field {
                "otlp_endpoint" => self.otlp_endpoint.as_ref().map(Spanned::span),
                "otlp_protocol" => self.otlp_protocol.as_ref().map(Spanned::span),
                _ => self.otlp_sampling_ratio.as_ref().map(Spanned::span),
            };
            Invalid::new(format!("server.{}", e.field), span.unwrap_or(0..0), e.message)
        })?;
        Ok(tracing)
    }
}

/// The listeners' TLS files as given; no certificate: plaintext listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerTlsFiles {
    /// The certificate chain served (PEM).
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The CA certificates (PEM) a client's certificate must chain to; none: no client
    /// certificate asked for.
    pub client_ca: Option<PathBuf>,
    /// A DNS name or IP address a client's certificate must also be valid for (a subject
    /// alternative name, as envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`); with `client_ca` only.
    pub client_san: Option<String>,
}

impl ListenerTlsFiles {
    /// Checks that the files given make a set-up: a certificate with its key, a client CA only
    /// beside them. The message names the settings by their `[server]` fields.
    pub fn check(&self) -> Result<(), String> {
        if let Some(name) = &self.client_san {
            if self.client_ca.is_none() {
                return Err("tls_client_san needs tls_client_ca: it checks the certificates clients present".to_owned());
            }
            client_san(name)?;
        }
        match (&self.cert, &self.key, &self.client_ca) {
            (Some(_), None, _) => Err("tls_cert needs tls_key, the certificate's private key".to_owned()),
            (None, Some(_), _) => Err("tls_key needs tls_cert, the certificate it is the key of".to_owned()),
            (None, None, Some(_)) => {
                Err("tls_client_ca needs tls_cert and tls_key: it asks clients of a TLS listener for certificates"
                    .to_owned())
            }
            _ => Ok(()),
        }
    }
}

/// `name` as the subject alternative name a client certificate must hold: a DNS name or an IP
/// address.
pub fn client_san(name: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    rustls::pki_types::ServerName::try_from(name.to_owned())
        .map_err(|_| format!("tls_client_san {name:?} is neither a DNS name nor an IP address"))
}
