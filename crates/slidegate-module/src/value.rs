//! The native data type: one [`Counter`] per key (for the sliding log a ring of the gaps between
//! admissions, a byte or two each) and the quota it was last checked with, so
//! `SLIDEGATE.INSPECT key` needs no arguments. Persisted as one binary string of little-endian words in RDB files (and so by
//! `DUMP`/`RESTORE`, `DEBUG RELOAD`, replication's full sync); an AOF rewrite emits one
//! `SLIDEGATE.RESTORE key payload` per key.

use std::ffi::{CString, c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::{Context, RedisString, RedisValue, raw};
use slidegate::state::Counter;
use slidegate::{Algorithm, Quota};

use crate::Error;

/// The type's name in RDB files: exactly nine characters, as Redis requires.
const TYPE_NAME: &str = "slidegate";

/// The encoding version written to RDB files; [`rdb_load`] refuses others.
const ENCODING_VERSION: c_int = 0;

/// The data type, registered when the module loads.
pub(crate) static SLIDEGATE_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: None,
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// What one key holds.
#[derive(Debug, Clone)]
pub(crate) struct Value {
    pub(crate) counter: Counter,
    /// The quota of the last check, for `SLIDEGATE.INSPECT key` and `MEMORY USAGE`'s readers.
    pub(crate) quota: Quota,
}

impl Value {
    /// The value as bytes: the quota in six words, then the counter's own encoding.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let q = &self.quota;
        let (tag, param) = match q.algorithm() {
            Algorithm::SlidingWindow { buckets } => (1, u64::from(buckets)),
            Algorithm::FixedWindow => (2, 0),
            Algorithm::Gcra { .. } => (3, q.burst()),
            _ => (0, 0),
        };
        let (period, cold) = q.warm_up().map_or((0, 0), |w| (w.period_ms(), w.cold_permille()));
        [q.limit(), q.window_ms(), tag, param, period, cold]
            .into_iter()
            .chain(self.counter.encode())
            .flat_map(u64::to_le_bytes)
            .collect()
    }

    /// A value from [`Value::to_bytes`]; a clear error when the bytes are not one.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let corrupt = || Error::Syntax("the payload is not a slidegate value".into());
        if bytes.len() % 8 != 0 {
            return Err(corrupt());
        }
        let words: Vec<u64> =
            bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect();
        let [limit, window_ms, tag, param, period, cold] = *words.first_chunk::<6>().ok_or_else(corrupt)?;
        let algorithm = match tag {
            0 => Algorithm::SlidingLog,
            1 => Algorithm::SlidingWindow { buckets: u32::try_from(param).map_err(|_| corrupt())? },
            2 => Algorithm::FixedWindow,
            3 => Algorithm::Gcra { burst: Some(param) },
            _ => return Err(corrupt()),
        };
        let mut quota = Quota::new(limit, std::time::Duration::from_millis(window_ms))?.with_algorithm(algorithm)?;
        if period > 0 {
            quota = quota.with_warm_up(std::time::Duration::from_millis(period), cold as f64 / 1000.0)?;
        }
        let counter = Counter::decode(&words[6..]).filter(|c| c.counts_by(algorithm)).ok_or_else(corrupt)?;
        Ok(Self { counter, quota })
    }
}

/// The most permits a Lua key's log is read into: [`slidegate::MAX_LOG_LIMIT`].
const MOST_PERMITS: usize = slidegate::MAX_LOG_LIMIT as usize;

