//! The Lua scripts: their registry (body and SHA1 of each `.lua` file beside this one), loading
//! them, running one by `EVALSHA` with the `EVAL` fallback on `NOSCRIPT`, and one method per
//! deciding script that sends its arguments and reads its reply through `wire.rs`
//! (`inspect.lua` is run by `Backend::inspect` itself: see `mod.rs`).

use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, ServerErrorKind};

use super::outlook::remember_outcome;
use super::{RedisBackend, Stamp, wire};
use crate::{Algorithm, Check, Decision, Error, MAX_CHARGE_FACTOR, MultiDecision, Quota, spec};

/// The largest limit whose sliding log `sliding_log.lua` keeps as one member per permit (cheapest
/// for small limits; a call writes at most this many members). A larger limit is kept as
/// counted entries (`counted_log.lua`: one member per admission, whatever its cost), as is a
/// key that holds them when its limit is lowered. `check.lua` draws the same line.
pub(super) const MAX_PER_PERMIT_LIMIT: u64 = 256;

pub(super) struct LuaScript {
    body: &'static str,
    sha: String,
}

impl LuaScript {
    fn new(body: &'static str) -> Self {
        Self { body, sha: redis::Script::new(body).get_hash().to_owned() }
    }
}

pub(super) struct Scripts {
    sliding_log: LuaScript,
    counted_log: LuaScript,
    one_key: LuaScript,
    sliding_window: LuaScript,
    check: LuaScript,
    charge: LuaScript,
    charge_log: LuaScript,
    pub(super) inspect: LuaScript,
    pub(super) writable: LuaScript,
}

