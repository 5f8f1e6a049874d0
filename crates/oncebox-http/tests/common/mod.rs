//! A real HTTP server (axum on 127.0.0.1:0) with the layer in front of a payments-like
//! app, a real HTTP client (hyper-util), and the scenarios every store runs through.
//!
//! Each store's test file calls `scenarios!(make_store)` with an async block that makes
//! a fresh, isolated store (and whatever must live as long as it).

#![allow(dead_code, unreachable_pub)]

pub mod hang_up;

use std::any::Any;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use oncebox_core::store::DedupStore;
use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions, problem};
use tokio::sync::Barrier;

/// A fresh store and what must be kept alive with it (a temporary directory...).
pub struct Fresh<S> {
    pub store: S,
    pub keep: Box<dyn Any + Send>,
}

impl<S> Fresh<S> {
    pub fn new(store: S) -> Self {
        Self {
            store,
            keep: Box::new(()),
        }
    }
}

/// How long the test handlers take, so that concurrent requests overlap.
const HANDLER_DELAY: Duration = Duration::from_millis(300);

/// The app behind the layer; `calls` counts handler executions.
#[derive(Clone, Default)]
struct App {
    calls: Arc<AtomicUsize>,
}

fn app(state: App) -> Router {
    Router::new()
        .route("/payments", post(create_payment))
        .route("/fail", post(fail))
        .route("/panic", post(panic_once))
        .route("/slow", post(slow))
        .with_state(state)
}

/// A unique body per execution: a second execution can never pass for a replay.
async fn create_payment(
    axum::extract::State(app): axum::extract::State<App>,
    body: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let run = app.calls.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(HANDLER_DELAY).await;
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().expect("static"));
    headers.insert("x-run", run.to_string().parse().expect("number"));
    let body = format!(
        "{{\"payment\":\"{}\",\"run\":{run},\"request_bytes\":{}}}",
        uuid::Uuid::new_v4(),
        body.len()
    );
    (StatusCode::CREATED, headers, body)
}

async fn fail(axum::extract::State(app): axum::extract::State<App>) -> (StatusCode, String) {
    let run = app.calls.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("failure {} on run {run}", uuid::Uuid::new_v4()),
    )
}

async fn panic_once(axum::extract::State(app): axum::extract::State<App>) -> &'static str {
    if app.calls.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("the handler panics on its first run (expected by the test)");
    }
    "done"
}

async fn slow(axum::extract::State(app): axum::extract::State<App>) -> &'static str {
    app.calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    "never"
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    calls: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn router<S: DedupStore + 'static>(store: S, options: IdempotencyOptions, state: App) -> Router {
    let principal = HeaderPrincipal::new(http::HeaderName::from_static("x-api-key"));
    let layer = IdempotencyLayer::new(store, principal, options).expect("valid options");
    app(state).layer(layer)
}

/// Serves the app behind the layer over `store` on a free loopback port.
pub async fn serve<S: DedupStore + 'static>(store: S, options: IdempotencyOptions) -> Server {
    let state = App::default();
    let calls = Arc::clone(&state.calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let router = router(store, options, state);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Server { addr, calls, task }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The `type` of a problem+json answer.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers.get("content-type").map(|v| v.as_bytes()),
            Some(problem::CONTENT_TYPE.as_bytes()),
            "a problem answer is application/problem+json: {self:?}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&self.body).expect("problem body is JSON");
        assert_eq!(json["status"], self.status.as_u16(), "status member");
        json["type"].as_str().expect("type member").to_owned()
    }
}

type ClientBody = BoxBody<Bytes, Infallible>;

/// A plain HTTP/1 client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, ClientBody>,
}

impl Default for Http {
    fn default() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

/// One request to send.
pub struct Call<'a> {
    pub path: &'a str,
    pub key: Option<&'a str>,
    pub api_key: Option<&'a str>,
    pub body: Bytes,
    /// Send the body chunked, without `Content-Length`.
    pub chunked: bool,
}

impl<'a> Call<'a> {
    pub fn post(path: &'a str, key: &'a str, api_key: &'a str, body: &'static str) -> Self {
        Self {
            path,
            key: Some(key),
            api_key: Some(api_key),
            body: Bytes::from_static(body.as_bytes()),
            chunked: false,
        }
    }
}

impl Http {
    pub async fn send(&self, server: &Server, call: &Call<'_>) -> Result<Reply, String> {
        self.send_to(server.addr, call).await
    }

