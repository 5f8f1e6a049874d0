//! Run with: cargo run -p example-traced-orders
//!
//! One order followed in one trace: an axum service places it (the order row and its
//! event commit together in the request's transaction), the relay publishes the event
//! through the in-process broker, and the payment handler charges it behind the
//! transactional inbox. The HTTP request, the enqueue (`create orders`) and the handler
//! (`process orders`) share one trace id; the relay's `send orders` span is a trace of its
//! own, linked to the enqueue. At the end the example prints the spans it recorded as a
//! tree, and with `OTEL_EXPORTER_OTLP_ENDPOINT` set it also exports them over OTLP/HTTP to
//! that collector.
//!
//! What makes it one trace, and how to wire the same into a service, is in the `oncebox`
//! crate's guide (`oncebox::guide::tracing`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncebox::consumer::{Consumer, ConsumerOptions, TransactionalInbox, handler_fn};
use oncebox::memory::MemoryBroker;
use oncebox::run::Runner;
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::sqlite::SqliteStore;
use oncebox::{Message, Received};
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use sqlx::{Sqlite, Transaction};
use tracing::Instrument as _;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

fn main() -> anyhow::Result<()> {
    // The tracer provider is built and shut down outside the async runtime: the OTLP
    // exporter's blocking HTTP client runs a runtime of its own.
    let recorded = Recorded::default();
    let mut provider = SdkTracerProvider::builder().with_simple_exporter(recorded.clone());
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        let otlp = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .context("building the OTLP exporter")?;
        provider = provider.with_batch_exporter(otlp);
    }
    let provider = provider.build();
    // Spans of oncebox (target `oncebox`) and of this service; logs of warnings only.
    let spans = Targets::new()
        .with_target("oncebox", LevelFilter::INFO)
        .with_target("example_traced_orders", LevelFilter::INFO);
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(LevelFilter::WARN))
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("example-traced-orders"))
                .with_filter(spans),
        )
        .init();

    let db = std::env::temp_dir().join(format!("oncebox-traced-{}.db", uuid::Uuid::new_v4()));
    let placed = tokio::runtime::Runtime::new()?.block_on(place_and_charge_one_order(&db));
    for file in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{file}", db.display()));
    }
    placed?;
    provider.shutdown().context("flushing the spans")?;
    print!("{}", render(&recorded.spans()));
    Ok(())
}

