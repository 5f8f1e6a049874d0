//! The idempotent path of a request: buffer and fingerprint the body, take the key,
//! run the handler, store and return its response; or answer from the store.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use oncebox_core::Error;
use oncebox_core::consumer::{StoreFailure, keep_lease};
use oncebox_core::store::{Begin, DedupStore, FencingToken};
use tower_service::Service;

use crate::body::{Collected, RequestBody, ResponseBody, Unfinished, collect_limited};
use crate::fingerprint::Fingerprint;
use crate::layer::Shared;
use crate::options::{IDEMPOTENT_REPLAYED, IdempotencyOptions, retry_after_secs};
use crate::problem::Problem;
use crate::record::StoredResponse;
use crate::service::too_large;

type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

pub(crate) async fn run<Svc, S, ReqB, ResB>(
    shared: Arc<Shared<S>>,
    mut inner: Svc,
    parts: Box<Parts>,
    body: ReqB,
    scope: String,
) -> Answer<ResB, Svc::Error>
where
    Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    S: DedupStore + 'static,
    ReqB: Body<Data = Bytes> + Unpin,
    ResB: Body<Data = Bytes> + Unpin,
{
    let options = &shared.options;
    let collected = match collect_limited(body, options.max_body_bytes).await {
        Ok(collected) => collected,
        Err(Unfinished::TooLarge { .. }) => return Ok(too_large(options.max_body_bytes)),
        Err(Unfinished::Failed { .. }) => {
            return Ok(Problem::BodyUnreadable.response("the request body could not be read", None));
        }
    };
    let path = parts.uri.path_and_query().map_or("", |p| p.as_str());
    let fingerprint = Fingerprint::of(&parts.method, path, &collected.data);

    let taken_at = tokio::time::Instant::now();
    let token = match shared.store.begin(&scope, options.lease).await {
        Ok(Begin::Started(token)) => token,
        Ok(Begin::InProgress { .. }) => {
            return Ok(Problem::KeyInUse.response(
                "a request with this idempotency key is being processed; retry later",
                Some(options.retry_after_secs()),
            ));
        }
        Ok(Begin::Completed(record)) => {
            return match StoredResponse::decode(&record) {
                Ok(stored) if stored.fingerprint == fingerprint => Ok(replay(stored)),
                Ok(_) => Ok(Problem::KeyReused.response(
                    "this idempotency key was used for a different request (method, path or body)",
                    None,
                )),
                Err(damaged) => {
                    let error = Error::store_permanent(damaged);
                    Box::pin(store_failed(error, options, inner, parts, collected)).await
                }
            };
        }
        Err(error) => return Box::pin(store_failed(error, options, inner, parts, collected)).await,
    };

    let mut hold = Hold {
        shared: &shared,
        scope,
        token,
        armed: true,
    };
    let request = Request::from_parts(*parts, RequestBody::buffered(collected));
    // The key's lease is kept alive while the handler runs: a retry meanwhile gets 409,
    // however long the handler takes. A handler whose lease cannot be kept (the store is
    // unreachable for a whole lease) is stopped before another request could take the key.
    let handled = keep_lease(
        &shared.store,
        &hold.scope,
        token,
        options.lease,
        taken_at,
        async { Ok(inner.call(request).await) },
    )
    .await;
    let response = match handled {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            hold.abandon().await;
            return Err(error);
        }
        Err(lost) => {
            tracing::warn!(%lost, "the idempotency key's lease could not be kept; the handler was stopped");
            hold.armed = false;
            return Ok(Problem::StoreUnavailable.response(
                "the idempotency key could not be kept while the request ran; retry later",
                Some(options.retry_after_secs()),
            ));
        }
    };
    if !should_store(response.status(), options) {
        hold.abandon().await;
        return Ok(response.map(ResponseBody::inner));
    }
    let (head, body) = response.into_parts();
    // Boxed, like the request's parts: the future stays small (no large allocation, no
    // large moves) while the body is read.
    let head = Box::new(head);
    match collect_limited(body, options.max_response_bytes).await {
        Ok(collected) if collected.trailers.is_none() => {
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
        Ok(with_trailers) => {
            tracing::debug!("response has trailers, which are not replayed: not stored");
            hold.abandon().await;
            Ok(Response::from_parts(
                *head,
                ResponseBody::collected(with_trailers),
            ))
        }
        Err(unfinished) => {
            if matches!(unfinished, Unfinished::TooLarge { .. }) {
                tracing::warn!(
                    limit = options.max_response_bytes,
                    "response larger than max_response_bytes: sent, not stored"
                );
            }
            hold.abandon().await;
            Ok(Response::from_parts(
                *head,
                ResponseBody::unfinished(unfinished),
            ))
        }
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

fn replay<B: Body>(stored: StoredResponse) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::full(stored.body));
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        headers.append(name, value);
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The store failed, is at capacity, or held a damaged record: `503` with `Retry-After`,
/// or with [`StoreFailure::FailOpen`] the handler runs unprotected.
async fn store_failed<Svc, ReqB, ResB>(
    error: Error,
    options: &IdempotencyOptions,
    mut inner: Svc,
    parts: Box<Parts>,
    collected: Collected,
) -> Answer<ResB, Svc::Error>
where
    Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body,
{
    match options.on_store_failure {
        StoreFailure::FailOpen => {
            tracing::warn!(%error, "idempotency store failed: running the handler unprotected");
            let request = Request::from_parts(*parts, RequestBody::buffered(collected));
            inner
                .call(request)
                .await
                .map(|response| response.map(ResponseBody::inner))
        }
        // Anything but an explicit fail-open fails closed.
        _ => {
            if let Error::AtCapacity { retry_after, .. } = error {
                tracing::warn!(%error, "idempotency store at capacity: answering 503");
                return Ok(Problem::StoreAtCapacity.response(
                    "the idempotency store is full until its oldest keys expire; retry with the same key",
                    Some(retry_after_secs(retry_after)),
                ));
            }
            tracing::warn!(%error, "idempotency store failed: answering 503");
            Ok(Problem::StoreUnavailable.response(
                "the idempotency store is unavailable; retry with the same key",
                Some(options.retry_after_secs()),
            ))
        }
    }
}

/// The key, held with `token` while the handler runs. Dropped while armed (the
/// handler panicked, or the response future was dropped), it frees the key in a task
/// of its own; if even that cannot happen (the runtime is gone with the process), the
/// lease frees it.
struct Hold<'a, S: DedupStore + 'static> {
    shared: &'a Arc<Shared<S>>,
    scope: String,
    token: FencingToken,
    armed: bool,
}

impl<S: DedupStore + 'static> Hold<'_, S> {
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

impl<S: DedupStore + 'static> Drop for Hold<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::clone(self.shared);
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
    use super::*;

    #[test]
    fn stores_what_was_processed() {
        let options = IdempotencyOptions::new();
        for stored in [200, 201, 204, 302, 400, 404, 409, 422] {
            assert!(should_store(
                StatusCode::from_u16(stored).unwrap(),
                &options
            ));
        }
        for not in [408, 429, 500, 502, 503] {
            assert!(!should_store(StatusCode::from_u16(not).unwrap(), &options));
        }
        let options = options.store_server_errors(true);
        assert!(should_store(StatusCode::INTERNAL_SERVER_ERROR, &options));
        assert!(!should_store(StatusCode::TOO_MANY_REQUESTS, &options));
    }
}
