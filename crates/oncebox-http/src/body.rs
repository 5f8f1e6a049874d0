//! The request and response bodies of the layer, and bounded buffering.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

pin_project! {
    /// The request body the inner service receives: the client's body as it came (for
    /// requests the layer passes through) or the buffered copy the fingerprint was
    /// taken of.
    pub struct RequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestKindProj]
    enum RequestKind<B> {
        Passthrough { #[pin] body: B },
        Buffered { data: Option<Bytes>, trailers: Option<Box<HeaderMap>> },
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn passthrough(body: B) -> Self {
        Self {
            kind: RequestKind::Passthrough { body },
        }
    }

    pub(crate) fn buffered(collected: Collected) -> Self {
        Self {
            kind: RequestKind::Buffered {
                data: Some(collected.data).filter(|d| !d.is_empty()),
                trailers: collected.trailers,
            },
        }
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the content.
        let kind = match &self.kind {
            RequestKind::Passthrough { .. } => "passthrough",
            RequestKind::Buffered { .. } => "buffered",
        };
        f.debug_struct("RequestBody").field("kind", &kind).finish()
    }
}

impl<B: Body<Data = Bytes>> Body for RequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            RequestKindProj::Passthrough { body } => body.poll_frame(cx),
            RequestKindProj::Buffered { data, trailers } => {
                Poll::Ready(buffered_frame(data, trailers).map(Ok))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Passthrough { body } => body.is_end_stream(),
            RequestKind::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Passthrough { body } => body.size_hint(),
            RequestKind::Buffered { data, .. } => exact(data.as_ref()),
        }
    }
}

pin_project! {
    /// The response body the layer returns: the inner service's body untouched, a
    /// buffered body (a response that was stored, a replay, a problem), or the buffered
    /// start of a body that could not be stored followed by the rest of it.
    pub struct ResponseBody<B: Body> {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseKindProj]
    enum ResponseKind<B: Body> {
        Inner { #[pin] body: B },
        Buffered { data: Option<Bytes>, trailers: Option<Box<HeaderMap>> },
        Prefixed { prefix: Option<Bytes>, #[pin] rest: B },
        Failed { prefix: Option<Bytes>, error: Option<B::Error> },
    }
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: ResponseKind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: ResponseKind::Buffered {
                data: Some(data).filter(|d| !d.is_empty()),
                trailers: None,
            },
        }
    }

    pub(crate) fn collected(collected: Collected) -> Self {
        Self {
            kind: ResponseKind::Buffered {
                data: Some(collected.data).filter(|d| !d.is_empty()),
                trailers: collected.trailers,
            },
        }
    }

    /// What a [`collect_limited`] that did not finish leaves, sent on unchanged.
    pub(crate) fn unfinished(unfinished: Unfinished<B>) -> Self {
        let kind = match unfinished {
            Unfinished::TooLarge { prefix, rest } => ResponseKind::Prefixed {
                prefix: Some(prefix).filter(|p| !p.is_empty()),
                rest,
            },
            Unfinished::Failed { prefix, error } => ResponseKind::Failed {
                prefix: Some(prefix).filter(|p| !p.is_empty()),
                error: Some(error),
            },
        };
        Self { kind }
    }
}

impl<B: Body> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            ResponseKind::Inner { .. } => "inner",
            ResponseKind::Buffered { .. } => "buffered",
            ResponseKind::Prefixed { .. } => "prefixed",
            ResponseKind::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            ResponseKindProj::Inner { body } => body.poll_frame(cx),
            ResponseKindProj::Buffered { data, trailers } => {
                Poll::Ready(buffered_frame(data, trailers).map(Ok))
            }
            ResponseKindProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
                None => rest.poll_frame(cx),
            },
            ResponseKindProj::Failed { prefix, error } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                Poll::Ready(error.take().map(Err))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Inner { body } => body.is_end_stream(),
            ResponseKind::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
            ResponseKind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            ResponseKind::Failed { prefix, error } => prefix.is_none() && error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Inner { body } => body.size_hint(),
            ResponseKind::Buffered { data, .. } => exact(data.as_ref()),
            ResponseKind::Prefixed { prefix, rest } => {
                let before = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(before));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(before));
                }
                hint
            }
            ResponseKind::Failed { .. } => SizeHint::default(),
        }
    }
}