    pub async fn send_to(&self, addr: SocketAddr, call: &Call<'_>) -> Result<Reply, String> {
        let body: ClientBody = if call.chunked {
            let chunks: Vec<Result<http_body::Frame<Bytes>, Infallible>> = call
                .body
                .chunks(1000)
                .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            StreamBody::new(futures_util::stream::iter(chunks)).boxed()
        } else {
            Full::new(call.body.clone()).boxed()
        };
        let mut request = http::Request::post(format!("http://{}{}", addr, call.path));
        if let Some(key) = call.key {
            request = request.header("idempotency-key", key);
        }
        if let Some(api_key) = call.api_key {
            request = request.header("x-api-key", api_key);
        }
        let request = request.body(body).map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    pub async fn ok(&self, server: &Server, call: &Call<'_>) -> Reply {
        self.send(server, call).await.expect("request failed")
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios.

/// 50 concurrent requests with one key run the handler once; every other request gets
/// 409 or the replay of the one response, never a second execution.
pub async fn concurrent_requests_run_once<S: DedupStore + 'static>(fresh: Fresh<S>) {
    const REQUESTS: usize = 50;
    let server = serve(fresh.store, IdempotencyOptions::new()).await;
    let http = Http::default();
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let server = Arc::new(server);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..REQUESTS {
        let (http, barrier, server) = (http.clone(), Arc::clone(&barrier), Arc::clone(&server));
        tasks.spawn(async move {
            barrier.wait().await;
            http.ok(
                &server,
                &Call::post("/payments", "pay-once", "tenant-a", "{\"amount\":42}"),
            )
            .await
        });
    }
    let mut originals = Vec::new();
    let mut replays = Vec::new();
    let mut conflicts = 0;
    while let Some(reply) = tasks.join_next().await {
        let reply = reply.expect("request task");
        match reply.status {
            StatusCode::CREATED if reply.replayed() => replays.push(reply.body),
            StatusCode::CREATED => originals.push(reply.body),
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem_type(), problem::KEY_IN_USE);
                assert!(
                    reply.headers.contains_key("retry-after"),
                    "409 has Retry-After"
                );
                conflicts += 1;
            }
            other => panic!("unexpected answer {other}: {reply:?}"),
        }
    }
    assert_eq!(server.calls(), 1, "the handler must run once");
    assert_eq!(originals.len(), 1, "one original response");
    assert_eq!(originals.len() + replays.len() + conflicts, REQUESTS);
    for replay in &replays {
        assert_eq!(replay, &originals[0], "replays carry the original body");
    }
    // Once completed, everyone gets the replay.
    let after = http
        .ok(
            &server,
            &Call::post("/payments", "pay-once", "tenant-a", "{\"amount\":42}"),
        )
        .await;
    assert!(after.replayed());
    assert_eq!(after.body, originals[0]);
    assert_eq!(server.calls(), 1);
}

/// The same key with another body is refused with 422 and never runs the handler.
pub async fn different_body_is_422<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let server = serve(fresh.store, IdempotencyOptions::new()).await;
    let http = Http::default();
    let first = http
        .ok(
            &server,
            &Call::post("/payments", "k-422", "tenant-a", "{\"amount\":1}"),
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = http
        .ok(
            &server,
            &Call::post("/payments", "k-422", "tenant-a", "{\"amount\":2}"),
        )
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(other.problem_type(), problem::KEY_REUSED);
    assert_eq!(server.calls(), 1);
    // The original request still replays.
    let again = http
        .ok(
            &server,
            &Call::post("/payments", "k-422", "tenant-a", "{\"amount\":1}"),
        )
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

/// Two principals using the same key each get their own execution and their own replay.
pub async fn principals_are_isolated<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let server = serve(fresh.store, IdempotencyOptions::new()).await;
    let http = Http::default();
    let a = http
        .ok(
            &server,
            &Call::post("/payments", "shared-key", "tenant-a", "{}"),
        )
        .await;
    let b = http
        .ok(
            &server,
            &Call::post("/payments", "shared-key", "tenant-b", "{}"),
        )
        .await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(
        !a.replayed() && !b.replayed(),
        "each principal's first request runs"
    );
    assert_ne!(a.body, b.body);
    assert_eq!(server.calls(), 2);
    let a_again = http
        .ok(
            &server,
            &Call::post("/payments", "shared-key", "tenant-a", "{}"),
        )
        .await;
    let b_again = http
        .ok(
            &server,
            &Call::post("/payments", "shared-key", "tenant-b", "{}"),
        )
        .await;
    assert_eq!(a_again.body, a.body, "tenant-a gets its own response");
    assert_eq!(b_again.body, b.body, "tenant-b gets its own response");
    assert_eq!(server.calls(), 2);
}

