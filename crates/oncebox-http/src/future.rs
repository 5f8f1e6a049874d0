//! [`ResponseFuture`]: the future of [`Idempotency`](crate::Idempotency).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;

pin_project! {
    /// The response future of [`Idempotency`](crate::Idempotency): the inner service's
    /// own future for requests the layer passes through, a ready answer for requests it
    /// refuses at once, and the idempotent flow (store, handler, store) otherwise.
    ///
    /// Once the request has taken its key, its handler runs on a task of its own and
    /// this future waits for it: dropping it (the client hung up) does not stop the
    /// handler, whose response is stored for the client's retry. See
    /// [`hang_up_timeout`](crate::IdempotencyOptions::hang_up_timeout).
    pub struct ResponseFuture<F, B: Body, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B: Body, E> {
        Passthrough { #[pin] future: F },
        Ready { response: Option<Response<ResponseBody<B>>> },
        Idempotent { future: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>> },
    }
}

impl<F, B: Body, E> ResponseFuture<F, B, E> {
    pub(crate) fn passthrough(future: F) -> Self {
        Self {
            kind: Kind::Passthrough { future },
        }
    }

    pub(crate) fn ready(response: Response<ResponseBody<B>>) -> Self {
        Self {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn idempotent(
        future: BoxFuture<'static, Result<Response<ResponseBody<B>>, E>>,
    ) -> Self {
        Self {
            kind: Kind::Idempotent { future },
        }
    }
}

impl<F, B: Body, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Ready { .. } => "ready",
            Kind::Idempotent { .. } => "idempotent",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(ResponseBody::inner))),
            KindProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Idempotent { future } => future.as_mut().poll(cx),
        }
    }
}
