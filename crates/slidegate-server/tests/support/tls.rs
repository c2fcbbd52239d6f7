//! Clients of a TLS `slidegate serve`: curl for HTTPS, a tonic client for gRPC over TLS, each
//! trusting a test CA and presenting a client certificate when asked to.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use slidegate_testkit::CertFiles;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::{Slidegate, path};

/// `curl` with `args`, within 10 s: its exit code, standard output and standard error.
pub fn curl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// curl's TLS flags: trust `ca`, present `client` when given.
pub fn trust(ca: &Path, client: Option<&CertFiles>) -> Vec<String> {
    let mut args = vec!["--cacert".to_owned(), path(ca).to_owned()];
    if let Some(c) = client {
        args.extend(["--cert".into(), path(&c.cert).into(), "--key".into(), path(&c.key).into()]);
    }
    args
}

/// `curl <client> <extra> <url>`.
pub fn curl_with(client: &[String], extra: &[&str], url: &str) -> (i32, String, String) {
    let mut args: Vec<&str> = client.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    args.push(url);
    curl(&args)
}

/// `slidegate serve <args>` with `env`, up once curl with `client`'s flags gets `/healthz`.
pub fn serve_https(args: &[&str], env: &[(&str, &str)], client: &[String]) -> Slidegate {
    Slidegate::start(args, env, "https", |s| curl_with(client, &[], &s.url("/healthz")).0 == 0)
}

/// One `ShouldRateLimit` over TLS to `grpc` (for the name `localhost`), trusting `ca` and
/// presenting `identity`, on a new connection, within 10 s: the overall code, or the error that
/// ended it.
pub async fn grpc_call(
    grpc: &str,
    ca: &Path,
    identity: Option<&CertFiles>,
    request: RateLimitRequest,
) -> Result<i32, String> {
    let read = |p: &Path| std::fs::read(p).expect("PEM file");
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca))).domain_name("localhost");
    if let Some(c) = identity {
        tls = tls.identity(Identity::from_pem(read(&c.cert), read(&c.key)));
    }
    let endpoint = Endpoint::from_shared(format!("https://{grpc}")).expect("URI").tls_config(tls).expect("TLS");
    let ask = async {
        let channel = endpoint.connect().await.map_err(|e| format!("connect: {e:?}"))?;
        let answer = RateLimitServiceClient::new(channel)
            .should_rate_limit(request)
            .await
            .map_err(|e| format!("call: {e:?}"))?;
        Ok(answer.into_inner().overall_code)
    };
    tokio::time::timeout(Duration::from_secs(10), ask).await.map_err(|_| "no answer within 10 s".to_owned())?
}