/// Reads a key written by slidegate's Lua scripts (before the module was loaded) as a counter
/// of `algorithm`, so that loading the module on a live Redis loses no one's admissions. `None`
/// when the key is empty; an error when it holds anything else.
pub(crate) fn read_lua_key(ctx: &Context, key: &RedisString, quota: &Quota) -> Result<Option<Counter>, Error> {
    let algorithm = quota.algorithm();
    let wrong =
        || Error::WrongType(format!("the key holds neither a slidegate value nor the Lua scripts' {algorithm} state"));
    let reply = |command: &str, args: &[&[u8]]| -> Result<Vec<Vec<u8>>, Error> {
        match ctx.call(command, args) {
            Ok(RedisValue::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Ok(s.into_bytes()),
                    RedisValue::StringBuffer(b) => Ok(b),
                    RedisValue::BulkRedisString(s) => Ok(s.as_slice().to_vec()),
                    _ => Err(wrong()),
                })
                .collect(),
            _ => Err(wrong()),
        }
    };
    let number = |bytes: &[u8]| std::str::from_utf8(bytes).ok().and_then(|s| s.parse::<u64>().ok()).ok_or_else(wrong);
    let key_type = ctx.open_key(key).key_type();
    match (key_type, algorithm) {
        (raw::KeyType::Empty, _) => Ok(None),
        (raw::KeyType::ZSet, Algorithm::SlidingLog) => {
            // Members `<ms>:<id>` (one per permit) or `c<ms>:<n><seq>:<weight>:<cum>:<id or tail>` (one
            // per admission of `weight` permits: counted_log.lua) scored by their time; under warm-up, `0:<start>`
            // scored -inf.
            let items = reply("ZRANGE", &[key.as_slice(), b"0", b"-1", b"WITHSCORES"])?;
            let (mut log, mut warm_since) = (Vec::with_capacity(items.len() / 2), 0);
            for pair in items.chunks(2) {
                let [member, score] = pair else { return Err(wrong()) };
                if score.as_slice() == b"-inf" {
                    warm_since = number(member.strip_prefix(b"0:").ok_or_else(wrong)?)?;
                    continue;
                }
                let fields: Vec<&[u8]> = member.splitn(5, |&b| b == b':').collect();
                let weight = match fields.as_slice() {
                    [_, _, weight, _, _] => number(weight)?,
                    _ => 1,
                };
                // The newest MAX_LOG_LIMIT permits decide every limit; older ones (expired, as
                // live ones never outnumber the limit) are dropped as the log grows, so that
                // the weights, however large, bound the memory.
                log.extend(std::iter::repeat_n(number(score)?, weight.min(MOST_PERMITS as u64) as usize));
                if log.len() > 2 * MOST_PERMITS {
                    log.drain(..log.len() - MOST_PERMITS);
                }
            }
            log.drain(..log.len().saturating_sub(MOST_PERMITS));
            // Through the counter's documented encoding (`Counter::encode`), which refuses
            // times no decision could write: saved, they would not load back.
            let words: Vec<u64> = [0, warm_since, log.len() as u64].into_iter().chain(log).collect();
            Counter::decode(&words).map(Some).ok_or_else(wrong)
        }
        (raw::KeyType::String, Algorithm::SlidingWindow { buckets }) => {
            let opened = ctx.open_key(key);
            let value = opened.read().ok().flatten().ok_or_else(wrong)?;
            let bucket_ms = quota.window_ms() / u64::from(buckets);
            let (warm_since, buckets) = lua_window_counts(value, bucket_ms).ok_or_else(wrong)?;
            Counter::decode(&window_words(warm_since, buckets)).map(Some).ok_or_else(wrong)
        }
        (raw::KeyType::Hash, Algorithm::SlidingWindow { .. } | Algorithm::FixedWindow | Algorithm::Gcra { .. }) => {
            let items = reply("HGETALL", &[key.as_slice()])?;
            let mut fields = std::collections::BTreeMap::new();
            let mut buckets = std::collections::BTreeMap::new();
            for pair in items.chunks(2) {
                let [field, value] = pair else { return Err(wrong()) };
                match (algorithm, field.as_slice()) {
                    (_, b"s") | (Algorithm::FixedWindow, b"i" | b"n") | (Algorithm::Gcra { .. }, b"t") => {
                        fields.insert(field.clone(), number(value)?);
                    }
                    (Algorithm::SlidingWindow { .. }, index) => {
                        buckets.insert(number(index)?, number(value)?);
                    }
                    _ => return Err(wrong()),
                }
            }
            let field = |name: &[u8]| fields.get(name).copied();
            let warm_since = field(b"s").unwrap_or(0);
            // The counter's documented encoding (`Counter::encode`).
            let words: Vec<u64> = match algorithm {
                Algorithm::SlidingWindow { .. } => window_words(warm_since, buckets),
                Algorithm::FixedWindow => match (field(b"i"), field(b"n")) {
                    (Some(i), Some(n)) => vec![3, warm_since, 1, i, n],
                    _ => vec![3, warm_since, 0],
                },
                _ => vec![4, warm_since, field(b"t").unwrap_or(0)],
            };
            Counter::decode(&words).map(Some).ok_or_else(wrong)
        }
        _ => Err(wrong()),
    }
}

