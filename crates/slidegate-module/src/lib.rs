//! slidegate's decisions as a native Redis module: the same semantics as the Lua scripts
//! ([`slidegate::spec`], and the very code of the embedded backend: [`slidegate::state`]),
//! at a fraction of their CPU per decision, with the sliding log stored as the gaps between its
//! admissions (a byte or two each) instead of a sorted set.
//!
//! ```text
//! redis-server --loadmodule target/release/libslidegate_module.so     # or: MODULE LOAD <path>
//!
//! SLIDEGATE.CHECK key algorithm limit window_ms cost [options] [AND key algorithm ...] [NOW ms]
//! SLIDEGATE.INSPECT key [algorithm limit window_ms [options]] [NOW ms] [TIMES n]
//! SLIDEGATE.CHARGE key algorithm limit window_ms cost [options] [NOW ms]
//! SLIDEGATE.REFUND key algorithm limit window_ms cost [options] [NOW ms]
//! SLIDEGATE.RESTORE key payload
//! ```
//!
//! - `algorithm`: `sliding_log`, `sliding_window`, `fixed_window`, `gcra` (or `token_bucket`);
//!   options `BUCKETS n`, `BURST n`, `WARMUP period_ms cold_permille` (see [`args`]).
//! - `CHECK` answers as slidegate's `check.lua` does: `admitted`, then per key `fits,
//!   remaining, reset_after_ms, retry_after_ms (-1 when none), limit, next_permit_after_ms`
//!   (when `remaining` next grows: [`slidegate::Decision::next_permit_after`]). Several checks joined by
//!   `AND` are decided all or nothing (distinct keys; on a Cluster, of one slot); a denial
//!   writes nothing.
//! - `INSPECT` answers `count, oldest_ms (-1 when none), reset_after_ms, algorithm, limit,
//!   window_ms` from the key's last quota, or from the one given; with `TIMES n`, then the
//!   times of a sliding log's newest `n` admissions in the window, oldest first, as an array
//!   (empty for the other algorithms).
//! - `CHARGE` records `cost` permits whatever the key holds, clamped at
//!   [`slidegate::MAX_CHARGE_FACTOR`] times the limit; `REFUND` gives back up to `cost` of its
//!   most recent admissions ([`slidegate::spec`], "Charges and refunds"). Both answer the key's
//!   standing after them as one check of `CHECK` does (`within, remaining, reset_after_ms,
//!   retry_after_ms, limit, next_permit_after_ms`), then the permits recorded or given back.
//! - `RESTORE` sets a key from the payload an AOF rewrite emitted for it.
//!
//! Time is the server's clock (`RedisModule_Milliseconds`, the wall clock `TIME` gives Lua)
//! unless `NOW` is given; with `NOW`, keys expire a minute later than their last admission
//! needs, as on the Lua path (Redis expires by its own clock). Commands are replicated (and
//! written to the AOF) with the `NOW` the master used, so replicas and reloads decide, and
//! store, exactly what the master did.
//!
//! A key written by the Lua scripts before the module was loaded (a sorted set for the log, a
//! hash for the others) is converted on its first check, keeping its admissions; any other
//! type answers `WRONGTYPE`.

pub mod args;
mod value;

use std::ffi::{c_int, c_long};
use std::mem::ManuallyDrop;

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue, raw, redis_module};
use slidegate::state::Counter;
use smallvec::SmallVec;

use crate::args::{Arg as _, Checks, INLINE_CHECKS, Spec};
use crate::value::{SLIDEGATE_TYPE, Value};

/// Keys hold this much longer than their last admission needs when the caller gives `NOW`:
/// Redis expires by its own clock, which a caller's may trail (the Lua path's slack too).
const CALLER_CLOCK_SLACK_MS: u64 = 60_000;

