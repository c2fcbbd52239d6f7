//! Redis over TLS: [`RedisServer::start_tls`], and the certificates it serves ([`TestPki`]).
//!
//! A TLS server keeps a plaintext port on 127.0.0.1 for the harness alone (its `PING` when
//! starting, [`RedisServer::conn`] and [`RedisServer::query`]); what a test checks connects to
//! [`RedisServer::tls_url`].

use std::path::Path;

use super::{RedisServer, free_port};

mod pki;
pub use pki::{CertFiles, Flaw, TestPki};
pub use rcgen::ExtendedKeyUsagePurpose;

/// The `redis-server` arguments that serve TLS on `tls_port` with `pki`'s server certificate;
/// `auth_clients`: whether a client must present a certificate from `pki`'s CA.
pub(crate) fn server_args(pki: &TestPki, tls_port: u16, auth_clients: bool) -> Vec<String> {
    let server = pki.server();
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_owned();
    vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path(&server.cert),
        "--tls-key-file".into(),
        path(&server.key),
        "--tls-ca-cert-file".into(),
        path(&pki.ca()),
        "--tls-auth-clients".into(),
        if auth_clients { "yes" } else { "no" }.into(),
    ]
}

impl RedisServer {
    /// Starts a server that also serves TLS with `pki`'s server certificate, on a port of its
    /// own ([`RedisServer::tls_url`]); `auth_clients`: Redis' `tls-auth-clients`. `extra`
    /// arguments follow.
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_tls(pki: &TestPki, auth_clients: bool, extra: &[&str]) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let tls_port = free_port();
            let mut args = server_args(pki, tls_port, auth_clients);
            args.extend(extra.iter().map(|&a| a.to_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match Self::launch(free_port(), &args) {
                Ok(mut server) => {
                    server.tls_port = Some(tls_port);
                    return server;
                }
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server with TLS did not start: {last_error}");
    }

    /// The TLS port, for a server started with [`RedisServer::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `rediss://127.0.0.1:<tls port>`.
    ///
    /// # Panics
    /// When the server serves no TLS.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port.expect("a server started with start_tls"))
    }
}
