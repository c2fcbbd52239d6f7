//! The wire format of the backend's commands, without I/O: the arguments of the Lua scripts
//! (after the KEYS/ARGV contract in each script's header) and of the module's
//! `SLIDEGATE.CHECK` and `SLIDEGATE.INSPECT`, and the reading of their replies into decisions
//! and key states. A reply of another shape is [`Error::UnexpectedReply`], never a guess.

use std::time::Duration;

use redis::{Cmd, Value};

use crate::{Algorithm, Check, Decision, Error, KeyState, KeyTimeline, MultiDecision, Quota};

/// Appends `sliding_log.lua`'s ARGV for `cost` permits of `quota`: `member`, the window,
/// `limit - cost`, the order (`expect_denial`: the reverse rank past the blocking entry's, to
/// look at it first),
/// `now` when the caller's clock decides, and cost and limit when the cost is above 1.
pub(super) fn sliding_log_args(
    cmd: &mut Cmd,
    member: &str,
    quota: &Quota,
    cost: u64,
    expect_denial: bool,
    now: Option<u64>,
) {
    let limit = quota.limit();
    // Precomputed here so that Redis formats no number: see the script's header.
    let room = limit - cost;
    cmd.arg(member).arg(quota.window_ms()).arg(room);
    if expect_denial {
        cmd.arg(room + 1);
    } else {
        cmd.arg("");
    }
    match now {
        Some(now) => {
            cmd.arg(now);
        }
        None if cost > 1 => {
            cmd.arg("");
        }
        None => {}
    }
    if cost > 1 {
        cmd.arg(cost).arg(limit);
    }
}

/// Whether `sliding_log.lua` answered that the key holds counted entries (`counted_log.lua`'s).
pub(super) fn is_counted(reply: &Value) -> bool {
    matches!(reply, Value::SimpleString(s) if s == "COUNTED")
}

/// Appends `counted_log.lua`'s ARGV: `member`, the window, the limit, `cost`, and `now` when the
/// caller's clock decides.
pub(super) fn counted_log_args(cmd: &mut Cmd, member: &str, quota: &Quota, cost: u64, now: Option<u64>) {
    cmd.arg(member).arg(quota.window_ms()).arg(quota.limit()).arg(cost).arg(now);
}

/// Reads `sliding_log.lua`'s (and `counted_log.lua`'s) answer: an admission packed into one integer >= 0; a denial
/// packed into one negative integer (its `next_permit_after` is its `retry_after`: one permit
/// waits for the oldest live admission; the script packs no other), or `[remaining, reset_after, retry_after,
/// next_permit_after]`.
pub(super) fn parse_sliding_log(reply: &Value, limit: u64, window: u64) -> Result<Decision, Error> {
    let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
    match *reply {
        Value::Int(packed) if packed >= 0 => {
            // remaining * (window + 1) + next_permit_after, with next_permit_after <= window.
            let (packed, base) = (packed.unsigned_abs(), window + 1);
            Ok(Decision::allowed(limit, packed / base, Duration::from_millis(window))
                .with_next_permit_after(Duration::from_millis(packed % base)))
        }
        Value::Int(packed) => {
            // -1 - (reset * (window + 1) + retry), with retry <= window.
            let (packed, base) = ((-1 - packed).unsigned_abs(), window + 1);
            let retry = Duration::from_millis(packed % base);
            Ok(Decision::denied(limit, 0, Duration::from_millis(packed / base), retry).with_next_permit_after(retry))
        }
        Value::Array(ref items) => match items.as_slice() {
            [Value::Int(remaining), Value::Int(reset), Value::Int(retry), Value::Int(next)] => {
                let remaining = u64::try_from(*remaining).map_err(|_| unexpected())?;
                Ok(Decision::denied(limit, remaining, ms(*reset), ms(*retry)).with_next_permit_after(ms(*next)))
            }
            _ => Err(unexpected()),
        },
        _ => Err(unexpected()),
    }
}

