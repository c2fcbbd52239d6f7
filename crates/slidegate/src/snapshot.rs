//! What a snapshot keeps of a key: [`Counter::encode`] and [`Counter::decode`], the flat list of
//! numbers the Redis module (`slidegate-module`) stores in RDB files and AOF rewrites. Stored
//! data, so the format never changes; a restored counter decides exactly as the one saved.
//! Snapshots come from files and `RESTORE` payloads, so decoding refuses anything no decision
//! could have written.

use crate::quota::MAX_WINDOW_MS;
use crate::spec::{self, SlidingLog, State};
use crate::state::{Counter, Inner, MAX_TIME_MS};

/// The tag that opens an encoded sliding log.
const LOG_TAG: u64 = 0;
/// The tag of the specification's own sliding log, which no counter holds (a counter keeps its
/// log compact): refused.
const SPEC_LOG_TAG: u64 = 1;

impl Counter {
    /// The counter as a flat list of numbers: what a snapshot stores (the Redis module's RDB
    /// files and AOF rewrites), so the format is stable. [`Counter::decode`] reads it back. Each list opens with a tag and the warm-up start:
    ///
    /// - sliding log: `0, warm_since, n, t₁ … tₙ` (admission times in ms, oldest first);
    /// - sliding window: `2, warm_since, n, i₁, c₁ … iₙ, cₙ` (bucket index and count, indexes
    ///   increasing);
    /// - fixed window: `3, warm_since, 0` (nothing counted) or `3, warm_since, 1, i, c` (window
    ///   index and count);
    /// - GCRA: `4, warm_since, tat` (theoretical arrival time in µs).
    pub fn encode(&self) -> Vec<u64> {
        match &self.0 {
            Inner::Log(log) => {
                let mut words = Vec::with_capacity(3 + self.len());
                words.extend([LOG_TAG, log.warm_since, log.len]);
                words.extend(log.times());
                words
            }
            Inner::Spec(key) => encode_spec(key),
        }
    }

    /// A counter from [`Counter::encode`]'s numbers; `None` when they are not such a list, or
    /// hold a time after [`MAX_TIME_MS`] or a count no admission could have made.
    pub fn decode(words: &[u64]) -> Option<Self> {
        match *words {
            [LOG_TAG, warm_since, n, ref rest @ ..]
                if rest.len() as u64 == n
                    && rest.is_sorted()
                    && rest.last().is_none_or(|&t| t <= MAX_TIME_MS)
                    && warm_since <= MAX_TIME_MS =>
            {
                Some(Self::from_log(rest.iter().copied(), warm_since))
            }
            // A specification's log (tag 1) is never encoded by a counter, which keeps its own.
            [LOG_TAG | SPEC_LOG_TAG, ..] => None,
            _ => decode_spec(words).map(|key| Self(Inner::Spec(key))),
        }
    }
}

/// A [`spec::Key`] as words: its tag (1 to 4), the warm-up start, then its state.
fn encode_spec(key: &spec::Key) -> Vec<u64> {
    let mut words = Vec::new();
    match &key.state {
        State::Log(log) => {
            words.extend([SPEC_LOG_TAG, key.warm_since, log.admissions.len() as u64]);
            words.extend(&log.admissions);
        }
        State::Window(counts) => {
            words.extend([2, key.warm_since, counts.len() as u64]);
            words.extend(counts.iter().flat_map(|&(i, c)| [i, c]));
        }
        State::Fixed(None) => words.extend([3, key.warm_since, 0]),
        State::Fixed(Some((i, c))) => words.extend([3, key.warm_since, 1, *i, *c]),
        State::Gcra(tat) => words.extend([4, key.warm_since, *tat]),
    }
    words
}

