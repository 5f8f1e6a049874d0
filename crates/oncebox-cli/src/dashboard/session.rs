//! Logging in: the token is exchanged for a session cookie (`HttpOnly`,
//! `SameSite=Strict`), and each session carries the CSRF token its forms must send back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use super::form::Fields;
use super::{Dashboard, Shared, view};
use crate::config::Secret;

/// The session cookie's name.
const COOKIE: &str = "oncebox_session";

/// Sessions kept at most; a login beyond it ends the one closest to expiry.
const MAX_SESSIONS: usize = 1024;

/// The logged-in sessions, in memory: a restart logs everyone out.
pub(super) struct Sessions {
    token: Secret,
    ttl: Duration,
    secure: bool,
    open: Mutex<HashMap<String, Session>>,
}

/// One login.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// What every form that changes data must carry.
    pub(super) csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether a submitted form carries this session's CSRF token.
    pub(super) fn sent_by_form(&self, fields: &Fields) -> bool {
        fields
            .get("csrf")
            .is_some_and(|sent| same(sent.as_bytes(), self.csrf.as_bytes()))
    }
}

impl Sessions {
    pub(super) fn new(token: Secret, ttl: Duration, secure: bool) -> Self {
        Self {
            token,
            ttl,
            secure,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The session of `id`, if it is open.
    fn find(&self, id: &str) -> Option<Session> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        match open.get(id) {
            Some(session) if session.expires > Instant::now() => Some(session.clone()),
            Some(_) => {
                open.remove(id);
                None
            }
            None => None,
        }
    }

    /// Opens a session if `token` is the dashboard's; its id.
    fn open(&self, token: &str) -> Option<String> {
        if !same(token.as_bytes(), self.token.expose().as_bytes()) {
            return None;
        }
        let now = Instant::now();
        let id = random();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, session| session.expires > now);
        if open.len() >= MAX_SESSIONS
            && let Some(first) = open
                .iter()
                .min_by_key(|(_, session)| session.expires)
                .map(|(id, _)| id.clone())
        {
            open.remove(&first);
        }
        open.insert(
            id.clone(),
            Session {
                csrf: random(),
                expires: now + self.ttl,
            },
        );
        Some(id)
    }

    fn close(&self, id: &str) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// The `Set-Cookie` value that stores `id` (or, with `None`, removes the cookie).
    fn cookie(&self, base: &str, id: Option<&str>) -> HeaderValue {
        let (value, age) = match id {
            Some(id) => (id, self.ttl.as_secs()),
            None => ("", 0),
        };
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!(
            "{COOKIE}={value}; Path={base}/; Max-Age={age}; HttpOnly; SameSite=Strict{secure}"
        );
        HeaderValue::from_str(&cookie).expect("ids, paths and numbers are valid header text")
    }
}

/// 244 random bits from the operating system's generator, as hex.
fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Compares in time that depends only on the lengths, so that a guess learns nothing
/// from how long the refusal took.
fn same(a: &[u8], b: &[u8]) -> bool {
    let differ = a
        .iter()
        .zip(b)
        .fold(u8::from(a.len() != b.len()), |differ, (x, y)| {
            differ | (x ^ y)
        });
    differ == 0
}

/// The session id the request's cookie names, if any.
fn cookie_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, id)| id)
}

/// Lets a request through only with an open session, which handlers then read as an
/// `Extension<Session>`; sends a browser to the login page otherwise.
pub(super) async fn require(
    State(dashboard): Shared,
    mut request: Request,
    next: Next,
) -> Response {
    let session = cookie_id(request.headers()).and_then(|id| dashboard.sessions.find(id));
    match session {
        Some(session) => {
            request.extensions_mut().insert(session);
            next.run(request).await
        }
        None if request.method() == Method::GET => {
            Redirect::to(&format!("{}/login", dashboard.base)).into_response()
        }
        None => view::error(
            &dashboard,
            None,
            StatusCode::FORBIDDEN,
            "Your session has ended: log in again, then repeat the action.",
        ),
    }
}

pub(super) async fn login_page(State(dashboard): Shared) -> Response {
    login_form(&dashboard, StatusCode::OK, None)
}

