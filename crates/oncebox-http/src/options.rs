//! What the layer does, with documented defaults.

use std::time::Duration;

use http::{HeaderName, Method, header};
use oncebox_core::consumer::StoreFailure;
use oncebox_core::{Error, Result};

/// The header clients send the key in, unless [`IdempotencyOptions::key_header`] sets
/// another.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header added to every replayed response, with the value `true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The longest key accepted, in bytes (IETF draft and Stripe: 255).
pub const MAX_KEY_LEN: usize = 255;

/// How the Idempotency-Key layer behaves.
///
/// ```
/// use std::time::Duration;
/// use oncebox_http::IdempotencyOptions;
///
/// let options = IdempotencyOptions::new()
///     .required(true)
///     .lease(Duration::from_secs(10))
///     .replay_header(http::header::LOCATION);
/// assert!(options.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotencyOptions {
    pub(crate) key_header: HeaderName,
    pub(crate) required: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) lease: Duration,
    pub(crate) hang_up_timeout: Duration,
    pub(crate) ttl: Duration,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) store_server_errors: bool,
    pub(crate) retry_after: Duration,
    pub(crate) on_store_failure: StoreFailure,
}

impl Default for IdempotencyOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyOptions {
    /// The defaults, each given on its setter.
    pub fn new() -> Self {
        Self {
            key_header: IDEMPOTENCY_KEY,
            required: false,
            methods: vec![Method::POST, Method::PATCH],
            lease: Duration::from_secs(30),
            hang_up_timeout: Duration::from_secs(60),
            ttl: Duration::from_secs(24 * 3600),
            max_body_bytes: 1024 * 1024,
            max_response_bytes: 4 * 1024 * 1024,
            replay_headers: vec![header::CONTENT_TYPE],
            store_server_errors: false,
            retry_after: Duration::from_secs(1),
            on_store_failure: StoreFailure::FailClosed,
        }
    }

    /// The request header that carries the key. Default: [`IDEMPOTENCY_KEY`]
    /// (`Idempotency-Key`); `PayPal-Request-Id` or `X-Request-Id` are other choices.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// Whether a request of an idempotent method without a key is refused with `400`.
    /// Default: `false` (it passes through, unprotected).
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// The methods the layer applies to; other requests pass through untouched.
    /// Default: `POST` and `PATCH` (`PUT` and `DELETE` are idempotent by definition).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The lease on a request's key, renewed every third of it while the handler runs
    /// and its response is read (so a slow handler keeps its key, and retries meanwhile
    /// get `409`). A request whose handler panicked, or whose process died, frees its key
    /// when the lease ends at the latest. A handler whose lease cannot be renewed (the
    /// store unreachable for a whole lease) is stopped before the lease ends and
    /// answered `503`, so two requests with one key never run at once. Default: 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a handler whose client hung up may still run. Once a request has taken
    /// its key, its handler runs on a task of its own: a client that hangs up (the server
    /// drops the response future) stops nothing, the handler runs to its end and its
    /// response is stored, so the client's retry gets it (or `409` while it runs), and
    /// the handler has run once. A handler still running this long after the hang-up is
    /// stopped (its future dropped), and only then is its key settled as for a handler
    /// that answered `504`: freed, or, with
    /// [`store_server_errors`](Self::store_server_errors), a
    /// [`handler-timeout`](crate::problem#handler-timeout) stored for replay. A stopped
    /// handler may have had part of its effect, so set this above your slowest
    /// handler. It counts from the hang-up: a client that waits is never cut off by it.
    /// Default: 60 s.
    pub fn hang_up_timeout(mut self, timeout: Duration) -> Self {
        self.hang_up_timeout = timeout;
        self
    }

    /// How long a completed response is replayed. Default: 24 h.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The largest request body buffered for the fingerprint; larger ones get `413`
    /// without the handler running. Default: 1 MiB.
    pub fn max_body_bytes(mut self, limit: usize) -> Self {
        self.max_body_bytes = limit;
        self
    }

