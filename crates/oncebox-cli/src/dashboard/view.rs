//! The frame every page shares, the embedded stylesheet, and how values are shown:
//! times, ages, statuses, payloads and the published-per-minute chart.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use oncebox::spool::{MinuteCount, RowStatus};

use super::Dashboard;
use super::session::Session;

/// The stylesheet, embedded in the binary: no page loads anything from elsewhere.
const STYLE: &str = include_str!("style.css");

pub(super) async fn stylesheet() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// A page with the navigation (when logged in) and `body`.
pub(super) fn page(
    dashboard: &Dashboard,
    session: Option<&Session>,
    title: &str,
    body: Markup,
) -> Response {
    page_with_status(dashboard, session, StatusCode::OK, title, body)
}

pub(super) fn page_with_status(
    dashboard: &Dashboard,
    session: Option<&Session>,
    status: StatusCode,
    title: &str,
    body: Markup,
) -> Response {
    let base = &dashboard.base;
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · oncebox" }
                link rel="stylesheet" href={ (base) "/assets/style.css" };
            }
            body {
                @if let Some(session) = session {
                    header {
                        nav {
                            a.brand href={ (base) "/" } { "oncebox" }
                            a href={ (base) "/" } { "Overview" }
                            a href={ (base) "/messages" } { "Messages" }
                            a href={ (base) "/inbox" } { "Inbox" }
                            a href={ (base) "/failures" } { "Failures" }
                            a href={ (base) "/keys" } { "Keys" }
                        }
                        div.session {
                            @if dashboard.read_only {
                                span.badge.read-only title="dashboard.read_only: no action is offered" { "read-only" }
                            }
                            form method="post" action={ (base) "/logout" } {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button.link type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    };
    (status, Html(markup.into_string())).into_response()
}

/// A page that says what went wrong.
pub(super) fn error(
    dashboard: &Dashboard,
    session: Option<&Session>,
    status: StatusCode,
    message: &str,
) -> Response {
    let body = html! {
        h1 { (status.canonical_reason().unwrap_or("Error")) }
        p.problem role="alert" { (message) }
    };
    page_with_status(dashboard, session, status, "Error", body)
}

/// The refusal of a form without this session's CSRF token.
pub(super) fn csrf_refused(dashboard: &Dashboard, session: &Session) -> Response {
    error(
        dashboard,
        Some(session),
        StatusCode::FORBIDDEN,
        "The form did not carry this session's CSRF token, so nothing was changed. Reload the page and try again.",
    )
}

/// The refusal of a change in read-only mode.
pub(super) fn read_only_refused(dashboard: &Dashboard, session: &Session) -> Response {
    error(
        dashboard,
        Some(session),
        StatusCode::FORBIDDEN,
        "This dashboard is read-only (dashboard.read_only): nothing can be changed from it.",
    )
}

/// A store error: logged, and shown with its message.
pub(super) fn store_failed(
    dashboard: &Dashboard,
    session: &Session,
    error: &oncebox::Error,
) -> Response {
    tracing::warn!(%error, "dashboard: the store failed");
    self::error(
        dashboard,
        Some(session),
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("The store could not answer: {error}"),
    )
}

/// A time as RFC 3339 UTC, to the second.
pub(super) fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// An age such as `3m 12s`.
pub(super) fn age(age: Duration) -> String {
    humantime::format_duration(Duration::from_secs(age.as_secs())).to_string()
}

pub(super) fn status_name(status: RowStatus) -> &'static str {
    match status {
        RowStatus::Pending => "pending",
        RowStatus::Done => "published",
        RowStatus::Dead => "dead",
        _ => "unknown",
    }
}

pub(super) fn status_badge(status: RowStatus) -> Markup {
    let name = status_name(status);
    html! { span class={ "badge " (name) } { (name) } }
}

/// How a payload is shown: JSON pretty-printed, text as it is, anything else as a hex
/// dump with its printable bytes beside.
pub(super) enum Payload {
    Json(String),
    Text(String),
    Hex(String),
}

impl Payload {
    pub(super) fn of(bytes: &[u8]) -> Self {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes)
            && let Ok(pretty) = serde_json::to_string_pretty(&value)
        {
            return Self::Json(pretty);
        }
        match std::str::from_utf8(bytes) {
            Ok(text) if !text.chars().any(|c| c.is_control() && !c.is_whitespace()) => {
                Self::Text(text.to_owned())
            }
            _ => Self::Hex(hex_dump(bytes)),
        }
    }

    pub(super) fn label(&self) -> &'static str {
        match self {
            Self::Json(_) => "JSON",
            Self::Text(_) => "text",
            Self::Hex(_) => "bytes (hex)",
        }
    }

    pub(super) fn text(&self) -> &str {
        match self {
            Self::Json(text) | Self::Text(text) | Self::Hex(text) => text,
        }
    }
}