pub(super) async fn login(State(dashboard): Shared, body: Bytes) -> Response {
    let fields = Fields::body(&body);
    let token = fields.get("token").unwrap_or_default();
    match dashboard.sessions.open(token) {
        Some(id) => {
            tracing::info!("dashboard: an operator logged in");
            let mut response = Redirect::to(&format!("{}/", dashboard.base)).into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                dashboard.sessions.cookie(&dashboard.base, Some(&id)),
            );
            response
        }
        None => {
            tracing::warn!("dashboard: a login with a wrong token was refused");
            login_form(
                &dashboard,
                StatusCode::UNAUTHORIZED,
                Some("That token is not the dashboard's."),
            )
        }
    }
}

pub(super) async fn logout(
    State(dashboard): Shared,
    axum::Extension(session): axum::Extension<Session>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !session.sent_by_form(&Fields::body(&body)) {
        return view::csrf_refused(&dashboard, &session);
    }
    if let Some(id) = cookie_id(&headers) {
        dashboard.sessions.close(id);
    }
    let mut response = Redirect::to(&format!("{}/login", dashboard.base)).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        dashboard.sessions.cookie(&dashboard.base, None),
    );
    response
}

fn login_form(dashboard: &Arc<Dashboard>, status: StatusCode, problem: Option<&str>) -> Response {
    let body = html! {
        form.login method="post" action={ (dashboard.base) "/login" } {
            h1 { "oncebox" }
            @if let Some(problem) = problem {
                p.problem role="alert" { (problem) }
            }
            label for="token" { "Token" }
            input #token type="password" name="token" autocomplete="current-password" required autofocus;
            button type="submit" { "Log in" }
        }
    };
    view::page_with_status(dashboard, None, status, "Log in", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_equal_bytes_are_the_same() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!same(b"", b"x"));
        assert!(same(b"", b""));
    }

    #[test]
    fn a_session_opens_only_with_the_token_and_ends_when_closed() {
        let sessions = Sessions::new(
            serde_json::from_str("\"a-token-long-enough\"").expect("a secret"),
            Duration::from_secs(60),
            false,
        );
        assert!(sessions.open("a-token-long-enougH").is_none());
        let id = sessions.open("a-token-long-enough").expect("a session");
        let session = sessions.find(&id).expect("open");
        assert_ne!(session.csrf, id);
        sessions.close(&id);
        assert!(sessions.find(&id).is_none());
    }

    /// The longest `dashboard.session_ttl` the configuration accepts: a login opens a
    /// session (`Instant + ttl` must not overflow) and its cookie lasts as long.
    #[test]
    fn a_login_with_the_longest_session_ttl_accepted_works() {
        let config = crate::config::Config::load_from_text(
            &format!(
                "[dashboard]\nsession_ttl = \"{}\"\n",
                crate::config::Span::MAX
            ),
            &[],
        )
        .expect("the longest session_ttl is accepted");
        let ttl = config.dashboard.session_ttl.get();
        let sessions = Sessions::new(
            serde_json::from_str("\"a-token-long-enough\"").expect("a secret"),
            ttl,
            false,
        );
        let id = sessions.open("a-token-long-enough").expect("a session");
        assert!(sessions.find(&id).is_some(), "open");
        let cookie = sessions.cookie("", Some(&id));
        let cookie = cookie.to_str().expect("text");
        assert!(
            cookie.contains(&format!("Max-Age={};", ttl.as_secs())),
            "{cookie}"
        );
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped_to_the_base_path() {
        let sessions = Sessions::new(
            serde_json::from_str("\"a-token-long-enough\"").expect("a secret"),
            Duration::from_secs(60),
            true,
        );
        let cookie = sessions.cookie("/ops", Some("abc"));
        assert_eq!(
            cookie,
            "oncebox_session=abc; Path=/ops/; Max-Age=60; HttpOnly; SameSite=Strict; Secure"
        );
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; oncebox_session=xyz; b=2"),
        );
        assert_eq!(cookie_id(&headers), Some("xyz"));
    }
}
