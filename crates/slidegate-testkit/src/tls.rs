//! Redis over TLS: [`RedisServer::start_tls`], and the certificates it serves ([`TestPki`]).
//!
//! A TLS server keeps a plaintext port on 127.0.0.1 for the harness alone (its `PING` when
//! starting, [`RedisServer::conn`] and [`RedisServer::query`]); what a test checks connects to
//! [`RedisServer::tls_url`].

use std::path::Path;

use super::{RedisCluster, RedisSentinel, RedisServer, free_port};

mod pki;
pub use pki::{CertFiles, Flaw, TestPki};

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
        Self::start_tls_retrying(pki, auth_clients, || extra.iter().map(|&a| a.to_owned()).collect())
    }

    /// As [`RedisServer::start_tls`], with new `extra` arguments for each attempt.
    pub(crate) fn start_tls_retrying(pki: &TestPki, auth_clients: bool, extra: impl Fn() -> Vec<String>) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let tls_port = free_port();
            let mut args = server_args(pki, tls_port, auth_clients);
            args.extend(extra());
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

impl RedisCluster {
    /// As [`RedisCluster::start`], every node also serving TLS with `pki`'s certificate
    /// (`tls-cluster yes`: the cluster bus and replication over TLS too). A client over TLS is
    /// told the nodes' TLS ports (`CLUSTER SLOTS`, `MOVED`); a plaintext one, the harness's.
    ///
    /// # Panics
    /// As [`RedisCluster::start`].
    pub fn start_tls(pki: &TestPki, masters: usize, replicas: usize) -> Self {
        Self::start_nodes(masters, replicas, |node_args| {
            RedisServer::start_tls_retrying(pki, false, || {
                let mut args = node_args();
                args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned));
                args
            })
        })
    }

    /// The nodes' `rediss://` URLs.
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
    }
}

impl RedisSentinel {
    /// As [`RedisSentinel::start`], the master, its replica and the Sentinel also serving TLS
    /// with `pki`'s certificate, replication and the Sentinel's own links over TLS
    /// (`tls-replication yes`): the Sentinel names the master by its TLS port.
    ///
    /// # Panics
    /// As [`RedisSentinel::start`].
    pub fn start_tls(pki: &TestPki) -> Self {
        let master = RedisServer::start_tls(pki, false, &["--tls-replication", "yes"]);
        let master_tls = master.tls_port().expect("TLS").to_string();
        let replica =
            RedisServer::start_tls(pki, false, &["--tls-replication", "yes", "--replicaof", "127.0.0.1", &master_tls]);
        let tls_port = free_port();
        let conf: String =
            server_args(pki, tls_port, false).chunks(2).map(|kv| format!("{} {}\n", &kv[0][2..], kv[1])).collect();
        let port = master.tls_port().expect("TLS");
        let mut setup = Self::watch(master, replica, port, &format!("{conf}tls-replication yes\n"));
        setup.sentinel_tls_port = Some(tls_port);
        setup
    }

    /// `rediss://127.0.0.1:<sentinel TLS port>`.
    ///
    /// # Panics
    /// When the Sentinel serves no TLS.
    pub fn sentinel_tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.sentinel_tls_port.expect("a Sentinel started with start_tls"))
    }
}