/// Everything a command can refuse; each becomes an error reply with its Redis error code.
///
/// Deliberately not a `std::error::Error`: redis-module turns those into `ERR <message>`,
/// which would bury the `WRONGTYPE` code under `ERR`.
#[derive(Debug)]
pub enum Error {
    /// Arguments that are not a command.
    Syntax(String),
    /// A quota or cost the library refuses.
    Quota(slidegate::Error),
    /// A key holding something else.
    WrongType(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (code, message) = match self {
            Self::Syntax(message) => ("ERR", message.clone()),
            Self::Quota(e) => ("ERR", e.to_string()),
            Self::WrongType(message) => ("WRONGTYPE", message.clone()),
        };
        // ASCII only: redis-module truncates every other character to a byte, which would make
        // the reply invalid UTF-8 for clients.
        write!(f, "{code} ")?;
        message
            .chars()
            .try_for_each(|c| if c.is_ascii() { write!(f, "{c}") } else { write!(f, "{}", c.escape_unicode()) })
    }
}

impl From<slidegate::Error> for Error {
    fn from(e: slidegate::Error) -> Self {
        Self::Quota(e)
    }
}

impl From<Error> for RedisError {
    fn from(e: Error) -> Self {
        RedisError::String(e.to_string())
    }
}

/// `SLIDEGATE.CHECK` as Redis calls it. Registered by hand rather than through `redis_module!`,
/// whose wrapper allocates a vector of the arguments, retains and frees each one, and builds the
/// reply as a vector of values: on the hot path that was most of the allocations per call.
#[allow(unsafe_code)]
extern "C" fn check_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    // SAFETY: Redis passes `argc` arguments, alive for the call.
    let args = unsafe { Borrowed::all(argv, argc) };
    if context.is_keys_position_request() {
        // Asked by Redis (Cluster routing, ACLs, `COMMAND GETKEYS`) where the keys are.
        for position in args::key_positions(args) {
            context.key_at_pos(i32::try_from(position).unwrap_or(1));
        }
    } else {
        if let Err(e) = check(&context, args) {
            context.reply(Err(e));
        }
    }
    raw::Status::Ok as c_int
}

/// `SLIDEGATE.CHECK`: one check, or several joined by `AND`, decided all or nothing.
fn check(ctx: &Context, args: &[Borrowed]) -> Result<(), RedisError> {
    let checks = args::parse_checks(args)?;
    if checks.keys.len() > 1 && ctx.get_flags().contains(ContextFlags::CLUSTER) {
        // Redis checked that this node serves the first key; the others must share its slot.
        let slot = |at: &usize| slidegate::key_slot(args[*at].bytes());
        if checks.keys.iter().any(|at| slot(at) != slot(&checks.keys[0])) {
            return Err(RedisError::Str("CROSSSLOT Keys in request don't hash to the same slot"));
        }
    }
    decide(ctx, args, &checks)
}

/// A command argument as Redis passed it, borrowed for the call: neither retained nor freed.
#[repr(transparent)]
struct Borrowed(*mut raw::RedisModuleString);

impl Borrowed {
    /// The arguments of a command call.
    ///
    /// # Safety
    /// `argv` holds `argc` strings that Redis keeps alive for the call (`'a`).
    #[allow(unsafe_code)]
    unsafe fn all<'a>(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> &'a [Self] {
        match usize::try_from(argc) {
            // SAFETY: as the caller promises; `Borrowed` is a transparent pointer.
            Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv.cast::<Self>(), len) },
            _ => &[],
        }
    }

    /// The argument as redis-module's string, for its key API: never dropped, so never freed.
    fn string(&self, ctx: &Context) -> ManuallyDrop<RedisString> {
        ManuallyDrop::new(RedisString::from_redis_module_string(ctx.get_raw(), self.0))
    }
}

impl args::Arg for Borrowed {
    fn bytes(&self) -> &[u8] {
        RedisString::string_as_slice(self.0)
    }
}

/// `CHECK`'s reply, `admitted` then six integers per key: on the stack for up to
/// [`INLINE_CHECKS`] keys.
type Integers = SmallVec<[i64; 1 + 6 * INLINE_CHECKS]>;