/// Appends `one_key.lua`'s ARGV: the algorithm's `code` (`f` or `g`), its three numbers, and
/// `now` when the caller's clock decides.
pub(super) fn one_key_args(cmd: &mut Cmd, code: &str, numbers: &[u64; 3], now: Option<u64>) {
    cmd.arg(code).arg(&numbers[..]).arg(now);
}

/// Appends `sliding_window.lua`'s ARGV for `cost` permits of `quota`, a sliding window counter
/// of `buckets`: the bucket's length in ms, the buckets, the limit, the cost, and `now` when the
/// caller's clock decides.
pub(super) fn sliding_window_args(cmd: &mut Cmd, quota: &Quota, buckets: u32, cost: u64, now: Option<u64>) {
    let n = u64::from(buckets);
    cmd.arg(quota.window_ms() / n).arg(n).arg(quota.limit()).arg(cost).arg(now);
}

/// The base `sliding_window.lua` packs its answer in: (buckets + 2) bucket lengths + 1 ms, above
/// any `reset_after` or `retry_after` it packs.
pub(super) fn sliding_window_base(quota: &Quota, buckets: u32) -> u64 {
    let n = u64::from(buckets);
    (n + 2) * (quota.window_ms() / n) + 1
}

/// A sliding window counter's value as `sliding_window.lua` writes it (docs/redis.md, "Sliding
/// window counter": a kind byte, the newest bucket's start, [a warm-up start,] 4-byte counts
/// newest first; little-endian) as the specification's counts, oldest first, buckets of `b` ms.
/// Empty for "" (no value); `None` for any other shape.
pub(super) fn window_counts(value: &[u8], b: u64) -> Option<Vec<(u64, u64)>> {
    let Some(&kind) = value.first() else { return Some(Vec::new()) };
    let head = match kind {
        1 => 8,
        2 => 15,
        _ => return None,
    };
    let start = seven_bytes(value.get(1..8)?);
    let counts = value.get(head..).filter(|c| c.len() % 4 == 0)?;
    let newest = start / b;
    let mut out: Vec<(u64, u64)> = counts
        .chunks_exact(4)
        .zip(0..)
        .filter_map(|(c, age)| {
            Some((newest.checked_sub(age)?, u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))))
        })
        .filter(|&(_, count)| count > 0)
        .collect();
    out.reverse();
    Some(out)
}

/// The warm-up start a sliding window counter's value carries (a kind byte 2), or 0: none.
pub(super) fn window_since(value: &[u8]) -> u64 {
    match value {
        [2, _, _, _, _, _, _, _, since @ ..] => since.get(..7).map_or(0, seven_bytes),
        _ => 0,
    }
}

/// A 7-byte little-endian integer, as the sliding window's values hold times.
fn seven_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0u64, |acc, &byte| acc << 8 | u64::from(byte))
}

/// Reads `sliding_window.lua`'s answer: one integer in `base` (`(remaining * base + reset) *
/// base + next` when admitted, `-1 - (((remaining * base + reset) * base + retry) * base +
/// next)` when denied), or, when that would not fit, the table `[remaining, reset, next]` or
/// `[remaining, reset, retry, next]`.
pub(super) fn parse_sliding_window(reply: &Value, limit: u64, base: u64) -> Result<Decision, Error> {
    let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
    let ms = Duration::from_millis;
    match *reply {
        Value::Int(packed) if packed >= 0 => {
            let packed = packed.unsigned_abs();
            let (state, next) = (packed / base, packed % base);
            Ok(Decision::allowed(limit, state / base, ms(state % base)).with_next_permit_after(ms(next)))
        }
        Value::Int(packed) => {
            let packed = (-1 - packed).unsigned_abs();
            let (rest, next) = (packed / base, packed % base);
            let (state, retry) = (rest / base, rest % base);
            let (remaining, reset) = (state / base, state % base);
            Ok(Decision::denied(limit, remaining, ms(reset), ms(retry)).with_next_permit_after(ms(next)))
        }
        Value::Array(ref items) => {
            let n = |item: &Value| match *item {
                Value::Int(n) => u64::try_from(n).map_err(|_| unexpected()),
                _ => Err(unexpected()),
            };
            match items.as_slice() {
                [remaining, reset, next] => {
                    Ok(Decision::allowed(limit, n(remaining)?, ms(n(reset)?)).with_next_permit_after(ms(n(next)?)))
                }
                [remaining, reset, retry, next] => {
                    Ok(Decision::denied(limit, n(remaining)?, ms(n(reset)?), ms(n(retry)?))
                        .with_next_permit_after(ms(n(next)?)))
                }
                _ => Err(unexpected()),
            }
        }
        _ => Err(unexpected()),
    }
}

