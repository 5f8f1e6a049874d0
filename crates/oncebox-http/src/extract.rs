//! The axum extractor for [`IdempotencyKey`] (feature `axum`).

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use crate::key::IdempotencyKey;
use crate::options::IDEMPOTENCY_KEY;
use crate::problem::Problem;

/// The key the layer validated (or, without the layer, the `Idempotency-Key` header,
/// validated here). Rejects a missing or invalid key with the layer's `400` problem; use
/// `Option<IdempotencyKey>` where the key is optional.
///
/// ```
/// use oncebox_http::IdempotencyKey;
///
/// async fn create_payment(key: IdempotencyKey) -> String {
///     format!("payment for request {key}")
/// }
/// # let _ = axum::Router::<()>::new().route("/payments", axum::routing::post(create_payment));
/// ```
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match <Self as OptionalFromRequestParts<S>>::from_request_parts(parts, state).await? {
            Some(key) => Ok(key),
            None => Err(Problem::KeyMissing
                .response::<axum::body::Body>(
                    "this request requires an Idempotency-Key header",
                    None,
                )
                .into_response()),
        }
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Response> {
        if let Some(key) = parts.extensions.get::<IdempotencyKey>() {
            return Ok(Some(key.clone()));
        }
        IdempotencyKey::from_headers(&parts.headers, &IDEMPOTENCY_KEY).map_err(|error| {
            Problem::KeyInvalid
                .response::<axum::body::Body>(&error.to_string(), None)
                .into_response()
        })
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    async fn extract(request: Request<()>) -> Result<Option<IdempotencyKey>, Response> {
        let (mut parts, ()) = request.into_parts();
        <IdempotencyKey as OptionalFromRequestParts<()>>::from_request_parts(&mut parts, &()).await
    }

    #[tokio::test]
    async fn reads_the_header_or_the_extension() {
        let plain = Request::builder()
            .header("idempotency-key", "k-1")
            .body(())
            .unwrap();
        assert_eq!(extract(plain).await.unwrap().unwrap().as_str(), "k-1");

        let mut from_layer = Request::new(());
        from_layer
            .extensions_mut()
            .insert(IdempotencyKey::parse(b"from-layer").unwrap());
        assert_eq!(
            extract(from_layer).await.unwrap().unwrap().as_str(),
            "from-layer"
        );

        assert!(extract(Request::new(())).await.unwrap().is_none());
        let bad = Request::builder()
            .header("idempotency-key", "has space")
            .body(())
            .unwrap();
        let rejection = extract(bad).await.unwrap_err();
        assert_eq!(rejection.status(), http::StatusCode::BAD_REQUEST);

        let (mut parts, ()) = Request::new(()).into_parts();
        let missing =
            <IdempotencyKey as FromRequestParts<()>>::from_request_parts(&mut parts, &()).await;
        assert_eq!(missing.unwrap_err().status(), http::StatusCode::BAD_REQUEST);
    }
}