/// Writes `integers` as an array reply, straight into the client's buffer.
fn reply_integers(ctx: &Context, integers: &[i64]) {
    let ctx = ctx.get_raw();
    raw::reply_with_array(ctx, c_long::try_from(integers.len()).unwrap_or(c_long::MAX));
    for &n in integers {
        raw::reply_with_long_long(ctx, n);
    }
}

/// `SLIDEGATE.INSPECT`: what a key holds now, changing nothing.
#[allow(clippy::needless_pass_by_value, reason = "the signature redis-module calls")]
fn inspect(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 2 {
        return Err(RedisError::WrongArity);
    }
    let args::Inspect { quota: asked, now, times } = args::parse_inspect(&args[2..])?;
    let now = now.unwrap_or_else(server_now);
    let key = ctx.open_key(&args[1]);
    let converted;
    let found = match key.get_value::<Value>(&SLIDEGATE_TYPE) {
        Ok(value) => value,
        // Not ours: perhaps the Lua scripts' state, read without converting it.
        Err(_) => match asked {
            Some(quota) => {
                converted = value::read_lua_key(ctx, &args[1], &quota)?.map(|counter| Value { counter, quota });
                converted.as_ref()
            }
            None => return Err(Error::WrongType("the key holds no slidegate value; name its quota".into()).into()),
        },
    };
    let Some(value) = found else {
        let quota =
            asked.map_or(vec![RedisValue::Null, RedisValue::Null, RedisValue::Null], |q| quota_reply(&q).to_vec());
        let times = times.map(|_| RedisValue::Array(Vec::new()));
        return Ok(RedisValue::Array([int(0), int(-1), int(0)].into_iter().chain(quota).chain(times).collect()));
    };
    let quota = asked.unwrap_or(value.quota);
    if !value.counter.counts_by(quota.algorithm()) {
        return Err(mismatch(value, &quota).into());
    }
    let state = value.counter.inspect(now, &quota);
    let oldest = state.oldest_ms.map_or(-1, clamp);
    let head = [int(clamp(state.count)), int(oldest), int(millis(state.reset_after))];
    let times = times.map(|n| {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        RedisValue::Array(value.counter.admissions(now, &quota, n).into_iter().map(|t| int(clamp(t))).collect())
    });
    Ok(RedisValue::Array(head.into_iter().chain(quota_reply(&quota)).chain(times).collect()))
}

/// `SLIDEGATE.CHARGE`: records a cost whatever the key holds.
#[allow(clippy::needless_pass_by_value, reason = "the signature redis-module calls")]
fn charge(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    charge_or_refund(ctx, &args, "SLIDEGATE.CHARGE", true)
}

/// `SLIDEGATE.REFUND`: gives back up to a cost of the key's most recent admissions.
#[allow(clippy::needless_pass_by_value, reason = "the signature redis-module calls")]
fn refund(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    charge_or_refund(ctx, &args, "SLIDEGATE.REFUND", false)
}