/// A replay is byte-identical to the original: status, allowed headers, body; it adds
/// `Idempotent-Replayed: true` and leaves out headers not on the allow-list.
pub async fn replays_are_byte_identical<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let server = serve(fresh.store, IdempotencyOptions::new()).await;
    let http = Http::default();
    let call = Call::post("/payments", "k-bytes", "tenant-a", "{\"amount\":7}");
    let first = http.ok(&server, &call).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(
        first.headers["x-run"], "1",
        "the first response has all headers"
    );
    for _ in 0..3 {
        let replay = http.ok(&server, &call).await;
        assert!(replay.replayed());
        assert_eq!(replay.status, first.status);
        assert_eq!(replay.body, first.body, "body byte for byte");
        assert_eq!(
            replay.headers["content-type"],
            first.headers["content-type"]
        );
        assert!(
            !replay.headers.contains_key("x-run"),
            "headers off the allow-list are not replayed"
        );
    }
    assert_eq!(server.calls(), 1);
}

/// A 500 is not stored by default (the key is freed: the retry runs); with
/// `store_server_errors` it is stored and replayed byte for byte.
pub async fn server_errors_stored_only_when_configured<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let store = Arc::new(fresh.store);
    let default = serve(Arc::clone(&store), IdempotencyOptions::new()).await;
    let http = Http::default();
    let call = Call::post("/fail", "k-500", "tenant-a", "{}");
    let first = http.ok(&default, &call).await;
    let second = http.ok(&default, &call).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(second.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!second.replayed());
    assert_eq!(default.calls(), 2, "an unstored 500 frees the key");

    let storing = serve(store, IdempotencyOptions::new().store_server_errors(true)).await;
    let call = Call::post("/fail", "k-500-stored", "tenant-a", "{}");
    let first = http.ok(&storing, &call).await;
    let replay = http.ok(&storing, &call).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(replay.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(replay.replayed());
    assert_eq!(
        replay.body, first.body,
        "the stored 500 replays byte for byte"
    );
    assert_eq!(storing.calls(), 1);
}

/// A body over the limit is refused with 413 without the handler running, whether the
/// client declared its length or sent it chunked; a body at the limit passes.
pub async fn oversized_body_is_413<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let server = serve(fresh.store, IdempotencyOptions::new().max_body_bytes(4096)).await;
    let http = Http::default();
    let big = Bytes::from(vec![b'x'; 10_000]);
    for chunked in [false, true] {
        let reply = http
            .ok(
                &server,
                &Call {
                    path: "/payments",
                    key: Some("k-big"),
                    api_key: Some("tenant-a"),
                    body: big.clone(),
                    chunked,
                },
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "chunked: {chunked}"
        );
        assert_eq!(reply.problem_type(), problem::BODY_TOO_LARGE);
    }
    assert_eq!(server.calls(), 0, "the handler never ran");
    let at_limit = http
        .ok(
            &server,
            &Call {
                path: "/payments",
                key: Some("k-big"),
                api_key: Some("tenant-a"),
                body: Bytes::from(vec![b'x'; 4096]),
                chunked: true,
            },
        )
        .await;
    assert_eq!(at_limit.status, StatusCode::CREATED);
    assert_eq!(server.calls(), 1);
}

/// A handler that panics frees its key: the retry runs the handler (again) and succeeds.
pub async fn panicking_handler_frees_key<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let lease = Duration::from_secs(2);
    let server = serve(fresh.store, IdempotencyOptions::new().lease(lease)).await;
    let http = Http::default();
    let call = Call::post("/panic", "k-panic", "tenant-a", "{}");
    // The connection dies with the handler: no answer.
    let crashed = http.send(&server, &call).await;
    assert!(
        crashed.is_err(),
        "the panicking request gets no response: {crashed:?}"
    );
    let deadline = Instant::now() + lease + Duration::from_secs(5);
    loop {
        let reply = http.ok(&server, &call).await;
        match reply.status {
            StatusCode::OK => break,
            StatusCode::CONFLICT if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("the key was not freed after the panic: {other} {reply:?}"),
        }
    }
    assert_eq!(server.calls(), 2, "the retry ran the handler");
}

/// A store handle that goes silent when its process "dies": from then on, every call
/// hangs, so nothing that process does afterwards reaches the store.
struct Mortal<S> {
    inner: S,
    dead: Arc<std::sync::atomic::AtomicBool>,
}