/// The scripts, hashed once per process.
pub(super) fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        sliding_log: LuaScript::new(include_str!("sliding_log.lua")),
        counted_log: LuaScript::new(include_str!("counted_log.lua")),
        one_key: LuaScript::new(include_str!("one_key.lua")),
        sliding_window: LuaScript::new(include_str!("sliding_window.lua")),
        check: LuaScript::new(include_str!("check.lua")),
        charge: LuaScript::new(concat!(include_str!("warm_up.lua"), include_str!("charge.lua"))),
        charge_log: LuaScript::new(concat!(include_str!("warm_up.lua"), include_str!("charge_log.lua"))),
        inspect: LuaScript::new(include_str!("inspect.lua")),
        writable: LuaScript::new(include_str!("writable.lua")),
    })
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Loads the scripts into Redis' cache (`SCRIPT LOAD`). Optional: a missing script is
    /// loaded on first use anyway.
    pub async fn load_scripts(&self) -> Result<(), Error> {
        let s = scripts();
        for script in [
            &s.sliding_log,
            &s.counted_log,
            &s.one_key,
            &s.sliding_window,
            &s.check,
            &s.charge,
            &s.charge_log,
            &s.inspect,
        ] {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(script.body);
            let _: String = self.query(&cmd).await?;
        }
        Ok(())
    }

    /// Runs `script` by EVALSHA, falling back to EVAL on NOSCRIPT, all within one deadline.
    /// `args` appends the script's ARGV after its KEYS.
    pub(super) async fn run_script<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[(&str, Algorithm)],
        args: impl Fn(&mut Cmd) + Send + Sync,
    ) -> Result<T, Error> {
        let build = |verb: &str, script_ref: &str| {
            let mut cmd = redis::cmd(verb);
            cmd.arg(script_ref).arg(keys.len());
            for &(key, algorithm) in keys {
                cmd.arg(self.redis_key(key, algorithm));
            }
            args(&mut cmd);
            cmd
        };
        let evalsha = build("EVALSHA", &script.sha);
        let mut conn = self.conn.clone();
        self.deadline(async move {
            match evalsha.query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    Ok(build("EVAL", script.body).query_async(&mut conn).await?)
                }
                other => Ok(other?),
            }
        })
        .await
    }

    /// One decision of a one-key sliding log: by `sliding_log.lua`, in the order the key's outlook
    /// suggests, for a limit of at most [`MAX_PER_PERMIT_LIMIT`]; by `counted_log.lua` for a
    /// larger one, or when the first finds the key holds counted entries.
    pub(super) async fn sliding_log(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        let (member, now) = (self.members.next(), self.now_arg()?);
        let slot = self.outlook.slot(key);
        let mut reply = redis::Value::Nil;
        if quota.limit() <= MAX_PER_PERMIT_LIMIT {
            let expect_denial = self.config.fixed_order.unwrap_or_else(|| slot.load(Ordering::Relaxed));
            reply = self
                .run_script(&scripts().sliding_log, &[(key, Algorithm::SlidingLog)], |cmd| {
                    wire::sliding_log_args(cmd, &member, quota, cost, expect_denial, now);
                })
                .await?;
        }
        if quota.limit() > MAX_PER_PERMIT_LIMIT || wire::is_counted(&reply) {
            reply = self
                .run_script(&scripts().counted_log, &[(key, Algorithm::SlidingLog)], |cmd| {
                    wire::counted_log_args(cmd, &member, quota, cost, now);
                })
                .await?;
        }
        let decision = wire::parse_sliding_log(&reply, quota.limit(), quota.window_ms())?;
        remember_outcome(slot, !decision.allowed);
        Ok(decision)
    }

    /// One run of `one_key.lua` for a fixed window or a GCRA without warm-up: `code` names the
    /// algorithm, `args` are its numbers, and the caller's clock, if any, comes last.
    pub(super) async fn one_key(
        &self,
        key: &str,
        algorithm: Algorithm,
        code: &str,
        args: [u64; 3],
        limit: u64,
    ) -> Result<Decision, Error> {
        let now = self.now_arg()?;
        let reply: Vec<i64> = self
            .run_script(&scripts().one_key, &[(key, algorithm)], |cmd| wire::one_key_args(cmd, code, &args, now))
            .await?;
        let gcra_te = (code == "g").then_some(args[0]);
        wire::parse_one_key(&reply, limit, gcra_te)
    }

    /// One run of `sliding_window.lua`: a sliding window counter of `buckets` without warm-up.
    pub(super) async fn sliding_window(
        &self,
        key: &str,
        quota: &Quota,
        buckets: u32,
        cost: u64,
    ) -> Result<Decision, Error> {
        let now = self.now_arg()?;
        let reply: redis::Value = self
            .run_script(&scripts().sliding_window, &[(key, quota.algorithm())], |cmd| {
                wire::sliding_window_args(cmd, quota, buckets, cost, now);
            })
            .await?;
        wire::parse_sliding_window(&reply, quota.limit(), wire::sliding_window_base(quota, buckets))
    }

    /// A charge (`charge == true`) or a refund of `cost` permits by `charge.lua` (a fixed window
    /// or a GCRA), `charge_log.lua` (a sliding log) or `sliding_window.lua`, a warm-up included.
    /// The script changes the state atomically and returns it; the key's standing is computed
    /// here from it by the specification's own code, so it answers exactly what the memory
    /// backend does.
    pub(super) async fn charge_script(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
        charge: bool,
        at: Stamp,
    ) -> Result<(Decision, u64), Error> {
        let (algorithm, w) = (quota.algorithm(), quota.window_ms());
        let (code, numbers) = match algorithm {
            Algorithm::FixedWindow => ("f", [w, MAX_CHARGE_FACTOR * quota.limit(), cost]),
            Algorithm::Gcra { .. } => {
                let te = quota.emission_us();
                ("g", [te, MAX_CHARGE_FACTOR * quota.burst() * te, cost])
            }
            Algorithm::SlidingLog => return self.charge_log(key, quota, cost, charge, at).await,
            Algorithm::SlidingWindow { buckets } => {
                return self.charge_window(key, quota, buckets, cost, charge, at.time()).await;
            }
        };
        // "" for Redis' clock: the warm-up's arguments follow.
        let now = at.time().map_or_else(String::new, |now| now.to_string());
        let reply: Vec<i64> = self
            .run_script(&scripts().charge, &[(key, algorithm)], |cmd| {
                cmd.arg(code).arg(if charge { "c" } else { "r" }).arg(&numbers[..]).arg(&now);
                if let Some(warm) = quota.warm_up() {
                    cmd.arg(warm.period_ms()).arg(warm.cold_permille()).arg(quota.limit()).arg(w);
                }
            })
            .await?;
        let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
        let number = |v: i64| u64::try_from(v).map_err(|_| unexpected());
        let [now, state, permits, index, since] = reply[..] else { return Err(unexpected()) };
        let (now, state) = (number(now)?, number(state)?);
        let state = match algorithm {
            // The window the hash holds (none: -1) tells whether the key is idle.
            Algorithm::FixedWindow => spec::State::Fixed(u64::try_from(index).ok().map(|i| (i, state))),
            _ => spec::State::Gcra(state),
        };
        let key = spec::Key { state, warm_since: number(since)? };
        Ok((key.standing(now, quota), number(permits)?))
    }

    /// A charge or a refund of a sliding log by `charge_log.lua`, which first rewrites a key of
    /// per-permit members as counted entries when the charge would leave it over its limit (or
    /// its limit is above [`MAX_PER_PERMIT_LIMIT`]).
    async fn charge_log(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
        charge: bool,
        at: Stamp,
    ) -> Result<(Decision, u64), Error> {
        let member = self.members.next();
        let (limit, w) = (quota.limit(), quota.window_ms());
        let reply: redis::Value = self
            .run_script(&scripts().charge_log, &[(key, Algorithm::SlidingLog)], |cmd| {
                cmd.arg(&member).arg(w).arg(limit).arg(cost).arg(if charge { "c" } else { "r" });
                cmd.arg(MAX_CHARGE_FACTOR * limit).arg(at.arg());
                if let Some(warm) = quota.warm_up() {
                    cmd.arg(warm.period_ms()).arg(warm.cold_permille());
                }
            })
            .await?;
        let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
        let numbers: Vec<u64> = redis::from_redis_value_ref(&reply).map_err(|_| unexpected())?;
        let [now, count, oldest, newest, blocking, permits, since] = numbers[..] else { return Err(unexpected()) };
        // An idle key starts its ramp over; one with no recorded start counts as warm.
        let elapsed = if count == 0 { 0 } else { now.saturating_sub(since) };
        let summary = spec::LogSummary { count, oldest, newest, blocking };
        Ok((summary.standing(now, quota.limit_at(elapsed), w), permits))
    }

    /// A charge or a refund of a sliding window counter by `sliding_window.lua`, which returns
    /// the key's value after it: read here into the specification's state.
    async fn charge_window(
        &self,
        key: &str,
        quota: &Quota,
        buckets: u32,
        cost: u64,
        charge: bool,
        now: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        let now = now.map_or_else(String::new, |now| now.to_string());
        let n = u64::from(buckets);
        let warm = if quota.warm_up().is_some() { "1" } else { "0" };
        let reply: redis::Value = self
            .run_script(&scripts().sliding_window, &[(key, quota.algorithm())], |cmd| {
                cmd.arg(quota.window_ms() / n).arg(n).arg(quota.limit()).arg(cost).arg(&now);
                cmd.arg(if charge { "c" } else { "r" }).arg(MAX_CHARGE_FACTOR * quota.limit()).arg(warm);
            })
            .await?;
        let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
        let (now, permits, value): (u64, u64, Vec<u8>) =
            redis::from_redis_value_ref(&reply).map_err(|_| unexpected())?;
        let counts = wire::window_counts(&value, quota.window_ms() / n).ok_or_else(unexpected)?;
        let key = spec::Key { state: spec::State::Window(counts), warm_since: wire::window_since(&value) };
        Ok((key.standing(now, quota), permits))
    }

    /// One run of `check.lua` over `checks`: decided and recorded all or nothing, or, with
    /// `record == false`, only looked at.
    pub(super) async fn check_script(&self, checks: &[Check<'_>], record: bool) -> Result<MultiDecision, Error> {
        let (member, now) = (self.members.next(), self.now_arg()?);
        let keys: Vec<(&str, Algorithm)> = checks.iter().map(|c| (c.key, c.quota.algorithm())).collect();
        let reply: Vec<i64> =
            self.run_script(&scripts().check, &keys, |cmd| wire::check_args(cmd, &member, now, record, checks)).await?;
        wire::parse_group(&reply, checks.len())
    }
}
