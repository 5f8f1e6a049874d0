//! The pages that read: overview, messages, one message, failures.

use std::time::{Duration, SystemTime};

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use oncebox::spool::{OutboxAdmin, OutboxRow, RowFilter, RowStatus};
use oncebox::store::{DedupRecord, DedupState, DedupStore};
use oncebox::{Headers, MessageId};

use super::failures::{self, MAX_GROUPED};
use super::form::{Fields, encode};
use super::session::Session;
use super::view::{self, Payload};
use super::{Dashboard, Shared};

/// Rows on a page of messages.
pub(super) const PAGE_ROWS: usize = 50;

/// The chart's span, in minutes.
const CHART_MINUTES: u32 = 60;

pub(super) async fn overview(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
) -> Response {
    let now = SystemTime::now();
    let since = now - Duration::from_secs(u64::from(CHART_MINUTES) * 60);
    let read = async {
        let stats = dashboard.outbox.stats().await?;
        let minutes = dashboard.outbox.published_per_minute(since).await?;
        let consumers = dashboard.database.consumers().await?;
        Ok::<_, oncebox::Error>((stats, minutes, consumers))
    };
    let (stats, minutes, consumers) = match read.await {
        Ok(read) => read,
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let base = &dashboard.base;
    let body = html! {
        h1 { "Outbox" }
        section.cards {
            a.card href={ (base) "/messages?status=pending" } {
                span.figure #pending { (stats.pending) }
                span.label { "pending" }
            }
            div.card {
                span.figure #oldest-pending {
                    @match stats.oldest_pending_age {
                        Some(age) => (view::age(age)),
                        None => "—",
                    }
                }
                span.label { "oldest pending" }
            }
            div.card {
                span.figure #scheduled { (stats.scheduled) }
                span.label { "scheduled, not yet due" }
            }
            a.card href={ (base) "/messages?status=published" } {
                span.figure #published { (stats.done) }
                span.label { "published, kept" }
            }
            a.card.dead[stats.dead > 0] href={ (base) "/failures" } {
                span.figure #dead { (stats.dead) }
                span.label { "dead letters" }
            }
        }
        h2 { "Published per minute" }
        (view::chart(&minutes, now, CHART_MINUTES))
        p.note {
            "Counts rows marked published and still kept: retention ("
            code { "relay.retention" } ") and the log-tailing relay remove rows from it."
        }
        h2 { "Inbox consumers" }
        @if consumers.is_empty() {
            p.empty { "No consumer has recorded a message in this store's inboxes." }
        } @else {
            table.consumers {
                thead { tr {
                    th { "Consumer" } th { "Handled, kept" } th { "Duplicates skipped" } th { "Pending" }
                    th { "Dead" } th { "Last handled" }
                } }
                tbody {
                    @for consumer in &consumers {
                        tr {
                            td { (consumer.consumer) }
                            td.number { (consumer.handled) }
                            td.number { (consumer.duplicates) }
                            td.number { (consumer.pending) }
                            td.number.error[consumer.dead > 0] { (consumer.dead) }
                            td.time { (consumer.last_handled_at.map(view::time).unwrap_or_default()) }
                        }
                    }
                }
            }
            p.note {
                "Handled counts the transactional inbox's records and the durable inbox's done rows still kept; "
                "duplicates skipped counts every duplicate delivery either inbox skipped since the consumer's first, "
                "whatever retention removed since."
            }
        }
    };
    view::page(&dashboard, Some(&session), "Overview", body)
}

/// The messages page's filters, as read from its query string.
struct Filters {
    filter: RowFilter,
    before: Option<i64>,
    /// The query string of the filters alone (without the page position).
    query: String,
}

impl Filters {
    fn read(fields: &Fields) -> Result<Self, String> {
        let status = match fields.get("status") {
            None => None,
            Some("pending") => Some(RowStatus::Pending),
            Some("published") => Some(RowStatus::Done),
            Some("dead") => Some(RowStatus::Dead),
            Some(other) => {
                return Err(format!(
                    "{other:?} is not a status: pending, published or dead"
                ));
            }
        };
        let id = fields
            .get("id")
            .map(|id| {
                MessageId::parse(id).map_err(|_| format!("{id:?} is not a message id (a UUID)"))
            })
            .transpose()?;
        Ok(Self {
            filter: RowFilter {
                status,
                topic: fields.get("topic").map(str::to_owned),
                key: fields.get("key").map(str::to_owned),
                id,
                created_from: fields.time("from")?,
                created_until: fields.time("until")?,
            },
            before: fields.before()?,
            query: fields.kept(&["status", "topic", "key", "id", "from", "until"]),
        })
    }
}