impl<S: DedupStore> Mortal<S> {
    async fn alive(&self) {
        if self.dead.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

impl<S: DedupStore> DedupStore for Mortal<S> {
    async fn begin(
        &self,
        id: &str,
        lease: Duration,
    ) -> oncebox_core::Result<oncebox_core::store::Begin> {
        self.alive().await;
        self.inner.begin(id, lease).await
    }

    async fn complete(
        &self,
        id: &str,
        token: oncebox_core::store::FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> oncebox_core::Result<()> {
        self.alive().await;
        self.inner.complete(id, token, result, ttl).await
    }

    async fn extend(
        &self,
        id: &str,
        token: oncebox_core::store::FencingToken,
        lease: Duration,
    ) -> oncebox_core::Result<()> {
        self.alive().await;
        self.inner.extend(id, token, lease).await
    }

    async fn abandon(
        &self,
        id: &str,
        token: oncebox_core::store::FencingToken,
    ) -> oncebox_core::Result<()> {
        self.alive().await;
        self.inner.abandon(id, token).await
    }

    async fn inspect(
        &self,
        id: &str,
    ) -> oncebox_core::Result<Option<oncebox_core::store::DedupRecord>> {
        self.alive().await;
        self.inner.inspect(id).await
    }
}

/// A process that dies while its handler runs cannot free the key; the lease does.
/// Here the process is a server whose store handle goes silent, then is shut down
/// mid-request (its abandon-on-drop never reaches the store).
pub async fn dead_process_frees_key_when_lease_ends<S: DedupStore + Clone + 'static>(
    fresh: Fresh<S>,
) {
    let lease = Duration::from_millis(1500);
    let options = IdempotencyOptions::new().lease(lease);
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let doomed = serve(
        Mortal {
            inner: fresh.store.clone(),
            dead: Arc::clone(&dead),
        },
        options.clone(),
    )
    .await;
    let http = Http::default();
    let call = Call::post("/slow", "k-dead", "tenant-a", "{}");
    let request = {
        let http = http.clone();
        let addr = doomed.addr;
        tokio::spawn(async move {
            let call = Call::post("/slow", "k-dead", "tenant-a", "{}");
            http.send_to(addr, &call).await
        })
    };
    let wait_start = Instant::now();
    while doomed.calls() == 0 {
        assert!(
            wait_start.elapsed() < Duration::from_secs(10),
            "slow handler never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The process dies.
    let killed_at = Instant::now();
    dead.store(true, Ordering::SeqCst);
    // Its client hangs up; its handler may run on, but nothing it does reaches the store.
    request.abort();
    drop(doomed);

    let survivor = serve(fresh.store, options).await;
    let early = tokio::time::timeout(Duration::from_secs(5), http.ok(&survivor, &call))
        .await
        .expect("a key held by a dead process answers 409 at once, it does not run");
    if killed_at.elapsed() < lease {
        assert_eq!(
            early.status,
            StatusCode::CONFLICT,
            "the dead holder's lease still runs"
        );
        assert_eq!(early.problem_type(), problem::KEY_IN_USE);
    }
    assert_eq!(survivor.calls(), 0);
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    // The key is free: this request takes it and runs the (slow) handler.
    let retry = {
        let http = http.clone();
        let addr = survivor.addr;
        tokio::spawn(async move {
            let call = Call::post("/slow", "k-dead", "tenant-a", "{}");
            http.send_to(addr, &call).await
        })
    };
    let started = Instant::now();
    while survivor.calls() == 0 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        survivor.calls(),
        1,
        "after the lease, the retry ran the handler"
    );
    assert!(
        !retry.is_finished(),
        "the retry is running the slow handler, not answered"
    );
    retry.abort();
}

/// One `#[tokio::test]` per scenario, each on a fresh store made by `$fresh`.
macro_rules! scenarios {
    ($fresh:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrent_requests_run_once() {
            common::concurrent_requests_run_once($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn different_body_is_422() {
            common::different_body_is_422($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn principals_are_isolated() {
            common::principals_are_isolated($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn replays_are_byte_identical() {
            common::replays_are_byte_identical($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn server_errors_stored_only_when_configured() {
            common::server_errors_stored_only_when_configured($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn oversized_body_is_413() {
            common::oversized_body_is_413($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn panicking_handler_frees_key() {
            common::panicking_handler_frees_key($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dead_process_frees_key_when_lease_ends() {
            common::dead_process_frees_key_when_lease_ends($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_client_that_hangs_up_gets_the_one_response_on_retry() {
            common::hang_up::a_client_that_hangs_up_gets_the_one_response_on_retry($fresh).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_response_over_the_limit_is_not_run_again() {
            common::hang_up::a_response_over_the_limit_is_not_run_again($fresh).await;
        }
    };
}
