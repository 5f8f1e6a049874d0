//! A request once its key is taken: the handler runs in the request's task, and goes on
//! in a task of its own if the client hangs up (the server drops the response future),
//! so that a hang-up stops nothing. The
//! handler runs to its end, its response is stored, and the key is settled, for at most
//! [`hang_up_timeout`](crate::IdempotencyOptions::hang_up_timeout) after the hang-up;
//! past it the handler is stopped first, and only then is its key settled as for a
//! handler that failed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::response::Parts as Head;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use oncebox_core::Error;
use oncebox_core::consumer::keep_lease;
use oncebox_core::store::{DedupStore, FencingToken};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower_service::Service;
use tracing::Instrument;

use crate::body::{Collected, RequestBody, ResponseBody, Unfinished, collect_limited};
use crate::fingerprint::Fingerprint;
use crate::layer::Shared;
use crate::options::IdempotencyOptions;
use crate::problem::Problem;
use crate::record::StoredResponse;

pub(crate) type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

/// A key this request took, and what settling it needs.
pub(crate) struct Taken<S> {
    pub(crate) shared: Arc<Shared<S>>,
    pub(crate) scope: String,
    pub(crate) token: FencingToken,
    pub(crate) taken_at: Instant,
    pub(crate) fingerprint: Fingerprint,
}

/// Runs the handler for a taken key and waits for its answer. Dropping this future (the
/// client hung up) does not stop the handler: it goes on in a task of its own, stores
/// the response as it would have, or is stopped `hang_up_timeout` later.
pub(crate) async fn run<Svc, S, ReqB, ResB>(
    taken: Taken<S>,
    inner: Svc,
    request: Request<RequestBody<ReqB>>,
) -> Answer<ResB, Svc::Error>
where
    Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    S: DedupStore + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB::Error: Send,
{
    let (waiting, hung_up) = oneshot::channel::<()>();
    let settle = settle(taken, inner, request, hung_up).instrument(tracing::Span::current());
    Detachable {
        work: Some(Box::pin(settle)),
        waiting: Some(waiting),
        polling: false,
    }
    .await
}

/// Work run in its caller's task until the caller stops waiting for it, then in a task
/// of its own: a task per request only for the requests whose client hung up.
struct Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    work: Option<Pin<Box<F>>>,
    /// Dropped with this: the work then knows that nobody waits for its answer.
    waiting: Option<oneshot::Sender<()>>,
    /// Set while the work is polled: still set when this is dropped, the poll panicked,
    /// and the work cannot go on (dropped, it frees its key).
    polling: bool,
}

impl<F> Future for Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let work = this
            .work
            .as_mut()
            .expect("Detachable polled after completion");
        this.polling = true;
        let polled = work.as_mut().poll(cx);
        this.polling = false;
        if polled.is_ready() {
            this.work = None;
        }
        polled
    }
}

impl<F> Drop for Detachable<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    fn drop(&mut self) {
        if self.polling {
            return;
        }
        // Without a runtime here, or on one shutting down (which drops what is spawned
        // on it), the work is dropped with no answer: its key is freed by its lease.
        if let (Some(work), Ok(runtime)) = (self.work.take(), Handle::try_current()) {
            runtime.spawn(work);
        }
        // The hang-up, seen by the work wherever it runs now.
        drop(self.waiting.take());
    }
}

enum Handled<B: Body, E> {
    /// The inner service failed.
    Failed(E),
    /// A status that is not stored (`5xx`, `408`, `429`): the body untouched.
    Unstored(Response<B>),
    /// A response read whole: stored.
    Whole(Box<Head>, Collected),
    /// A response the layer cannot store (over `max_response_bytes`, or with trailers):
    /// `why` says which.
    Unkept {
        head: Box<Head>,
        body: ResponseBody<B>,
        why: String,
    },
    /// The response body failed while it was read.
    BodyFailed(Box<Head>, ResponseBody<B>),
}

