//! The Envoy service's settings at the top of the rules file, each named as its `serve` flag
//! (`envoy_shadow_mode` is `--envoy-shadow-mode`).

use std::ops::Range;

use super::{EnvoyOptions, HeaderStyle};
use super::{FileSpec, Invalid};

/// The file's `envoy_*` settings over the defaults.
pub(super) fn envoy_options(file: &FileSpec) -> Result<EnvoyOptions, Invalid> {
    let mut o = EnvoyOptions::default();
    let flag = |v: Option<bool>, default: bool| v.unwrap_or(default);
    o.merge_domains = flag(file.envoy_merge_domains, o.merge_domains);
    o.shadow_mode = flag(file.envoy_shadow_mode, o.shadow_mode);
    o.quota_mode = flag(file.envoy_quota_mode, o.quota_mode);
    o.dynamic_metadata = flag(file.envoy_response_dynamic_metadata, o.dynamic_metadata);
    o.headers.enabled = flag(file.envoy_response_headers, o.headers.enabled);
    if let Some(style) = &file.envoy_response_headers_style {
        o.headers.style = style
            .get_ref()
            .parse::<HeaderStyle>()
            .map_err(|m| Invalid::new("envoy_response_headers_style", style.span(), m))?;
    }
    let mut spans: Vec<(&str, Range<usize>)> = Vec::new();
    for (field, value, target) in [
        ("envoy_limit_header", &file.envoy_limit_header, &mut o.headers.limit),
        ("envoy_remaining_header", &file.envoy_remaining_header, &mut o.headers.remaining),
        ("envoy_reset_header", &file.envoy_reset_header, &mut o.headers.reset),
    ] {
        if let Some(name) = value {
            spans.push((field, name.span()));
            target.clone_from(name.get_ref());
        }
    }
    if let Some(ratio) = &file.envoy_near_limit_ratio {
        spans.push(("envoy_near_limit_ratio", ratio.span()));
        o.near_limit_ratio = *ratio.get_ref();
    }
    o.validate().map_err(|(field, message)| {
        // The defaults are valid: an error is about a value the file sets.
        let span = spans.iter().find(|(f, _)| *f == field).map_or(0..0, |(_, s)| s.clone());
        Invalid::new(field, span, message)
    })?;
    Ok(o)
}
