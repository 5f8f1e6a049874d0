//! The idempotent path of a request: buffer and fingerprint the body, take the key and
//! hand it to [`held`](crate::held) (the handler on a task of its own); or answer from
//! the store.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use oncebox_core::Error;
use oncebox_core::consumer::StoreFailure;
use oncebox_core::store::{Begin, DedupStore};
use tower_service::Service;

use crate::body::{Collected, RequestBody, ResponseBody, Unfinished, collect_limited};
use crate::fingerprint::Fingerprint;
use crate::held::{self, Answer, Taken};
use crate::layer::Shared;
use crate::options::{IDEMPOTENT_REPLAYED, IdempotencyOptions, retry_after_secs};
use crate::problem::Problem;
use crate::record::StoredResponse;
use crate::service::too_large;

pub(crate) async fn run<Svc, S, ReqB, ResB>(
    shared: Arc<Shared<S>>,
    inner: Svc,
    parts: Box<Parts>,
    body: ReqB,
    scope: String,
) -> Answer<ResB, Svc::Error>
where
    Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    S: DedupStore + 'static,
    ReqB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB::Error: Send,
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

    let request = Request::from_parts(*parts, RequestBody::buffered(collected));
    let taken = Taken {
        shared,
        scope,
        token,
        taken_at,
        fingerprint,
    };
    held::run(taken, inner, request).await
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