/// The task: the handler under the key's lease, its response read, the key settled.
async fn settle<Svc, S, ReqB, ResB>(
    taken: Taken<S>,
    mut inner: Svc,
    request: Request<RequestBody<ReqB>>,
    hung_up: oneshot::Receiver<()>,
) -> Answer<ResB, Svc::Error>
where
    Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    S: DedupStore + 'static,
    ResB: Body<Data = Bytes> + Unpin,
{
    let Taken {
        shared,
        scope,
        token,
        taken_at,
        fingerprint,
    } = taken;
    let mut hold = Hold {
        shared: Arc::clone(&shared),
        scope,
        token,
        armed: true,
    };
    let options = &shared.options;
    let work = async {
        let response = match inner.call(request).await {
            Ok(response) => response,
            Err(error) => return Ok::<_, Error>(Handled::Failed(error)),
        };
        Ok(read::<_, Svc::Error>(response, options).await)
    };
    // The key's lease is kept alive while the handler runs and its body is read: a retry
    // meanwhile gets 409, however long it takes. A handler whose lease cannot be kept
    // (the store unreachable for a whole lease) is stopped before another request could
    // take the key.
    let kept = keep_lease(
        &shared.store,
        &hold.scope,
        token,
        options.lease,
        taken_at,
        work,
    );
    let handled = match unless_abandoned(kept, hung_up, options.hang_up_timeout).await {
        Some(Ok(handled)) => handled,
        Some(Err(lost)) => {
            tracing::warn!(%lost, "the idempotency key's lease could not be kept; the handler was stopped");
            hold.armed = false;
            return Ok(Problem::StoreUnavailable.response(
                "the idempotency key could not be kept while the request ran; retry later",
                Some(options.retry_after_secs()),
            ));
        }
        None => return Ok(stopped(&mut hold, &fingerprint).await),
    };
    match handled {
        Handled::Failed(error) => {
            hold.abandon().await;
            Err(error)
        }
        Handled::Unstored(response) => {
            hold.abandon().await;
            Ok(response.map(ResponseBody::inner))
        }
        Handled::Whole(head, collected) => {
            let record = StoredResponse::encode(
                &fingerprint,
                head.status,
                &head.headers,
                &options.replay_headers,
                &collected.data,
            );
            hold.complete(&record).await;
            Ok(Response::from_parts(
                *head,
                ResponseBody::collected(collected),
            ))
        }
        Handled::Unkept { head, body, why } => {
            let detail = format!(
                "this request was processed and answered {}, but its response {why}, so it \
                 was sent once and cannot be sent again; sending the request with a new key \
                 would process it again",
                head.status
            );
            let problem = Problem::ResponseNotStored;
            let original = ("original_status", head.status.as_u16().into());
            let record = problem_record(&fingerprint, problem, &detail, &[original]);
            hold.complete(&record).await;
            Ok(Response::from_parts(*head, body))
        }
        Handled::BodyFailed(head, body) => {
            hold.abandon().await;
            Ok(Response::from_parts(*head, body))
        }
    }
}

/// Reads a response as far as storing it needs: the body of a status that is stored, up
/// to `max_response_bytes`.
async fn read<B, E>(response: Response<B>, options: &IdempotencyOptions) -> Handled<B, E>
where
    B: Body<Data = Bytes> + Unpin,
{
    if !should_store(response.status(), options) {
        return Handled::Unstored(response);
    }
    let (head, body) = response.into_parts();
    // Boxed: the future stays small (no large moves) while the body is read.
    let head = Box::new(head);
    match collect_limited(body, options.max_response_bytes).await {
        Ok(collected) if collected.trailers.is_none() => Handled::Whole(head, collected),
        Ok(with_trailers) => {
            tracing::warn!("response has trailers, which are not replayed: not stored");
            Handled::Unkept {
                head,
                body: ResponseBody::collected(with_trailers),
                why: "had trailers, which are not kept for replay".to_owned(),
            }
        }
        Err(too_large @ Unfinished::TooLarge { .. }) => {
            tracing::warn!(
                limit = options.max_response_bytes,
                "response larger than max_response_bytes: sent, not stored"
            );
            Handled::Unkept {
                head,
                body: ResponseBody::unfinished(too_large),
                why: format!(
                    "was larger than the {} bytes kept for replay",
                    options.max_response_bytes
                ),
            }
        }
        Err(failed) => Handled::BodyFailed(head, ResponseBody::unfinished(failed)),
    }
}

/// Whether a response with `status` is stored for replay.
fn should_store(status: StatusCode, options: &IdempotencyOptions) -> bool {
    match status {
        // Not processed: the client retries with the same key.
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => false,
        status if status.is_server_error() => options.store_server_errors,
        _ => true,
    }
}

/// The handler was stopped at `hang_up_timeout` (it no longer runs): its key is settled
/// as for a handler that answered `504`: stored with `store_server_errors`, else freed.
async fn stopped<B: Body, S: DedupStore + 'static>(
    hold: &mut Hold<S>,
    fingerprint: &Fingerprint,
) -> Response<ResponseBody<B>> {
    let options = &hold.shared.options;
    tracing::warn!(
        timeout = ?options.hang_up_timeout,
        "the handler still ran hang_up_timeout after its client hung up: stopped"
    );
    let detail = format!(
        "the client hung up and the handler still ran {} ms later, so it was stopped; it          may have had part of its effect",
        options.hang_up_timeout.as_millis()
    );
    let problem = Problem::HandlerTimeout;
    if should_store(problem.status(), options) {
        let record = problem_record(fingerprint, problem, &detail, &[]);
        hold.complete(&record).await;
    } else {
        hold.abandon().await;
    }
    problem.response(&detail, None)
}

