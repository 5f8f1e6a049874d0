//! `Idempotency-Key` for HTTP APIs: a tower [`Layer`](tower::Layer) that makes `POST`
//! and `PATCH` requests safe to retry, over any oncebox
//! [`DedupStore`](oncebox_core::store::DedupStore).
//!
//! It follows the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's
//! behaviour. A client sends a unique key with a request; if the response gets lost, it
//! sends the same request with the same key again, and gets the first response back
//! instead of a second charge.
//!
//! | the request | the answer |
//! |---|---|
//! | first with its key | the handler runs once; its status, selected headers and body are stored for [`ttl`](IdempotencyOptions::ttl) (24 h) |
//! | same key, same request, after completion | the stored response, byte for byte, plus `Idempotent-Replayed: true` |
//! | same key while the first is running | `409 Conflict` with `Retry-After` |
//! | same key after the first one's client hung up | `409` while its handler runs on, then the stored response: the handler runs once |
//! | same key after a response over [`max_response_bytes`](IdempotencyOptions::max_response_bytes) (4 MiB) | [`410 Gone`](problem#response-not-stored) naming the first status, replayed: the handler does not run again |
//! | same key, another method, path or body | `422 Unprocessable Content` |
//! | no key where [`required`](IdempotencyOptions::required) | `400 Bad Request` |
//! | a key that is not 1..=255 visible ASCII characters | `400 Bad Request` |
//! | a key, but no [`Principal`] (no credentials) | `400 Bad Request`, handler not run |
//! | a body over [`max_body_bytes`](IdempotencyOptions::max_body_bytes) (1 MiB) | `413 Content Too Large`, handler not run |
//! | the store is unreachable | `503` with `Retry-After` (fail closed), or [fail open](IdempotencyOptions::on_store_failure) |
//! | the store is at capacity | `503` with the store's `Retry-After` (fail closed), or [fail open](IdempotencyOptions::on_store_failure) |
//! | another method (`GET`, `PUT`, `DELETE`...) | passed through untouched |
//!
//! The layer's own errors are `application/problem+json` (RFC 9457); the [`problem`]
//! module lists their `type`s.
//!
//! # Example
//!
//! ```
//! use axum::{Router, routing::post};
//! use oncebox_core::memory::MemoryDedupStore;
//! use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions};
//!
//! # fn app() -> oncebox_core::Result<Router> {
//! // Keys are kept per caller, here per `Authorization` header: no caller ever gets
//! // another's response, and a request with a key but no credentials is refused.
//! let idempotency = IdempotencyLayer::new(
//!     MemoryDedupStore::default(),
//!     HeaderPrincipal::authorization(),
//!     IdempotencyOptions::new().required(true),
//! )?;
//!
//! let app = Router::new()
//!     .route("/payments", post(|| async { "charged" }))
//!     .layer(idempotency);
//! # Ok(app) }
//! ```
//!
//! # One idea, two faces
//!
//! The idempotency record *is* a dedup record: its id is the key's scope, its result is
//! the request fingerprint and the response. So every `DedupStore` is an idempotency
//! store with no code of its own:
//!
//! | store | crate | notes |
//! |---|---|---|
//! | [`MemoryDedupStore`](oncebox_core::memory::MemoryDedupStore) | `oncebox-core` | one process |
//! | [`LayeredDedupStore`](oncebox_core::memory::LayeredDedupStore) | `oncebox-core` | replays from memory, in front of a shared store |
//! | `SqliteDedupStore` | `oncebox-sqlite` | one host |
//! | `PgDedupStore` | `oncebox-postgres` | shared, durable |
//! | `MySqlDedupStore` | `oncebox-mysql` | shared, durable |
//! | `RedisDedupStore` | `oncebox-redis` | shared, fast, as durable as Redis is configured |
//!
//! A key's record holds the request's fingerprint and the whole response (status, the
//! replayed headers, at most
//! [`max_response_bytes`](IdempotencyOptions::max_response_bytes) of body) for the
//! [`ttl`](IdempotencyOptions::ttl). In memory the store's capacity bounds the keys held,
//! and so the memory: a full store answers `503` rather than forget a live key (what a
//! key costs is measured in `docs/benchmarks.md`, with `oncebox-bench http`).
//!
//! # Scope and fingerprint
//!
//! A key is scoped by the request's [`Principal`], the method, and the route.
//!
//! The principal says who sent the request: a credential, an authenticated subject, a
//! tenant. Every layer is built with one (there is no default), and two principals with
//! the same key never see each other's responses. A request with a key but no principal
//! is refused with `400` ([`principal-missing`](problem#principal-missing)) rather than
//! put in a scope it would share with other unidentified callers. [`Principal`] lists
//! the choices; [`SharedScope`], one scope for all callers, is an explicit opt-in for a
//! service with a single trusted client. Where an authentication layer checks
//! credentials, run it before this one (with axum's `Router::layer`, add it after) so
//! that unauthenticated callers get its `401`.
//!
//! The route is, with the `axum` feature, the route template
//! (`/orders/{id}/refund`) when axum matched one before the layer ran (as it has for
//! `Router::layer` and `Router::route_layer`), else the path (as when the layer wraps a
//! whole router as a service). The scope is hashed (SHA-256) into the dedup id, so
//! principals are never stored in clear.
//!
//! The fingerprint is the SHA-256 of the method, the path with its query, and the body;
//! a key reused with another fingerprint is refused with `422`. The body is buffered for
//! that, up to [`max_body_bytes`](IdempotencyOptions::max_body_bytes); the inner service
//! gets the buffered copy.
//!
//! # What is stored, what is replayed
//!
//! Every response but `5xx` (unless [`store_server_errors`](IdempotencyOptions::store_server_errors)),
//! `408` and `429` is stored: the status, the headers on the
//! [`replay_headers`](IdempotencyOptions::replay_headers) allow-list (default
//! `content-type`), and the body byte for byte. The first response is sent as the
//! handler made it, with all of its headers; replays carry the allowed headers and
//! `Idempotent-Replayed: true`.
//!
//! A response whose body is over
//! [`max_response_bytes`](IdempotencyOptions::max_response_bytes), or that has trailers,
//! is sent whole to its request but cannot be stored. Its key does not go free (a retry
//! would run the handler a second time): what is stored is a
//! [`410 response-not-stored`](problem#response-not-stored) whose `original_status`
//! member is the first response's status, replayed to every retry.
//!
//! # Hang-ups, crashes, panics
//!
//! A request holds its key with a [`lease`](IdempotencyOptions::lease) (default 30 s),
//! renewed while its handler runs. Once the key is taken, **a client that hangs up stops
//! nothing**: the server drops the response future, the handler goes on in a tokio task
//! of its own (`tokio::spawn`, with the request's tracing span) and runs to its end, and its response is stored as if the client were still there. The client's
//! retry gets `409` while the handler runs, then the stored response, and the handler
//! has run once. A handler still running
//! [`hang_up_timeout`](IdempotencyOptions::hang_up_timeout) (default 60 s) after its
//! client hung up is stopped (its future dropped), and only then is its key settled as
//! for a handler that answered `504`: freed, or kept as a
//! [`handler-timeout`](problem#handler-timeout) where `5xx` are stored. A key is never
//! freed while its handler may still run. A client that stays is never cut off by the
//! timeout.
//!
//! An error of the inner service, and a `5xx` that is not stored, free the key at once
//! (the handler has ended). A handler that panics frees its key, and the panic goes on to
//! the server as it would without the layer. A process that dies holding keys frees them
//! when their leases end. Meanwhile retries get `409`.
//!
//! **What this does not promise:** like every idempotent receiver whose store is not the
//! handler's database, a handler whose effect happened but whose process died before the
//! response was stored will run again on a retry after the lease; so will a handler
//! stopped by `hang_up_timeout` after part of its effect, where `5xx` are not stored.
//! Tasks the handler spawned itself are not stopped with it. A handler whose lease
//! cannot be kept (the store unreachable for a whole lease) is stopped and answered
//! `503`. Where the effect is a database write, record the key in the same transaction
//! as well (the transactional inbox does).
//!
//! The inner service must be `Clone + Send + 'static`, with a `Send + 'static` future,
//! error and response body, for its call to move to a task on a hang-up; axum's routers and
//! handlers are. Each request takes the clone that was polled ready, as tower services
//! do.
//!
//! # Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `axum` | [`IdempotencyKey`] as an axum extractor; route templates (`MatchedPath`) as scope |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
#[cfg(feature = "axum")]
mod extract;
mod fingerprint;
mod flow;
mod future;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod held;
mod key;
mod layer;
mod options;
mod principal;
pub mod problem;
mod record;
mod service;

pub use body::{RequestBody, ResponseBody};
pub use future::ResponseFuture;
pub use key::{IdempotencyKey, KeyError};
pub use layer::IdempotencyLayer;
pub use oncebox_core::consumer::StoreFailure;
pub use options::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyOptions, MAX_KEY_LEN};
pub use principal::{HeaderPrincipal, Principal, SharedScope};
pub use service::Idempotency;