/// A charge or a refund of one key: its quota and cost parsed (and bounded) as one check of
/// `CHECK`, the change made by the library's own [`Counter`], replicated with the time it used.
fn charge_or_refund(ctx: &Context, args: &[RedisString], command: &str, charge: bool) -> RedisResult {
    let checks = args::parse_checks(args)?;
    let ([at], [spec]) = (checks.keys.as_slice(), checks.specs.as_slice()) else {
        return Err(Error::Syntax("one key per charge or refund".into()).into());
    };
    let now = checks.now.unwrap_or_else(server_now);
    let key = ctx.open_key_writable(&args[*at]);
    let mut slot = slot(ctx, &key, &args[*at], spec)?;
    let value = slot.value();
    let (decision, permits) = if charge {
        let c = value.counter.charge(now, &spec.quota, spec.cost);
        (c.decision, c.recorded)
    } else {
        let r = value.counter.refund(now, &spec.quota, spec.cost);
        (r.decision, r.refunded)
    };
    value.quota = spec.quota;
    let expires_at = value.counter.expires_at(&spec.quota);
    let slack = if checks.now.is_some() { CALLER_CLOCK_SLACK_MS } else { 0 };
    // Dropping expired admissions is a change too: every call that found a key is replicated.
    let changed = match slot {
        Slot::Made { value, converted } if permits > 0 || converted => {
            if converted {
                key.delete()?;
            }
            key.set_value(&SLIDEGATE_TYPE, value)?;
            set_expiry(&key, expires_at, now, slack)?;
            true
        }
        Slot::Made { .. } => false,
        Slot::Stored(_) => {
            set_expiry(&key, expires_at, now, slack)?;
            true
        }
    };
    if changed {
        match checks.now {
            Some(_) => ctx.replicate_verbatim(),
            None => {
                let now = now.to_string();
                let mut with_now: Vec<&[u8]> = args[1..].iter().map(RedisString::as_slice).collect();
                with_now.extend([b"NOW".as_slice(), now.as_bytes()]);
                ctx.replicate(command, with_now.as_slice());
            }
        }
    }
    let standing = [
        i64::from(decision.allowed),
        clamp(decision.remaining),
        millis(decision.reset_after),
        decision.retry_after.map_or(-1, millis),
        clamp(decision.limit),
        millis(decision.next_permit_after),
        clamp(permits),
    ];
    Ok(RedisValue::Array(standing.into_iter().map(int).collect()))
}

/// `SLIDEGATE.RESTORE`: sets a key from the payload an AOF rewrite emitted for it.
#[allow(clippy::needless_pass_by_value, reason = "the signature redis-module calls")]
fn restore(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, name, payload] = args.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let value = Value::from_bytes(payload.as_slice())?;
    let key = ctx.open_key_writable(name);
    if key.key_type() != raw::KeyType::Empty {
        key.get_value::<Value>(&SLIDEGATE_TYPE)?;
    }
    key.set_value(&SLIDEGATE_TYPE, value)?;
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// One key of a check in progress: its stored value, or one made for it (new, or converted
/// from the Lua scripts' state) that is stored only if something is written.
enum Slot<'a> {
    Stored(&'a mut Value),
    Made { value: Value, converted: bool },
}

impl Slot<'_> {
    fn value(&mut self) -> &mut Value {
        match self {
            Self::Stored(value) => value,
            Self::Made { value, .. } => value,
        }
    }
}

/// Decides `checks` all or nothing, writes what changed, replicates the command with the time
/// it used, and replies (last: nothing after it can fail, and the reply is not copied out).
fn decide(ctx: &Context, argv: &[Borrowed], checks: &Checks) -> Result<(), RedisError> {
    let now = checks.now.unwrap_or_else(server_now);
    // Every check is evaluated before any is recorded. Evaluating drops expired admissions,
    // which is a change to replicate even when nothing is admitted.
    let mut changed = false;
    let mut evaluated = SmallVec::<[_; INLINE_CHECKS]>::new();
    for (&at, spec) in checks.keys.iter().zip(&checks.specs) {
        let name = argv[at].string(ctx);
        let key = ctx.open_key_writable(&name);
        let mut slot = slot(ctx, &key, &name, spec)?;
        let stored = matches!(slot, Slot::Stored(_));
        let counter = &mut slot.value().counter;
        let before = counter.len();
        let verdict = counter.evaluate(now, &spec.quota, spec.cost);
        changed |= stored && counter.len() != before;
        evaluated.push((key, slot, spec, verdict));
    }
    let admitted = evaluated.iter().all(|(.., verdict)| verdict.allowed);
    let slack = if checks.now.is_some() { CALLER_CLOCK_SLACK_MS } else { 0 };
    let mut reply = Integers::new();
    reply.push(i64::from(admitted));
    // Drained in place: moving the array of keys out would copy it whole.
    for (key, mut slot, spec, verdict) in evaluated.drain(..) {
        let value = slot.value();
        let decision = if admitted {
            value.counter.record(now, &spec.quota, spec.cost);
            value.quota = spec.quota;
            verdict
        } else if verdict.allowed {
            value.counter.held(now, &spec.quota, spec.cost, &verdict)
        } else {
            verdict
        };
        let expires_at = value.counter.expires_at(&spec.quota);
        match slot {
            // A new key is stored only if admitted; a converted one in any case (once).
            Slot::Made { value, converted } if admitted || converted => {
                if converted {
                    key.delete()?;
                }
                key.set_value(&SLIDEGATE_TYPE, value)?;
                set_expiry(&key, expires_at, now, slack)?;
                changed = true;
            }
            Slot::Stored(_) if admitted => {
                set_expiry(&key, expires_at, now, slack)?;
                changed = true;
            }
            _ => {}
        }
        reply.extend([
            i64::from(decision.allowed || decision.retry_after.is_none()),
            clamp(decision.remaining),
            millis(decision.reset_after),
            decision.retry_after.map_or(-1, millis),
            clamp(decision.limit),
            millis(decision.next_permit_after),
        ]);
    }
    if changed {
        replicate_at(ctx, argv, checks.now.is_none().then_some(now));
    }
    reply_integers(ctx, &reply);
    Ok(())
}

