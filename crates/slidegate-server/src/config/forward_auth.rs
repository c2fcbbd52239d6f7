//! The `[forward_auth]` table: the proxies whose forwarding header is believed, and that header.

use serde::Deserialize;
use slidegate::client_ip::TrustedProxies;
use toml::Spanned;

use super::Invalid;
use super::{ClientHeader, ForwardAuthConfig, MAX_TRUSTED_PROXIES};

/// `[forward_auth]` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ForwardAuthSpec {
    trusted_proxies: Option<Spanned<Vec<String>>>,
    client_header: Option<Spanned<String>>,
}

impl ForwardAuthSpec {
    /// The table over the defaults: nothing trusted, `X-Forwarded-For`.
    pub(super) fn validate(&self) -> Result<ForwardAuthConfig, Invalid> {
        let mut c = ForwardAuthConfig::default();
        if let Some(blocks) = &self.trusted_proxies {
            let invalid = |m: String| Invalid::new("forward_auth.trusted_proxies", blocks.span(), m);
            if blocks.get_ref().len() > MAX_TRUSTED_PROXIES {
                let given = blocks.get_ref().len();
                return Err(invalid(format!("{given} entries, over the {MAX_TRUSTED_PROXIES} allowed")));
            }
            c.trusted_proxies = TrustedProxies::parse(blocks.get_ref()).map_err(|e| invalid(e.to_string()))?;
        }
        if let Some(name) = &self.client_header {
            c.client_header = ClientHeader::parse(name.get_ref()).ok_or_else(|| {
                let message =
                    format!("{:?} is not one of {:?}", name.get_ref(), ClientHeader::ALL.map(ClientHeader::name));
                Invalid::new("forward_auth.client_header", name.span(), message)
            })?;
        }
        Ok(c)
    }
}
