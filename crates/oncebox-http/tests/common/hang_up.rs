//! A client that hangs up while its handler runs, and a response too large to store,
//! over a real server on every store: the handler runs once, to its end, and the retry
//! gets what it left (the stored response, or `410 response-not-stored`), never a
//! second run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use oncebox_core::store::DedupStore;
use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions, problem};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::{Call, Fresh, Http, Reply};

/// The length of the body `/large` answers.
const LARGE: usize = 10_000;

/// The app's state: handler runs, the gate every run waits for, the bodies answered.
#[derive(Clone)]
struct Gated {
    calls: Arc<AtomicUsize>,
    gate: watch::Receiver<bool>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

/// Counts a run, waits for the gate, then answers `201` with a unique body of at least
/// `len` bytes, which it keeps.
async fn answer(app: Gated, len: usize) -> (StatusCode, HeaderMap, Bytes) {
    app.calls.fetch_add(1, Ordering::SeqCst);
    let mut gate = app.gate.clone();
    let _ = gate.wait_for(|open| *open).await;
    let mut text = format!("{{\"payment\":\"{}\"}}", uuid::Uuid::new_v4());
    while text.len() < len {
        text.push(' ');
    }
    let body = Bytes::from(text);
    app.bodies.lock().expect("not poisoned").push(body.clone());
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    (StatusCode::CREATED, headers, body)
}

async fn gated(State(app): State<Gated>) -> (StatusCode, HeaderMap, Bytes) {
    answer(app, 0).await
}

async fn large(State(app): State<Gated>) -> (StatusCode, HeaderMap, Bytes) {
    answer(app, LARGE).await
}

/// Counts a response future dropped before its end: the server saw its client hang up.
struct CountIfDropped(Option<Arc<AtomicUsize>>);

impl CountIfDropped {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl Drop for CountIfDropped {
    fn drop(&mut self) {
        if let Some(count) = self.0.take() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A running server with the gated app behind the layer.
struct Server {
    addr: SocketAddr,
    state: Gated,
    open: watch::Sender<bool>,
    hung_up: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }

    fn hung_up(&self) -> usize {
        self.hung_up.load(Ordering::SeqCst)
    }

    fn bodies(&self) -> Vec<Bytes> {
        self.state.bodies.lock().expect("not poisoned").clone()
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<S: DedupStore + 'static>(store: S, options: IdempotencyOptions) -> Server {
    let (open, gate) = watch::channel(false);
    let state = Gated {
        calls: Arc::default(),
        gate,
        bodies: Arc::default(),
    };
    let hung_up = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hung_up);
    let principal = HeaderPrincipal::new(http::HeaderName::from_static("x-api-key"));
    let layer = IdempotencyLayer::new(store, principal, options).expect("valid options");
    // Outside the layer: notes when the server drops a response future unfinished.
    let observe = axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let guard = CountIfDropped(Some(Arc::clone(&counter)));
            async move {
                let response = next.run(request).await;
                guard.finished();
                response
            }
        },
    );
    let router = Router::new()
        .route("/gated", post(gated))
        .route("/large", post(large))
        .layer(layer)
        .layer(observe)
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Server {
        addr,
        state,
        open,
        hung_up,
        task,
    }
}

/// Sends `call` on a connection of its own, which the caller closes to hang up.
async fn send_raw(addr: SocketAddr, call: &Call<'_>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: {}\r\nx-api-key: {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        call.path,
        call.key.expect("a key"),
        call.api_key.expect("an API key"),
        call.body.len(),
    );
    stream.write_all(head.as_bytes()).await.expect("send");
    stream.write_all(&call.body).await.expect("send");
    stream
}

/// Waits until `done`, at most 10 s.
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: never");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `call` again while the answer is `409` (the first request still runs), for
/// at most 10 s; a retry that runs the (gated) handler again instead of answering fails.
async fn until_settled(http: &Http, addr: SocketAddr, call: &Call<'_>) -> Reply {
    let start = Instant::now();
    loop {
        let reply = tokio::time::timeout(Duration::from_secs(10), http.send_to(addr, call))
            .await
            .expect("the retry ran the handler again instead of answering")
            .expect("request failed");
        if reply.status != StatusCode::CONFLICT || start.elapsed() > Duration::from_secs(10) {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The client hangs up while the handler runs: the handler runs to its end, its
/// response is stored, a retry meanwhile gets `409`, and the retry after gets the
/// response byte for byte with `Idempotent-Replayed: true`; the handler ran once.
pub async fn a_client_that_hangs_up_gets_the_one_response_on_retry<S: DedupStore + 'static>(
    fresh: Fresh<S>,
) {
    let server = serve(fresh.store, IdempotencyOptions::new()).await;
    let http = Http::default();
    let call = Call::post("/gated", "k-hang-up", "tenant-a", "{\"amount\":42}");
    let connection = send_raw(server.addr, &call).await;
    wait_for("the handler started", || server.calls() == 1).await;
    drop(connection);
    wait_for("the server saw the client hang up", || {
        server.hung_up() == 1
    })
    .await;

    let busy = tokio::time::timeout(Duration::from_secs(3), http.send_to(server.addr, &call))
        .await
        .expect("the retry ran the handler again: the key was freed when the client hung up")
        .expect("request failed");
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    assert_eq!(busy.problem_type(), problem::KEY_IN_USE);

    server.open();
    let retry = until_settled(&http, server.addr, &call).await;
    assert_eq!(server.calls(), 1, "the handler ran once");
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(retry.replayed(), "the retry is a replay: {retry:?}");
    assert_eq!(
        retry.body,
        server.bodies()[0],
        "the replay is the handler's response, byte for byte"
    );
    assert_eq!(retry.headers["content-type"], "application/json");
}

/// A response over `max_response_bytes` reaches its client whole, and the key stays
/// taken: the retry gets `410 response-not-stored` naming the first status (replayed),
/// and the handler ran once.
pub async fn a_response_over_the_limit_is_not_run_again<S: DedupStore + 'static>(fresh: Fresh<S>) {
    let options = IdempotencyOptions::new().max_response_bytes(1000);
    let server = serve(fresh.store, options).await;
    server.open();
    let http = Http::default();
    let call = Call::post("/large", "k-large", "tenant-a", "{\"amount\":42}");
    let first = http.send_to(server.addr, &call).await.expect("request");
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.body.len(), LARGE, "the whole body reached the client");
    assert_eq!(first.body, server.bodies()[0]);

    let retry = http.send_to(server.addr, &call).await.expect("request");
    assert_eq!(
        server.calls(),
        1,
        "the retry ran the handler again: the key was freed"
    );
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.status, StatusCode::GONE);
    assert_eq!(retry.problem_type(), problem::RESPONSE_NOT_STORED);
    let json: serde_json::Value = serde_json::from_slice(&retry.body).expect("JSON");
    assert_eq!(json["original_status"], 201, "{json}");
}
