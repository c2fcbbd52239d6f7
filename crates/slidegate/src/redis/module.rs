//! The module's commands, `SLIDEGATE.CHECK`, `SLIDEGATE.INSPECT`, `SLIDEGATE.CHARGE` and
//! `SLIDEGATE.REFUND`: what the module engine
//! sends instead of the scripts, on the same keys and with the same answers.

use redis::aio::ConnectionLike;

use super::{RedisBackend, wire};
use crate::{Check, Decision, Error, KeyState, KeyTimeline, MultiDecision, Quota};

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `SLIDEGATE.CHECK` over `checks` (joined by `AND`): the module's decision, answered as
    /// `check.lua` answers.
    pub(super) async fn module_check(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        let keyed = checks.iter().map(|c| (self.redis_key(c.key, c.quota.algorithm()), c));
        let reply: Vec<i64> = self.query(&wire::module_check(keyed, self.now_arg()?)).await?;
        wire::parse_group(&reply, checks.len())
    }

    /// `SLIDEGATE.CHARGE` (`charge`) or `SLIDEGATE.REFUND` of `cost` permits of `quota` on
    /// `key`, at `now` (`None`: Redis' clock): the key's standing after it, and the permits
    /// recorded or given back.
    pub(super) async fn module_charge(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
        charge: bool,
        now: Option<u64>,
    ) -> Result<(Decision, u64), Error> {
        let cmd = wire::module_charge(charge, self.redis_key(key, quota.algorithm()), quota, cost, now);
        let reply: Vec<i64> = self.query(&cmd).await?;
        wire::parse_module_charge(&reply)
    }

    /// `SLIDEGATE.INSPECT` of `key` under `quota`.
    pub(super) async fn module_inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        let cmd = wire::module_inspect(self.redis_key(key, quota.algorithm()), quota, self.now_arg()?, None);
        let reply: Vec<redis::Value> = self.query(&cmd).await?;
        wire::parse_module_inspect(&reply)
    }

    /// `SLIDEGATE.INSPECT … TIMES times` of `key` under `quota`.
    pub(super) async fn module_timeline(&self, key: &str, quota: &Quota, times: usize) -> Result<KeyTimeline, Error> {
        let cmd = wire::module_inspect(self.redis_key(key, quota.algorithm()), quota, self.now_arg()?, Some(times));
        let reply: Vec<redis::Value> = self.query(&cmd).await?;
        wire::parse_module_timeline(&reply)
    }
}
