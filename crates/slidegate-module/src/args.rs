//! The commands' arguments, parsed without touching Redis (so the parser is property-tested on
//! its own, and fuzzed through a live server in `tests/module.rs`).
//!
//! `SLIDEGATE.CHECK key algorithm limit window_ms cost [options] [AND key algorithm ...]`: each
//! check names its key first, so the command's first argument is always a key (Cluster clients
//! route by it), and `AND` starts the next check, whose first argument is again a key (so a key
//! may be spelled like a keyword). Options, in any order after a check's cost: `BUCKETS n`
//! (sliding window), `BURST n` (GCRA), `WARMUP period_ms cold_permille`; `NOW ms`, anywhere
//! among them, sets the time of the whole command. Keywords and algorithm names are
//! case-insensitive. Every quota is validated as the library validates it ([`Quota`]), every
//! cost against what an idle key could ever admit. Error messages quote arguments as escaped
//! ASCII: redis-module truncates every other character to a byte, which would make the reply
//! invalid UTF-8 for clients.

use std::time::Duration;

use smallvec::SmallVec;

use slidegate::state::MAX_TIME_MS;
use slidegate::{Algorithm, MAX_CHECKS, Quota, quota::DEFAULT_BUCKETS};

use crate::Error;

/// A command argument's bytes: Redis' strings in the module, plain strings in tests.
pub trait Arg {
    /// The argument as Redis received it.
    fn bytes(&self) -> &[u8];
}

impl Arg for str {
    fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Arg for String {
    fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Arg for [u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl<T: Arg + ?Sized> Arg for &T {
    fn bytes(&self) -> &[u8] {
        (**self).bytes()
    }
}

/// One check of a command: `cost` permits of `quota`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The limit, window and algorithm.
    pub quota: Quota,
    /// Permits asked for.
    pub cost: u64,
}

/// Checks a command holds without allocating (one key, or two joined by `AND`); more (up to
/// [`MAX_CHECKS`]) go to the heap. Kept small: the arrays are moved whole.
pub const INLINE_CHECKS: usize = 2;

/// A parsed `SLIDEGATE.CHECK`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checks {
    /// Where each check's key is among the arguments (the command's name is argument 0).
    pub keys: SmallVec<[usize; INLINE_CHECKS]>,
    /// One per key.
    pub specs: SmallVec<[Spec; INLINE_CHECKS]>,
    /// `NOW ms`, when given; otherwise the server's clock decides.
    pub now: Option<u64>,
}

/// Parses `SLIDEGATE.CHECK`'s arguments (`args[0]` is the command's name). Keys must be distinct.
pub fn parse_checks<A: Arg>(args: &[A]) -> Result<Checks, Error> {
    let mut p = Parser { args, at: 1, now: None, times: None, inspecting: false };
    let (mut keys, mut specs) = (SmallVec::new(), SmallVec::new());
    loop {
        let key = p.at;
        let name = p.next("key")?;
        if keys.iter().any(|&k: &usize| args[k].bytes() == name) {
            return Err(Error::Syntax("keys must be distinct".into()));
        }
        if keys.len() == MAX_CHECKS {
            return Err(Error::Syntax(format!("at most {MAX_CHECKS} checks per command")));
        }
        keys.push(key);
        specs.push(p.spec(true)?);
        match args.get(p.at) {
            Some(arg) if arg.bytes().eq_ignore_ascii_case(b"AND") => p.at += 1,
            _ => break,
        }
    }
    p.finish()?;
    Ok(Checks { keys, specs, now: p.now })
}

/// Where `SLIDEGATE.CHECK`'s keys are, for Redis' key-position requests: those of a well-formed
/// command, or the first argument alone (the command then fails with its error when run).
pub fn key_positions<A: Arg>(args: &[A]) -> Vec<usize> {
    parse_checks(args).map_or_else(|_| if args.len() > 1 { vec![1] } else { Vec::new() }, |c| c.keys.into_vec())
}

/// `SLIDEGATE.INSPECT`'s arguments after the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inspect {
    /// The quota to read the key under (its last check's when `None`).
    pub quota: Option<Quota>,
    /// `NOW ms`.
    pub now: Option<u64>,
    /// `TIMES n`: answer the times of a sliding log's newest `n` admissions in the window too.
    pub times: Option<u64>,
}

