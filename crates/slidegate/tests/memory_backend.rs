//! The embedded backend under real threads, and its input checks.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use slidegate::{Algorithm, Check, Error, Limiter, ManualClock, MemoryBackend, Quota};

#[test]
fn sixty_four_threads_admit_exactly_the_limit() {
    assert_eq!(admitted_by_threads(&MemoryBackend::new(), Quota::per_minute(100).expect("valid")), 100);
    // Every other algorithm, on a frozen clock so that no refill or window edge frees a permit.
    for algorithm in [Algorithm::SlidingWindow { buckets: 6 }, Algorithm::FixedWindow, Algorithm::Gcra { burst: None }]
    {
        let quota = Quota::per_minute(100).and_then(|q| q.with_algorithm(algorithm)).expect("valid");
        let backend = MemoryBackend::with_clock(ManualClock::new(1_795_000_000_000));
        assert_eq!(admitted_by_threads(&backend, quota), 100, "{algorithm}");
    }
}

/// 64 threads released together check one key 50 times each; returns the admissions.
fn admitted_by_threads(backend: &MemoryBackend, quota: Quota) -> usize {
    let start = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (backend, start) = (backend.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                (0..50).filter(|_| backend.check_now("hot", &quota, 1).allowed).count()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("thread")).sum()
}

#[test]
fn many_keys_from_many_threads_each_get_exactly_their_limit() {
    let backend = MemoryBackend::new();
    let quota = Quota::per_minute(10).expect("valid");
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let backend = backend.clone();
            std::thread::spawn(move || {
                let mut admitted = vec![0u32; 500];
                for _ in 0..15 {
                    for (k, n) in admitted.iter_mut().enumerate() {
                        *n += u32::from(backend.check_now(&format!("user:{k}"), &quota, 1).allowed);
                    }
                }
                admitted
            })
        })
        .collect();
    let mut per_key = vec![0u32; 500];
    for t in threads {
        for (total, n) in per_key.iter_mut().zip(t.join().expect("thread")) {
            *total += n;
        }
    }
    assert!(per_key.iter().all(|&n| n == 10), "{per_key:?}");
    assert_eq!(backend.len(), 500);
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_creates_no_key() {
    let limiter = Limiter::in_memory();
    let q = Quota::new(5, Duration::from_secs(1)).expect("valid");
    assert!(matches!(limiter.check_cost("k", &q, 0).await, Err(Error::InvalidCost { cost: 0, max: 5 })));
    assert!(matches!(limiter.check_cost("k", &q, 6).await, Err(Error::InvalidCost { cost: 6, max: 5 })));
    assert!(matches!(limiter.check("", &q).await, Err(Error::EmptyKey)));
    let long = "é".repeat(slidegate::MAX_KEY_LEN / 2 + 1);
    assert!(matches!(limiter.check(&long, &q).await, Err(Error::KeyTooLong { .. })));
    assert!(limiter.backend().is_empty());
    assert!(matches!(Quota::new(0, Duration::from_secs(1)), Err(Error::InvalidLimit { limit: 0, .. })));
    assert!(matches!(Quota::new(1, Duration::ZERO), Err(Error::InvalidWindow { .. })));
    assert!(matches!(Quota::new(1, Duration::from_secs(400 * 86_400)), Err(Error::InvalidWindow { .. })));
}

#[test]
fn sixty_four_threads_of_multi_limit_checks_charge_all_or_nothing() {
    let backend = MemoryBackend::new();
    let (user, ip) = (Quota::per_minute(100).expect("valid"), Quota::per_minute(1_000).expect("valid"));
    let start = Arc::new(Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|t| {
            let (backend, start) = (backend.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                // Each thread also hits a key of its own in the same call, so shard locks overlap.
                let own = format!("thread:{t}");
                let checks = [Check::new("user", user), Check::new("ip", ip), Check::new(&own, ip)];
                (0..20).filter(|_| backend.check_all_now(&checks).allowed).count()
            })
        })
        .collect();
    let admitted: usize = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    assert_eq!(admitted, 100);
    let probe = backend.check_now("ip", &ip, 1);
    assert_eq!(probe.remaining, 1_000 - 100 - 1, "the ip limit was charged exactly once per admitted group");
}

/// `check_in_order` asks check after check: a caller's mistake is that check's answer and the
/// next is asked; the first denial is the last answer, the checks after it not asked (nor
/// charged); those before it stay charged.
#[tokio::test]
async fn checks_in_order_stop_at_the_first_denial_and_pass_a_callers_mistake() {
    let limiter = Limiter::in_memory();
    let (five, one) = (Quota::per_minute(5).expect("valid"), Quota::per_minute(1).expect("valid"));
    assert!(limiter.check("full", &one).await.expect("check").allowed);
    let checks = [Check::new("first", five), Check::new("", five), Check::new("full", one), Check::new("after", five)];
    let answers = limiter.check_in_order(&checks).await;
    assert_eq!(answers.len(), 3, "the check after the denial is not asked: {answers:?}");
    assert!(answers[0].as_ref().is_ok_and(|d| d.allowed), "{answers:?}");
    assert!(matches!(answers[1], Err(Error::EmptyKey)), "{answers:?}");
    assert!(answers[2].as_ref().is_ok_and(|d| !d.allowed), "{answers:?}");
    assert_eq!(limiter.inspect("first", &five).await.expect("inspect").count, 1, "stays charged");
    assert_eq!(limiter.inspect("after", &five).await.expect("inspect").count, 0, "not charged");
}
