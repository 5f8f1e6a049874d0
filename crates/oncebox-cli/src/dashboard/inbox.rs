//! The pages of the durable inbox: its rows, newest first, and one row.

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use oncebox::consumer::{InboxRow, InboxRowFilter};
use oncebox::spool::RowStatus;

use super::form::Fields;
use super::pages::{PAGE_ROWS, contents, page_links};
use super::session::Session;
use super::view;
use super::{Dashboard, Shared};

/// The inbox page's filters, as read from its query string.
struct Filters {
    filter: InboxRowFilter,
    before: Option<i64>,
    /// The query string of the filters alone (without the page position).
    query: String,
}

impl Filters {
    fn read(fields: &Fields) -> Result<Self, String> {
        let status = match fields.get("status") {
            None => None,
            Some("pending") => Some(RowStatus::Pending),
            Some("handled") => Some(RowStatus::Done),
            Some("dead") => Some(RowStatus::Dead),
            Some(other) => {
                return Err(format!(
                    "{other:?} is not a status: pending, handled or dead"
                ));
            }
        };
        let text = |name: &str| fields.get(name).map(str::to_owned);
        Ok(Self {
            filter: InboxRowFilter {
                consumer: text("consumer"),
                status,
                topic: text("topic"),
                key: text("key"),
                dedup_id: text("id"),
                received_from: fields.time("from")?,
                received_until: fields.time("until")?,
            },
            before: fields.before()?,
            query: fields.kept(&["consumer", "status", "topic", "key", "id", "from", "until"]),
        })
    }
}

/// The name an inbox row's status goes by: a done row was handled, not published.
fn status_badge(status: RowStatus) -> Markup {
    match status {
        RowStatus::Done => html! { span class="badge published" { "handled" } },
        other => view::status_badge(other),
    }
}

pub(super) async fn rows(
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
        .database
        .inbox_rows(&filters.filter, filters.before, PAGE_ROWS)
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
        h1 { "Inbox" }
        p.note {
            "The durable inbox's rows: deliveries stored first and handled later. The "
            "transactional inbox keeps ids only; the overview counts them."
        }
        form.filters method="get" action={ (base) "/inbox" } {
            label { "Consumer " input type="text" name="consumer" value=[fields.get("consumer")]; }
            label { "Status "
                select name="status" {
                    option value="" { "any" }
                    @for name in ["pending", "handled", "dead"] {
                        option value=(name) selected[selected(name)] { (name) }
                    }
                }
            }
            label { "Topic " input type="text" name="topic" value=[fields.get("topic")]; }
            label { "Key " input type="text" name="key" value=[fields.get("key")]; }
            label { "Dedup id " input type="text" name="id" size="36" value=[fields.get("id")]; }
            label { "Received from " input type="datetime-local" name="from" value=[fields.get("from")]; }
            label { "until " input type="datetime-local" name="until" value=[fields.get("until")]; }
            button type="submit" { "Filter" }
            a href={ (base) "/inbox" } { "Clear" }
        }
        @if rows.is_empty() {
            p.empty { "No inbox row matches." }
        } @else {
            (table(&dashboard, &rows))
        }
        (page_links(&format!("{base}/inbox"), &filters.query, filters.before, older))
    };
    view::page(&dashboard, Some(&session), "Inbox", body)
}