/// A sliding window counter in the counter's documented encoding (`Counter::encode`): its
/// warm-up start and its `(bucket index, count)` pairs, indexes increasing.
fn window_words(warm_since: u64, buckets: impl IntoIterator<Item = (u64, u64)>) -> Vec<u64> {
    let buckets: Vec<(u64, u64)> = buckets.into_iter().collect();
    [2, warm_since, buckets.len() as u64].into_iter().chain(buckets.into_iter().flat_map(|(i, c)| [i, c])).collect()
}

/// The sliding window scripts' string (`sliding_window.lua`): a byte 1, or 2 when a warm-up start
/// follows; the newest bucket's start in ms (7 bytes); [the warm-up start in ms (7 bytes)]; then
/// each bucket's count (4 bytes), newest first; little-endian. The warm-up start (0 without) and
/// the buckets of `bucket_ms` that hold permits, oldest first (a start that is no multiple of
/// `bucket_ms` was counted under another bucket length: as the scripts do, every count is taken
/// as the bucket's holding that start); `None` when the bytes are not such a value.
fn lua_window_counts(value: &[u8], bucket_ms: u64) -> Option<(u64, Vec<(u64, u64)>)> {
    let int = |bytes: &[u8]| bytes.iter().rev().fold(0u64, |n, &b| n << 8 | u64::from(b));
    let head = match value.first()? {
        1 => 8,
        2 => 15,
        _ => return None,
    };
    // At most MAX_BUCKETS + 1 counts: no writer keeps more.
    let counts = value.get(head..).filter(|c| c.len() % 4 == 0 && c.len() <= 4 * 101)?;
    let (start, warm_since) = (int(&value[1..8]), if head == 15 { int(&value[8..15]) } else { 0 });
    // A start past the scripts' latest time is no value they wrote.
    if start > slidegate::MAX_CLOCK_MS {
        return None;
    }
    if start % bucket_ms != 0 {
        let sum = counts.chunks(4).map(int).sum::<u64>().min(slidegate::MAX_LIMIT);
        return Some((warm_since, if sum > 0 { vec![(start / bucket_ms, sum)] } else { Vec::new() }));
    }
    let mut buckets = Vec::new();
    for (age, count) in counts.chunks(4).map(int).enumerate() {
        if count > 0 {
            buckets.push(((start / bucket_ms).checked_sub(age as u64)?, count));
        }
    }
    buckets.reverse();
    Some((warm_since, buckets))
}

// The callbacks below are how Redis hands the module its values: raw pointers to `Value`s that
// `RedisKeyWritable::set_value` boxed. Redis guarantees each pointer is one of ours, alive for
// the call, and (for `free`) never used again.

#[allow(unsafe_code)]
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver != ENCODING_VERSION {
        return std::ptr::null_mut();
    }
    // A null return makes Redis report the RDB file as corrupt instead of loading garbage.
    match raw::load_string_buffer(rdb).ok().and_then(|buffer| Value::from_bytes(buffer.as_ref()).ok()) {
        Some(value) => Box::into_raw(Box::new(value)).cast(),
        None => std::ptr::null_mut(),
    }
}