fn buffered_frame(
    data: &mut Option<Bytes>,
    trailers: &mut Option<Box<HeaderMap>>,
) -> Option<Frame<Bytes>> {
    if let Some(data) = data.take() {
        return Some(Frame::data(data));
    }
    trailers.take().map(|trailers| Frame::trailers(*trailers))
}

fn exact(data: Option<&Bytes>) -> SizeHint {
    SizeHint::with_exact(data.map_or(0, |d| d.len() as u64))
}

/// A body read to its end.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) data: Bytes,
    /// Boxed: rare, and large next to the data.
    pub(crate) trailers: Option<Box<HeaderMap>>,
}

/// A body that [`collect_limited`] could not read whole.
pub(crate) enum Unfinished<B: Body> {
    /// Over the limit: what was read, and the body to read the rest from.
    TooLarge { prefix: Bytes, rest: B },
    /// The body failed after `prefix`.
    Failed { prefix: Bytes, error: B::Error },
}

/// Reads `body` to its end, unless it holds more than `limit` bytes. A single data frame
/// is kept without copying.
pub(crate) async fn collect_limited<B>(body: B, limit: usize) -> Result<Collected, Unfinished<B>>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    let prefix = |first: Option<Bytes>, joined: Option<BytesMut>| match joined {
        Some(joined) => joined.freeze(),
        None => first.unwrap_or_default(),
    };
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(error)) => {
                return Err(Unfinished::Failed {
                    prefix: prefix(first, joined),
                    error,
                });
            }
        };
        let frame = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return Ok(Collected {
                        data: prefix(first, joined),
                        trailers: Some(Box::new(trailers)),
                    });
                }
                continue;
            }
        };
        len = len.saturating_add(frame.len());
        if len > limit {
            let mut so_far = match joined {
                Some(joined) => joined,
                None => BytesMut::from(first.unwrap_or_default()),
            };
            so_far.extend_from_slice(&frame);
            return Err(Unfinished::TooLarge {
                prefix: so_far.freeze(),
                rest: body,
            });
        }
        match (&mut joined, first.take()) {
            (Some(joined), _) => joined.extend_from_slice(&frame),
            (None, None) => first = Some(frame),
            (None, Some(earlier)) => {
                let mut both = BytesMut::with_capacity(earlier.len() + frame.len());
                both.extend_from_slice(&earlier);
                both.extend_from_slice(&frame);
                joined = Some(both);
            }
        }
    }
    Ok(Collected {
        data: prefix(first, joined),
        trailers: None,
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures_util::stream;
    use http_body_util::{Full, StreamBody};

    use super::*;

    fn chunks(
        parts: &[&'static [u8]],
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Unpin>
    {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(stream::iter(frames))
    }

    #[tokio::test]
    async fn collects_within_the_limit() {
        let collected = collect_limited(chunks(&[b"ab", b"cd", b"e"]), 5)
            .await
            .ok()
            .unwrap();
        assert_eq!(&collected.data[..], b"abcde");
        let single = collect_limited(Full::new(Bytes::from_static(b"xyz")), 3)
            .await
            .ok()
            .unwrap();
        assert_eq!(&single.data[..], b"xyz");
        let empty = collect_limited(Full::new(Bytes::new()), 1)
            .await
            .ok()
            .unwrap();
        assert!(empty.data.is_empty());
    }

    #[tokio::test]
    async fn over_the_limit_keeps_what_was_read_and_the_rest() {
        let Err(Unfinished::TooLarge { prefix, rest }) =
            collect_limited(chunks(&[b"ab", b"cd", b"ef"]), 3).await
        else {
            panic!("not refused");
        };
        assert_eq!(&prefix[..], b"abcd");
        let body = ResponseBody::unfinished(Unfinished::TooLarge { prefix, rest });
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"abcdef");
    }
}
