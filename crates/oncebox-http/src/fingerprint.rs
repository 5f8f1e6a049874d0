//! The request fingerprint and the scope id of a key, both SHA-256.

use http::Method;
use sha2::{Digest, Sha256};

pub(crate) const FINGERPRINT_LEN: usize = 32;

/// SHA-256 over the method, the path with its query, and the body: a key reused for
/// another request has another fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint([u8; FINGERPRINT_LEN]);

impl Fingerprint {
    pub(crate) fn of(method: &Method, path_and_query: &str, body: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        field(&mut hasher, method.as_str().as_bytes());
        field(&mut hasher, path_and_query.as_bytes());
        hasher.update(body);
        Self(hasher.finalize().into())
    }

    pub(crate) fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    pub(crate) fn as_bytes(&self) -> &[u8; FINGERPRINT_LEN] {
        &self.0
    }
}

/// The dedup id of a key: `http-idem:` and, in hex, the first 128 bits of the SHA-256
/// of the principal, the method, the route and the key. Hashing keeps ids short and
/// principals (which may be credentials) out of the store; 128 bits keep collisions out
/// of reach (2^64 keys for an even chance of one).
pub(crate) fn scope_id(principal: &str, method: &Method, route: &str, key: &str) -> String {
    const PREFIX: &str = "http-idem:";
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hasher = Sha256::new();
    // The tag byte once told principals from their absence; it stays so that ids of
    // keys stored by earlier versions still match.
    hasher.update([1]);
    field(&mut hasher, principal.as_bytes());
    field(&mut hasher, method.as_str().as_bytes());
    field(&mut hasher, route.as_bytes());
    field(&mut hasher, key.as_bytes());
    let digest = hasher.finalize();
    let mut id = String::with_capacity(PREFIX.len() + 32);
    id.push_str(PREFIX);
    for byte in &digest[..16] {
        id.push(char::from(HEX[usize::from(byte >> 4)]));
        id.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    id
}

/// A length-prefixed field, so that no two distinct field lists hash alike.
fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_separates_every_part() {
        let base = scope_id("a", &Method::POST, "/pay", "k");
        assert!(base.starts_with("http-idem:"));
        assert_eq!(base.len(), 10 + 32);
        assert!(
            base[10..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(base, scope_id("a", &Method::POST, "/pay", "k"));
        for other in [
            scope_id("b", &Method::POST, "/pay", "k"),
            scope_id("", &Method::POST, "/pay", "k"),
            scope_id("a", &Method::PATCH, "/pay", "k"),
            scope_id("a", &Method::POST, "/pay2", "k"),
            scope_id("a", &Method::POST, "/pay", "k2"),
            // Moving bytes between fields changes the id.
            scope_id("a/pay", &Method::POST, "", "k"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn scope_ids_are_stable_across_versions() {
        // The id of this scope as every version so far has computed it: a stored key
        // stays found after an upgrade.
        assert_eq!(
            scope_id("a", &Method::POST, "/pay", "k"),
            "http-idem:20c4e535663ecad1609d3b62aa3ae001"
        );
    }

    #[test]
    fn fingerprint_covers_method_path_and_body() {
        let base = Fingerprint::of(&Method::POST, "/pay", b"{}");
        assert_eq!(base, Fingerprint::of(&Method::POST, "/pay", b"{}"));
        assert_ne!(base, Fingerprint::of(&Method::PATCH, "/pay", b"{}"));
        assert_ne!(base, Fingerprint::of(&Method::POST, "/pay?x", b"{}"));
        assert_ne!(base, Fingerprint::of(&Method::POST, "/pay", b"{ }"));
    }
}
