//! What a rule counts a forwarded request as (`key = [...]`, its parts joined into one key)
//! and which requests it applies to (`methods`, `path_prefix`).

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName, Method};
use slidegate::MAX_KEY_LEN;
use slidegate::client_ip;
use slidegate::key::escape_separators;

use crate::api::ApiError;

/// The most parts a rule's `key` may join.
pub const MAX_KEY_PARTS: usize = 8;

/// The most methods a rule's `methods` may list.
pub const MAX_METHODS: usize = 16;

/// The longest method name in `methods`, in bytes (the standard ones have at most 7).
pub const MAX_METHOD_LEN: usize = 32;

/// The longest `path_prefix`, in bytes: each request's path is compared with it.
pub const MAX_PATH_PREFIX: usize = 1024;

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `client_ip`: the client's address (IPv6 by its /64).
    ClientIp,
    /// `header:<Name>`: a request header's value.
    Header(HeaderName),
    /// `method`: the forwarded request's method.
    Method,
    /// `host`: the forwarded request's host.
    Host,
    /// `path`: the forwarded request's path, without its query.
    Path,
}

impl KeyPart {
    /// Parses `client_ip`, `header:<Name>`, `method`, `host`, `path`.
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "client_ip" => Ok(Self::ClientIp),
            "method" => Ok(Self::Method),
            "host" => Ok(Self::Host),
            "path" => Ok(Self::Path),
            _ => match text.strip_prefix("header:") {
                Some(name) => {
                    HeaderName::try_from(name).map(Self::Header).map_err(|_| format!("{name:?} is not a header name"))
                }
                None => Err(format!("unknown key part {text:?}: use client_ip, header:<Name>, method, host or path")),
            },
        }
    }
}

/// Which forwarded requests a rule applies to, and what it counts them as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The key's parts, in order.
    pub key: Vec<KeyPart>,
    /// Only requests of these methods; `None`: every method.
    pub methods: Option<Vec<Method>>,
    /// Only requests whose path starts with this.
    pub path_prefix: Option<String>,
}

impl Default for Caller {
    fn default() -> Self {
        Self { key: vec![KeyPart::ClientIp], methods: None, path_prefix: None }
    }
}

/// A field of a rule's caller that cannot be used: which (`key`, `methods`, `path_prefix`) and why.
pub type CallerError = (&'static str, String);

impl Caller {
    /// The caller a rule's `key`, `methods` and `path_prefix` describe.
    pub fn parse(
        key: Option<&[String]>,
        methods: Option<&[String]>,
        path_prefix: Option<&str>,
    ) -> Result<Self, CallerError> {
        let mut caller = Self::default();
        if let Some(parts) = key {
            if parts.is_empty() || parts.len() > MAX_KEY_PARTS {
                return Err(("key", format!("list 1 to {MAX_KEY_PARTS} parts, got {}", parts.len())));
            }
            caller.key = parts.iter().map(|p| KeyPart::parse(p)).collect::<Result<_, _>>().map_err(|m| ("key", m))?;
        }
        if let Some(names) = methods {
            if names.is_empty() || names.len() > MAX_METHODS {
                return Err(("methods", format!("list 1 to {MAX_METHODS} methods, got {}", names.len())));
            }
            let method = |name: &String| match Method::from_bytes(name.as_bytes()) {
                Ok(m) if name.len() <= MAX_METHOD_LEN => Ok(m),
                _ => Err(("methods", format!("{name:?} is not a method of at most {MAX_METHOD_LEN} bytes"))),
            };
            caller.methods = Some(names.iter().map(method).collect::<Result<_, _>>()?);
        }
        if let Some(prefix) = path_prefix {
            if !prefix.starts_with('/') || prefix.len() > MAX_PATH_PREFIX {
                let message = format!("must start with / and be at most {MAX_PATH_PREFIX} bytes");
                return Err(("path_prefix", message));
            }
            caller.path_prefix = Some(prefix.to_owned());
        }
        Ok(caller)
    }

    /// Appends `request`'s key: its parts, each but the last escaped and followed by `|`. A
    /// part the request lacks, or one longer than [`MAX_KEY_LEN`], is refused before it is copied.
    pub fn write_key(&self, request: &Described<'_>, out: &mut String) -> Result<(), ApiError> {
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
                if out.len() + value.len() > MAX_KEY_LEN {
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
