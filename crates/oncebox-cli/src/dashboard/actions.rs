//! What changes data: replay and purge of dead letters — one, a selection, or a whole
//! failure group — always in two steps: a confirmation that names how many, then the
//! change, which acts on exactly the letters confirmed (a group that changed in between
//! is refused, to be confirmed again). Both steps check the session's CSRF token and
//! refuse in read-only mode.

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;
use oncebox::MessageId;
use oncebox::spool::OutboxAdmin;
use sha2::{Digest, Sha256};

use super::failures;
use super::form::Fields;
use super::session::Session;
use super::{Dashboard, Shared, view};

/// Ids listed on a confirmation page; beyond, it says how many more.
const LISTED: usize = 20;

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Replay,
    Purge,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Self::Replay => "Replay",
            Self::Purge => "Purge",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Self::Replay => "Replayed",
            Self::Purge => "Purged",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
        }
    }
}

/// To which dead letters.
enum Target {
    /// These, by id.
    Ids(Vec<MessageId>),
    /// A failure group's letters up to a position: the letters that died after the
    /// group was shown are not taken by surprise.
    Group {
        topic: String,
        signature: String,
        through: i64,
        /// What the confirmation named, when applying: the change is refused unless
        /// the group is still exactly that.
        confirmed: Option<String>,
    },
}

