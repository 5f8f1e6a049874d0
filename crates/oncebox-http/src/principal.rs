//! Who sent a request: the first part of a key's scope.

use std::fmt::Write as _;

use http::request::Parts;
use http::{HeaderName, header};

/// Finds the principal of a request (an API key, an authenticated subject, a tenant), so
/// that two callers using the same key never see each other's responses: a stored
/// response is replayed only to requests of the principal that made it.
///
/// Every [`IdempotencyLayer`](crate::IdempotencyLayer) is built with one. Choose
/// something the caller cannot forge:
///
/// - [`HeaderPrincipal::authorization()`]: the request's `Authorization` header, for
///   callers with long-lived credentials (API keys, Basic). A client whose bearer token
///   changes between a request and its retry (an OAuth refresh) lands in another scope,
///   and its retry runs again: scope such callers by their subject instead.
/// - [`HeaderPrincipal::new`]: another credential header, such as `X-Api-Key`, or a
///   header your gateway sets after authenticating (and strips from what callers send).
/// - a closure reading the subject your authentication layer left in the request's
///   extensions (run that layer before this one).
/// - [`SharedScope`]: one scope for every caller, an explicit opt-in for services with a
///   single trusted client.
///
/// Any `Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static` closure is a
/// `Principal`:
///
/// ```
/// use oncebox_http::Principal;
///
/// /// The user id an authentication layer (run before this one) left in the extensions.
/// #[derive(Clone)]
/// struct UserId(String);
///
/// let subject = |parts: &http::request::Parts| {
///     parts.extensions.get::<UserId>().map(|user| user.0.clone())
/// };
/// # fn is_principal<P: Principal>(_: &P) {}
/// # is_principal(&subject);
/// ```
///
/// `None`, or an empty string, means the request does not say who sent it: the layer
/// refuses such a request when it carries a key, with `400`
/// ([`principal-missing`](crate::problem#principal-missing)), rather than let it share a
/// scope with other unidentified callers. Requests without a key pass through as ever.
///
/// Principals are hashed (SHA-256) into the scope id, never stored in clear, so a
/// credential is fine as a principal.
pub trait Principal: Clone + Send + Sync + 'static {
    /// The principal of the request with these parts, or `None` if it has none.
    fn principal(&self, parts: &Parts) -> Option<String>;
}

impl<F> Principal for F
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn principal(&self, parts: &Parts) -> Option<String> {
        self(parts)
    }
}

/// The value of a request header as the principal: `Authorization`
/// ([`authorization`](Self::authorization)), `X-Api-Key`, or a tenant header your
/// gateway sets.
///
/// A request without the header, with an empty value, or with the header more than once
/// (which value would its authentication have checked?) has no principal, and is
/// refused when it carries a key.
///
/// Values that are not UTF-8 are told apart from every UTF-8 value (they are encoded in
/// hex behind a character no header value holds), so no two distinct values share a
/// scope.
///
/// The header must be one the caller cannot forge: a secret credential, or a value set
/// by a proxy that authenticates callers and overwrites what they send. A caller who
/// can put another caller's value in the header gets that caller's stored responses.
#[derive(Debug, Clone)]
pub struct HeaderPrincipal {
    name: HeaderName,
}

impl HeaderPrincipal {
    /// The principal is the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// The principal is the request's `Authorization` header: each credential has its
    /// own keys, as Stripe scopes keys per API key.
    pub fn authorization() -> Self {
        Self::new(header::AUTHORIZATION)
    }
}

impl Principal for HeaderPrincipal {
    fn principal(&self, parts: &Parts) -> Option<String> {
        let mut values = parts.headers.get_all(&self.name).iter();
        let value = values.next()?;
        if value.is_empty() || values.next().is_some() {
            return None;
        }
        Some(match std::str::from_utf8(value.as_bytes()) {
            Ok(text) => text.to_owned(),
            Err(_) => {
                let mut encoded = String::with_capacity(1 + 2 * value.len());
                encoded.push('\0');
                for byte in value.as_bytes() {
                    let _ = write!(encoded, "{byte:02x}");
                }
                encoded
            }
        })
    }
}

/// One scope for every caller: **any caller who sends (or guesses) another caller's key
/// gets that caller's stored response**, and the two requests count as one.
///
/// Use it only where every caller may see every other caller's responses: a service
/// with a single client, or behind a gateway that sends each client to its own
/// instance with its own store. Anywhere else, scope keys by a [`Principal`] that
/// identifies the caller.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedScope;

impl SharedScope {
    /// The principal every request shares. No header value holds a NUL character, and
    /// [`HeaderPrincipal`] puts one only before hex digits, so no header-derived
    /// principal can join this scope.
    const PRINCIPAL: &'static str = "\0shared";
}

impl Principal for SharedScope {
    fn principal(&self, _parts: &Parts) -> Option<String> {
        Some(Self::PRINCIPAL.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, Request};

    use super::*;

    fn parts(values: &[HeaderValue]) -> Parts {
        let mut request = Request::new(());
        for value in values {
            request.headers_mut().append("x-api-key", value.clone());
        }
        request.into_parts().0
    }

    #[test]
    fn header_principal() {
        let p = HeaderPrincipal::new(HeaderName::from_static("x-api-key"));
        assert_eq!(p.principal(&parts(&[])), None);
        assert_eq!(p.principal(&parts(&[HeaderValue::from_static("")])), None);
        assert_eq!(
            p.principal(&parts(&[HeaderValue::from_static("k1")]))
                .as_deref(),
            Some("k1")
        );
        let twice = [
            HeaderValue::from_static("k1"),
            HeaderValue::from_static("k2"),
        ];
        assert_eq!(p.principal(&parts(&twice)), None, "ambiguous");
        let opaque = HeaderValue::from_bytes(&[0xff, 0x41]).unwrap();
        assert_eq!(p.principal(&parts(&[opaque])).as_deref(), Some("\0ff41"));
    }

    #[test]
    fn authorization_reads_its_header() {
        let mut request = Request::new(());
        request
            .headers_mut()
            .insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        let (parts, ()) = request.into_parts();
        assert_eq!(
            HeaderPrincipal::authorization()
                .principal(&parts)
                .as_deref(),
            Some("Bearer t")
        );
    }

    #[test]
    fn closures_are_principals() {
        let fixed = |_: &Parts| Some("tenant-1".to_owned());
        assert_eq!(fixed.principal(&parts(&[])).as_deref(), Some("tenant-1"));
    }

    #[test]
    fn the_shared_scope_is_out_of_reach_of_headers() {
        let shared = SharedScope.principal(&parts(&[])).unwrap();
        assert!(HeaderValue::from_str(&shared).is_err());
        assert!(!shared[1..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