/// The slot of one key: its value (borrowed from Redis for as long as its key stays open and
/// unchanged, which `decide` guarantees: it keeps each key beside its slot and replaces only
/// values it made), a conversion of the Lua scripts' state, or a new counter.
fn slot<'v>(ctx: &Context, key: &RedisKeyWritable, name: &RedisString, spec: &Spec) -> Result<Slot<'v>, RedisError> {
    let algorithm = spec.quota.algorithm();
    match key.get_value::<Value>(&SLIDEGATE_TYPE) {
        Ok(Some(value)) if value.counter.counts_by(algorithm) => Ok(Slot::Stored(value)),
        Ok(Some(value)) => Err(mismatch(value, &spec.quota).into()),
        Ok(None) => {
            Ok(Slot::Made { value: Value { counter: Counter::new(algorithm), quota: spec.quota }, converted: false })
        }
        Err(_) => match value::read_lua_key(ctx, name, &spec.quota)? {
            Some(counter) => Ok(Slot::Made { value: Value { counter, quota: spec.quota }, converted: true }),
            None => Ok(Slot::Made {
                value: Value { counter: Counter::new(algorithm), quota: spec.quota },
                converted: false,
            }),
        },
    }
}

fn mismatch(value: &Value, quota: &slidegate::Quota) -> Error {
    Error::WrongType(format!("the key counts by {}, not {}", value.counter.algorithm_kind(), quota.algorithm()))
}

/// Keeps the key until its last admission has left (plus the caller clock's slack), and at most
/// [`MAX_TTL`]: a key's count from another quota's window (a window index, a bucket) can place
/// its end far beyond any time Redis can represent.
fn set_expiry(key: &RedisKeyWritable, expires_at: u64, now: u64, slack: u64) -> RedisResult {
    let ttl = std::time::Duration::from_millis(expires_at.saturating_sub(now).max(1).saturating_add(slack));
    key.set_expire(ttl.min(MAX_TTL))
}

/// The longest a key is kept: two of the longest windows, what a fixed window admitted at its
/// start or a sliding window's newest bucket can need.
const MAX_TTL: std::time::Duration = slidegate::MAX_WINDOW.saturating_mul(2);