#[allow(unsafe_code)]
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes one of our values (see above).
    let value = unsafe { &*value.cast::<Value>() };
    raw::save_slice(rdb, &value.to_bytes());
}

#[allow(unsafe_code)]
unsafe extern "C" fn aof_rewrite(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, value: *mut c_void) {
    // SAFETY: Redis passes one of our values (see above).
    let value = unsafe { &*value.cast::<Value>() };
    let bytes = value.to_bytes();
    let (Ok(command), Ok(format)) = (CString::new("SLIDEGATE.RESTORE"), CString::new("sb")) else { return };
    // SAFETY: the format "sb" takes a RedisModuleString and a buffer with its length, as given;
    // the expiry is emitted by Redis after this.
    unsafe {
        if let Some(emit) = raw::RedisModule_EmitAOF {
            emit(aof, command.as_ptr(), format.as_ptr(), key, bytes.as_ptr(), bytes.len());
        }
    }
}

#[allow(unsafe_code)]
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes one of our values (see above).
    let value = unsafe { &*value.cast::<Value>() };
    size_of::<Value>() + value.counter.heap_bytes()
}

#[allow(unsafe_code)]
unsafe extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis passes one of our values, boxed by `set_value`, and never uses it again.
    drop(unsafe { Box::from_raw(value.cast::<Value>()) });
}

