//! The service's recorder with its upkeep running keeps a histogram nobody scrapes bounded: the
//! exporter holds every sample until something drains it into buckets. One test in a process
//! of its own, as it measures the process's resident memory.

use std::time::Duration;

use slidegate_server::metrics::{recorder, spawn_upkeep};

/// The process's resident memory (Linux: `/proc/self/statm`, in 4 KiB pages).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("resident pages");
    pages * 4096
}

/// How much the process grows while 4,000,000 samples (32 MB as raw samples) go into one
/// histogram of the service's recorder, with or without its upkeep running, never scraped.
fn growth(upkeep: bool) -> u64 {
    let recorder = recorder();
    if upkeep {
        spawn_upkeep(recorder.handle(), Duration::from_millis(10));
    }
    let histogram = metrics::with_local_recorder(&recorder, || metrics::histogram!("slidegate_unscraped_seconds"));
    let before = resident_bytes();
    for _ in 0..400 {
        for _ in 0..10_000 {
            histogram.record(0.001);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    resident_bytes().saturating_sub(before)
}

#[test]
fn histograms_nobody_scrapes_stay_bounded_with_the_upkeep_running() {
    const MB: u64 = 1 << 20;
    // With the upkeep first, so that memory it frees cannot hide the other run's growth.
    let with = growth(true);
    let without = growth(false);
    eprintln!(
        "resident growth over 4,000,000 unscraped samples: {} KB with the upkeep, {} KB without",
        with >> 10,
        without >> 10
    );
    assert!(without > 24 * MB, "without upkeep every sample is kept: grew {} MB", without / MB);
    assert!(with < 4 * MB, "with the upkeep running the histogram stays small: grew {} MB", with / MB);
}
