//! [`IdempotencyLayer`]: applies [`Idempotency`] to a service.

use std::fmt;
use std::sync::Arc;

use oncebox_core::Result;
use oncebox_core::store::DedupStore;
use tower::Layer;

use crate::options::IdempotencyOptions;
use crate::principal::Principal;
use crate::service::Idempotency;

/// The store and options every clone of the layer and its services share.
pub(crate) struct Shared<S> {
    pub(crate) store: S,
    pub(crate) options: IdempotencyOptions,
}

/// A tower [`Layer`] that makes requests carrying an `Idempotency-Key` safe to retry:
/// the first request with a key runs the inner service and its response is stored;
/// every retry with the same key gets that response replayed, byte for byte.
///
/// `S` is any [`DedupStore`]: memory, layered, SQLite, PostgreSQL, Redis. `P` is the
/// [`Principal`] that says who sent a request: keys are kept per principal, so no caller
/// ever gets another caller's response, and a request with a key but no principal is
/// refused. There is no default: choose one. See the [crate documentation](crate) for
/// the protocol.
///
/// ```
/// use oncebox_core::memory::MemoryDedupStore;
/// use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions};
///
/// # fn build() -> oncebox_core::Result<()> {
/// // Keys are kept per API key.
/// let layer = IdempotencyLayer::new(
///     MemoryDedupStore::default(),
///     HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")),
///     IdempotencyOptions::new(),
/// )?;
/// # let _ = layer; Ok(()) }
/// ```
pub struct IdempotencyLayer<S, P> {
    shared: Arc<Shared<S>>,
    principal: P,
}

impl<S: DedupStore + 'static, P: Principal> IdempotencyLayer<S, P> {
    /// A layer over `store` that keeps keys per `principal`, as `options` say.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) if `options` fail
    /// [`validate`](IdempotencyOptions::validate).
    pub fn new(store: S, principal: P, options: IdempotencyOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            shared: Arc::new(Shared { store, options }),
            principal,
        })
    }
}

impl<S, P> IdempotencyLayer<S, P> {
    /// The principal.
    pub fn principal(&self) -> &P {
        &self.principal
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The options.
    pub fn options(&self) -> &IdempotencyOptions {
        &self.shared.options
    }
}

impl<S, P: Clone> Clone for IdempotencyLayer<S, P> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            principal: self.principal.clone(),
        }
    }
}

impl<S, P: fmt::Debug> fmt::Debug for IdempotencyLayer<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("options", &self.shared.options)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, P: Clone> Layer<Svc> for IdempotencyLayer<S, P> {
    type Service = Idempotency<Svc, S, P>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Idempotency::from_shared(inner, Arc::clone(&self.shared), self.principal.clone())
    }
}
