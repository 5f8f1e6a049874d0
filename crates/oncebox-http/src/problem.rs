//! The layer's own answers, as `application/problem+json` (RFC 9457) with the members
//! `type`, `title`, `status` and `detail`. Each `type` is a constant of this module and
//! links to its section below.
//!
//! # key-missing
//!
//! `400 Bad Request`: the route requires an idempotency key and the request has none.
//! Send the request again with a key.
//!
//! # key-invalid
//!
//! `400 Bad Request`: the key is empty, longer than 255 bytes, holds characters outside
//! visible ASCII, or the header was sent twice.
//!
//! # principal-missing
//!
//! `400 Bad Request`: the request carries an idempotency key but nothing that says who
//! sent it (no credentials where the layer looks for its
//! [`Principal`](crate::Principal)). Keys are kept per caller, so the layer refuses to
//! run the request in a scope shared with other unidentified callers. The handler did
//! not run. Send the request with the credentials the API expects.
//!
//! Not `401 Unauthorized`: a `401` must carry the `WWW-Authenticate` challenge of the
//! API's authentication, which this layer does not know. Run the authentication layer
//! before this one and it answers unauthenticated callers with its own `401`.
//!
//! # body-unreadable
//!
//! `400 Bad Request`: the request body failed while it was read (the connection broke).
//!
//! # key-in-use
//!
//! `409 Conflict`, with `Retry-After`: a request with the same key is being processed.
//! Retry after the given seconds; you will get its response (or, if it failed, your
//! request will run).
//!
//! # key-reused
//!
//! `422 Unprocessable Content`: the key was used before for a different request (method,
//! path or body differ). Use a new key for a new request.
//!
//! # body-too-large
//!
//! `413 Content Too Large`: the body is larger than the layer buffers to fingerprint it.
//! The handler did not run.
//!
//! # store-unavailable
//!
//! `503 Service Unavailable`, with `Retry-After`: the idempotency store could not be
//! reached (or held a damaged record), and the layer fails closed rather than risk a
//! second execution. Retry with the same key.
//!
//! # store-at-capacity
//!
//! `503 Service Unavailable`, with `Retry-After`: the idempotency store holds as many
//! live keys as it may and refuses new ones until the oldest expire (the `Retry-After`
//! is the store's estimate, in whole seconds, at least 1). The handler did not run.
//! Retry with the same key.
//!
//! # response-not-stored
//!
//! `410 Gone`, replayed (`Idempotent-Replayed: true`): the request with this key was
//! processed, but its response could not be kept for replay: its body was larger than
//! [`max_response_bytes`](crate::IdempotencyOptions::max_response_bytes), or it had
//! trailers. It was sent once, to the first request (which may have hung up). The member
//! `original_status` holds the status it was sent with. The handler does not run again
//! for this key; a request with a new key would run it again, so find out what the
//! first request did some other way (a `GET` of the resource it made) before sending one.
//!
//! # handler-timeout
//!
//! `504 Gateway Timeout`: the client hung up, and the handler was still running
//! [`hang_up_timeout`](crate::IdempotencyOptions::hang_up_timeout) later, so it was
//! stopped, perhaps after part of its effect. Nobody receives this answer when it is made;
//! it is what a retry gets replayed where
//! [`store_server_errors`](crate::IdempotencyOptions::store_server_errors) is set. Without
//! that setting (the default) the key is freed once the handler is stopped, as for any
//! `5xx`, and a retry runs the handler again.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Body;

use crate::body::ResponseBody;

/// The `type` URI of the problem whose section in this page is `$slug`.
macro_rules! problem_type {
    ($slug:literal) => {
        concat!(
            "https://docs.rs/oncebox-http/latest/oncebox_http/problem/index.html#",
            $slug
        )
    };
}

/// The media type of the layer's error responses.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// `type` of [`key-missing`](self#key-missing).
pub const KEY_MISSING: &str = problem_type!("key-missing");
/// `type` of [`key-invalid`](self#key-invalid).
pub const KEY_INVALID: &str = problem_type!("key-invalid");
/// `type` of [`principal-missing`](self#principal-missing).
pub const PRINCIPAL_MISSING: &str = problem_type!("principal-missing");
/// `type` of [`body-unreadable`](self#body-unreadable).
pub const BODY_UNREADABLE: &str = problem_type!("body-unreadable");
/// `type` of [`key-in-use`](self#key-in-use).
pub const KEY_IN_USE: &str = problem_type!("key-in-use");
/// `type` of [`key-reused`](self#key-reused).
pub const KEY_REUSED: &str = problem_type!("key-reused");
/// `type` of [`body-too-large`](self#body-too-large).
pub const BODY_TOO_LARGE: &str = problem_type!("body-too-large");
/// `type` of [`store-unavailable`](self#store-unavailable).
pub const STORE_UNAVAILABLE: &str = problem_type!("store-unavailable");
/// `type` of [`store-at-capacity`](self#store-at-capacity).
pub const STORE_AT_CAPACITY: &str = problem_type!("store-at-capacity");
/// `type` of [`response-not-stored`](self#response-not-stored).
pub const RESPONSE_NOT_STORED: &str = problem_type!("response-not-stored");
/// `type` of [`handler-timeout`](self#handler-timeout).
pub const HANDLER_TIMEOUT: &str = problem_type!("handler-timeout");