/// The record of the layer's own `problem`, stored for replay as a response would be.
fn problem_record(
    fingerprint: &Fingerprint,
    problem: Problem,
    detail: &str,
    members: &[(&str, serde_json::Value)],
) -> Bytes {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::problem::CONTENT_TYPE),
    );
    StoredResponse::encode(
        fingerprint,
        problem.status(),
        &headers,
        &[header::CONTENT_TYPE],
        &problem.body(detail, members),
    )
}

/// `work`'s output, or `None` if it still ran `timeout` after its client hung up (it
/// is then dropped, which stops it).
async fn unless_abandoned<T>(
    work: impl Future<Output = T>,
    hung_up: oneshot::Receiver<()>,
    timeout: Duration,
) -> Option<T> {
    let expired = async move {
        // Never sent: it ends when the sender is dropped.
        let _ = hung_up.await;
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        biased;
        done = work => Some(done),
        () = expired => None,
    }
}

/// The key, held with `token` while the handler runs. Dropped while armed (the
/// handler panicked, or the runtime shut down), it frees the key in a task of its own;
/// if even that cannot happen (the runtime is gone with the process), the lease frees
/// it.
struct Hold<S: DedupStore + 'static> {
    shared: Arc<Shared<S>>,
    scope: String,
    token: FencingToken,
    armed: bool,
}

impl<S: DedupStore + 'static> Hold<S> {
    async fn complete(&mut self, record: &[u8]) {
        self.armed = false;
        let options = &self.shared.options;
        match self
            .shared
            .store
            .complete(&self.scope, self.token, record, options.ttl)
            .await
        {
            Ok(()) => {}
            Err(Error::LeaseLost) => tracing::warn!(
                lease = ?options.lease,
                "the handler outlived its lease: its response was sent but not stored"
            ),
            // The key stays held until its lease ends; then a retry runs the handler.
            Err(error) => tracing::warn!(%error, "storing the response for replay failed"),
        }
    }

    async fn abandon(&mut self) {
        self.armed = false;
        match self.shared.store.abandon(&self.scope, self.token).await {
            Ok(()) | Err(Error::LeaseLost) => {}
            Err(error) => {
                tracing::warn!(%error, "freeing the idempotency key failed; its lease will");
            }
        }
    }
}

impl<S: DedupStore + 'static> Drop for Hold<S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let scope = std::mem::take(&mut self.scope);
        let token = self.token;
        runtime.spawn(async move {
            match shared.store.abandon(&scope, token).await {
                Ok(()) | Err(Error::LeaseLost) => {}
                Err(error) => tracing::warn!(%error, "freeing an abandoned idempotency key failed"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Work that counts its polls: its first poll panics if `panics`, else is pending;
    /// every later poll is ready.
    struct Counted {
        polls: Arc<AtomicUsize>,
        panics: bool,
    }

    impl Future for Counted {
        type Output = ();

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            let first = self.polls.fetch_add(1, Ordering::SeqCst) == 0;
            assert!(!(first && self.panics), "the handler panicked");
            if first {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }
    }

    /// Polls `work` once in a `Detachable` (catching a panic), drops it, lets any task
    /// it spawned run, and returns how often the work was polled.
    async fn polls_after_a_drop(panics: bool) -> usize {
        let polls = Arc::new(AtomicUsize::new(0));
        let (waiting, _hung_up) = oneshot::channel();
        let mut detachable = Box::pin(Detachable {
            work: Some(Box::pin(Counted {
                polls: Arc::clone(&polls),
                panics,
            })),
            waiting: Some(waiting),
            polling: false,
        });
        let waker = std::task::Waker::noop();
        let polled = catch_unwind(AssertUnwindSafe(|| {
            detachable.as_mut().poll(&mut Context::from_waker(waker))
        }));
        assert_eq!(polled.is_err(), panics);
        drop(detachable);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        polls.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn work_dropped_while_pending_goes_on_in_a_task_of_its_own() {
        assert_eq!(polls_after_a_drop(false).await, 2);
    }

    #[tokio::test]
    async fn work_whose_poll_panicked_is_never_polled_again() {
        assert_eq!(polls_after_a_drop(true).await, 1);
    }

    #[test]
    fn stores_what_was_processed() {
        let options = IdempotencyOptions::new();
        for stored in [200, 201, 204, 302, 400, 404, 409, 422] {
            assert!(should_store(
                StatusCode::from_u16(stored).unwrap(),
                &options
            ));
        }
        for not in [408, 429, 500, 502, 503, 504] {
            assert!(!should_store(StatusCode::from_u16(not).unwrap(), &options));
        }
        let options = options.store_server_errors(true);
        assert!(should_store(StatusCode::INTERNAL_SERVER_ERROR, &options));
        assert!(should_store(StatusCode::GATEWAY_TIMEOUT, &options));
        assert!(!should_store(StatusCode::TOO_MANY_REQUESTS, &options));
    }
}
