//! What per-key overrides cost a decision, and memory: `POST /v1/check` requests through the
//! service's router (no sockets) on the memory backend, 10,000 keys drawn uniformly under one
//! rule (100 per minute: nearly every decision an admission), with 0 or 100,000 overrides
//! loaded. Instructions, the decisions alone collected:
//!
//! ```sh
//! cargo build --release -p slidegate-server --example override_cost
//! for loaded in none other checked; do
//!   valgrind --tool=callgrind --toggle-collect='override_cost::decide_all' \
//!       target/release/examples/override_cost $loaded 100000
//! done
//! ```
//!
//! then divide the collected instructions by the decisions. `none`: no override; `other`:
//! 100,000 overrides of other keys (the checked keys have none, the common case); `checked`:
//! 100,000 overrides, the 10,000 checked keys among them. Memory: run it without valgrind,
//! `override_cost other 0`, which prints the resident set's growth per override loaded.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Request;
use slidegate_server::app::App;
use slidegate_server::config::{Config, Source};
use slidegate_server::overrides::{Limits, Override};
use tower_service::Service;

// As the server: overrides are small allocations, and their memory is the allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RULES: &str = "max_overrides = 1000000\n\n[[rules]]\nname = \"api\"\nlimit = 100\nwindow = \"60s\"\n";
const KEYS: usize = 10_000;
const LOADED: usize = 100_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let loaded = args.next().unwrap_or_else(|| "none".to_owned());
    let decisions: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let app = runtime
        .block_on(App::start(Config::parse(RULES, "rules.toml").expect("valid"), Source::default()))
        .expect("app");
    let before = resident_bytes();
    let names: Vec<String> = match loaded.as_str() {
        "none" => Vec::new(),
        "other" => (0..LOADED).map(|i| format!("customer-{i}")).collect(),
        _ => (0..KEYS).map(|i| format!("user-{i}")).chain((KEYS..LOADED).map(|i| format!("customer-{i}"))).collect(),
    };
    for name in names {
        let o = Override {
            rule: "api".into(),
            key: name.clone(),
            // As many digits as the rule's limit: the answer is as long as without the override.
            limits: Limits { limit: 200, window: None, counting: None },
            set_at_ms: 0,
            expires_at_ms: Some(u64::MAX),
            set_from: "127.0.0.1".into(),
        };
        app.overrides.insert(format!("api:{{{name}}}"), o).expect("room");
    }
    if !app.overrides.is_empty() {
        let grown = resident_bytes().saturating_sub(before);
        println!(
            "{} overrides: {grown} bytes resident, {} per override",
            app.overrides.len(),
            grown / app.overrides.len() as u64
        );
    }
    let bodies: Vec<Bytes> = (0..KEYS).map(|i| Bytes::from(format!(r#"{{"rule":"api","key":"user-{i}"}}"#))).collect();
    let mut router = slidegate_server::routes::router(Arc::new(app));
    let _guard = runtime.enter();
    let answered = decide_all(&mut router, &bodies, decisions);
    println!("{loaded}: {decisions} decisions, {answered} answered 200");
}

/// The decisions, in one function for the instruction counter to collect in; returns how many
/// were answered 200. The memory backend answers without waiting, so each request's future is
/// ready at its first poll.
#[inline(never)]
fn decide_all(router: &mut Router, bodies: &[Bytes], n: u64) -> u64 {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut answered = 0;
    for _ in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let body = bodies[(state % bodies.len() as u64) as usize].clone();
        let request = Request::post("/v1/check").body(Body::from(body)).expect("a request");
        let Poll::Ready(answer) = pin!(router.call(request)).poll(&mut Context::from_waker(Waker::noop())) else {
            unreachable!("the memory backend never waits")
        };
        let status = answer.expect("infallible").status();
        answered += u64::from(black_box(status).is_success());
    }
    answered
}

/// The process' resident set, from `/proc/self/statm`.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}