pub(super) async fn messages(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    RawQuery(query): RawQuery,
) -> Response {
    let fields = Fields::query(query.as_deref());
    let filters = match Filters::read(&fields) {
        Ok(filters) => filters,
        Err(problem) => {
            return view::error(
                &dashboard,
                Some(&session),
                StatusCode::BAD_REQUEST,
                &problem,
            );
        }
    };
    let rows = match dashboard
        .outbox
        .rows(&filters.filter, filters.before, PAGE_ROWS)
        .await
    {
        Ok(rows) => rows,
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let base = &dashboard.base;
    let older = (rows.len() == PAGE_ROWS)
        .then(|| rows.last().map(|row| row.state.seq))
        .flatten();
    let selected = |name: &str| fields.get("status") == Some(name);
    let body = html! {
        h1 { "Messages" }
        form.filters method="get" action={ (base) "/messages" } {
            label { "Status "
                select name="status" {
                    option value="" { "any" }
                    @for name in ["pending", "published", "dead"] {
                        option value=(name) selected[selected(name)] { (name) }
                    }
                }
            }
            label { "Topic " input type="text" name="topic" value=[fields.get("topic")]; }
            label { "Key " input type="text" name="key" value=[fields.get("key")]; }
            label { "Id " input type="text" name="id" size="36" value=[fields.get("id")]; }
            label { "Created from " input type="datetime-local" name="from" value=[fields.get("from")]; }
            label { "until " input type="datetime-local" name="until" value=[fields.get("until")]; }
            button type="submit" { "Filter" }
            a href={ (base) "/messages" } { "Clear" }
        }
        @if rows.is_empty() {
            p.empty { "No message matches." }
        } @else {
            (message_table(&dashboard, &rows))
        }
        (page_links(&format!("{base}/messages"), &filters.query, filters.before, older))
    };
    view::page(&dashboard, Some(&session), "Messages", body)
}

/// The links of a listing at `path` with the filters `query`: back to the newest page
/// when this one starts at `before`, and on to the rows older than `older`.
pub(super) fn page_links(
    path: &str,
    query: &str,
    before: Option<i64>,
    older: Option<i64>,
) -> Markup {
    html! {
        nav.pages {
            @if before.is_some() {
                a href={ (path) "?" (query) } { "← Newest" }
            }
            @if let Some(older) = older {
                a #older href={ (path) "?" (pairs(query, "before", &older.to_string())) } { "Older →" }
            }
        }
    }
}

/// `query` with one more pair.
fn pairs(query: &str, name: &str, value: &str) -> String {
    let added = encode([(name, value)]);
    if query.is_empty() {
        added
    } else {
        format!("{query}&{added}")
    }
}

fn message_table(dashboard: &Dashboard, rows: &[OutboxRow]) -> Markup {
    let base = &dashboard.base;
    html! {
        table.messages {
            thead { tr {
                th { "Seq" } th { "Id" } th { "Topic" } th { "Key" } th { "Kind" }
                th { "Status" } th { "Attempts" } th { "Created" } th { "Last error" }
            } }
            tbody {
                @for row in rows {
                    tr {
                        td.number { (row.state.seq) }
                        td.id { a href={ (base) "/messages/" (row.message.id) } { (row.message.id) } }
                        td { (row.message.topic) }
                        td { (row.message.key.as_deref().unwrap_or("")) }
                        td { (row.message.kind) }
                        td { (view::status_badge(row.state.status)) }
                        td.number { (row.state.attempts) }
                        td.time { (view::time(row.message.created_at)) }
                        td.error { (row.state.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

pub(super) async fn message(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = MessageId::parse(&id) else {
        return view::error(
            &dashboard,
            Some(&session),
            StatusCode::BAD_REQUEST,
            "That is not a message id (a UUID).",
        );
    };
    let row = match dashboard.outbox.row(id).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            return view::error(
                &dashboard,
                Some(&session),
                StatusCode::NOT_FOUND,
                "No outbox row has this id: never enqueued, or purged since.",
            );
        }
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let (state, message) = (&row.state, &row.message);
    let trace = message.headers.get("traceparent").and_then(view::trace_id);
    let body = html! {
        h1 { "Message " code { (message.id) } }
        dl.facts {
            dt { "Status" } dd { (view::status_badge(state.status)) }
            dt { "Topic" } dd #topic { (message.topic) }
            dt { "Key" } dd { (message.key.as_deref().unwrap_or("—")) }
            dt { "Kind" } dd { (message.kind) }
            dt { "Position" } dd { (state.seq) }
            dt { "Created" } dd { (view::time(message.created_at)) }
            dt { "Attempts" } dd { (state.attempts) }
            dt { "Due" } dd { (view::time(state.available_at)) }
            @if let Some(until) = state.leased_until {
                dt { "Leased until" } dd { (view::time(until)) }
            }
            @if let Some(settled) = state.settled_at {
                dt { (if state.status == RowStatus::Dead { "Given up" } else { "Published" }) }
                dd { (view::time(settled)) }
            }
            dt { "Last error" } dd.error #last-error { (state.last_error.as_deref().unwrap_or("—")) }
            dt { "Trace id" } dd { (trace.unwrap_or("—")) }
        }
        @if state.status == RowStatus::Dead && !dashboard.read_only {
            (actions_for(&dashboard, &session, &[message.id]))
        }
        (contents(&message.headers, &message.payload))
    };
    view::page(&dashboard, Some(&session), "Message", body)
}

/// A message's headers and its payload (see [`Payload`]).
pub(super) fn contents(headers: &Headers, payload: &[u8]) -> Markup {
    let shown = Payload::of(payload);
    html! {
        h2 { "Headers" }
        @if headers.is_empty() {
            p.empty { "None." }
        } @else {
            table.headers {
                @for (name, value) in headers.iter() {
                    tr { th { (name) } td { (value) } }
                }
            }
        }
        h2 { "Payload " small { (shown.label()) ", " (payload.len()) " bytes" } }
        pre #payload { (shown.text()) }
    }
}

/// The replay and purge buttons for the dead letters `ids` (each asks for a
/// confirmation first).
fn actions_for(dashboard: &Dashboard, session: &Session, ids: &[MessageId]) -> Markup {
    html! {
        form.actions method="post" action={ (dashboard.base) "/actions/confirm" } {
            input type="hidden" name="csrf" value=(session.csrf);
            @for id in ids {
                input type="hidden" name="id" value=(id);
            }
            button type="submit" name="action" value="replay" { "Replay" }
            button.danger type="submit" name="action" value="purge" { "Purge" }
        }
    }
}

pub(super) async fn failures(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
) -> Response {
    let grouped = match failures::group(&dashboard.outbox).await {
        Ok(grouped) => grouped,
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let base = &dashboard.base;
    let body = html! {
        h1 { "Failures" }
        @if !grouped.complete {
            p.note { "Only the first " (MAX_GROUPED) " dead letters are grouped here." }
        }
        @if grouped.groups.is_empty() {
            p.empty { "No dead letter." }
        } @else {
            table.groups {
                thead { tr {
                    th { "Topic" } th { "Error" } th { "Letters" } th { "First" } th { "Last" } th {}
                } }
                tbody {
                    @for group in &grouped.groups {
                        @let query = encode([
                            ("topic", group.topic.as_str()),
                            ("signature", group.signature.as_str()),
                        ]);
                        tr {
                            td { (group.topic) }
                            td.error title=(group.example) { (group.signature) }
                            td.number { (group.ids.len()) }
                            td.time { (view::time(group.first_dead)) }
                            td.time { (view::time(group.last_dead)) }
                            td { a href={ (base) "/failures/group?" (query) } { "Open" } }
                        }
                    }
                }
            }
        }
    };
    view::page(&dashboard, Some(&session), "Failures", body)
}

pub(super) async fn failure_group(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    RawQuery(query): RawQuery,
) -> Response {
    let fields = Fields::query(query.as_deref());
    // Exactly as the link wrote them: an empty topic, or one with outer spaces, names a
    // group of its own.
    let (Some(topic), Some(signature)) = (fields.exact("topic"), fields.exact("signature")) else {
        return view::error(
            &dashboard,
            Some(&session),
            StatusCode::BAD_REQUEST,
            "A group is named by its topic and signature.",
        );
    };
    let grouped = match failures::group(&dashboard.outbox).await {
        Ok(grouped) => grouped,
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let Some(group) = grouped
        .groups
        .iter()
        .find(|group| group.topic == topic && group.signature == signature)
    else {
        return view::error(
            &dashboard,
            Some(&session),
            StatusCode::NOT_FOUND,
            "No dead letter is left in this group.",
        );
    };
    let base = &dashboard.base;
    let through = grouped.through.unwrap_or(i64::MAX).to_string();
    let body = html! {
        h1 { "Failures of " code { (group.topic) } }
        p.error { (group.signature) }
        p { "For example: " span.error { (group.example) } }
        @if !dashboard.read_only {
            form.actions method="post" action={ (base) "/actions/confirm" } {
                input type="hidden" name="csrf" value=(session.csrf);
                input type="hidden" name="topic" value=(group.topic);
                input type="hidden" name="signature" value=(group.signature);
                input type="hidden" name="through" value=(through);
                button type="submit" name="action" value="replay-group" { "Replay all " (group.ids.len()) }
                button.danger type="submit" name="action" value="purge-group" { "Purge all " (group.ids.len()) }
            }
        }
        form method="post" action={ (base) "/actions/confirm" } {
            input type="hidden" name="csrf" value=(session.csrf);
            table.messages {
                thead { tr {
                    @if !dashboard.read_only { th { "Select" } }
                    th { "Id" }
                } }
                tbody {
                    @for id in &group.ids {
                        tr {
                            @if !dashboard.read_only {
                                td { input type="checkbox" name="id" value=(id) aria-label={ "select " (id) }; }
                            }
                            td.id { a href={ (base) "/messages/" (id) } { (id) } }
                        }
                    }
                }
            }
            @if !dashboard.read_only {
                div.actions {
                    button type="submit" name="action" value="replay" { "Replay selected" }
                    button.danger type="submit" name="action" value="purge" { "Purge selected" }
                }
            }
        }
    };
    view::page(&dashboard, Some(&session), "Failures", body)
}

pub(super) async fn keys(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    RawQuery(query): RawQuery,
) -> Response {
    let fields = Fields::query(query.as_deref());
    let id = fields.get("id");
    let (mut in_store, mut in_redis) = (None, None);
    if let Some(id) = id {
        match dashboard.database.inspect_key(id).await {
            Ok(record) => in_store = Some(record),
            Err(error) => return view::store_failed(&dashboard, &session, &error),
        }
        if let Some(redis) = &dashboard.redis_dedup {
            let record = match redis.store().await {
                Ok(store) => store.inspect(id).await,
                Err(error) => Err(error),
            };
            match record {
                Ok(record) => in_redis = Some(record),
                Err(error) => return view::store_failed(&dashboard, &session, &error),
            }
        }
    }
    let body = html! {
        h1 { "Idempotency keys" }
        p.note {
            "The idempotent receiver's dedup records in this store"
            @if dashboard.redis_dedup.is_some() { " and in Redis" }
            ": look one id up."
        }
        form.filters method="get" action={ (dashboard.base) "/keys" } {
            label { "Id " input type="text" name="id" size="48" value=[id] required; }
            button type="submit" { "Look up" }
        }
        @if let Some(id) = id {
            @if let Some(record) = &in_store {
                @if dashboard.redis_dedup.is_some() { h2 { "In the store" } }
                (dedup_record("key-", id, record.as_ref()))
            }
            @if let Some(record) = &in_redis {
                h2 { "In Redis" }
                (dedup_record("redis-key-", id, record.as_ref()))
            }
        }
    };
    view::page(&dashboard, Some(&session), "Keys", body)
}

/// One dedup record of `id`, or that there is none; its elements' ids start with
/// `prefix`.
fn dedup_record(prefix: &str, id: &str, record: Option<&DedupRecord>) -> Markup {
    html! {
        @match record {
            None => p.empty id={ (prefix) "state" } { "No record of " code { (id) } ": never seen, or expired." },
            Some(record) => dl.facts {
                dt { "Id" } dd { code { (id) } }
                @match &record.state {
                    DedupState::InProgress { lease_until } => {
                        dt { "State" } dd id={ (prefix) "state" } { "in progress" }
                        dt { "Lease until" } dd { (view::time(*lease_until)) }
                    }
                    DedupState::Completed { result } => {
                        @let result = Payload::of(result);
                        dt { "State" } dd id={ (prefix) "state" } { "completed" }
                        dt { "Result" } dd { small { (result.label()) } pre id={ (prefix) "result" } { (result.text()) } }
                    }
                    _ => { dt { "State" } dd id={ (prefix) "state" } { "unknown" } }
                }
                dt { "Fencing token" } dd { (record.token) }
                dt { "Expires" } dd { (record.expires_at.map(view::time).unwrap_or_else(|| "never".to_owned())) }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_filters_are_named() {
        let problem = |query: &str| Filters::read(&Fields::parse(query.as_bytes())).err();
        assert!(problem("status=lost").is_some_and(|p| p.contains("not a status")));
        assert!(problem("id=42").is_some_and(|p| p.contains("not a message id")));
        assert!(problem("from=soon").is_some_and(|p| p.contains("not a time")));
        assert!(problem("before=x").is_some_and(|p| p.contains("not a position")));
        assert!(problem("status=dead&topic=t&before=10").is_none());
    }

    #[test]
    fn the_page_position_is_not_kept_in_the_filters_query() {
        let filters =
            Filters::read(&Fields::parse(b"status=dead&before=10&key=a%26b")).expect("valid");
        assert_eq!(filters.query, "status=dead&key=a%26b");
        assert_eq!(filters.before, Some(10));
    }
}
