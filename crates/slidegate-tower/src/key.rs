//! What a request is counted as: its client IP ([`crate::PeerIp`]), a header, the
//! authenticated user, the route, or anything a closure computes — alone or combined.

use std::fmt::Display;
use std::marker::PhantomData;

use http::HeaderName;
use http::request::Parts;
use slidegate::MAX_KEY_LEN;
use slidegate::key::escape_separators;

use crate::Rejection;

/// Computes a request's key for a rule. Built-in: [`crate::PeerIp`], [`Header`],
/// [`Extension`], [`Route`]; any `Fn(&Parts) -> Option<String>` is one too; a pair `(A, B)`
/// combines two (`a|b`).
///
/// The layer holds every key to the limiter's bounds: a key that is empty, or longer than
/// [`slidegate::MAX_KEY_LEN`] bytes together with `<rule>:{…}`, is refused with a
/// [`Rejection`] ([`KeyExtractor::too_long`] says which), never passed on.
pub trait KeyExtractor: Send + Sync + 'static {
    /// Appends this request's key to `out`: `Ok(true)`; `Ok(false)` when the request has none
    /// (then the rule does not apply to it: an anonymous request is not limited by a per-user
    /// rule); `Err` when the request carries a key that cannot be used.
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection>;

    /// The answer to a key of this extractor that is too long: `400 key_too_long` unless the
    /// extractor knows better (a header: `431`; the path: `414`).
    fn too_long(&self) -> Rejection {
        Rejection::KeyTooLong
    }
}

/// Runs `extractor` and holds what it appended to the limiter's bounds: not empty, and `out`
/// (the backend key so far) not over [`MAX_KEY_LEN`].
pub(crate) fn extract_part<E: KeyExtractor + ?Sized>(
    extractor: &E,
    request: &Parts,
    out: &mut String,
) -> Result<bool, Rejection> {
    let start = out.len();
    if !extractor.extract(request, out)? {
        return Ok(false);
    }
    match out.len() {
        len if len == start => Err(Rejection::EmptyKey),
        len if len > MAX_KEY_LEN => Err(extractor.too_long()),
        _ => Ok(true),
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        Ok(self(request).map(|k| out.push_str(&k)).is_some())
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for (A, B) {
    /// `a|b`, with `|` and `\` inside `a` escaped by a `\`: the first unescaped `|` ends the
    /// first part, so a client who controls either part cannot land on another pair's key
    /// (`x|y` + `z` is `x\|y|z`, not `x` + `y|z`).
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        let start = out.len();
        if !extract_part(&self.0, request, out)? {
            return Ok(false);
        }
        escape_separators(out, start);
        out.push('|');
        extract_part(&self.1, request, out)
    }

    fn too_long(&self) -> Rejection {
        // Each part is held to the bound as it is appended; what is left over is the last's.
        self.1.too_long()
    }
}

/// The value of a request header (for example an API key, `x-api-key`). A request without the
/// header has no key; one whose value is empty or not visible ASCII is
/// `400 invalid_key`, longer than [`slidegate::MAX_KEY_LEN`] `431 header_too_long`.
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl Header {
    /// The header called `name`.
    pub fn new(name: HeaderName) -> Self {
        Self(name)
    }
}

impl KeyExtractor for Header {
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        let Some(value) = request.headers.get(&self.0) else { return Ok(false) };
        // Before anything is copied: a value this long can never make a key.
        if value.len() > MAX_KEY_LEN {
            return Err(Rejection::HeaderTooLong);
        }
        out.push_str(value.to_str().map_err(|_| Rejection::InvalidKey)?);
        Ok(true)
    }

    fn too_long(&self) -> Rejection {
        Rejection::HeaderTooLong
    }
}

/// A value an earlier layer put in the request's extensions — typically the authenticated user
/// (`Extension::<UserId>::new()`), formatted with `Display`.
pub struct Extension<T>(PhantomData<fn() -> T>);