/// A digest of `ids`, in their order, which the confirmation of a group carries to the
/// change: letters of older positions that died in between, or left, change it.
fn digest(ids: &[MessageId]) -> String {
    let mut hasher = Sha256::new();
    for id in ids {
        hasher.update(id.as_uuid().as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A request to change something, read from a form, its session's CSRF token checked.
struct Request {
    action: Action,
    target: Target,
}

/// Why a request was refused before anything was read or changed.
enum Refusal {
    Csrf,
    ReadOnly,
    Malformed(&'static str),
}

impl Refusal {
    fn page(&self, dashboard: &Dashboard, session: &Session) -> Response {
        match self {
            Self::Csrf => view::csrf_refused(dashboard, session),
            Self::ReadOnly => view::read_only_refused(dashboard, session),
            Self::Malformed(problem) => {
                view::error(dashboard, Some(session), StatusCode::BAD_REQUEST, problem)
            }
        }
    }
}

impl Request {
    fn read(dashboard: &Dashboard, session: &Session, body: &Bytes) -> Result<Self, Refusal> {
        let fields = Fields::body(body);
        if !session.sent_by_form(&fields) {
            return Err(Refusal::Csrf);
        }
        if dashboard.read_only {
            return Err(Refusal::ReadOnly);
        }
        let (action, group) = match fields.get("action") {
            Some("replay") => (Action::Replay, false),
            Some("purge") => (Action::Purge, false),
            Some("replay-group") => (Action::Replay, true),
            Some("purge-group") => (Action::Purge, true),
            _ => return Err(Refusal::Malformed("No action was chosen: replay or purge.")),
        };
        let target = if group {
            // The group's topic and signature as the page wrote them: an empty topic,
            // or one with outer spaces, names a group of its own.
            let (Some(topic), Some(signature), Some(through)) = (
                fields.exact("topic"),
                fields.exact("signature"),
                fields.get("through").and_then(|seq| seq.parse().ok()),
            ) else {
                return Err(Refusal::Malformed(
                    "A group is named by its topic, signature and position.",
                ));
            };
            Target::Group {
                topic: topic.to_owned(),
                signature: signature.to_owned(),
                through,
                confirmed: fields.get("confirmed").map(str::to_owned),
            }
        } else {
            let ids = fields
                .all("id")
                .map(MessageId::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| Refusal::Malformed("A selected id is not a message id (a UUID)."))?;
            if ids.is_empty() {
                return Err(Refusal::Malformed("Nothing was selected."));
            }
            Target::Ids(ids)
        };
        Ok(Self { action, target })
    }

    /// The ids the request names now.
    async fn ids(&self, dashboard: &Dashboard) -> oncebox::Result<Vec<MessageId>> {
        match &self.target {
            Target::Ids(ids) => Ok(ids.clone()),
            Target::Group {
                topic,
                signature,
                through,
                ..
            } => failures::members(&dashboard.outbox, topic, signature, *through).await,
        }
    }
}

/// Step one: names what the action would change, and asks.
pub(super) async fn confirm(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Response {
    let request = match Request::read(&dashboard, &session, &body) {
        Ok(request) => request,
        Err(refusal) => return refusal.page(&dashboard, &session),
    };
    let ids = match request.ids(&dashboard).await {
        Ok(ids) => ids,
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let (action, count) = (request.action, ids.len());
    let noun = if count == 1 {
        "dead letter"
    } else {
        "dead letters"
    };
    let body = html! {
        h1 { (action.verb()) " " (count) " " (noun) "?" }
        @match action {
            Action::Replay => p { "Each goes back in line: pending, due now, attempts reset, in its key's order. The relay publishes it again." },
            Action::Purge => p.warning { "Each is deleted for good. This cannot be undone." },
        }
        ul.ids {
            @for id in ids.iter().take(LISTED) { li { code { (id) } } }
            @if count > LISTED { li { "and " (count - LISTED) " more" } }
        }
        form.actions method="post" action={ (dashboard.base) "/actions/apply" } {
            input type="hidden" name="csrf" value=(session.csrf);
            @match &request.target {
                Target::Ids(ids) => {
                    input type="hidden" name="action" value=(action.field());
                    @for id in ids { input type="hidden" name="id" value=(id); }
                }
                Target::Group { topic, signature, through, .. } => {
                    input type="hidden" name="action" value={ (action.field()) "-group" };
                    input type="hidden" name="topic" value=(topic);
                    input type="hidden" name="signature" value=(signature);
                    input type="hidden" name="through" value=(through);
                    input type="hidden" name="confirmed" value=(digest(&ids));
                }
            }
            button #confirm .danger[action == Action::Purge] type="submit" { (action.verb()) " " (count) }
            a href={ (dashboard.base) "/failures" } { "Cancel" }
        }
    };
    view::page(&dashboard, Some(&session), "Confirm", body)
}

/// Step two: does it, and says how many were changed.
pub(super) async fn apply(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    body: Bytes,
) -> Response {
    let request = match Request::read(&dashboard, &session, &body) {
        Ok(request) => request,
        Err(refusal) => return refusal.page(&dashboard, &session),
    };
    let ids = match request.ids(&dashboard).await {
        Ok(ids) => ids,
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    if let Target::Group {
        topic,
        signature,
        confirmed,
        ..
    } = &request.target
    {
        let Some(confirmed) = confirmed else {
            return view::error(
                &dashboard,
                Some(&session),
                StatusCode::BAD_REQUEST,
                "A group's change comes from its confirmation.",
            );
        };
        if *confirmed != digest(&ids) {
            let again =
                super::form::encode([("topic", topic.as_str()), ("signature", signature.as_str())]);
            let body = html! {
                h1 #outcome { "The group changed: nothing was done" }
                p {
                    "Since the confirmation, letters of this group died or left it; it now has "
                    (ids.len()) ". Look at it again before confirming."
                }
                p { a href={ (dashboard.base) "/failures/group?" (again) } { "Back to the group" } }
            };
            return view::page_with_status(
                &dashboard,
                Some(&session),
                StatusCode::CONFLICT,
                "Changed",
                body,
            );
        }
    }
    let mut changed = 0usize;
    for id in &ids {
        let result = match request.action {
            Action::Replay => dashboard.outbox.replay_dead(*id).await,
            Action::Purge => dashboard.outbox.purge_dead(*id).await,
        };
        match result {
            Ok(true) => changed += 1,
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%error, changed, "dashboard: an action stopped at a store error");
                return view::store_failed(&dashboard, &session, &error);
            }
        }
    }
    tracing::info!(
        action = request.action.field(),
        changed,
        asked = ids.len(),
        "dashboard: dead letters changed"
    );
    let body = html! {
        h1 #outcome { (request.action.done()) " " (changed) " of " (ids.len()) }
        @if changed < ids.len() {
            p { (ids.len() - changed) " were no longer dead letters (replayed or purged meanwhile)." }
        }
        p { a href={ (dashboard.base) "/failures" } { "Back to the failures" } }
    };
    view::page(&dashboard, Some(&session), "Done", body)
}
