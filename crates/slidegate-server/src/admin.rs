//! The admin token: kept as its SHA-256 digest and compared in constant time, so neither the
//! comparison's time nor a length check tells a caller how much of a guess was right.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The token of the admin routes (`admin_token` in the rules file).
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// The token `token`.
    pub fn new(token: &str) -> Self {
        Self { digest: Sha256::digest(token.as_bytes()).into() }
    }

    /// Whether `given` is the token. Both sides are digests of one length, compared in constant
    /// time: a guess of any length takes as long as any other.
    pub fn matches(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        self.digest.ct_eq(&given).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::AdminToken;

    #[test]
    fn only_the_token_itself_matches() {
        let token = AdminToken::new("s3cret");
        assert!(token.matches(b"s3cret"));
        for guess in ["", "s", "s3cre", "s3cret ", "S3cret", "s3cret\0", "x3cret"] {
            assert!(!token.matches(guess.as_bytes()), "{guess:?}");
        }
        assert_eq!(format!("{token:?}"), "AdminToken(***)", "the digest stays out of logs");
    }
}