impl<T> Extension<T> {
    /// The extension of type `T`.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for Extension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for Extension<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(std::any::type_name::<Self>())
    }
}

impl<T: Display + Send + Sync + 'static> KeyExtractor for Extension<T> {
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        use std::fmt::Write;
        Ok(request.extensions.get::<T>().is_some_and(|v| write!(out, "{v}").is_ok()))
    }
}

/// The request's path: one limit per endpoint, shared by every client. A path longer than
/// [`slidegate::MAX_KEY_LEN`] is `414 uri_too_long`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

impl KeyExtractor for Route {
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        let path = request.uri.path();
        if path.len() > MAX_KEY_LEN {
            return Err(Rejection::UriTooLong);
        }
        out.push_str(path);
        Ok(true)
    }

    fn too_long(&self) -> Rejection {
        Rejection::UriTooLong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &[u8])]) -> Parts {
        let mut b = http::Request::builder().uri("/login");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    fn key(e: &impl KeyExtractor, p: &Parts) -> Result<Option<String>, Rejection> {
        let mut out = String::new();
        Ok(extract_part(e, p, &mut out)?.then_some(out))
    }

    #[test]
    fn extractors_combine() {
        #[derive(Clone)]
        struct User(u32);
        impl Display for User {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "u{}", self.0)
            }
        }
        let mut p = request(&[("x-api-key", b"k1")]);
        assert_eq!(key(&Extension::<User>::new(), &p), Ok(None), "anonymous");
        p.extensions.insert(User(42));
        let both = (Extension::<User>::new(), (Header::new(HeaderName::from_static("x-api-key")), Route));
        assert_eq!(key(&both, &p), Ok(Some("u42|k1|/login".to_owned())));
        let closure = |p: &Parts| p.uri.query().map(str::to_owned);
        assert_eq!(key(&closure, &p), Ok(None));
    }

    #[test]
    fn a_separator_in_a_part_cannot_reach_another_pair() {
        let pair = (Header::new(HeaderName::from_static("a")), Header::new(HeaderName::from_static("b")));
        let one = key(&pair, &request(&[("a", b"x|y"), ("b", b"z")]));
        let other = key(&pair, &request(&[("a", b"x"), ("b", b"y|z")]));
        assert_eq!(one, Ok(Some("x\\|y|z".to_owned())));
        assert_eq!(other, Ok(Some("x|y|z".to_owned())));
        let escaped = key(&pair, &request(&[("a", b"x\\"), ("b", b"|z")]));
        assert_eq!(escaped, Ok(Some("x\\\\||z".to_owned())), "a trailing backslash is escaped too");
    }

    #[test]
    fn a_header_key_that_cannot_be_counted_is_refused_not_skipped() {
        let api_key = Header::new(HeaderName::from_static("x-api-key"));
        assert_eq!(key(&api_key, &request(&[])), Ok(None), "absent: the rule does not apply");
        assert_eq!(key(&api_key, &request(&[("x-api-key", b"")])), Err(Rejection::EmptyKey));
        assert_eq!(key(&api_key, &request(&[("x-api-key", b"k\xff")])), Err(Rejection::InvalidKey));
        let long = vec![b'k'; MAX_KEY_LEN + 1];
        assert_eq!(key(&api_key, &request(&[("x-api-key", &long)])), Err(Rejection::HeaderTooLong));
        // Within the bound alone, over it once combined: still the header's answer.
        let half = vec![b'k'; MAX_KEY_LEN / 2 + 1];
        let twice = (Header::new(HeaderName::from_static("a")), Header::new(HeaderName::from_static("b")));
        assert_eq!(key(&twice, &request(&[("a", &half), ("b", &half)])), Err(Rejection::HeaderTooLong));
        let empty = |_: &Parts| Some(String::new());
        assert_eq!(key(&empty, &request(&[])), Err(Rejection::EmptyKey), "a closure's empty key too");
    }
}
