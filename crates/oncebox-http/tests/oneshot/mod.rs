//! A plain tower service behind the layer, driven with `oneshot` (no server): a handler
//! that counts its runs and the helpers the protocol tests share.

#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use oncebox_core::memory::MemoryDedupStore;
use oncebox_core::store::DedupStore;
use oncebox_http::{
    HeaderPrincipal, IdempotencyLayer, IdempotencyOptions, RequestBody, ResponseBody, problem,
};
use tokio::sync::watch;
use tower::{Service, ServiceExt, service_fn};

pub type Req = Request<RequestBody<Full<Bytes>>>;

/// A handler that counts its runs, answers `201` with a unique body, and sleeps
/// `delay` first (and waits for its `gate` to open, if it has one). It keeps every body
/// it answered, and counts the runs stopped before their end (their future dropped).
#[derive(Clone)]
pub struct Handler {
    pub calls: Arc<AtomicUsize>,
    pub delay: Duration,
    pub status: StatusCode,
    pub body_len: usize,
    pub gate: Option<watch::Receiver<bool>>,
    pub bodies: Arc<Mutex<Vec<Bytes>>>,
    pub stopped: Arc<AtomicUsize>,
}

/// Counts a run as stopped if dropped before [`Running::finish`].
pub struct Running(Option<Arc<AtomicUsize>>);

impl Running {
    pub fn finish(mut self) {
        self.0 = None;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stopped) = self.0.take() {
            stopped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Handler {
    pub fn new() -> Self {
        Self {
            calls: Arc::default(),
            delay: Duration::ZERO,
            status: StatusCode::CREATED,
            body_len: 0,
            gate: None,
            bodies: Arc::default(),
            stopped: Arc::default(),
        }
    }

    /// A handler that waits, once started, until the returned sender opens its gate.
    pub fn gated() -> (Self, watch::Sender<bool>) {
        let (open, gate) = watch::channel(false);
        let mut handler = Self::new();
        handler.gate = Some(gate);
        (handler, open)
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn stopped(&self) -> usize {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The bodies the handler answered, in order.
    pub fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().expect("not poisoned").clone()
    }

    pub fn service(
        &self,
    ) -> impl Service<Req, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static {
        let handler = self.clone();
        service_fn(move |request: Req| {
            let handler = handler.clone();
            async move {
                let run = handler.calls.fetch_add(1, Ordering::SeqCst) + 1;
                let running = Running(Some(Arc::clone(&handler.stopped)));
                if let Some(mut gate) = handler.gate.clone() {
                    let _ = gate.wait_for(|open| *open).await;
                }
                let key = request
                    .extensions()
                    .get::<oncebox_http::IdempotencyKey>()
                    .map(|k| k.to_string());
                let body = request
                    .into_body()
                    .collect()
                    .await
                    .ok()
                    .map(|b| b.to_bytes());
                tokio::time::sleep(handler.delay).await;
                let mut text = format!(
                    "run {run} key {key:?} body {:?} {}",
                    body.unwrap_or_default(),
                    uuid::Uuid::new_v4()
                );
                while text.len() < handler.body_len {
                    text.push('.');
                }
                let text = Bytes::from(text);
                handler
                    .bodies
                    .lock()
                    .expect("not poisoned")
                    .push(text.clone());
                running.finish();
                let mut response = Response::new(Full::new(text));
                *response.status_mut() = handler.status;
                Ok::<_, Infallible>(response)
            }
        })
    }
}

/// A `POST` from one caller (its API key in `Authorization`), with `key` if given.
pub fn post(key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/orders?x=1").header("authorization", "Basic c2hvcC0x");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request")
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn problem_type(&self) -> String {
        assert_eq!(self.headers["content-type"], problem::CONTENT_TYPE);
        let json: serde_json::Value = serde_json::from_slice(&self.body).expect("JSON");
        json["type"].as_str().expect("type").to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers.contains_key("idempotent-replayed")
    }
}

pub async fn send<S, B>(service: S, request: Request<Full<Bytes>>) -> Answer
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResponseBody<B>>, Error = Infallible>,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let response = service.oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.expect("body").to_bytes(),
    }
}

pub fn memory() -> Arc<MemoryDedupStore> {
    Arc::new(MemoryDedupStore::new(100))
}

/// The layer over `store`, keeping keys per `Authorization` header.
pub fn layer<S: DedupStore + 'static>(
    store: S,
    options: IdempotencyOptions,
) -> IdempotencyLayer<S, HeaderPrincipal> {
    IdempotencyLayer::new(store, HeaderPrincipal::authorization(), options).expect("valid options")
}

/// Polls `future` until `handler` has started (the caller then hangs up by dropping
/// it).
pub async fn until_started<F: Future + Unpin>(future: &mut F, handler: &Handler) {
    let started = async {
        while handler.calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        _ = future => panic!("answered before the handler started"),
        () = started => {}
    }
}

/// Sends `request()` again while the answer is `409` (the first request still runs),
/// for at most `within`.
pub async fn until_settled<S, B>(
    service: &S,
    request: impl Fn() -> Request<Full<Bytes>>,
    within: Duration,
) -> Answer
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResponseBody<B>>, Error = Infallible>
        + Clone,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let answer = tokio::time::timeout(within, send(service.clone(), request()))
            .await
            .expect("the retry ran the handler again instead of answering");
        if answer.status != StatusCode::CONFLICT || tokio::time::Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
