//! The memory backend's key bound under a flood, measured where it matters: this process's
//! resident memory. One test in a binary of its own, so nothing else moves the figure.

use slidegate::{ManualClock, MemoryBackend, Quota};

const MAX_KEYS: usize = 100_000;

/// This process's resident memory in bytes (`VmRSS` of /proc/self/status).
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

#[test]
fn a_flood_of_twice_max_keys_new_keys_stays_within_the_bound_and_keeps_denials() {
    let clock = ManualClock::new(0);
    let backend = MemoryBackend::with_clock(clock.clone()).with_max_keys(MAX_KEYS);
    let (strict, loose) = (Quota::per_minute(3).expect("valid"), Quota::per_minute(10).expect("valid"));
    let before = rss();
    for _ in 0..3 {
        assert!(backend.check_now("victim", &strict, 1).allowed);
    }
    assert!(!backend.check_now("victim", &strict, 1).allowed, "the victim is at its limit");
    // The attack: 2 × max_keys distinct keys, each admitted once, over half a minute.
    let flood = |range: std::ops::Range<usize>| {
        for i in range {
            clock.set_ms(u64::try_from(i / 8).expect("small"));
            let key = format!("attacker-{i:08}-with-a-key-long-enough-for-the-heap");
            assert!(backend.check_now(&key, &loose, 1).allowed, "a key under its limit makes room");
        }
    };
    flood(0..MAX_KEYS);
    let full = rss();
    flood(MAX_KEYS..2 * MAX_KEYS);
    let after = rss();
    assert!(backend.len() <= MAX_KEYS, "{} keys held", backend.len());
    let (first, second) = (full.saturating_sub(before), after.saturating_sub(full));
    eprintln!(
        "memory bound: {MAX_KEYS} keys grew RSS by {} B ({} B/key); {MAX_KEYS} more keys by {} B",
        first,
        first / MAX_KEYS,
        second
    );
    // Bounded: the second max_keys keys replace the first instead of adding to them.
    assert!(second <= first / 8, "RSS grew {first} B, then {second} B more");
    assert!(first <= MAX_KEYS * 400, "{} B per key", first / MAX_KEYS);
    assert!(!backend.check_now("victim", &strict, 1).allowed, "the victim is still denied after the flood");
    clock.set_ms(60_000);
    assert!(backend.check_now("victim", &strict, 1).allowed, "until its window passes");
}
