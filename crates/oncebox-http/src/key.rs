//! The idempotency key of a request, validated.

use std::fmt;

use http::{HeaderMap, HeaderName};

use crate::options::MAX_KEY_LEN;

/// A valid idempotency key: 1 to 255 visible ASCII characters (`!` to `~`).
///
/// The header value is taken as it is (Stripe's form, `Idempotency-Key: 8e03978e-...`)
/// or, as the IETF draft writes it, as a structured-field string in double quotes
/// (`Idempotency-Key: "8e03978e-..."`), whose quotes are not part of the key.
///
/// The layer puts the key of each request it handles into the request's extensions, so
/// handlers can read it (with the `axum` feature, as an extractor).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Validates `raw` (a header value's bytes).
    ///
    /// # Errors
    ///
    /// [`KeyError`] says what is wrong; the layer answers it with `400`.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let key = match raw {
            [b'"', inner @ .., b'"'] => inner,
            _ => raw,
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        // Visible ASCII is UTF-8.
        Ok(Self(String::from_utf8_lossy(key).into_owned()))
    }

    /// The key in `headers` under `name`: `Ok(None)` if absent.
    ///
    /// # Errors
    ///
    /// [`KeyError`] for a malformed key or more than one header.
    pub fn from_headers(headers: &HeaderMap, name: &HeaderName) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(first.as_bytes()).map(Some)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header is there but empty.
    #[error("the idempotency key is empty")]
    Empty,
    /// Longer than 255 bytes.
    #[error("the idempotency key is {len} bytes long; at most {MAX_KEY_LEN} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A character outside visible ASCII (`!` to `~`): spaces, control or non-ASCII bytes.
    #[error("the idempotency key may only hold visible ASCII characters ('!' to '~')")]
    NotVisibleAscii,
    /// The header was sent more than once.
    #[error("the idempotency key header was sent more than once")]
    Repeated,
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn accepts_visible_ascii_plain_or_quoted() {
        assert_eq!(
            IdempotencyKey::parse(b"abc-123").unwrap().as_str(),
            "abc-123"
        );
        assert_eq!(IdempotencyKey::parse(b"\"abc\"").unwrap().as_str(), "abc");
        assert_eq!(IdempotencyKey::parse(b"\"").unwrap().as_str(), "\"");
        let longest = "k".repeat(MAX_KEY_LEN);
        assert!(IdempotencyKey::parse(longest.as_bytes()).is_ok());
    }

    #[test]
    fn refuses_bad_keys() {
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(
            IdempotencyKey::parse(long.as_bytes()),
            Err(KeyError::TooLong { len: 256 })
        );
        for bad in [&b"a b"[..], b"a\tb", "é".as_bytes(), b"\x7f", b"a\x00"] {
            assert_eq!(IdempotencyKey::parse(bad), Err(KeyError::NotVisibleAscii));
        }
    }

    #[test]
    fn finds_one_header() {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers, &name), Ok(None));
        headers.append(&name, HeaderValue::from_static("k"));
        assert!(
            IdempotencyKey::from_headers(&headers, &name)
                .unwrap()
                .is_some()
        );
        headers.append(&name, HeaderValue::from_static("k2"));
        assert_eq!(
            IdempotencyKey::from_headers(&headers, &name),
            Err(KeyError::Repeated)
        );
    }
}
