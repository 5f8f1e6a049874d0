//! [`IdempotencyLayer`]: applies [`Idempotency`] to a service.

use std::fmt;
use std::sync::Arc;

use oncebox_core::Result;
use oncebox_core::store::DedupStore;
use tower::Layer;

use crate::options::IdempotencyOptions;
use crate::principal::{Anonymous, Principal};
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
/// `S` is any [`DedupStore`]: memory, layered, SQLite, PostgreSQL, Redis. `P` finds the
/// request's [`Principal`]; the default, [`Anonymous`], scopes keys by method and route
/// only. See the [crate documentation](crate) for the protocol.
///
/// ```
/// use oncebox_core::memory::MemoryDedupStore;
/// use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions};
///
/// # fn build() -> oncebox_core::Result<()> {
/// let layer = IdempotencyLayer::new(MemoryDedupStore::default(), IdempotencyOptions::new())?
///     .principal(HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")));
/// # let _ = layer; Ok(()) }
/// ```
pub struct IdempotencyLayer<S, P = Anonymous> {
    shared: Arc<Shared<S>>,
    principal: P,
}

impl<S: DedupStore + 'static> IdempotencyLayer<S, Anonymous> {
    /// A layer over `store`, with anonymous principals.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) if `options` fail
    /// [`validate`](IdempotencyOptions::validate).
    pub fn new(store: S, options: IdempotencyOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            shared: Arc::new(Shared { store, options }),
            principal: Anonymous,
        })
    }
}

impl<S, P> IdempotencyLayer<S, P> {
    /// The same layer, finding principals with `principal`.
    pub fn principal<Q: Principal>(self, principal: Q) -> IdempotencyLayer<S, Q> {
        IdempotencyLayer {
            shared: self.shared,
            principal,
        }
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