/// Sixteen bytes a line: offset, hex, and the printable ASCII bytes.
fn hex_dump(bytes: &[u8]) -> String {
    let mut dump = String::new();
    for (line, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(dump, "{:08x}  ", line * 16);
        for column in 0..16 {
            match chunk.get(column) {
                Some(byte) => {
                    let _ = write!(dump, "{byte:02x} ");
                }
                None => dump.push_str("   "),
            }
        }
        dump.push(' ');
        dump.extend(chunk.iter().map(|&byte| {
            if byte.is_ascii_graphic() || byte == b' ' {
                char::from(byte)
            } else {
                '.'
            }
        }));
        dump.push('\n');
    }
    dump
}

/// The W3C trace id a `traceparent` header carries, if it is well-formed.
pub(super) fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32
        && trace.bytes().all(|b| b.is_ascii_hexdigit())
        && trace.bytes().any(|b| b != b'0'))
    .then_some(trace)
}

/// Published per minute over the last `minutes` minutes ending at `now`, as an SVG bar
/// chart (markup, not a script: the page's content security policy allows no script).
pub(super) fn chart(counts: &[MinuteCount], now: SystemTime, minutes: u32) -> Markup {
    const WIDTH: u32 = 600;
    const HEIGHT: u32 = 80;
    let bar = WIDTH / minutes.max(1);
    let start = now - Duration::from_secs(u64::from(minutes) * 60);
    let mut bars = vec![0u64; minutes as usize];
    for count in counts {
        if let Ok(after) = count.minute.duration_since(start) {
            let index = usize::try_from(after.as_secs() / 60).unwrap_or(usize::MAX);
            if let Some(slot) = bars.get_mut(index) {
                *slot += count.published;
            }
        }
    }
    let peak = bars.iter().copied().max().unwrap_or(0).max(1);
    let total: u64 = bars.iter().sum();
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } preserveAspectRatio="none" role="img"
                aria-label={ (total) " messages published in the last " (minutes) " minutes" } {
                @for (index, &count) in bars.iter().enumerate() {
                    @let height = scaled(count, peak, HEIGHT);
                    rect x=(index as u32 * bar) y=(HEIGHT - height) width=(bar.saturating_sub(1).max(1)) height=(height) {
                        title { (count) " published" }
                    }
                }
            }
            div.axis { span { (minutes) " minutes ago" } span { "now" } }
            figcaption { (total) " published in the last " (minutes) " minutes (peak " (peak) " a minute)" }
        }
    }
}

/// `count` of `peak` as a bar height of at most `height`, at least 1 when not zero.
fn scaled(count: u64, peak: u64, height: u32) -> u32 {
    if count == 0 {
        return 0;
    }
    let scaled = count.saturating_mul(u64::from(height)) / peak;
    u32::try_from(scaled).unwrap_or(height).clamp(1, height)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_pretty_printed_text_kept_and_bytes_dumped() {
        assert!(
            matches!(Payload::of(br#"{"a":1}"#), Payload::Json(text) if text == "{\n  \"a\": 1\n}")
        );
        assert!(matches!(Payload::of(b"plain <b>"), Payload::Text(text) if text == "plain <b>"));
        let Payload::Hex(dump) = Payload::of(&[0, 1, b'A', 0xff]) else {
            panic!("bytes are dumped as hex");
        };
        assert_eq!(
            dump,
            format!("00000000  00 01 41 ff {} ..A.\n", "   ".repeat(12))
        );
    }

    #[test]
    fn a_trace_id_is_read_from_a_valid_traceparent_only() {
        assert_eq!(
            trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(
            trace_id("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            None
        );
        assert_eq!(trace_id("garbage"), None);
    }

    #[test]
    fn bars_are_scaled_to_the_peak() {
        assert_eq!(scaled(0, 10, 80), 0);
        assert_eq!(scaled(10, 10, 80), 80);
        assert_eq!(scaled(1, 1000, 80), 1, "a minute with any message shows");
    }

    #[test]
    fn the_chart_places_each_minute_in_its_bar() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(3600 * 24);
        let counts = [
            MinuteCount {
                minute: now - Duration::from_secs(60),
                published: 7,
            },
            MinuteCount {
                minute: now - Duration::from_secs(7200),
                published: 99,
            },
        ];
        let markup = chart(&counts, now, 60).into_string();
        assert!(
            markup.contains("7 published in the last 60 minutes"),
            "{markup}"
        );
        assert!(!markup.contains("99"), "outside the hour: {markup}");
    }
}