/// A [`spec::Key`] from [`encode_spec`]'s words; `None` when they are not such a list.
///
/// Numbers no decision could have written are refused, so that a restored key's arithmetic
/// stays in range: times and window indexes after [`MAX_TIME_MS`], counts over
/// [`crate::MAX_LIMIT`] (an admission fits under a limit), a GCRA time past [`MAX_TIME_MS`]
/// plus the longest bucket.
fn decode_spec(words: &[u64]) -> Option<spec::Key> {
    let (&[tag, warm_since], rest) = words.split_first_chunk::<2>()?;
    let count = |c: u64| c <= crate::MAX_LIMIT;
    let state = match (tag, rest) {
        _ if warm_since > MAX_TIME_MS => return None,
        (SPEC_LOG_TAG, [n, admissions @ ..])
            if admissions.len() as u64 == *n && admissions.iter().all(|&t| t <= MAX_TIME_MS) =>
        {
            State::Log(SlidingLog { admissions: admissions.to_vec() })
        }
        (2, [n, pairs @ ..]) if pairs.len() as u64 == n.checked_mul(2)? => {
            let counts: Vec<(u64, u64)> = pairs.chunks_exact(2).map(|p| (p[0], p[1])).collect();
            if !counts.is_sorted_by(|a, b| a.0 < b.0) || !counts.iter().all(|&(i, c)| i <= MAX_TIME_MS && count(c)) {
                return None;
            }
            State::Window(counts)
        }
        (3, [0]) => State::Fixed(None),
        (3, [1, i, c]) if *i <= MAX_TIME_MS && count(*c) => State::Fixed(Some((*i, *c))),
        (4, [tat]) if *tat <= (MAX_TIME_MS + MAX_WINDOW_MS) * 1000 => State::Gcra(*tat),
        _ => return None,
    };
    Some(spec::Key { state, warm_since })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Algorithm, MAX_LIMIT, MAX_LOG_LIMIT, Quota};

    fn quota(algorithm: Algorithm) -> Quota {
        Quota::new(10, Duration::from_millis(1_000)).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
    }

    #[test]
    fn every_algorithm_round_trips_through_its_encoding() {
        for algorithm in [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow { buckets: 4 },
            Algorithm::FixedWindow,
            Algorithm::Gcra { burst: Some(3) },
        ] {
            let q = quota(algorithm);
            let mut counter = Counter::new(algorithm);
            for t in [0, 0, 100, 260, 700] {
                if counter.evaluate(t, &q, 1).allowed {
                    counter.record(t, &q, 1);
                }
            }
            let mut restored = Counter::decode(&counter.encode()).expect("decodes");
            assert!(restored.counts_by(algorithm));
            for t in [750, 1_000, 1_150, 1_300, 2_500] {
                assert_eq!(restored.evaluate(t, &q, 2), counter.evaluate(t, &q, 2), "{algorithm} at {t}");
            }
        }
    }

    #[test]
    fn malformed_encodings_are_refused() {
        for words in [&[][..], &[0, 0, 2, 5], &[0, 0, 2, 9, 5], &[9, 0], &[2, 0, 3, 1, 1], &[4]] {
            assert!(Counter::decode(words).is_none(), "{words:?}");
        }
        // Lengths claiming more than the words hold, refused before anything is allocated;
        // numbers no decision writes; the specification's own log.
        let far = MAX_TIME_MS + 1;
        for words in [
            &[0, 0, 1 << 60, 5][..],
            &[2, 0, 1 << 63, 1, 1],
            &[2, 0, u64::MAX, 1, 1],
            &[0, 0, 1, far],
            &[0, far, 1, 5],
            &[2, 0, 1, far, 1],
            &[2, 0, 1, 5, MAX_LIMIT + 1],
            &[3, 0, 1, 5, u64::MAX],
            &[4, 0, u64::MAX],
            &[1, 0, 1, 5],
        ] {
            assert!(Counter::decode(words).is_none(), "{words:?}");
        }
        assert!(Counter::decode(&[0, MAX_TIME_MS, 2, 5, MAX_TIME_MS]).is_some(), "the bound itself is a time");
    }

    /// A quota of `kind`'s algorithm from fuzzed numbers, when they make a valid one.
    fn fuzzed_quota(
        kind: Algorithm,
        limit: u64,
        window_ms: u64,
        param: u64,
        warm: Option<(u64, u64)>,
    ) -> Option<Quota> {
        let algorithm = match kind {
            Algorithm::SlidingWindow { .. } => Algorithm::SlidingWindow { buckets: u32::try_from(param % 101).ok()? },
            Algorithm::Gcra { .. } => Algorithm::Gcra { burst: (param > 0).then_some(param) },
            other => other,
        };
        let quota =
            Quota::new(limit, Duration::from_millis(window_ms)).and_then(|q| q.with_algorithm(algorithm)).ok()?;
        match warm {
            Some((period, permille)) => {
                quota.with_warm_up(Duration::from_millis(period), permille as f64 / 1000.0).ok()
            }
            None => Some(quota),
        }
    }

    /// Numbers biased to the edges where arithmetic overflows.
    fn edgy() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            0u64..=20,
            any::<u64>(),
            Just(u64::MAX),
            Just(MAX_TIME_MS),
            (0u64..=64).prop_map(|b| 1u64.checked_shl(b as u32).unwrap_or(u64::MAX).wrapping_sub(1)),
            1_700_000_000_000u64..1_800_000_000_000,
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 2_000, failure_persistence: None, ..Default::default() })]
        /// A snapshot's words come from a file or a `RESTORE` payload: random words, and valid
        /// encodings with words flipped, inserted, deleted or cut, either decode to a counter or
        /// are refused. A counter that decodes then takes checks of any valid quota of its kind
        /// (quotas change between checks of one key), at any time a caller may give, without
        /// panicking (overflow included: tests build with overflow checks), within a second,
        /// and encodes to words that decode again.
        #[test]
        fn any_snapshot_words_decode_or_are_refused_and_never_break_decisions(
            seed_algorithm in 0usize..4,
            history in proptest::collection::vec((edgy(), 1u64..=1_000), 0..40),
            edits in proptest::collection::vec((proptest::prelude::any::<u8>(), proptest::prelude::any::<usize>(), edgy()), 0..6),
            random in proptest::option::weighted(0.3, proptest::collection::vec(edgy(), 0..24)),
            checks in proptest::collection::vec(
                (edgy(), edgy(), edgy(), edgy(), proptest::option::weighted(0.2, (edgy(), 0u64..=1_000)), 0..=MAX_TIME_MS, proptest::bool::weighted(0.2)),
                1..24,
            ),
        ) {
            use proptest::prelude::*;
            let started = std::time::Instant::now();
            let kinds = [Algorithm::SlidingLog, Algorithm::SlidingWindow { buckets: 4 }, Algorithm::FixedWindow, Algorithm::Gcra { burst: None }];
            let seed_quota = fuzzed_quota(kinds[seed_algorithm], 50, 10_000, 4, None).expect("valid");
            let mut seed = Counter::new(seed_quota.algorithm());
            let mut now = 1_000_000;
            for (step, cost) in history {
                now = (now + step % 5_000).min(MAX_TIME_MS);
                if seed.evaluate(now, &seed_quota, cost.min(50)).allowed {
                    seed.record(now, &seed_quota, cost.min(50));
                }
            }
            let mut words = random.unwrap_or_else(|| seed.encode());
            for (op, at, value) in edits {
                let at = if words.is_empty() { 0 } else { at % words.len() };
                match op % 5 {
                    0 if !words.is_empty() => words[at] ^= 1 << (value % 64),
                    1 => words.insert(at, value),
                    2 if !words.is_empty() => { words.remove(at); }
                    3 => words.truncate(at),
                    _ if !words.is_empty() => words[at] = value,
                    _ => {}
                }
            }
            let Some(mut counter) = Counter::decode(&words) else { return Ok(()) };
            let kind = counter.algorithm_kind();
            for (limit, window, param, cost, warm, at, step_back) in checks {
                let Some(quota) = fuzzed_quota(kind, limit % (MAX_LIMIT + 1), window % (crate::quota::MAX_WINDOW_MS + 1), param, warm) else { continue };
                let cost = cost % quota.max_cost().min(MAX_LOG_LIMIT) + 1;
                let at = if step_back { at } else { at.max(now) };
                now = at;
                let fit = counter.evaluate(at, &quota, cost);
                if fit.allowed && cost % 3 != 0 {
                    counter.record(at, &quota, cost);
                } else if fit.allowed {
                    counter.held(at, &quota, cost, &fit);
                }
                let _ = (counter.expires_at(&quota), counter.reset_after(at, &quota), counter.inspect(at, &quota), counter.heap_bytes());
            }
            prop_assert!(Counter::decode(&counter.encode()).is_some(), "a counter's own words decode");
            prop_assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        }
    }
}