/// Parses `SLIDEGATE.INSPECT`'s optional quota (`algorithm limit window_ms [options]`, no cost),
/// `NOW` and `TIMES` (at most [`slidegate::MAX_TIMELINE`]), after the key.
pub fn parse_inspect<A: Arg>(args: &[A]) -> Result<Inspect, Error> {
    let mut p = Parser { args, at: 0, now: None, times: None, inspecting: true };
    p.options(None)?;
    let quota = if p.at < args.len() { Some(p.spec(false)?.quota) } else { None };
    p.finish()?;
    Ok(Inspect { quota, now: p.now, times: p.times })
}

struct Parser<'a, A> {
    args: &'a [A],
    at: usize,
    now: Option<u64>,
    times: Option<u64>,
    /// Whether `TIMES` is an option here (`INSPECT`'s).
    inspecting: bool,
}

/// What options set on one check.
#[derive(Default)]
struct Options {
    buckets: Option<u64>,
    burst: Option<u64>,
    warm_up: Option<(u64, u64)>,
}

impl<A: Arg> Parser<'_, A> {
    fn next(&mut self, what: &str) -> Result<&[u8], Error> {
        let arg = self.args.get(self.at).ok_or_else(|| Error::Syntax(format!("missing {what}")))?;
        self.at += 1;
        Ok(arg.bytes())
    }

    fn number(&mut self, what: &str) -> Result<u64, Error> {
        let arg = self.next(what)?;
        whole_number(arg)
            .ok_or_else(|| Error::Syntax(format!("{what} must be a whole number, got \"{}\"", arg.escape_ascii())))
    }

    /// `algorithm limit window_ms [cost]` and the options after it.
    fn spec(&mut self, with_cost: bool) -> Result<Spec, Error> {
        let arg = self.next("algorithm")?;
        let unknown = || {
            Error::Syntax(format!(
                "unknown algorithm \"{}\": sliding_log, sliding_window, fixed_window, gcra or token_bucket",
                arg.escape_ascii()
            ))
        };
        let algorithm = [
            (&b"sliding_log"[..], Algorithm::SlidingLog),
            (b"sliding_window", Algorithm::SlidingWindow { buckets: DEFAULT_BUCKETS }),
            (b"fixed_window", Algorithm::FixedWindow),
            (b"gcra", Algorithm::Gcra { burst: None }),
            (b"token_bucket", Algorithm::Gcra { burst: None }),
        ]
        .into_iter()
        .find_map(|(name, algorithm)| arg.eq_ignore_ascii_case(name).then_some(algorithm))
        .ok_or_else(unknown)?;
        let limit = self.number("limit")?;
        let window_ms = self.number("window_ms")?;
        let cost = if with_cost { self.number("cost")? } else { 1 };
        let mut options = Options::default();
        self.options(Some(&mut options))?;
        let algorithm = match algorithm {
            Algorithm::SlidingWindow { .. } => Algorithm::SlidingWindow {
                buckets: options.buckets.map_or(Ok(DEFAULT_BUCKETS), |b| {
                    u32::try_from(b).map_err(|_| Error::Syntax(format!("BUCKETS {b} is too many")))
                })?,
            },
            Algorithm::Gcra { .. } => Algorithm::Gcra { burst: options.burst },
            other => other,
        };
        if options.buckets.is_some() && !matches!(algorithm, Algorithm::SlidingWindow { .. }) {
            return Err(Error::Syntax("BUCKETS is for sliding_window only".into()));
        }
        if options.burst.is_some() && !matches!(algorithm, Algorithm::Gcra { .. }) {
            return Err(Error::Syntax("BURST is for gcra only".into()));
        }
        let mut quota = Quota::new(limit, window(window_ms)?)?.with_algorithm(algorithm)?;
        if let Some((period_ms, cold_permille)) = options.warm_up {
            // A permille is exact as a fraction of 1000 (`with_warm_up` rounds to the thousandth).
            quota = quota.with_warm_up(window(period_ms)?, cold_permille as f64 / 1000.0)?;
        }
        if with_cost {
            // Bounds the work: a sliding log's cost is at most its limit, itself at most
            // `slidegate::MAX_LOG_LIMIT`, and each permit is a byte or two of the log.
            quota.validate_cost(cost)?;
        }
        Ok(Spec { quota, cost })
    }

    /// Options until the next argument that is not one (the next check's algorithm, or the end).
    /// Without `options`, only `NOW` is accepted.
    fn options(&mut self, mut options: Option<&mut Options>) -> Result<(), Error> {
        while let Some(arg) = self.args.get(self.at) {
            let is = |keyword: &str| arg.bytes().eq_ignore_ascii_case(keyword.as_bytes());
            match options.as_deref_mut() {
                _ if is("NOW") => {
                    // Later times would overflow the decisions' arithmetic.
                    let now = self.option(self.now.is_some(), "NOW")?;
                    if now > MAX_TIME_MS {
                        return Err(Error::Syntax(format!("NOW must be at most {MAX_TIME_MS} ms, got {now}")));
                    }
                    self.now = Some(now);
                }
                _ if is("TIMES") && self.inspecting => {
                    let times = self.option(self.times.is_some(), "TIMES")?;
                    if times > slidegate::MAX_TIMELINE as u64 {
                        let max = slidegate::MAX_TIMELINE;
                        return Err(Error::Syntax(format!("TIMES must be at most {max}, got {times}")));
                    }
                    self.times = Some(times);
                }
                Some(o) if is("BUCKETS") => o.buckets = Some(self.option(o.buckets.is_some(), "BUCKETS")?),
                Some(o) if is("BURST") => o.burst = Some(self.option(o.burst.is_some(), "BURST")?),
                Some(o) if is("WARMUP") => {
                    let period = self.option(o.warm_up.is_some(), "WARMUP period_ms")?;
                    o.warm_up = Some((period, self.number("WARMUP cold_permille")?));
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// The number after the keyword at the cursor, refused if the option was `set` already.
    fn option(&mut self, set: bool, name: &str) -> Result<u64, Error> {
        if set {
            let keyword = name.split(' ').next().unwrap_or(name);
            return Err(Error::Syntax(format!("{keyword} given twice")));
        }
        self.at += 1;
        self.number(name)
    }

    fn finish(&self) -> Result<(), Error> {
        match self.args.get(self.at) {
            None => Ok(()),
            Some(extra) => Err(Error::Syntax(format!("unexpected argument \"{}\"", extra.bytes().escape_ascii()))),
        }
    }
}

/// ASCII digits (at least one, nothing else) as a `u64`, `None` past its range: read from the
/// bytes directly, without the UTF-8 check and sign handling `str::parse` would add.
fn whole_number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let digit = d.checked_sub(b'0').filter(|&d| d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

fn window(ms: u64) -> Result<Duration, Error> {
    // Out-of-range values are refused by the quota; this only keeps them representable.
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Checks, Error> {
        parse_checks(&format!("SLIDEGATE.CHECK {line}").split_whitespace().collect::<Vec<_>>())
    }

    #[test]
    fn every_algorithm_and_option_parses() {
        let c = parse("a sliding_log 5 10000 1 and b Sliding_Window 100 60000 2 buckets 6 now 42").expect("valid");
        assert_eq!((c.keys.as_slice(), c.now), (&[1, 7][..], Some(42)));
        assert_eq!(c.specs[0].quota, Quota::new(5, Duration::from_secs(10)).expect("valid"));
        assert_eq!(c.specs[1].quota.algorithm(), Algorithm::SlidingWindow { buckets: 6 });
        assert_eq!(c.specs[1].cost, 2);
        let c = parse("k GCRA 10 1000 1 BURST 5 WARMUP 2000 250").expect("valid");
        let q = c.specs[0].quota;
        assert_eq!((q.algorithm(), q.burst()), (Algorithm::Gcra { burst: Some(5) }, 5));
        assert_eq!(q.warm_up().map(|w| (w.period_ms(), w.cold_permille())), Some((2_000, 250)));
        let c = parse("k fixed_window 1 1 1 AND NOW token_bucket 1 1 1").expect("a key may be spelled NOW");
        assert_eq!((c.keys.as_slice(), c.now), (&[1, 7][..], None));
    }

    #[test]
    fn bad_arguments_are_named() {
        for (line, says) in [
            ("", "missing key"),
            ("k", "missing algorithm"),
            ("k sliding_log 5 10000", "missing cost"),
            ("k sliding_log 5 10000 0", "cost"),
            ("k sliding_log 5 10000 6", "cost"),
            ("k sliding_log 1000000 10000 100001", "limit must be between 1 and 100000"),
            ("k sliding_log 0 10000 1", "limit"),
            ("k sliding_log 5 0 1", "window"),
            ("k sliding_log 5 99999999999999 1", "window"),
            ("k sliding_log -5 10 1", "whole number"),
            ("k sliding_log +5 10 1", "whole number"),
            ("k sliding_log 18446744073709551616 10 1", "whole number"),
            ("k leaky 5 10 1", "unknown algorithm"),
            ("k sliding_log 5 10000 1 BURST 2", "BURST is for gcra"),
            ("k gcra 5 10000 1 BUCKETS 2", "BUCKETS is for sliding_window"),
            ("k sliding_window 5 10000 1 BUCKETS 3", "divide the window"),
            ("k sliding_log 5 10000 1 NOW 1 NOW 2", "NOW given twice"),
            ("k sliding_log 5 10000 1 NOW", "missing NOW"),
            ("k gcra 5 10000 1 NOW 18446744073709551615", "NOW must be at most 9007199254740992"),
            ("k fixed_window 5 10000 1 NOW 9007199254740993", "NOW must be at most"),
            ("k sliding_log 5 10000 1 extra", "unexpected argument"),
            ("k sliding_log 5 10000 1 AND", "missing key"),
            ("k sliding_log 5 10000 1 AND k sliding_log 5 10000 1", "distinct"),
        ] {
            let err = parse(line).expect_err(line).to_string();
            assert!(err.contains(says), "{line}: {err}");
            assert!(err.starts_with("ERR "), "{line}: {err}");
        }
        // A megabyte of non-UTF-8 bytes as an algorithm's name, quoted back as escaped ASCII.
        let huge = vec![0xffu8; 1 << 20];
        let err = parse_checks(&[&b"SLIDEGATE.CHECK"[..], b"k", &huge]).expect_err("not an algorithm").to_string();
        assert!(err.is_ascii() && err.contains("unknown algorithm"));
        let many: Vec<String> = (0..=MAX_CHECKS).map(|i| format!("k{i} fixed_window 1 1 1")).collect();
        assert!(parse(&many.join(" AND ")).expect_err("too many").to_string().contains("at most"));
    }

    #[test]
    fn key_positions_follow_the_checks() {
        let args = ["SLIDEGATE.CHECK", "a", "gcra", "1", "1000", "1", "AND", "b", "sliding_log", "1", "1", "1"];
        assert_eq!(key_positions(&args), [1, 7]);
        assert_eq!(key_positions(&["SLIDEGATE.CHECK", "a", "nonsense"]), [1]);
        assert!(key_positions(&["SLIDEGATE.CHECK"]).is_empty());
    }

    #[test]
    fn inspect_takes_an_optional_quota() {
        let none: [&str; 0] = [];
        let nothing = Inspect { quota: None, now: None, times: None };
        assert_eq!(parse_inspect(&none).expect("valid"), nothing);
        assert_eq!(parse_inspect(&["NOW", "5"]).expect("valid"), Inspect { now: Some(5), ..nothing });
        let i = parse_inspect(&["sliding_log", "5", "1000", "NOW", "7", "TIMES", "3"]).expect("valid");
        assert_eq!((i.quota.map(|q| q.limit()), i.now, i.times), (Some(5), Some(7), Some(3)));
        assert!(parse_inspect(&["sliding_log", "5"]).is_err());
        assert!(parse_inspect(&["TIMES", "10001"]).expect_err("over the bound").to_string().contains("at most"));
        assert!(parse_inspect(&["TIMES", "1", "TIMES", "2"]).is_err());
        assert!(parse("a sliding_log 5 1000 1 TIMES 3").is_err(), "TIMES is INSPECT's alone");
    }

    proptest::proptest! {
        /// The byte-level number parser accepts exactly what `u64::from_str` accepts without a
        /// sign: any text, digits near `u64::MAX` and past it.
        #[test]
        fn whole_numbers_read_as_the_standard_parser_reads_them(
            text in proptest::prop_oneof![
                proptest::string::string_regex("[+-]?[0-9]{0,21}").expect("regex"),
                proptest::string::string_regex(".{0,6}").expect("regex"),
                proptest::strategy::Strategy::prop_map(u64::MAX - 1_000..=u64::MAX, |n| n.to_string()),
                proptest::strategy::Strategy::prop_map(u64::MAX / 10 - 10..=u64::MAX / 10 + 10, |n| format!("{n}9")),
            ],
        ) {
            let expected = if text.starts_with('+') { None } else { text.parse::<u64>().ok() };
            proptest::prop_assert_eq!(whole_number(text.as_bytes()), expected);
        }

        /// Whatever the arguments, the parser answers (checks or an error), never panics, and
        /// every key it reports is an argument; what it accepts is in bounds (at most
        /// `MAX_CHECKS` checks, each cost valid for its quota, `NOW` at most `MAX_TIME_MS`).
        #[test]
        fn any_arguments_parse_or_fail_cleanly(
            args in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::string::string_regex("(?i)(sliding_log|sliding_window|fixed_window|gcra|token_bucket|now|buckets|burst|warmup|times|and)").expect("regex"),
                    proptest::string::string_regex("-?[0-9]{1,21}").expect("regex"),
                    proptest::strategy::Strategy::prop_map(
                        proptest::prop_oneof![proptest::strategy::Just(MAX_TIME_MS), proptest::strategy::Just(u64::MAX), 0u64..=100_000],
                        |n| n.to_string(),
                    ),
                    proptest::string::string_regex(".{0,8}").expect("regex"),
                ],
                0..24,
            ),
        ) {
            let started = std::time::Instant::now();
            let positions = key_positions(&args);
            proptest::prop_assert!(positions.iter().all(|&p| p >= 1 && p < args.len()));
            match parse_checks(&args) {
                Ok(c) => {
                    proptest::prop_assert!(c.keys.len() <= MAX_CHECKS && c.now.is_none_or(|n| n <= MAX_TIME_MS));
                    for spec in &c.specs {
                        proptest::prop_assert!(spec.quota.validate_cost(spec.cost).is_ok(), "{spec:?}");
                    }
                }
                Err(err) => proptest::prop_assert!(err.to_string().is_ascii(), "{err}"),
            }
            match parse_inspect(&args) {
                Ok(i) => proptest::prop_assert!(
                    i.now.is_none_or(|n| n <= MAX_TIME_MS) && i.times.is_none_or(|n| n <= slidegate::MAX_TIMELINE as u64)
                ),
                Err(err) => proptest::prop_assert!(err.to_string().is_ascii(), "{err}"),
            }
            proptest::prop_assert!(started.elapsed() < Duration::from_secs(1));
        }
    }
}
