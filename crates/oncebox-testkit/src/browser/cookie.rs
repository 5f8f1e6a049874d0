//! The cookies a page left in the browser, with the attributes tests check.

/// A cookie the browser holds, as WebDriver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cookie {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// The path it is sent for, when one was set.
    pub path: Option<String>,
    /// Whether scripts of the page cannot read it (`HttpOnly`).
    pub http_only: bool,
    /// Whether it is only sent over HTTPS (`Secure`).
    pub secure: bool,
    /// Its `SameSite` attribute, when the browser reports one.
    pub same_site: Option<SameSite>,
}

/// The `SameSite` attribute of a [`Cookie`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SameSite {
    /// Sent only with requests from the cookie's own site.
    Strict,
    /// Also sent when a person follows a link from another site.
    Lax,
    /// Sent with every request, including those of other sites (requires `Secure`).
    None,
}

impl Cookie {
    pub(super) fn from_webdriver(cookie: &fantoccini::cookies::Cookie<'_>) -> Self {
        Self {
            name: cookie.name().to_owned(),
            value: cookie.value().to_owned(),
            path: cookie.path().map(str::to_owned),
            http_only: cookie.http_only().unwrap_or(false),
            secure: cookie.secure().unwrap_or(false),
            same_site: cookie.same_site().map(|same_site| match same_site {
                cookie::SameSite::Strict => SameSite::Strict,
                cookie::SameSite::Lax => SameSite::Lax,
                cookie::SameSite::None => SameSite::None,
            }),
        }
    }
}
