//! The client's cost per decision through `Limiter`, for an instruction counter. On the memory
//! backend (the decisions alone are collected):
//!
//! ```sh
//! cargo build --release -p slidegate --features redis --example decision_cost
//! valgrind --tool=callgrind --toggle-collect='decision_cost::decide_all' \
//!     target/release/examples/decision_cost W2 200000
//! ```
//!
//! then divide the collected instructions by the decisions. With a Redis URL as a third
//! argument the decisions go to that Redis, one at a time, and the whole client is counted: run
//! it twice, with N and 2N decisions, and divide the difference by N (connecting and loading the
//! scripts cancel out). Shapes: `W1` one hot key, 100 per 10 s (nearly every decision a
//! denial); `W2` 10,000 keys drawn uniformly, 100 per 60 s (nearly every decision an admission
//! into a short log). The memory backend runs on a `ManualClock` stepped by 1 ms per decision,
//! so a run counts nearly the same instructions every time (its hash keys are random per
//! process).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use slidegate::{Limiter, ManualClock, MemoryBackend, Quota, RedisBackend};

fn main() {
    let mut args = std::env::args().skip(1);
    let shape = args.next().unwrap_or_else(|| "W2".to_owned());
    let decisions: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let (keys, quota) = match shape.as_str() {
        "W1" => (vec!["rl:w1:hot".to_owned()], Quota::new(100, Duration::from_secs(10))),
        _ => ((0..10_000).map(|i| format!("rl:w2:{i}")).collect(), Quota::new(100, Duration::from_secs(60))),
    };
    let quota = quota.expect("valid quota");
    let admitted = match args.next() {
        Some(url) => on_redis(&url, &keys, &quota, decisions),
        None => {
            let clock = ManualClock::new(1_000_000);
            let limiter = Limiter::new(MemoryBackend::with_clock(clock.clone()));
            decide_all(&limiter, &keys, &quota, decisions, || clock.advance(Duration::from_millis(1)))
        }
    };
    println!("{shape}: {decisions} decisions, {admitted} admitted");
}

fn on_redis(url: &str, keys: &[String], quota: &Quota, decisions: u64) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let limiter = Limiter::new(RedisBackend::connect(url).await.expect("connect"));
        let mut admitted = 0;
        for key in keys.iter().cycle().take(usize::try_from(decisions).unwrap_or(usize::MAX)) {
            admitted += u64::from(limiter.check(black_box(key), quota).await.expect("a valid check").allowed);
        }
        admitted
    })
}

/// The decisions, in one function for the instruction counter to collect in. The memory
/// backend answers without waiting, so each check's future is ready at its first poll.
#[inline(never)]
fn decide_all(limiter: &Limiter, keys: &[String], quota: &Quota, n: u64, mut tick: impl FnMut()) -> u64 {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut admitted = 0;
    for _ in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = &keys[(state % keys.len() as u64) as usize];
        let Poll::Ready(d) = pin!(limiter.check(black_box(key), quota)).poll(&mut Context::from_waker(Waker::noop()))
        else {
            unreachable!("the memory backend never waits")
        };
        admitted += u64::from(d.expect("a valid check").allowed);
        tick();
    }
    admitted
}