/// Reads `one_key.lua`'s answer: `[remaining, reset_after]` when admitted, `[remaining,
/// reset_after, retry_after]` when denied. A fixed window's `next_permit_after` is its
/// `reset_after`, the window's end (what the constructors set); a GCRA's (`gcra_te`, its
/// emission interval in µs) follows from `remaining` and `reset_after`.
pub(super) fn parse_one_key(reply: &[i64], limit: u64, gcra_te: Option<u64>) -> Result<Decision, Error> {
    let number = |v: i64| u64::try_from(v).map_err(|_| unexpected(reply));
    let decision = match *reply {
        [remaining, reset] => Decision::allowed(limit, number(remaining)?, ms(reset)),
        [remaining, reset, retry] => Decision::denied(limit, number(remaining)?, ms(reset), ms(retry)),
        _ => return Err(unexpected(reply)),
    };
    Ok(match gcra_te {
        Some(te) => {
            let reset = u64::try_from(decision.reset_after.as_millis()).unwrap_or(u64::MAX);
            let next = crate::spec::gcra_next_permit(limit, decision.remaining, reset, te);
            decision.with_next_permit_after(Duration::from_millis(next))
        }
        None => decision,
    })
}

/// Appends `check.lua`'s ARGV: `member`, `now` (or `""` for Redis' clock), whether to record
/// (`record == false` only looks), then seven numbers per check.
pub(super) fn check_args(cmd: &mut Cmd, member: &str, now: Option<u64>, record: bool, checks: &[Check<'_>]) {
    cmd.arg(member);
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(if record { "1" } else { "0" });
    for c in checks {
        let q = &c.quota;
        let (code, param) = match q.algorithm() {
            Algorithm::SlidingLog => ("l", 0),
            Algorithm::SlidingWindow { buckets } => ("w", u64::from(buckets)),
            Algorithm::FixedWindow => ("f", 0),
            Algorithm::Gcra { .. } => ("g", q.burst()),
        };
        let (period, cold) = q.warm_up().map_or((0, 0), |w| (w.period_ms(), w.cold_permille()));
        cmd.arg(code).arg(q.limit()).arg(q.window_ms()).arg(c.cost).arg(param).arg(period).arg(cold);
    }
}

/// Reads `check.lua`'s (and `SLIDEGATE.CHECK`'s) answer for `count` checks: `admitted`, then per
/// check `fits, remaining, reset_after, retry_after, limit, next_permit_after`.
pub(super) fn parse_group(reply: &[i64], count: usize) -> Result<MultiDecision, Error> {
    let (Some(&admitted), Some(per_key)) = (reply.first(), reply.get(1..)) else {
        return Err(unexpected(reply));
    };
    if per_key.len() != GROUP_FIELDS * count {
        return Err(unexpected(reply));
    }
    let decisions = per_key
        .chunks_exact(GROUP_FIELDS)
        .map(|r| {
            let number = |v: i64| u64::try_from(v).map_err(|_| unexpected(reply));
            let (remaining, limit) = (number(r[1])?, number(r[4])?);
            let decision = match (admitted, r[0]) {
                (1, _) => Decision::allowed(limit, remaining, ms(r[2])),
                (0, 0) => Decision::denied(limit, remaining, ms(r[2]), ms(r[3])),
                (0, 1) => Decision::held(limit, remaining, ms(r[2])),
                _ => return Err(unexpected(reply)),
            };
            Ok(decision.with_next_permit_after(ms(r[5])))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(MultiDecision::new(decisions))
}

/// Appends `inspect.lua`'s ARGV: the window, `now` when the caller's clock decides (`""` for
/// Redis' own when a count follows), and how many admission times to answer, if any.
pub(super) fn inspect_args(cmd: &mut Cmd, window: u64, now: Option<u64>, times: usize) {
    cmd.arg(window);
    match (now, times) {
        (now, 0) => {
            cmd.arg(now);
        }
        (now, times) => {
            cmd.arg(now.map_or_else(String::new, |n| n.to_string())).arg(times);
        }
    }
}

/// Reads `inspect.lua`'s answer: `[count, oldest or -1, reset_after]`.
pub(super) fn parse_inspect(reply: &[i64]) -> Result<KeyState, Error> {
    let &[count, oldest, reset_after] = reply else {
        return Err(unexpected(reply));
    };
    Ok(KeyState {
        count: u64::try_from(count).map_err(|_| unexpected(reply))?,
        oldest_ms: u64::try_from(oldest).ok(),
        reset_after: ms(reset_after),
    })
}

/// Reads `inspect.lua`'s answer with admission times: `[count, oldest or -1, reset_after,
/// newest time, …, oldest time]`.
pub(super) fn parse_timeline(reply: &[i64]) -> Result<KeyTimeline, Error> {
    let (head, times) = reply.split_at(reply.len().min(3));
    let state = parse_inspect(head)?;
    let admissions_ms = times.iter().rev().map(|&t| u64::try_from(t).map_err(|_| unexpected(reply)));
    Ok(KeyTimeline { state, admissions_ms: admissions_ms.collect::<Result<_, _>>()? })
}

/// `SLIDEGATE.CHECK` of each Redis key with its check, joined by `AND`, then `NOW` when the
/// caller's clock decides.
pub(super) fn module_check<'a>(keyed: impl IntoIterator<Item = (String, &'a Check<'a>)>, now: Option<u64>) -> Cmd {
    let mut cmd = redis::cmd("SLIDEGATE.CHECK");
    for (i, (key, c)) in keyed.into_iter().enumerate() {
        if i > 0 {
            cmd.arg("AND");
        }
        cmd.arg(key);
        module_quota(&mut cmd, &c.quota, Some(c.cost));
    }
    if let Some(now) = now {
        cmd.arg("NOW").arg(now);
    }
    cmd
}

/// `SLIDEGATE.CHARGE` (`charge`) or `SLIDEGATE.REFUND` of `cost` permits of `quota` on the
/// Redis key `key`, then `NOW` when the caller's clock decides.
pub(super) fn module_charge(charge: bool, key: String, quota: &Quota, cost: u64, now: Option<u64>) -> Cmd {
    let mut cmd = redis::cmd(if charge { "SLIDEGATE.CHARGE" } else { "SLIDEGATE.REFUND" });
    cmd.arg(key);
    module_quota(&mut cmd, quota, Some(cost));
    if let Some(now) = now {
        cmd.arg("NOW").arg(now);
    }
    cmd
}

/// Reads `SLIDEGATE.CHARGE`'s or `SLIDEGATE.REFUND`'s answer: the key's standing (`within,
/// remaining, reset_after_ms, retry_after_ms, limit, next_permit_after_ms`), then the permits
/// recorded or given back.
pub(super) fn parse_module_charge(reply: &[i64]) -> Result<(Decision, u64), Error> {
    let number = |v: i64| u64::try_from(v).map_err(|_| unexpected(reply));
    let &[within, remaining, reset, retry, limit, next, permits] = reply else { return Err(unexpected(reply)) };
    let (limit, remaining, reset, next) = (number(limit)?, number(remaining)?, ms(reset), ms(next));
    let decision = match within {
        1 => Decision::allowed(limit, remaining, reset),
        0 => Decision::denied(limit, remaining, reset, ms(retry)),
        _ => return Err(unexpected(reply)),
    };
    Ok((decision.with_next_permit_after(next), number(permits)?))
}

/// `SLIDEGATE.INSPECT` of the Redis key `key` under `quota`, then `NOW` when the caller's clock
/// decides, then `TIMES` when admission times are asked for.
pub(super) fn module_inspect(key: String, quota: &Quota, now: Option<u64>, times: Option<usize>) -> Cmd {
    let mut cmd = redis::cmd("SLIDEGATE.INSPECT");
    cmd.arg(key);
    module_quota(&mut cmd, quota, None);
    if let Some(now) = now {
        cmd.arg("NOW").arg(now);
    }
    if let Some(times) = times {
        cmd.arg("TIMES").arg(times);
    }
    cmd
}

/// Appends `algorithm limit window_ms [cost]` and the options of `quota`, as the module reads
/// them.
fn module_quota(cmd: &mut Cmd, quota: &Quota, cost: Option<u64>) {
    cmd.arg(quota.algorithm().as_str()).arg(quota.limit()).arg(quota.window_ms()).arg(cost);
    match quota.algorithm() {
        Algorithm::SlidingWindow { buckets } => {
            cmd.arg("BUCKETS").arg(buckets);
        }
        Algorithm::Gcra { .. } => {
            cmd.arg("BURST").arg(quota.burst());
        }
        _ => {}
    }
    if let Some(w) = quota.warm_up() {
        cmd.arg("WARMUP").arg(w.period_ms()).arg(w.cold_permille());
    }
}

/// Reads `SLIDEGATE.INSPECT … TIMES n`'s answer: the state, the quota (three values), then the
/// admission times, oldest first.
pub(super) fn parse_module_timeline(reply: &[Value]) -> Result<KeyTimeline, Error> {
    let bad = || Error::UnexpectedReply(format!("{reply:?}"));
    let admissions_ms = match reply.get(6) {
        Some(Value::Array(times)) => times
            .iter()
            .map(|t| match t {
                Value::Int(t) => u64::try_from(*t).map_err(|_| bad()),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    Ok(KeyTimeline { state: parse_module_inspect(reply)?, admissions_ms })
}

/// Reads `SLIDEGATE.INSPECT`'s answer: `[count, oldest or -1, reset_after]`.
pub(super) fn parse_module_inspect(reply: &[Value]) -> Result<KeyState, Error> {
    let bad = || Error::UnexpectedReply(format!("{reply:?}"));
    let number = |i: usize| match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        _ => Err(bad()),
    };
    Ok(KeyState {
        count: u64::try_from(number(0)?).map_err(|_| bad())?,
        oldest_ms: u64::try_from(number(1)?).ok(),
        reset_after: ms(number(2)?),
    })
}

/// The numbers per check in a group's answer.
const GROUP_FIELDS: usize = 6;

/// A reply's milliseconds; a negative one (none) is zero.
fn ms(value: i64) -> Duration {
    Duration::from_millis(u64::try_from(value).unwrap_or(0))
}

/// The error of a reply of another shape than the command's.
pub(super) fn unexpected(reply: &[i64]) -> Error {
    Error::UnexpectedReply(format!("{reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                other => panic!("not a plain argument: {other:?}"),
            })
            .collect()
    }

    fn quota(limit: u64, window_ms: u64) -> Quota {
        Quota::new(limit, Duration::from_millis(window_ms)).expect("a valid quota")
    }

    #[test]
    fn sliding_log_args_follow_the_scripts_argv() {
        let q = quota(10, 1000);
        let mut cmd = redis::cmd("EVALSHA");
        sliding_log_args(&mut cmd, "m1", &q, 1, false, None);
        assert_eq!(words(&cmd)[1..], ["m1", "1000", "9", ""], "cost 1 on Redis' clock: no now, no cost");
        let mut cmd = redis::cmd("EVALSHA");
        sliding_log_args(&mut cmd, "m1", &q, 1, true, Some(5));
        assert_eq!(
            words(&cmd)[1..],
            ["m1", "1000", "9", "10", "5"],
            "the blocking entry and the one before it: the 10th and 11th newest"
        );
        let mut cmd = redis::cmd("EVALSHA");
        sliding_log_args(&mut cmd, "m1", &q, 3, false, None);
        assert_eq!(words(&cmd)[1..], ["m1", "1000", "7", "", "", "3", "10"], "a cost above 1 keeps now's place");
    }

    #[test]
    fn sliding_log_replies_unpack_to_decisions() {
        // remaining * (window + 1) + next_permit_after
        let admitted = parse_sliding_log(&Value::Int(4 * 1001 + 250), 10, 1000).expect("a decision");
        let ms = Duration::from_millis;
        assert_eq!(admitted, Decision::allowed(10, 4, ms(1000)).with_next_permit_after(ms(250)));
        let full = parse_sliding_log(&Value::Int(1000), 10, 1000).expect("a decision");
        assert_eq!((full.remaining, full.next_permit_after), (0, ms(1000)), "the only entry is the new one");
        // -1 - (reset * (window + 1) + retry)
        let packed = Value::Int(-1 - (700 * 1001 + 300));
        let denied = parse_sliding_log(&packed, 10, 1000).expect("a decision");
        assert_eq!(denied, Decision::denied(10, 0, ms(700), ms(300)).with_next_permit_after(ms(300)));
        let long = Value::Array(vec![Value::Int(2), Value::Int(500), Value::Int(100), Value::Int(40)]);
        let denied = parse_sliding_log(&long, 10, 1000).expect("a decision");
        assert_eq!(denied, Decision::denied(10, 2, ms(500), ms(100)).with_next_permit_after(ms(40)));
        for bad in [
            Value::Array(vec![Value::Int(-2), Value::Int(500), Value::Int(100), Value::Int(40)]),
            Value::Array(vec![Value::Int(2), Value::Int(500), Value::Int(100)]),
            Value::Array(vec![Value::Int(2), Value::Int(500)]),
            Value::SimpleString("OK".to_owned()),
        ] {
            assert!(matches!(parse_sliding_log(&bad, 10, 1000), Err(Error::UnexpectedReply(_))), "{bad:?}");
        }
    }

    #[test]
    fn sliding_window_args_give_the_bucket_length_not_the_window() {
        let q = quota(100, 60_000).with_algorithm(Algorithm::SlidingWindow { buckets: 6 }).expect("a valid quota");
        let mut cmd = redis::cmd("EVALSHA");
        sliding_window_args(&mut cmd, &q, 6, 3, None);
        assert_eq!(words(&cmd)[1..], ["10000", "6", "100", "3"], "Redis' clock: no now");
        let mut cmd = redis::cmd("EVALSHA");
        sliding_window_args(&mut cmd, &q, 6, 1, Some(42));
        assert_eq!(words(&cmd)[1..], ["10000", "6", "100", "1", "42"]);
    }

    #[test]
    fn sliding_window_replies_unpack_to_decisions() {
        let q = quota(100, 60_000).with_algorithm(Algorithm::SlidingWindow { buckets: 6 }).expect("a valid quota");
        let base = sliding_window_base(&q, 6);
        assert_eq!(base, 80_001, "eight buckets of 10 s, and one");
        let ms = Duration::from_millis;
        let admitted = Value::Int((7 * 80_001 + 65_000) * 80_001 + 4_000);
        let admitted = parse_sliding_window(&admitted, 100, base).expect("a decision");
        assert_eq!(admitted, Decision::allowed(100, 7, ms(65_000)).with_next_permit_after(ms(4_000)));
        let denied = Value::Int(-1 - (((2 * 80_001 + 61_000) * 80_001 + 9_500) * 80_001 + 3_000));
        let denied = parse_sliding_window(&denied, 100, base).expect("a decision");
        assert_eq!(denied, Decision::denied(100, 2, ms(61_000), ms(9_500)).with_next_permit_after(ms(3_000)));
        let long = Value::Array(vec![Value::Int(0), Value::Int(61_000), Value::Int(9_500), Value::Int(3_000)]);
        assert_eq!(
            parse_sliding_window(&long, 100, base).expect("a decision"),
            Decision::denied(100, 0, ms(61_000), ms(9_500)).with_next_permit_after(ms(3_000))
        );
        let long = Value::Array(vec![Value::Int(5), Value::Int(61_000), Value::Int(1)]);
        let admitted = parse_sliding_window(&long, 100, base).expect("a decision");
        assert_eq!(admitted, Decision::allowed(100, 5, ms(61_000)).with_next_permit_after(ms(1)));
        for bad in [
            Value::Array(vec![Value::Int(-2), Value::Int(500)]),
            Value::Array(vec![Value::Int(2), Value::Nil]),
            Value::SimpleString("OK".to_owned()),
        ] {
            assert!(matches!(parse_sliding_window(&bad, 100, base), Err(Error::UnexpectedReply(_))), "{bad:?}");
        }
    }

    #[test]
    fn one_key_replies_are_an_admission_or_a_denial() {
        let ms = Duration::from_millis;
        assert_eq!(parse_one_key(&[3, 200], 5, None).expect("admitted"), Decision::allowed(5, 3, ms(200)));
        let denied = parse_one_key(&[0, 200, 40], 5, None).expect("denied");
        assert_eq!(denied, Decision::denied(5, 0, ms(200), ms(40)));
        // A GCRA of 5 permits of 100 ms: 3 left, the bucket empty after 200 ms; one more is free
        // once it has drained to 1 permit, 100 ms before it is empty.
        let gcra = parse_one_key(&[3, 200], 5, Some(100_000)).expect("admitted");
        assert_eq!(gcra.next_permit_after, ms(100));
        for bad in [&[][..], &[3], &[-1, 200], &[0, 200, 40, 1]] {
            assert!(matches!(parse_one_key(bad, 5, None), Err(Error::UnexpectedReply(_))), "{bad:?}");
        }
    }

    #[test]
    fn check_args_carry_seven_numbers_per_check() {
        let gcra = quota(10, 1000).with_algorithm(Algorithm::Gcra { burst: Some(4) }).expect("a valid quota");
        let window = quota(6, 60_000).with_algorithm(Algorithm::SlidingWindow { buckets: 3 }).expect("a valid quota");
        let checks = [Check { key: "a", quota: gcra, cost: 2 }, Check { key: "b", quota: window, cost: 1 }];
        let mut cmd = redis::cmd("EVALSHA");
        check_args(&mut cmd, "m7", None, false, &checks);
        let expected = ["m7", "", "0", "g", "10", "1000", "2", "4", "0", "0", "w", "6", "60000", "1", "3", "0", "0"];
        assert_eq!(words(&cmd)[1..], expected);
    }

    #[test]
    fn group_replies_read_as_admitted_denied_or_held() {
        let ms = Duration::from_millis;
        let admitted = parse_group(&[1, 1, 4, 900, -1, 5, 600], 1).expect("a group");
        assert_eq!(admitted.decisions, [Decision::allowed(5, 4, ms(900)).with_next_permit_after(ms(600))]);
        let denied = parse_group(&[0, 1, 4, 900, -1, 5, 600, 0, 0, 300, 120, 2, 120], 2).expect("a group");
        assert_eq!(
            denied.decisions,
            [
                Decision::held(5, 4, ms(900)).with_next_permit_after(ms(600)),
                Decision::denied(2, 0, ms(300), ms(120)).with_next_permit_after(ms(120)),
            ]
        );
        assert_eq!(denied.denied_by, Some(1));
        let bad_ones =
            [(&[][..], 0), (&[1, 1, 4, 900, -1, 5][..], 1), (&[2, 1, 4, 900, -1, 5, 600][..], 1), (&[1][..], 1)];
        for (bad, count) in bad_ones {
            assert!(matches!(parse_group(bad, count), Err(Error::UnexpectedReply(_))), "{bad:?}");
        }
    }

    #[test]
    fn module_commands_name_each_key_and_its_quota() {
        let gcra = quota(10, 1000).with_algorithm(Algorithm::Gcra { burst: Some(4) }).expect("a valid quota");
        let log = quota(3, 500).with_warm_up(Duration::from_secs(60), 0.5).expect("a valid quota");
        let checks = [Check { key: "a", quota: gcra, cost: 2 }, Check { key: "b", quota: log, cost: 1 }];
        let keyed = checks.iter().map(|c| (format!("p:{}", c.key), c));
        let words_sent = words(&module_check(keyed, Some(42)));
        let expected = "SLIDEGATE.CHECK p:a gcra 10 1000 2 BURST 4 AND p:b sliding_log 3 500 1 WARMUP 60000 500 NOW 42";
        assert_eq!(words_sent.join(" "), expected);
        assert_eq!(
            words(&module_inspect("p:a".to_owned(), &gcra, None, None)).join(" "),
            "SLIDEGATE.INSPECT p:a gcra 10 1000 BURST 4"
        );
    }

    #[test]
    fn timeline_replies_read_oldest_first() {
        let t = parse_timeline(&[3, 100, 900, 300, 200, 100]).expect("a timeline");
        assert_eq!((t.state.count, t.admissions_ms), (3, vec![100, 200, 300]));
        assert_eq!(parse_timeline(&[0, -1, 0]).expect("empty"), KeyTimeline::default());
        assert!(parse_timeline(&[1, 100, 900, -5]).is_err());
        let module = [2, -1, 800].map(Value::Int).into_iter().chain([Value::Nil, Value::Nil, Value::Nil]);
        let with = |times: Value| module.clone().chain([times]).collect::<Vec<_>>();
        let t = parse_module_timeline(&with(Value::Array(vec![Value::Int(7), Value::Int(9)]))).expect("a timeline");
        assert_eq!(t.admissions_ms, [7, 9]);
        assert!(parse_module_timeline(&with(Value::Int(1))).is_err());
        let mut args = redis::cmd("EVALSHA");
        inspect_args(&mut args, 1_000, None, 5);
        assert_eq!(words(&args), ["EVALSHA", "1000", "", "5"]);
        let mut args = redis::cmd("EVALSHA");
        inspect_args(&mut args, 1_000, Some(42), 0);
        assert_eq!(words(&args), ["EVALSHA", "1000", "42"]);
    }

    #[test]
    fn inspect_replies_read_as_key_states() {
        let state = parse_inspect(&[2, 1_700_000_000_000, 800]).expect("a state");
        assert_eq!(
            (state.count, state.oldest_ms, state.reset_after),
            (2, Some(1_700_000_000_000), Duration::from_millis(800))
        );
        assert_eq!(parse_inspect(&[0, -1, 0]).expect("a state"), KeyState::default());
        assert!(matches!(parse_inspect(&[0, -1]), Err(Error::UnexpectedReply(_))));
        let module = parse_module_inspect(&[Value::Int(2), Value::Int(-1), Value::Int(800)]).expect("a state");
        assert_eq!((module.count, module.oldest_ms, module.reset_after), (2, None, Duration::from_millis(800)));
        let bad = [Value::Int(2), Value::Nil, Value::Int(800)];
        assert!(matches!(parse_module_inspect(&bad), Err(Error::UnexpectedReply(_))));
    }
}