#[allow(unsafe_code)]
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes one of our values (see above).
    let value = unsafe { &*value.cast::<Value>() };
    Box::into_raw(Box::new(value.clone())).cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn values_round_trip_through_bytes() {
        let quota = Quota::new(10, Duration::from_secs(1))
            .and_then(|q| q.with_algorithm(Algorithm::Gcra { burst: Some(4) }))
            .and_then(|q| q.with_warm_up(Duration::from_secs(2), 0.5))
            .expect("valid");
        let mut counter = Counter::new(quota.algorithm());
        counter.record(5, &quota, 2);
        let value = Value { counter, quota };
        let back = Value::from_bytes(&value.to_bytes()).expect("round trip");
        assert_eq!(back.quota, quota);
        assert_eq!(back.counter.encode(), value.counter.encode());
        for bad in [&value.to_bytes()[..7], &value.to_bytes()[..40], &[0xff; 80][..]] {
            assert!(Value::from_bytes(bad).is_err());
        }
    }

    #[test]
    fn the_scripts_sliding_window_strings_read_as_buckets() {
        // Buckets of 10 ms: the newest, 1,000, starts at 10,000 ms (3 permits), 999 is empty,
        // 998 holds 7; then the same with a warm-up start.
        let plain = [&[1][..], &10_000u64.to_le_bytes()[..7], &[3, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0]].concat();
        assert_eq!(lua_window_counts(&plain, 10), Some((0, vec![(998, 7), (1_000, 3)])));
        let warm = [&[2][..], &10_000u64.to_le_bytes()[..7], &42u64.to_le_bytes()[..7], &[3, 0, 0, 0]].concat();
        assert_eq!(lua_window_counts(&warm, 10), Some((42, vec![(1_000, 3)])));
        // Under another bucket length (10,000 ms lies in bucket 3,333 of 3 ms): every count there.
        assert_eq!(lua_window_counts(&plain, 3), Some((0, vec![(3_333, 10)])));
        // A short head, a torn count, an unknown first byte, an index below 0.
        let below = [&[1][..], &[0; 7], &[0; 4], &[1, 0, 0, 0]].concat();
        for bad in [&plain[..5], &plain[..10], &[3; 12][..], &below[..]] {
            assert_eq!(lua_window_counts(bad, 10), None, "{bad:?}");
        }
    }

    fn words(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn hostile_payloads_are_refused_before_allocating() {
        // A valid quota (5 per second, sliding log) before each counter.
        let quota = [5, 1_000, 0, 0, 0, 0];
        for counter in [
            &[0, 0, 1 << 60][..],
            &[0, 0, u64::MAX, 1],
            &[2, 0, 1 << 63],
            &[0, 0, 1, u64::MAX],
            &[4, 0, u64::MAX],
            &[1, 0, 1, 5],
        ] {
            let payload = words(&[&quota[..], counter].concat());
            assert!(Value::from_bytes(&payload).is_err(), "{counter:?}");
        }
        for header in [[0, 1_000, 0, 0, 0, 0], [5, 0, 0, 0, 0, 0], [200_000, 1_000, 0, 0, 0, 0], [5, 1_000, 9, 0, 0, 0]]
        {
            assert!(Value::from_bytes(&words(&[&header[..], &[0, 0, 0]].concat())).is_err(), "{header:?}");
        }
        // Warm-up with a cold share of 2^64 - 1 permille.
        assert!(Value::from_bytes(&words(&[5, 1_000, 0, 0, 1_000, u64::MAX, 0, 0, 0])).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 2_000, failure_persistence: None, ..Default::default() })]
        /// A `SLIDEGATE.RESTORE` payload or an RDB string is anyone's bytes: random ones, and
        /// valid values with bytes flipped, inserted, deleted or cut, either load as a value or
        /// are refused, never panic, and take under a second. A value that loads answers
        /// `INSPECT` and checks at any time a caller may give, and saves to bytes that load again.
        #[test]
        fn any_payload_loads_or_is_refused(
            algorithm in 0u64..4,
            admissions in proptest::collection::vec(0u64..5_000, 0..300),
            edits in proptest::collection::vec((0u8..5, proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 0..8),
            random in proptest::option::weighted(0.3, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)),
            times in proptest::collection::vec(0..=slidegate::state::MAX_TIME_MS, 1..8),
        ) {
            let started = std::time::Instant::now();
            let algorithm = [
                Algorithm::SlidingLog,
                Algorithm::SlidingWindow { buckets: 10 },
                Algorithm::FixedWindow,
                Algorithm::Gcra { burst: Some(50) },
            ][algorithm as usize];
            let quota = Quota::new(100_000, Duration::from_secs(60)).and_then(|q| q.with_algorithm(algorithm)).expect("valid");
            let mut counter = Counter::new(algorithm);
            let mut now = 1_700_000_000_000;
            for gap in admissions {
                now += gap;
                if counter.evaluate(now, &quota, 1).allowed {
                    counter.record(now, &quota, 1);
                }
            }
            let mut bytes = random.unwrap_or_else(|| Value { counter, quota }.to_bytes());
            for (op, at, byte) in edits {
                let at = if bytes.is_empty() { 0 } else { at % bytes.len() };
                match op {
                    0 if !bytes.is_empty() => bytes[at] ^= 1 << (byte % 8),
                    1 => bytes.insert(at, byte),
                    2 if !bytes.is_empty() => { bytes.remove(at); }
                    3 => bytes.truncate(at),
                    _ => bytes.extend(std::iter::repeat_n(byte, 8)),
                }
            }
            if let Ok(mut value) = Value::from_bytes(&bytes) {
                for &at in &times {
                    let _ = value.counter.inspect(at, &value.quota);
                    let cost = value.quota.max_cost().min(slidegate::MAX_LOG_LIMIT);
                    let quota = value.quota;
                    if value.counter.evaluate(at, &quota, cost).allowed {
                        value.counter.record(at, &quota, cost);
                    }
                    let _ = value.counter.expires_at(&quota);
                }
                proptest::prop_assert!(Value::from_bytes(&value.to_bytes()).is_ok(), "a saved value loads");
            }
            proptest::prop_assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        }
    }
}
