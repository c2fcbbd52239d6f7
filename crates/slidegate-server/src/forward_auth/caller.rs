//! What a rule counts a forwarded request as (`key = [...]`, its parts joined into one key)
//! and which requests it applies to (`methods`, `path_prefix`).

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName, Method};
use slidegate::MAX_KEY_LEN;
use slidegate::client_ip;
use slidegate::key::escape_separators;

use crate::api_error::ApiError;
use crate::config::{Caller, KeyPart};

impl Caller {
    /// Appends `request`'s key to `out` (which may hold a rule's part already): its parts, each
    /// but the last escaped and followed by `|`. A part the request lacks, or one that makes the
    /// key longer than [`MAX_KEY_LEN`], is refused before it is copied.
    pub fn write_key(&self, request: &Described<'_>, out: &mut String) -> Result<(), ApiError> {
        let key_start = out.len();
        for (i, part) in self.key.iter().enumerate() {
            let start = out.len();
            let (value, named) = match part {
                KeyPart::ClientIp => {
                    client_ip::write_key(
                        request.client,
                        client_ip::DEFAULT_IPV4_PREFIX,
                        client_ip::DEFAULT_IPV6_PREFIX,
                        out,
                    );
                    (None, "client_ip")
                }
                KeyPart::Header(name) => (Some(header(request.headers, name)?), name.as_str()),
                KeyPart::Method => (Some(Some(request.method)), "X-Forwarded-Method"),
                KeyPart::Host => (Some(request.host), "X-Forwarded-Host or Host"),
                KeyPart::Path => (Some(request.path), "X-Forwarded-Uri or X-Original-URI"),
            };
            if let Some(value) = value {
                let value = value.ok_or_else(|| missing(named))?;
                if out.len() - key_start + value.len() > MAX_KEY_LEN {
                    let message = format!("the key with {named} is over {MAX_KEY_LEN} bytes");
                    return Err(ApiError::bad_request("key_too_long", message));
                }
                out.push_str(value);
            }
            if i + 1 < self.key.len() {
                escape_separators(out, start);
                out.push('|');
            }
        }
        Ok(())
    }

    /// Whether the rule applies to `request`.
    pub fn applies(&self, request: &Described<'_>) -> bool {
        let method = self.methods.as_ref().is_none_or(|m| m.iter().any(|m| m.as_str() == request.method));
        let path = self.path_prefix.as_ref().is_none_or(|p| request.path.is_some_and(|path| path.starts_with(&**p)));
        method && path
    }
}

/// The request a proxy asks about, as its headers describe it.
#[derive(Debug)]
pub struct Described<'a> {
    /// Its method: `X-Forwarded-Method`, else the method of the question itself.
    pub method: &'a str,
    /// Its host: `X-Forwarded-Host`, else `Host`.
    pub host: Option<&'a str>,
    /// Its path: `X-Forwarded-Uri` (Caddy, Traefik), else `X-Original-URI` (nginx), without the
    /// query.
    pub path: Option<&'a str>,
    /// The question's headers.
    pub headers: &'a HeaderMap,
    /// The client, after the trusted proxies.
    pub client: IpAddr,
}

impl<'a> Described<'a> {
    /// The request that `headers` describe, asked about with `method` by a proxy that
    /// forwards `client`.
    pub fn read(method: &'a Method, headers: &'a HeaderMap, client: IpAddr) -> Result<Self, ApiError> {
        // The first of two names the request has, as its own answer (a 400 stops the search).
        let first = |names: &[HeaderName; 2]| -> Result<Option<&'a str>, ApiError> {
            Ok(match header(headers, &names[0])? {
                Some(value) => Some(value),
                None => header(headers, &names[1])?,
            })
        };
        let method = header(headers, &X_FORWARDED_METHOD)?.unwrap_or(method.as_str());
        let host = first(&HOST_NAMES)?;
        let uri = first(&URI_NAMES)?;
        let path = uri.map(|u| u.split_once('?').map_or(u, |(path, _)| path));
        Ok(Self { method, host, path, headers, client })
    }
}

// Names made once, at compile time: a name made from text per request is parsed and checked.
const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const HOST_NAMES: [HeaderName; 2] = [HeaderName::from_static("x-forwarded-host"), HeaderName::from_static("host")];
const URI_NAMES: [HeaderName; 2] =
    [HeaderName::from_static("x-forwarded-uri"), HeaderName::from_static("x-original-uri")];

/// The value of the header `name`, `None` when absent; a 400 naming it when it is not visible
/// ASCII or given twice.
pub(super) fn header<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).into_iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::bad_request("invalid_header", format!("header {name} is given more than once")));
    }
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad_request("invalid_header", format!("header {name} is not visible ASCII")))?;
    Ok(Some(text))
}

/// The answer to a request that lacks what its rule's key is made of.
fn missing(named: &str) -> ApiError {
    ApiError::bad_request("missing_key", format!("the rule's key needs {named}, which the request lacks"))
}
