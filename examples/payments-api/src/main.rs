//! Run with: cargo run -p example-payments-api
//!
//! A payments API whose `POST /payments` is safe to retry: the Idempotency-Key layer of
//! `oncebox-http` stores each response in Redis (behind an in-memory window for replays)
//! and replays it, byte for byte, to a client that retries with the same key, so a
//! payment is never charged twice because a response got lost.
//!
//! It needs a Redis server (`ONCEBOX_REDIS_URL`, default `redis://127.0.0.1:6379`) and
//! listens on `ONCEBOX_LISTEN` (default `127.0.0.1:3000`). Clients authenticate with an
//! `X-Api-Key` header; idempotency keys are kept per API key, so two clients can never
//! see each other's payments through a shared key, and a request with an idempotency key
//! but no API key is refused.
//!
//! ```text
//! $ curl -si localhost:3000/payments -H 'x-api-key: shop-1' \
//!     -H 'idempotency-key: 4f1c6f0e-order-17' -d '{"amount_cents":4200,"currency":"EUR"}'
//! HTTP/1.1 201 Created
//! content-type: application/json
//! location: /payments/0190f0c2-...
//!
//! {"id":"0190f0c2-...","amount_cents":4200,"currency":"EUR","status":"captured"}
//!
//! # The same request again (the client never saw the answer): replayed, not re-charged.
//! HTTP/1.1 201 Created
//! idempotent-replayed: true
//!
//! # The same key with another amount: 422, as application/problem+json.
//! # While the first request still runs: 409 with Retry-After.
//! # No key at all: 400 (keys are required here).
//! # A key but no X-Api-Key: 400 (principal-missing); nothing is charged.
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use oncebox::http::{HeaderPrincipal, IdempotencyKey, IdempotencyLayer, IdempotencyOptions};
use oncebox::memory::LayeredDedupStore;
use oncebox::redis::RedisDedupStore;
use serde::{Deserialize, Serialize};

/// What a client asks for.
#[derive(Debug, Deserialize)]
struct NewPayment {
    amount_cents: u64,
    currency: String,
}

/// A payment, as stored and returned.
#[derive(Debug, Clone, Serialize)]
struct Payment {
    id: String,
    amount_cents: u64,
    currency: String,
    status: &'static str,
    /// The idempotency key the payment was created with, for the audit trail.
    idempotency_key: String,
}

/// The "bank": payments by id. A real service keeps them in its database.
#[derive(Clone, Default)]
struct Payments(Arc<Mutex<HashMap<String, Payment>>>);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let redis_url =
        std::env::var("ONCEBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let listen = std::env::var("ONCEBOX_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());

    // Redis holds the keys for every instance of the API; the in-memory window in front
    // answers replays without a round trip.
    let redis = RedisDedupStore::connect(&redis_url)
        .await
        .with_context(|| format!("connecting to Redis at {redis_url}"))?
        .with_prefix("payments-api:");
    let store = LayeredDedupStore::new(redis, 100_000);
    // Keys are kept per API key. A real service checks the API key in an authentication
    // layer added after this one (so that it runs first).
    let idempotency = IdempotencyLayer::new(
        store,
        HeaderPrincipal::new(HeaderName::from_static("x-api-key")),
        IdempotencyOptions::new()
            .required(true)
            .lease(Duration::from_secs(10))
            .replay_header(header::LOCATION),
    )?;

    let app = Router::new()
        .route("/payments", post(create_payment))
        .route("/payments/{id}", get(show_payment))
        .with_state(Payments::default())
        .layer(idempotency);

    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    tracing::info!("payments API on http://{listen}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// Charges once per idempotency key: retries never reach this handler.
async fn create_payment(
    State(payments): State<Payments>,
    key: IdempotencyKey,
    Json(new): Json<NewPayment>,
) -> impl IntoResponse {
    if new.amount_cents == 0 {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            HeaderMap::new(),
            "amount must be positive",
        )
            .into_response();
    }
    // Stand-in for the call to the card network, the part that must not happen twice.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let payment = Payment {
        id: uuid::Uuid::now_v7().to_string(),
        amount_cents: new.amount_cents,
        currency: new.currency,
        status: "captured",
        idempotency_key: key.to_string(),
    };
    payments
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(payment.id.clone(), payment.clone());
    tracing::info!(id = %payment.id, key = %key, "payment captured");
    let mut headers = HeaderMap::new();
    if let Ok(location) = format!("/payments/{}", payment.id).parse() {
        headers.insert(header::LOCATION, location);
    }
    (StatusCode::CREATED, headers, Json(payment)).into_response()
}

async fn show_payment(
    State(payments): State<Payments>,
    Path(id): Path<String>,
) -> Result<Json<Payment>, StatusCode> {
    payments
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&id)
        .cloned()
        .map(Json)
        .ok_or(StatusCode::NOT_FOUND)
}