/// One of the layer's problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    KeyMissing,
    KeyInvalid,
    PrincipalMissing,
    BodyUnreadable,
    KeyInUse,
    KeyReused,
    BodyTooLarge,
    StoreUnavailable,
    StoreAtCapacity,
    ResponseNotStored,
    HandlerTimeout,
}

impl Problem {
    fn type_uri(self) -> &'static str {
        match self {
            Self::KeyMissing => KEY_MISSING,
            Self::KeyInvalid => KEY_INVALID,
            Self::PrincipalMissing => PRINCIPAL_MISSING,
            Self::BodyUnreadable => BODY_UNREADABLE,
            Self::KeyInUse => KEY_IN_USE,
            Self::KeyReused => KEY_REUSED,
            Self::BodyTooLarge => BODY_TOO_LARGE,
            Self::StoreUnavailable => STORE_UNAVAILABLE,
            Self::StoreAtCapacity => STORE_AT_CAPACITY,
            Self::ResponseNotStored => RESPONSE_NOT_STORED,
            Self::HandlerTimeout => HANDLER_TIMEOUT,
        }
    }

    pub(crate) fn status(self) -> StatusCode {
        match self {
            Self::KeyMissing | Self::KeyInvalid | Self::PrincipalMissing | Self::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Self::KeyInUse => StatusCode::CONFLICT,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::StoreUnavailable | Self::StoreAtCapacity => StatusCode::SERVICE_UNAVAILABLE,
            Self::ResponseNotStored => StatusCode::GONE,
            Self::HandlerTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Self::KeyMissing => "Idempotency key missing",
            Self::KeyInvalid => "Idempotency key invalid",
            Self::PrincipalMissing => "Caller not identified",
            Self::BodyUnreadable => "Request body unreadable",
            Self::KeyInUse => "Idempotency key in use",
            Self::KeyReused => "Idempotency key reused",
            Self::BodyTooLarge => "Request body too large",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::StoreAtCapacity => "Idempotency store at capacity",
            Self::ResponseNotStored => "Response not stored",
            Self::HandlerTimeout => "Handler stopped after the client hung up",
        }
    }

    /// The JSON body: `type`, `title`, `status`, `detail`, then `members`.
    pub(crate) fn body(self, detail: &str, members: &[(&str, serde_json::Value)]) -> Bytes {
        let mut body = serde_json::json!({
            "type": self.type_uri(),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": detail,
        });
        if let Some(object) = body.as_object_mut() {
            for (name, value) in members {
                object.insert((*name).to_owned(), value.clone());
            }
        }
        Bytes::from(body.to_string())
    }

    /// The response, with `Retry-After: retry_after` when given.
    pub(crate) fn response<B: Body>(
        self,
        detail: &str,
        retry_after: Option<u64>,
    ) -> Response<ResponseBody<B>> {
        let status = self.status();
        let mut response = Response::new(ResponseBody::full(self.body(detail, &[])));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if let Some(seconds) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};

    use super::*;

    #[test]
    fn type_uris_share_the_base() {
        for problem in [
            Problem::KeyMissing,
            Problem::KeyInvalid,
            Problem::PrincipalMissing,
            Problem::BodyUnreadable,
            Problem::KeyInUse,
            Problem::KeyReused,
            Problem::BodyTooLarge,
            Problem::StoreUnavailable,
            Problem::StoreAtCapacity,
            Problem::ResponseNotStored,
            Problem::HandlerTimeout,
        ] {
            assert!(
                problem
                    .type_uri()
                    .starts_with("https://docs.rs/oncebox-http/")
            );
        }
    }

    #[tokio::test]
    async fn renders_rfc_9457() {
        let response: Response<ResponseBody<Full<Bytes>>> =
            Problem::KeyInUse.response("a \"quoted\" detail", Some(2));
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], KEY_IN_USE);
        assert_eq!(json["status"], 409);
        assert_eq!(json["title"], "Idempotency key in use");
        assert_eq!(json["detail"], "a \"quoted\" detail");
    }
}
