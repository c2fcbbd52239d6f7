//! Which code decides on Redis — slidegate's module or the Lua scripts: [`RedisEngine`], what
//! the backend knows of the server's module, and when a call goes to the module, falls back to
//! the scripts, or makes the next call ask the server again.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::aio::ConnectionLike;

use super::RedisBackend;
use crate::Error;

/// Which code decides on Redis.
///
/// The module and the scripts make identical decisions and use the same keys; a key the
/// scripts wrote is converted by the module on its first check (keeping its admissions), but
/// the scripts cannot read what the module wrote — so do not go back to `Lua` on a server
/// whose keys the module holds, until they have expired (one window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RedisEngine {
    /// The module when the server has it loaded, the Lua scripts otherwise (the default).
    /// The first call, and the first after the connection failed (a restart or a failover may
    /// have changed the server), goes to the module: if the server does not know the command,
    /// the scripts make that call and the ones after it. A script meeting a key of the
    /// module's type (the module was loaded since) makes the next call try the module again;
    /// so does [`RedisBackend::detect_module`] (`COMMAND INFO SLIDEGATE.CHECK`), which
    /// [`RedisBackend::ready`] calls.
    #[default]
    Auto,
    /// Always the Lua scripts.
    Lua,
    /// Always the module: calls fail when the server does not have it.
    Module,
}

impl RedisEngine {
    /// The name used in configuration files: `auto`, `lua` or `module`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Lua => "lua",
            Self::Module => "module",
        }
    }
}

impl std::str::FromStr for RedisEngine {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(Self::Auto),
            "lua" => Ok(Self::Lua),
            "module" => Ok(Self::Module),
            other => Err(Error::UnknownEngine(other.to_owned())),
        }
    }
}

/// What the backend knows of the server's module: not asked yet (or to ask again), absent,
/// loaded. Shared by clones.
#[derive(Default)]
pub(super) struct ModuleState(AtomicU8);

const MODULE_UNKNOWN: u8 = 0;
const MODULE_ABSENT: u8 = 1;
const MODULE_LOADED: u8 = 2;

impl<C> RedisBackend<C> {
    /// The code deciding now: [`RedisEngine::Lua`] or [`RedisEngine::Module`], or
    /// [`RedisEngine::Auto`] while the server has not been asked yet.
    pub fn engine(&self) -> RedisEngine {
        match (self.config.engine, self.module.0.load(Ordering::Relaxed)) {
            (RedisEngine::Auto, MODULE_LOADED) => RedisEngine::Module,
            (RedisEngine::Auto, MODULE_ABSENT) => RedisEngine::Lua,
            (engine, _) => engine,
        }
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Asks the server whether it has slidegate's module loaded (`COMMAND INFO
    /// SLIDEGATE.CHECK`), and remembers the answer for [`RedisEngine::Auto`].
    pub async fn detect_module(&self) -> Result<bool, Error> {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("SLIDEGATE.CHECK");
        let info: Vec<redis::Value> = self.query(&cmd).await?;
        let loaded = info.first().is_some_and(|v| !matches!(v, redis::Value::Nil));
        self.remember(if loaded { MODULE_LOADED } else { MODULE_ABSENT });
        Ok(loaded)
    }

    /// Whether the backend can decide: Redis answers `PING` within the deadline, and is asked
    /// again whether it has slidegate's module (so a `MODULE LOAD` is picked up). With the
    /// engine forced to the module, a server without it fails with [`Error::ModuleNotLoaded`].
    pub async fn ready(&self) -> Result<(), Error> {
        self.ping().await?;
        if self.config.engine != RedisEngine::Lua
            && !self.detect_module().await?
            && self.config.engine == RedisEngine::Module
        {
            return Err(Error::ModuleNotLoaded);
        }
        Ok(())
    }

    /// Whether this call goes to the module first: unless the engine is `Lua` or the server
    /// said it has no module. Not knowing yet (the first call, or the first after a failed
    /// connection), the call itself asks: no extra round trip, and no second deadline.
    pub(super) fn module_first(&self) -> bool {
        match self.config.engine {
            RedisEngine::Lua => false,
            RedisEngine::Module => true,
            RedisEngine::Auto => self.module.0.load(Ordering::Relaxed) != MODULE_ABSENT,
        }
    }

    /// The module's answer, or `None` when the call is to be made by the scripts instead: the
    /// server does not know the command (no module, or a failover to a server without it) and
    /// the engine is `Auto` (forced to the module, that is [`Error::ModuleNotLoaded`]).
    pub(super) fn module_answer<T>(&self, answer: Result<T, Error>) -> Option<Result<T, Error>> {
        match &answer {
            Err(Error::Redis(e)) if unknown_command(e) => {
                self.remember(MODULE_ABSENT);
                (self.config.engine == RedisEngine::Module).then_some(Err(Error::ModuleNotLoaded))
            }
            Ok(_) => {
                self.remember(MODULE_LOADED);
                Some(answer)
            }
            Err(_) => Some(self.noting_failure(answer)),
        }
    }

    /// Passes the scripts' (or the module's) `answer` on. A failed connection, or a script
    /// meeting a key of the module's type (another instance found the module first), makes
    /// the next call ask the server again.
    pub(super) fn noting_failure<T>(&self, answer: Result<T, Error>) -> Result<T, Error> {
        let recheck = match &answer {
            Err(Error::Redis(e)) => e.code() == Some("WRONGTYPE") || e.is_io_error() || e.is_connection_dropped(),
            Err(Error::Timeout(_)) => true,
            _ => false,
        };
        if recheck {
            self.remember(MODULE_UNKNOWN);
        }
        answer
    }

    /// Records what the server said of its module; a store only when it changed, so that the
    /// calls of many threads do not pass one cache line around.
    fn remember(&self, state: u8) {
        if self.module.0.load(Ordering::Relaxed) != state {
            self.module.0.store(state, Ordering::Relaxed);
        }
    }
}

/// Whether Redis refused a command it does not know (the module is not loaded).
fn unknown_command(e: &redis::RedisError) -> bool {
    e.to_string().to_ascii_lowercase().contains("unknown command")
}
