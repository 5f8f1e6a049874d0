//! Who sent a request: the first part of a key's scope.

use std::fmt::Write as _;

use http::HeaderName;
use http::request::Parts;

/// Finds the principal of a request (an API key, an authenticated subject, a tenant), so
/// that two principals using the same key never see each other's responses.
///
/// Any `Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static` closure is a
/// `Principal`:
///
/// ```
/// use oncebox_http::Principal;
///
/// // The tenant of a request, from a header set by an authenticating proxy.
/// let tenant = |parts: &http::request::Parts| {
///     parts.headers.get("x-tenant-id")?.to_str().ok().map(str::to_owned)
/// };
/// # fn is_principal<P: Principal>(_: &P) {}
/// # is_principal(&tenant);
/// ```
///
/// An authentication layer that runs first can leave the subject in the request's
/// extensions for the closure to read.
///
/// `None` puts the request in the anonymous scope, shared by every request without a
/// principal. Where clients authenticate, make sure authentication runs before this
/// layer and always yields a principal. Principals are hashed into the scope id, never
/// stored in clear, so an API key is fine as a principal.
pub trait Principal: Clone + Send + Sync + 'static {
    /// The principal of the request with these parts, or `None` for anonymous.
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

/// No principal: every request shares one scope (per method and route). For services
/// with one client, or behind a gateway that already separates clients.
#[derive(Debug, Clone, Copy, Default)]
pub struct Anonymous;

impl Principal for Anonymous {
    fn principal(&self, _parts: &Parts) -> Option<String> {
        None
    }
}

/// The value of a request header as the principal, such as `X-Api-Key` or
/// `X-Tenant-Id`. A request without the header is anonymous.
///
/// Values that are not UTF-8 are told apart from every UTF-8 value (they are encoded in
/// hex behind a character no header value holds), so no two distinct values share a
/// scope.
#[derive(Debug, Clone)]
pub struct HeaderPrincipal {
    name: HeaderName,
}

impl HeaderPrincipal {
    /// The principal is the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl Principal for HeaderPrincipal {
    fn principal(&self, parts: &Parts) -> Option<String> {
        let value = parts.headers.get(&self.name)?;
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

#[cfg(test)]
mod tests {
    use http::{HeaderValue, Request};

    use super::*;

    fn parts(value: Option<HeaderValue>) -> Parts {
        let mut request = Request::new(());
        if let Some(value) = value {
            request.headers_mut().insert("x-api-key", value);
        }
        request.into_parts().0
    }

    #[test]
    fn header_principal() {
        let p = HeaderPrincipal::new(HeaderName::from_static("x-api-key"));
        assert_eq!(p.principal(&parts(None)), None);
        assert_eq!(
            p.principal(&parts(Some(HeaderValue::from_static("k1"))))
                .as_deref(),
            Some("k1")
        );
        let opaque = HeaderValue::from_bytes(&[0xff, 0x41]).unwrap();
        assert_eq!(p.principal(&parts(Some(opaque))).as_deref(), Some("\0ff41"));
    }

    #[test]
    fn closures_are_principals() {
        let fixed = |_: &Parts| Some("tenant-1".to_owned());
        assert_eq!(fixed.principal(&parts(None)).as_deref(), Some("tenant-1"));
        assert_eq!(Anonymous.principal(&parts(None)), None);
    }
}
