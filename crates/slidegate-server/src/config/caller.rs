//! A rule's forward-auth caller as its `key`, `methods` and `path_prefix` fields write it:
//! which parts make a forwarded request's key, and which requests the rule applies to.

use axum::http::{HeaderName, Method};

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
}
