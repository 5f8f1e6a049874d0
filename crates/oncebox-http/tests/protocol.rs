//! The protocol, driven with `oneshot` on a plain tower service (no server): every
//! answer of the layer, store failures, errors of the inner service, handlers that
//! outlive their lease. What a client that hangs up gets is in `hang_up.rs`.

mod oneshot;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use oncebox_core::memory::MemoryDedupStore;
use oncebox_core::store::{Begin, DedupStore};
use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions, StoreFailure, problem};
use oneshot::{Handler, Req, layer, memory, post, send};
use tower::{Layer, ServiceExt, service_fn};

#[tokio::test]
async fn required_key_missing_or_invalid_is_400() {
    let handler = Handler::new();
    let service =
        layer(memory(), IdempotencyOptions::new().required(true)).layer(handler.service());
    let missing = send(service.clone(), post(None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem_type(), problem::KEY_MISSING);

    let (long, longer) = ("k".repeat(256), "k".repeat(300));
    // A tab is the one control character HTTP lets through in a header value.
    let bad_keys = [
        HeaderValue::from_static(""),
        HeaderValue::from_static("has space"),
        HeaderValue::from_str(&long).expect("ascii"),
        HeaderValue::from_str(&longer).expect("ascii"),
        HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque bytes"),
        HeaderValue::from_bytes(b"tab\there").expect("a tab is allowed in a value"),
    ];
    for bad in bad_keys {
        let mut request = post(None, "{}");
        request.headers_mut().insert("idempotency-key", bad.clone());
        let answer = send(service.clone(), request).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(answer.problem_type(), problem::KEY_INVALID);
    }
    let mut twice = post(Some("a"), "{}");
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("b"));
    assert_eq!(
        send(service.clone(), twice).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(handler.calls(), 0);

    // The longest key, and the IETF draft's quoted form, are fine.
    let longest = "k".repeat(255);
    let mut request = post(None, "{}");
    request.headers_mut().insert(
        "idempotency-key",
        HeaderValue::from_str(&longest).expect("ascii"),
    );
    assert_eq!(
        send(service.clone(), request).await.status,
        StatusCode::CREATED
    );
    let quoted = send(service.clone(), post(Some("\"q-1\""), "{}")).await;
    assert_eq!(quoted.status, StatusCode::CREATED);
    // Quoted and bare forms are the same key.
    let bare = send(service, post(Some("q-1"), "{}")).await;
    assert!(bare.replayed());
    assert_eq!(bare.body, quoted.body);
}

#[tokio::test]
async fn other_methods_and_keyless_requests_pass_through() {
    let handler = Handler::new();
    let store = Arc::new(MemoryDedupStore::new(100));
    let service = layer(Arc::clone(&store), IdempotencyOptions::new()).layer(handler.service());
    for _ in 0..2 {
        // Not required: no key, no protection.
        assert_eq!(
            send(service.clone(), post(None, "{}")).await.status,
            StatusCode::CREATED
        );
        // GET is not one of the methods, even with a key.
        let mut get = post(Some("k"), "");
        *get.method_mut() = Method::GET;
        let answer = send(service.clone(), get).await;
        assert!(!answer.replayed());
    }
    assert_eq!(handler.calls(), 4);
    assert!(store.is_empty(), "nothing was recorded");

    // PUT can be opted in.
    let service =
        layer(store, IdempotencyOptions::new().methods([Method::PUT])).layer(handler.service());
    let mut put = post(Some("k-put"), "{}");
    *put.method_mut() = Method::PUT;
    let first = send(service.clone(), put).await;
    let mut put = post(Some("k-put"), "{}");
    *put.method_mut() = Method::PUT;
    let again = send(service, put).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

#[tokio::test]
async fn the_handler_sees_the_body_and_the_key() {
    let handler = Handler::new();
    let service = layer(memory(), IdempotencyOptions::new()).layer(handler.service());
    let answer = send(service, post(Some("k-seen"), "{\"a\":1}")).await;
    let text = String::from_utf8_lossy(&answer.body);
    assert!(text.contains("key Some(\"k-seen\")"), "{text}");
    assert!(text.contains("{\\\"a\\\":1}"), "{text}");
}

#[tokio::test]
async fn path_and_query_are_part_of_the_fingerprint() {
    let handler = Handler::new();
    let service = layer(memory(), IdempotencyOptions::new()).layer(handler.service());
    send(service.clone(), post(Some("k-q"), "{}")).await;
    let mut other_query = post(Some("k-q"), "{}");
    *other_query.uri_mut() = "/orders?x=2".parse().expect("uri");
    // Another path is another scope (the route is part of it) ...
    let mut other_path = post(Some("k-q"), "{}");
    *other_path.uri_mut() = "/refunds".parse().expect("uri");
    assert_eq!(
        send(service.clone(), other_path).await.status,
        StatusCode::CREATED
    );
    // ... while the same path with another query is the same scope, another request.
    let answer = send(service, other_query).await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer.problem_type(), problem::KEY_REUSED);
    assert_eq!(handler.calls(), 2);
}

#[tokio::test]
async fn store_failure_fails_closed_by_default_or_open_when_asked() {
    let handler = Handler::new();
    let store = Arc::new(MemoryDedupStore::new(100));
    store.set_down(true);
    let closed = layer(
        Arc::clone(&store),
        IdempotencyOptions::new().retry_after(Duration::from_secs(5)),
    )
    .layer(handler.service());
    let answer = send(closed, post(Some("k-down"), "{}")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), problem::STORE_UNAVAILABLE);
    assert_eq!(answer.headers["retry-after"], "5");
    assert_eq!(handler.calls(), 0);

    let open = layer(
        Arc::clone(&store),
        IdempotencyOptions::new().on_store_failure(StoreFailure::FailOpen),
    )
    .layer(handler.service());
    assert_eq!(
        send(open, post(Some("k-down"), "{}")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(handler.calls(), 1);
}

/// A store whose every id holds a result that is no idempotency record.
struct Junk;

impl DedupStore for Junk {
    async fn begin(&self, _id: &str, _lease: Duration) -> oncebox_core::Result<Begin> {
        Ok(Begin::Completed(Bytes::from_static(b"charged")))
    }

    async fn complete(
        &self,
        _id: &str,
        _token: oncebox_core::store::FencingToken,
        _result: &[u8],
        _ttl: Duration,
    ) -> oncebox_core::Result<()> {
        Ok(())
    }

    async fn extend(
        &self,
        _id: &str,
        _token: oncebox_core::store::FencingToken,
        _lease: Duration,
    ) -> oncebox_core::Result<()> {
        Ok(())
    }

    async fn abandon(
        &self,
        _id: &str,
        _token: oncebox_core::store::FencingToken,
    ) -> oncebox_core::Result<()> {
        Ok(())
    }

    async fn inspect(
        &self,
        _id: &str,
    ) -> oncebox_core::Result<Option<oncebox_core::store::DedupRecord>> {
        Ok(None)
    }
}

#[tokio::test]
async fn damaged_record_is_a_store_failure_not_a_panic() {
    let handler = Handler::new();
    let service = layer(Junk, IdempotencyOptions::new()).layer(handler.service());
    let answer = send(service, post(Some("k-junk"), "{}")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), problem::STORE_UNAVAILABLE);
    assert_eq!(handler.calls(), 0);
}

#[tokio::test]
async fn inner_errors_pass_through_and_free_the_key() {
    #[derive(Debug)]
    struct Boom;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let failing = service_fn(move |_request: Req| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(Boom)
            } else {
                Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }
    });
    let service = layer(memory(), IdempotencyOptions::new()).layer(failing);
    let error = service.clone().oneshot(post(Some("k-err"), "{}")).await;
    assert!(
        matches!(error, Err(Boom)),
        "the inner error type passes through"
    );
    let ok = service
        .oneshot(post(Some("k-err"), "{}"))
        .await
        .expect("second call");
    assert_eq!(ok.status(), StatusCode::OK, "the key was freed");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_outliving_its_first_lease_keeps_its_key() {
    let store = Arc::new(MemoryDedupStore::new(100));
    let mut slow = Handler::new();
    slow.delay = Duration::from_millis(900);
    let options = IdempotencyOptions::new().lease(Duration::from_millis(300));
    let slow_service = layer(Arc::clone(&store), options.clone()).layer(slow.service());
    let fast = Handler::new();
    let fast_service = layer(Arc::clone(&store), options).layer(fast.service());

    let first = tokio::spawn(send(slow_service, post(Some("k-lease"), "{}")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Past the first lease, the slow holder still holds the key: a retry waits.
    let second = send(fast_service.clone(), post(Some("k-lease"), "{}")).await;
    assert_eq!(
        second.status,
        StatusCode::CONFLICT,
        "a retry ran beside the slow handler"
    );
    assert_eq!(second.problem_type(), problem::KEY_IN_USE);
    assert_eq!(fast.calls(), 0);
    let first = first.await.expect("slow request");
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = send(fast_service, post(Some("k-lease"), "{}")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body, "the slow holder's response stands");
    assert_eq!(fast.calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_whose_lease_cannot_be_kept_is_stopped_before_it_ends() {
    let store = Arc::new(MemoryDedupStore::new(100));
    let mut slow = Handler::new();
    slow.delay = Duration::from_secs(5);
    let lease = Duration::from_millis(300);
    let service =
        layer(Arc::clone(&store), IdempotencyOptions::new().lease(lease)).layer(slow.service());
    let started = std::time::Instant::now();
    let request = tokio::spawn(send(service, post(Some("k-cut"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.set_down(true);
    let answer = request.await.expect("request");
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), problem::STORE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the handler ran on after its lease could no longer be kept"
    );
}

#[tokio::test]
async fn rate_limited_responses_are_not_stored() {
    let mut handler = Handler::new();
    handler.status = StatusCode::TOO_MANY_REQUESTS;
    let service = layer(memory(), IdempotencyOptions::new()).layer(handler.service());
    send(service.clone(), post(Some("k-429"), "{}")).await;
    let again = send(service, post(Some("k-429"), "{}")).await;
    assert!(!again.replayed());
    assert_eq!(handler.calls(), 2);
}

#[tokio::test]
async fn options_are_validated() {
    let error = IdempotencyLayer::new(
        MemoryDedupStore::new(10),
        HeaderPrincipal::authorization(),
        IdempotencyOptions::new().lease(Duration::ZERO),
    )
    .expect_err("zero lease");
    assert!(error.is_invalid_input());
}

/// A store that holds as many live keys as it may: it refuses every new key, as the
/// bounded stores document (`Error::AtCapacity`).
struct AtCapacity {
    retry_after: Duration,
}

impl DedupStore for AtCapacity {
    async fn begin(&self, _id: &str, _lease: Duration) -> oncebox_core::Result<Begin> {
        Err(oncebox_core::Error::AtCapacity {
            capacity: 3,
            retry_after: self.retry_after,
        })
    }

    async fn complete(
        &self,
        _id: &str,
        _token: oncebox_core::store::FencingToken,
        _result: &[u8],
        _ttl: Duration,
    ) -> oncebox_core::Result<()> {
        Ok(())
    }

    async fn extend(
        &self,
        _id: &str,
        _token: oncebox_core::store::FencingToken,
        _lease: Duration,
    ) -> oncebox_core::Result<()> {
        Ok(())
    }

    async fn abandon(
        &self,
        _id: &str,
        _token: oncebox_core::store::FencingToken,
    ) -> oncebox_core::Result<()> {
        Ok(())
    }

    async fn inspect(
        &self,
        _id: &str,
    ) -> oncebox_core::Result<Option<oncebox_core::store::DedupRecord>> {
        Ok(None)
    }
}

#[tokio::test]
async fn a_full_store_is_503_with_its_retry_after() {
    let handler = Handler::new();
    for (retry_after, seconds) in [
        (Duration::from_millis(2300), "3"),
        (Duration::from_secs(7), "7"),
        (Duration::from_millis(10), "1"),
        (Duration::ZERO, "1"),
    ] {
        let service =
            layer(AtCapacity { retry_after }, IdempotencyOptions::new()).layer(handler.service());
        let answer = send(service, post(Some("k-full"), "{}")).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.problem_type(), problem::STORE_AT_CAPACITY);
        assert_eq!(answer.headers["retry-after"], seconds, "{retry_after:?}");
    }
    assert_eq!(handler.calls(), 0, "a full store runs no handler");

    // Failing open runs the handler unprotected, as for any store failure.
    let open = layer(
        AtCapacity {
            retry_after: Duration::from_secs(1),
        },
        IdempotencyOptions::new().on_store_failure(StoreFailure::FailOpen),
    )
    .layer(handler.service());
    assert_eq!(
        send(open, post(Some("k-full"), "{}")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(handler.calls(), 1);
}