fn table(dashboard: &Dashboard, rows: &[InboxRow]) -> Markup {
    let base = &dashboard.base;
    html! {
        table.inbox {
            thead { tr {
                th { "Seq" } th { "Consumer" } th { "Dedup id" } th { "Topic" } th { "Key" }
                th { "Status" } th { "Attempts" } th { "Received" } th { "Last error" }
            } }
            tbody {
                @for row in rows {
                    tr {
                        td.number { a href={ (base) "/inbox/" (row.state.seq) } { (row.state.seq) } }
                        td { (row.consumer) }
                        td.id { (row.dedup_id) }
                        td { (row.received.topic) }
                        td { (row.received.key.as_deref().unwrap_or("")) }
                        td { (status_badge(row.state.status)) }
                        td.number { (row.state.attempts) }
                        td.time { (view::time(row.received_at)) }
                        td.error { (row.state.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

pub(super) async fn row(
    State(dashboard): Shared,
    Extension(session): Extension<Session>,
    Path(seq): Path<String>,
) -> Response {
    let Ok(seq) = seq.parse::<i64>() else {
        return view::error(
            &dashboard,
            Some(&session),
            StatusCode::BAD_REQUEST,
            "That is not a position in the inbox (a number).",
        );
    };
    let row = match dashboard.database.inbox_row(seq).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            return view::error(
                &dashboard,
                Some(&session),
                StatusCode::NOT_FOUND,
                "No inbox row is at this position: never stored, or purged since.",
            );
        }
        Err(error) => return view::store_failed(&dashboard, &session, &error),
    };
    let (state, received) = (&row.state, &row.received);
    let trace = received.headers.get("traceparent").and_then(view::trace_id);
    let at = &received.coordinates;
    let body = html! {
        h1 { "Inbox row " (state.seq) }
        dl.facts {
            dt { "Status" } dd { (status_badge(state.status)) }
            dt { "Consumer" } dd #consumer { (row.consumer) }
            dt { "Dedup id" } dd #dedup-id { (row.dedup_id) }
            dt { "Message id" } dd { (received.id.map(|id| id.to_string()).unwrap_or_else(|| "—".to_owned())) }
            dt { "Topic" } dd #topic { (received.topic) }
            dt { "Key" } dd { (received.key.as_deref().unwrap_or("—")) }
            dt { "Kind" } dd { (received.kind) }
            dt { "From" } dd {
                (at.source)
                @if let Some(partition) = at.partition { " partition " (partition) }
                " at " (at.position) ", delivery " (received.delivery_count)
            }
            dt { "Created" } dd { (received.created_at.map(view::time).unwrap_or_else(|| "—".to_owned())) }
            dt { "Received" } dd { (view::time(row.received_at)) }
            dt { "Attempts" } dd { (state.attempts) }
            dt { "Due" } dd { (view::time(state.available_at)) }
            @if let Some(until) = state.leased_until {
                dt { "Leased until" } dd { (view::time(until)) }
            }
            @if let Some(settled) = state.settled_at {
                dt { (if state.status == RowStatus::Dead { "Given up" } else { "Handled" }) }
                dd { (view::time(settled)) }
            }
            dt { "Last error" } dd.error #last-error { (state.last_error.as_deref().unwrap_or("—")) }
            dt { "Trace id" } dd { (trace.unwrap_or("—")) }
        }
        @if let Some(result) = &row.result {
            h2 { "Result " small { (result.len()) " bytes" } }
            pre #result { (view::Payload::of(result).text()) }
        }
        (contents(&received.headers, &received.payload))
    };
    view::page(&dashboard, Some(&session), "Inbox row", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_filters_are_named() {
        let problem = |query: &str| Filters::read(&Fields::parse(query.as_bytes())).err();
        assert!(problem("status=done").is_some_and(|p| p.contains("pending, handled or dead")));
        assert!(problem("until=later").is_some_and(|p| p.contains("not a time")));
        assert!(problem("before=-x").is_some_and(|p| p.contains("not a position")));
        let read = Filters::read(&Fields::parse(
            b"consumer=billing&status=handled&id=m-1&x=y",
        ))
        .expect("good filters");
        assert_eq!(read.filter.consumer.as_deref(), Some("billing"));
        assert_eq!(read.filter.status, Some(RowStatus::Done));
        assert_eq!(read.filter.dedup_id.as_deref(), Some("m-1"));
        assert_eq!(read.query, "consumer=billing&status=handled&id=m-1");
    }
}