/// Replicates the command as it was run, with `NOW <ms>` appended when the server's clock
/// decided: replicas and AOF reloads then decide with the master's time.
fn replicate_at(ctx: &Context, argv: &[Borrowed], server_now: Option<u64>) {
    let Some(now) = server_now else {
        ctx.replicate_verbatim();
        return;
    };
    // The arguments are handed over as they are (format `v`: Redis takes a reference to each,
    // copying nothing); only `NOW` and the time are new. Cheaper than redis-module's
    // `replicate`, which copies every argument into a new string.
    // A command of up to 32 arguments (every one the backend sends) needs no allocation.
    let mut stack = [std::ptr::null_mut(); 32];
    let heap: Vec<*mut raw::RedisModuleString>;
    let args: &[*mut raw::RedisModuleString] = if argv.len() <= stack.len() {
        for (slot, s) in stack.iter_mut().zip(&argv[1..]) {
            *slot = s.0;
        }
        &stack[..argv.len() - 1]
    } else {
        heap = argv[1..].iter().map(|s| s.0).collect();
        &heap
    };
    let now = std::ffi::c_longlong::try_from(now).unwrap_or(std::ffi::c_longlong::MAX);
    // SAFETY: the format `vcl` takes an array of strings with its length, a C string and a long
    // long, exactly as passed; the strings are the command's own arguments, alive for the call.
    #[allow(unsafe_code)]
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.get_raw(),
                c"SLIDEGATE.CHECK".as_ptr(),
                c"vcl".as_ptr(),
                args.as_ptr(),
                args.len(),
                c"NOW".as_ptr(),
                now,
            );
        }
    }
}

fn quota_reply(q: &slidegate::Quota) -> [RedisValue; 3] {
    [RedisValue::SimpleStringStatic(q.algorithm().as_str()), int(clamp(q.limit())), int(clamp(q.window_ms()))]
}

/// The server's wall clock in ms, as Lua's `TIME` gives it.
fn server_now() -> u64 {
    // SAFETY: Redis fills the API table before any command runs; `Milliseconds` takes nothing.
    #[allow(unsafe_code)]
    let ms = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    u64::try_from(ms).unwrap_or(0)
}

impl args::Arg for RedisString {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

fn int(n: i64) -> RedisValue {
    RedisValue::Integer(n)
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// What Redis looks up when it loads the module: its name, allocator, type and commands.
/// Allocations go through Redis' allocator, so `INFO memory` and `maxmemory` count them; unit
/// tests, outside Redis, keep the system's.
#[allow(missing_docs)]
mod entry {
    use super::{SLIDEGATE_TYPE, charge, check_command, inspect, raw, redis_module, refund, restore};
    use redis_module::{Context, RedisString, Status};

    #[cfg(not(test))]
    use redis_module::alloc::RedisAlloc as Allocator;
    #[cfg(test)]
    use std::alloc::System as Allocator;

    redis_module! {
        name: "slidegate",
        version: 1,
        allocator: (Allocator, Allocator),
        data_types: [SLIDEGATE_TYPE],
        init: create_check,
        commands: [
            ["slidegate.inspect", inspect, "readonly", 1, 1, 1, ""],
            ["slidegate.restore", restore, "write deny-oom", 1, 1, 1, ""],
            ["slidegate.charge", charge, "write deny-oom", 1, 1, 1, ""],
            ["slidegate.refund", refund, "write deny-oom", 1, 1, 1, ""],
        ],
    }

    /// Registers `SLIDEGATE.CHECK` with its own entry point ([`check_command`]).
    fn create_check(ctx: &Context, _args: &[RedisString]) -> Status {
        // SAFETY: Redis fills the API table before `OnLoad`; the name and flags are C strings
        // and the handler has the signature Redis calls.
        #[allow(unsafe_code)]
        let created = unsafe {
            raw::RedisModule_CreateCommand.map(|create| {
                create(
                    ctx.get_raw(),
                    c"slidegate.check".as_ptr(),
                    Some(check_command),
                    // `getkeys-api`: the keys after the first are found by parsing (`AND` checks).
                    c"write deny-oom getkeys-api".as_ptr(),
                    1,
                    1,
                    1,
                )
            })
        };
        if created == Some(raw::Status::Ok as i32) { Status::Ok } else { Status::Err }
    }
}
