//! Log-linear buckets of a latency in µs, shared by the load generator's histogram and the
//! dashboard's series: values under 2^`sub_bits` have a bucket each, and every power of two
//! above is split into 2^`sub_bits` equal buckets, so a bucket's width is at most 1/2^`sub_bits`
//! of its values.

/// The bucket of `us`.
#[inline]
pub(crate) fn bucket(us: u32, sub_bits: u32) -> usize {
    let sub = 1usize << sub_bits;
    if (us as usize) < sub {
        return us as usize;
    }
    let shift = 31 - us.leading_zeros() - sub_bits;
    ((shift as usize + 1) << sub_bits) + (us >> shift) as usize - sub
}

/// The largest value that falls in bucket `b`.
pub(crate) fn highest(b: usize, sub_bits: u32) -> u64 {
    let sub = 1usize << sub_bits;
    if b < sub {
        return b as u64;
    }
    let shift = (b >> sub_bits) - 1;
    ((((b & (sub - 1)) + sub + 1) as u64) << shift) - 1
}
