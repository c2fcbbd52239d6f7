//! The `[ui]` table: whether the dashboard and `/v1/stats` are served, and whether reading them
//! needs the admin token.

use serde::Deserialize;
use toml::Spanned;

use super::Invalid;

/// The `[ui]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UiConfig {
    /// Whether `/ui` and `/v1/stats` are served and traffic is recorded (default true).
    pub enabled: bool,
    /// Whether `/v1/stats` needs `Authorization: Bearer <admin_token>` (default false).
    pub require_token: bool,
}

impl Default for UiConfig {
    fn default() -> Self {
        Self { enabled: true, require_token: false }
    }
}

/// `[ui]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct UiSpec {
    enabled: Option<bool>,
    require_token: Option<Spanned<bool>>,
}

impl UiSpec {
    /// The table over the defaults; `require_token` needs an admin token to require.
    pub(super) fn validate(&self, admin_token: bool) -> Result<UiConfig, Invalid> {
        let mut c = UiConfig::default();
        c.enabled = self.enabled.unwrap_or(c.enabled);
        if let Some(r) = &self.require_token {
            if *r.get_ref() && !admin_token {
                return Err(Invalid::new("ui.require_token", r.span(), "needs admin_token to be set"));
            }
            c.require_token = *r.get_ref();
        }
        Ok(c)
    }
}
