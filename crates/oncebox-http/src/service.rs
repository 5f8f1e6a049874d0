//! [`Idempotency`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, header};
use http_body::Body;
use oncebox_core::store::DedupStore;
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::fingerprint::scope_id;
use crate::flow;
use crate::future::ResponseFuture;
use crate::key::IdempotencyKey;
use crate::layer::Shared;
use crate::options::IdempotencyOptions;
use crate::principal::Principal;
use crate::problem::Problem;

/// The Idempotency-Key middleware around the service `Svc`; made by
/// [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// Protocol outcomes (`400`, `409`, `410`, `413`, `422`, `503`, `504`) are responses; errors of the
/// inner service pass through unchanged (and free the key). Requests of other methods,
/// and requests without a key where none is required, go to the inner service untouched
/// but for the body type ([`RequestBody`] wraps it without reading it).
///
/// For a request that takes a key, the inner service's call runs on a tokio task of its
/// own, so that a client that hangs up does not stop a handler midway (see
/// [`hang_up_timeout`](crate::IdempotencyOptions::hang_up_timeout)); hence the
/// `Clone + Send + 'static` bounds. Bodies must be `Unpin` with `Bytes` as data, as
/// hyper's and axum's are.
pub struct Idempotency<Svc, S, P> {
    inner: Svc,
    shared: Arc<Shared<S>>,
    principal: P,
}

impl<Svc, S, P> Idempotency<Svc, S, P> {
    pub(crate) fn from_shared(inner: Svc, shared: Arc<Shared<S>>, principal: P) -> Self {
        Self {
            inner,
            shared,
            principal,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &Svc {
        &self.inner
    }

    /// The options.
    pub fn options(&self) -> &IdempotencyOptions {
        &self.shared.options
    }
}

impl<Svc: Clone, S, P: Clone> Clone for Idempotency<Svc, S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            principal: self.principal.clone(),
        }
    }
}

impl<Svc: fmt::Debug, S, P: fmt::Debug> fmt::Debug for Idempotency<Svc, S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("options", &self.shared.options)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, P, ReqB, ResB> Service<Request<ReqB>> for Idempotency<Svc, S, P>
where
    Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    S: DedupStore + 'static,
    P: Principal,
    ReqB: Body<Data = Bytes> + Unpin + Send + 'static,
    ReqB::Error: Send,
    ResB: Body<Data = Bytes> + Unpin + Send + 'static,
    ResB::Error: Send,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Svc::Future, ResB, Svc::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let options = &self.shared.options;
        if !options.applies_to(request.method()) {
            return self.passthrough(request);
        }
        let key = match IdempotencyKey::from_headers(request.headers(), &options.key_header) {
            Ok(Some(key)) => key,
            Ok(None) if options.required => {
                let detail = format!("this request requires an {} header", options.key_header);
                return ResponseFuture::ready(Problem::KeyMissing.response(&detail, None));
            }
            Ok(None) => return self.passthrough(request),
            Err(error) => {
                return ResponseFuture::ready(
                    Problem::KeyInvalid.response(&error.to_string(), None),
                );
            }
        };
        let (mut parts, body) = request.into_parts();
        let Some(principal) = self
            .principal
            .principal(&parts)
            .filter(|principal| !principal.is_empty())
        else {
            return ResponseFuture::ready(Problem::PrincipalMissing.response(
                "idempotency keys are kept per caller, and this request does not say who \
                 sent it; send it with the credentials this API expects",
                None,
            ));
        };
        if let Some(length) = declared_length(&parts.headers)
            && length > options.max_body_bytes as u64
        {
            return ResponseFuture::ready(too_large(options.max_body_bytes));
        }
        let scope = scope_id(&principal, &parts.method, route_of(&parts), key.as_str());
        parts.extensions.insert(key);
        // The service that was polled ready goes with the request; this one keeps a clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        ResponseFuture::idempotent(Box::pin(flow::run(
            shared,
            inner,
            Box::new(parts),
            body,
            scope,
        )))
    }
}

impl<Svc, S, P> Idempotency<Svc, S, P> {
    fn passthrough<ReqB, ResB>(
        &mut self,
        request: Request<ReqB>,
    ) -> ResponseFuture<Svc::Future, ResB, Svc::Error>
    where
        Svc: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ResB: Body,
    {
        ResponseFuture::passthrough(self.inner.call(request.map(RequestBody::passthrough)))
    }
}

pub(crate) fn too_large<B: Body>(limit: usize) -> Response<ResponseBody<B>> {
    Problem::BodyTooLarge.response(
        &format!("requests with an idempotency key may carry at most {limit} bytes of body"),
        None,
    )
}

/// The `Content-Length` of the request, if it has a valid one.
fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The route a key is scoped to: the route template when axum matched one before this
/// layer ran (`Router::layer`, `Router::route_layer`), else the path.
fn route_of(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    parts.uri.path()
}
