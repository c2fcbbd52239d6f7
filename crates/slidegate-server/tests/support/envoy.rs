//! An Envoy RLS client (tonic) against a real `slidegate serve` with a configuration directory.

use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use slidegate_testkit::RedisServer;
use tonic::transport::Channel;

use super::{RulesFile, Slidegate};

/// A descriptor's status: OK.
pub const OK: i32 = Code::Ok as i32;
/// Over the limit.
pub const OVER: i32 = Code::OverLimit as i32;
/// A refused descriptor's code: not decided.
pub const UNKNOWN: i32 = Code::Unknown as i32;

/// Domain `edge`: 2 a minute per `user`.
pub const USER_EDGE: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

/// A config directory with the given files, and a server serving it over gRPC.
pub struct Envoy {
    pub server: Slidegate,
    /// The gRPC listener's `host:port`.
    pub grpc: String,
    pub client: RateLimitServiceClient<Channel>,
    pub dir: Dir,
}

/// A scratch directory removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    /// A new empty directory holding `files` (name, text).
    pub fn with(files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "slidegate-envoy-{}-{}",
            std::process::id(),
            slidegate_testkit::free_port()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write");
        }
        Self(dir)
    }

    pub fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How the loader refuses a fixture of `tests/fixtures/envoy/refused` written at `file`:
/// `file:line:column: reason`, the reason from the fixture's first line (`# refused: <reason>`),
/// the line the one that ends in `# refused at: <text>`, the column that of the first `<text>`
/// on it (the offending node).
pub fn refusal(file: &Path, text: &str) -> String {
    let reason = text.lines().next().and_then(|l| l.strip_prefix("# refused: ")).expect("a `# refused:` line");
    let (line, column) = text
        .lines()
        .enumerate()
        .find_map(|(i, line)| {
            let (_, at) = line.rsplit_once("# refused at: ")?;
            Some((i + 1, line[..line.find(at)?].chars().count() + 1))
        })
        .expect("a `# refused at:` mark");
    format!("{}:{line}:{column}: {reason}", file.display())
}

impl Envoy {
    /// Serves `files` with `extra` flags.
    pub async fn start(files: &[(&str, &str)], extra: &[&str]) -> Self {
        Self::start_with_env(files, extra, &[]).await
    }

    /// Serves `files` with `extra` flags and the environment variables `env`.
    pub async fn start_with_env(files: &[(&str, &str)], extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = Dir::with(files);
        let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
        let mut args = vec!["--grpc", &grpc, "--envoy-config", dir.arg()];
        args.extend_from_slice(extra);
        let server = Slidegate::serve_with_env(&args, env);
        let client = RateLimitServiceClient::connect(format!("http://{grpc}")).await.expect("connect");
        Self { server, grpc, client, dir }
    }

    pub async fn ask(&mut self, domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitResponse {
        self.send(request(domain, descriptors, hits)).await
    }

    pub async fn send(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.client.should_rate_limit(request).await.expect("answer").into_inner()
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(self.server.url("/metrics")).await.expect("metrics").text().await.expect("text")
    }
}

/// A descriptor's entries, `(key, value)`.
pub type Descriptor<'a> = &'a [(&'a str, &'a str)];

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: hits,
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).to_owned(), value: (*v).to_owned() }).collect(),
        ..RateLimitDescriptor::default()
    }
}

/// The overall code and each descriptor's.
pub fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

/// Runs `case` against a server on the memory backend, then on a real redis-server.
pub async fn on_both_backends(case: impl AsyncFn(&[&str])) {
    case(&[]).await;
    let redis = RedisServer::start();
    let rules = redis_rules(&redis);
    case(&["--config", rules.arg()]).await;
}

/// A rules file for `redis` with a deadline no busy machine misses: a missed one would be a
/// fail-open admission, not the decision a test asserts.
pub fn redis_rules(redis: &RedisServer) -> RulesFile {
    RulesFile::new(&format!("[backend]\nredis = \"{}\"\ntimeout = \"10s\"\n", redis.url()))
}