    /// The largest response body stored for replay. A larger response is sent whole to
    /// its request (which reads it as it streams, past the first `limit` bytes), and is
    /// not stored; what is stored for the key is a
    /// [`410 response-not-stored`](crate::problem#response-not-stored) naming the first
    /// response's status, so a retry learns that the request was processed and the
    /// handler does not run again. Default: 4 MiB.
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// Response headers stored and replayed (an allow-list: nothing else is stored).
    /// Default: `content-type`. Hop-by-hop headers are refused by
    /// [`validate`](Self::validate).
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replay_headers = names.into_iter().collect();
        self
    }

    /// Adds one header to [`replay_headers`](Self::replay_headers).
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        if !self.replay_headers.contains(&name) {
            self.replay_headers.push(name);
        }
        self
    }

    /// Whether `5xx` responses are stored and replayed byte for byte. Default: `false`:
    /// a `5xx` frees the key, so the client may retry. `408` and `429` are never stored
    /// (the request was not processed).
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.store_server_errors = store;
        self
    }

    /// The `Retry-After` sent with `409` (key in use) and `503` (store unavailable),
    /// rounded up to whole seconds. Default: 1 s. A store at capacity says itself when
    /// to retry, and its `503` carries that.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// What to do when the store fails or is at capacity. Default:
    /// [`StoreFailure::FailClosed`]: `503` with `Retry-After`. [`StoreFailure::FailOpen`]
    /// runs the handler unprotected.
    pub fn on_store_failure(mut self, failure: StoreFailure) -> Self {
        self.on_store_failure = failure;
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a zero lease, hang-up timeout or TTL, a zero body
    /// limit, or a hop-by-hop header (`connection`, `transfer-encoding`, ...) among the
    /// replayed ones.
    pub fn validate(&self) -> Result<()> {
        if self.lease.is_zero() {
            return Err(Error::InvalidOptions(
                "lease must be longer than zero".into(),
            ));
        }
        if self.hang_up_timeout.is_zero() {
            return Err(Error::InvalidOptions(
                "hang_up_timeout must be longer than zero".into(),
            ));
        }
        if self.ttl.is_zero() {
            return Err(Error::InvalidOptions("ttl must be longer than zero".into()));
        }
        if self.max_body_bytes == 0 {
            return Err(Error::InvalidOptions(
                "max_body_bytes must be at least 1".into(),
            ));
        }
        if let Some(name) = self.replay_headers.iter().find(|n| is_hop_by_hop(n)) {
            return Err(Error::InvalidOptions(format!(
                "{name} is a hop-by-hop header and cannot be replayed"
            )));
        }
        Ok(())
    }

    pub(crate) fn applies_to(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// `Retry-After` in whole seconds, at least 1.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        retry_after_secs(self.retry_after)
    }
}

/// `after` as a `Retry-After` value: whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs();
    let secs = if after.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    };
    secs.max(1)
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
    ]
    .contains(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        let options = IdempotencyOptions::new();
        assert!(options.validate().is_ok());
        assert!(options.applies_to(&Method::POST));
        assert!(options.applies_to(&Method::PATCH));
        assert!(!options.applies_to(&Method::GET));
        assert_eq!(options.retry_after_secs(), 1);
    }

    #[test]
    fn refuses_bad_options() {
        for bad in [
            IdempotencyOptions::new().lease(Duration::ZERO),
            IdempotencyOptions::new().hang_up_timeout(Duration::ZERO),
            IdempotencyOptions::new().ttl(Duration::ZERO),
            IdempotencyOptions::new().max_body_bytes(0),
            IdempotencyOptions::new().replay_header(header::TRANSFER_ENCODING),
        ] {
            assert!(bad.validate().unwrap_err().is_invalid_input());
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        let options = IdempotencyOptions::new().retry_after(Duration::from_millis(1500));
        assert_eq!(options.retry_after_secs(), 2);
        let options = IdempotencyOptions::new().retry_after(Duration::ZERO);
        assert_eq!(options.retry_after_secs(), 1);
    }
}
