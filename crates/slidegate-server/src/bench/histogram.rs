//! The latency histogram: fixed memory per worker however long the run.

/// Latencies in µs in log-linear buckets: exact below 128 µs, above it within 1/128 (0.8%), never
/// under; 26 KiB per worker however long the run (keeping every sample cost a long run on the
/// memory backend hundreds of MB, and 3.5% of the client's CPU in page faults at 64 in flight).
pub(super) struct Histogram {
    counts: Vec<u64>,
    max: u32,
}

/// Sub-buckets per power of two, as bits.
const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;

impl Histogram {
    pub(super) fn new() -> Self {
        Self { counts: vec![0; (33 - SUB_BITS as usize) * SUB], max: 0 }
    }

    fn bucket(us: u32) -> usize {
        crate::log_buckets::bucket(us, SUB_BITS)
    }

    /// The largest value that falls in bucket `b`.
    fn highest(b: usize) -> u64 {
        crate::log_buckets::highest(b, SUB_BITS)
    }

    pub(super) fn record(&mut self, us: u32) {
        self.counts[Self::bucket(us)] += 1;
        self.max = self.max.max(us);
    }

    pub(super) fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    /// The slowest recorded value.
    pub(super) fn max(&self) -> u64 {
        u64::from(self.max)
    }

    /// How many values were recorded.
    pub(super) fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `p`-th percentile: the smallest recorded value with `p`% of the samples at or below
    /// it, rounded up to its bucket's top (0 with no samples).
    pub(super) fn percentile(&self, p: f64) -> u64 {
        let rank = ((p / 100.0 * self.count() as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::highest(b).min(u64::from(self.max));
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    #[test]
    fn buckets_tile_every_value() {
        let mut v = 1u32;
        while v < u32::MAX / 3 {
            for us in [v - 1, v, v + 1, v.saturating_mul(3) / 2] {
                let b = Histogram::bucket(us);
                assert!(Histogram::highest(b) >= u64::from(us), "{us} above its bucket {b}");
                assert!(b == 0 || Histogram::highest(b - 1) < u64::from(us), "{us} belongs below bucket {b}");
            }
            v = v * 2 + 1;
        }
        assert_eq!(Histogram::highest(Histogram::bucket(u32::MAX)), u64::from(u32::MAX));
    }

    #[test]
    fn percentiles_are_exact_or_at_most_one_128th_over() {
        let mut samples = Vec::new();
        let mut h = Histogram::new();
        let mut x = 0x2545_F491_4F6C_DD1D_u64;
        for i in 0..100_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly tens to thousands of µs, some very slow.
            let us = (x % (1 << (5 + i % 12))) as u32;
            samples.push(us);
            h.record(us);
        }
        samples.sort_unstable();
        assert_eq!(h.count(), samples.len() as u64);
        for p in [1.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
            let exact = u64::from(samples[((p / 100.0 * samples.len() as f64).ceil() as usize).max(1) - 1]);
            let got = h.percentile(p);
            assert!(got >= exact && got <= exact + exact / 128, "p{p}: {got} against {exact}");
        }
        assert_eq!(h.percentile(100.0), u64::from(*samples.last().expect("samples")));
        assert_eq!(Histogram::new().percentile(50.0), 0);
    }
}