/// The service, its relay and its payment consumer, until one order is charged.
async fn place_and_charge_one_order(db: &std::path::Path) -> anyhow::Result<()> {
    let store = SqliteStore::connect(db).await?;
    store.migrate().await?;
    for table in [
        "CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)",
        "CREATE TABLE charges (order_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)",
    ] {
        sqlx::query(table).execute(store.pool()).await?;
    }

    let app = Router::new()
        .route("/orders", post(place_order))
        .layer(middleware::from_fn(trace_request))
        .with_state(store.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(axum::serve(listener, app).into_future());

    // A client places one order of 42.00.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<axum::body::Bytes>>();
    let request =
        axum::http::Request::post(format!("http://{address}/orders")).body(Full::from("4200"))?;
    let response = client.request(request).await?;
    anyhow::ensure!(
        response.status() == StatusCode::CREATED,
        "{}",
        response.status()
    );
    let order = String::from_utf8(response.into_body().collect().await?.to_bytes().to_vec())?;

    let broker = MemoryBroker::new();
    let relay = Relay::new(store.outbox(), broker.publisher(), SpoolOptions::new())?;
    let payments = TransactionalInbox::new(
        store.inbox(),
        handler_fn(charge),
        ConsumerOptions::new("payments"),
    )?;
    let pool = store.pool().clone();
    let charged = async move {
        let query = "SELECT 1 FROM charges WHERE order_id = ?";
        while sqlx::query(query)
            .bind(&order)
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    Runner::new()
        .spawn("relay", relay)
        .spawn(
            "payments",
            Consumer::new(broker.subscribe("orders", "payments"), payments),
        )
        .run_until(charged)
        .await?;
    server.abort();
    store.pool().close().await;
    Ok(())
}

/// The request's server span, as `tower-http`'s `TraceLayer` would open it: everything
/// the handler does, the enqueue included, happens inside it.
async fn trace_request(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{} {}", request.method(), request.uri().path()),
        otel.kind = "server",
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
    );
    next.run(request).instrument(span).await
}

/// `POST /orders` with the amount in cents: the order and its event in one transaction.
async fn place_order(State(store): State<SqliteStore>, amount: String) -> (StatusCode, String) {
    match place(&store, &amount).await {
        Ok(order) => (StatusCode::CREATED, order),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

async fn place(store: &SqliteStore, amount: &str) -> anyhow::Result<String> {
    let amount: i64 = amount.trim().parse()?;
    let order = uuid::Uuid::new_v4().to_string();
    let mut tx = store.pool().begin().await?;
    sqlx::query("INSERT INTO orders (id, amount) VALUES (?, ?)")
        .bind(&order)
        .bind(amount)
        .execute(&mut *tx)
        .await?;
    // The enqueue opens `create orders` under the request's span and stores its trace
    // context with the row.
    let event = Message::new("orders", format!("{order} {amount}"))
        .with_key(&order)
        .with_kind("OrderPlaced");
    store.outbox().enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    Ok(order)
}

/// The payment, in the inbox's transaction, inside the `process orders` span.
async fn charge(message: &Received, tx: &mut Transaction<'static, Sqlite>) -> oncebox::Result<()> {
    let text = String::from_utf8_lossy(&message.payload);
    let (order, amount) = text.split_once(' ').unwrap_or((&text, "0"));
    tracing::info!(target: "example_traced_orders", %order, "charging");
    sqlx::query("INSERT INTO charges (order_id, amount) VALUES (?, ?)")
        .bind(order)
        .bind(amount.parse::<i64>().unwrap_or(0))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Keeps every finished span, to print them at the end.
#[derive(Debug, Clone, Default)]
struct Recorded(Arc<Mutex<Vec<SpanData>>>);

impl Recorded {
    fn spans(&self) -> Vec<SpanData> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl SpanExporter for Recorded {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(batch);
        Ok(())
    }
}

/// The spans as one tree per trace, children in start order, links by name.
fn render(spans: &[SpanData]) -> String {
    let mut by_trace: Vec<(opentelemetry::trace::TraceId, Vec<&SpanData>)> = Vec::new();
    for span in spans {
        let trace = span.span_context.trace_id();
        match by_trace.iter_mut().find(|(id, _)| *id == trace) {
            Some((_, members)) => members.push(span),
            None => by_trace.push((trace, vec![span])),
        }
    }
    by_trace.sort_by_key(|(_, members)| members.iter().map(|s| s.start_time).min());
    let name_of = |id: SpanId| {
        spans
            .iter()
            .find(|s| s.span_context.span_id() == id)
            .map_or("?".to_owned(), |s| s.name.to_string())
    };
    let mut out = String::new();
    for (trace, members) in &by_trace {
        out.push_str(&format!("trace {trace}\n"));
        let ids: Vec<SpanId> = members.iter().map(|s| s.span_context.span_id()).collect();
        let mut roots: Vec<&&SpanData> = members
            .iter()
            .filter(|s| !ids.contains(&s.parent_span_id))
            .collect();
        roots.sort_by_key(|s| s.start_time);
        for root in roots {
            tree(&mut out, root, members, "", &name_of);
        }
    }
    out
}

fn tree(
    out: &mut String,
    span: &SpanData,
    members: &[&SpanData],
    indent: &str,
    name_of: &dyn Fn(SpanId) -> String,
) {
    let took = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default();
    let attribute = |key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    let mut line = format!(
        "{indent}└─ {} ({:?}, {:.1} ms)",
        span.name,
        span.span_kind,
        took.as_secs_f64() * 1000.0
    );
    for key in [
        "messaging.system",
        "messaging.batch.message_count",
        "oncebox.outcome",
    ] {
        if let Some(value) = attribute(key) {
            line.push_str(&format!(" {key}={value}"));
        }
    }
    for link in span.links.iter() {
        line.push_str(&format!(
            " → link to {} in trace {}",
            name_of(link.span_context.span_id()),
            link.span_context.trace_id()
        ));
    }
    out.push_str(&line);
    out.push('\n');
    let mut children: Vec<&&SpanData> = members
        .iter()
        .filter(|s| s.parent_span_id == span.span_context.span_id())
        .collect();
    children.sort_by_key(|s| s.start_time);
    for child in children {
        tree(out, child, members, &format!("{indent}   "), name_of);
    }
}
