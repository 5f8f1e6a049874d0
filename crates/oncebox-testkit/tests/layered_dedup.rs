//! The dedup conformance suite against [`LayeredDedupStore`] over [`MemoryDedupStore`]:
//! the in-memory window of completed results must keep the contract of the store behind
//! it (leases, fencing, TTL). The suite runs over Redis in `oncebox-redis` too.

use std::sync::Arc;

use oncebox_core::memory::{LayeredDedupStore, MemoryDedupStore};
use oncebox_testkit::dedup::{self, DedupHarness};

struct Layered(Arc<LayeredDedupStore<MemoryDedupStore>>);

impl Layered {
    fn new() -> Self {
        Self(Arc::new(LayeredDedupStore::new(
            MemoryDedupStore::new(10_000),
            10_000,
        )))
    }
}

impl DedupHarness for Layered {
    type Store = Arc<LayeredDedupStore<MemoryDedupStore>>;

    fn store(&self) -> Self::Store {
        Arc::clone(&self.0)
    }
}

macro_rules! checks {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            dedup::$check(&Layered::new()).await;
        }
    )*};
}

oncebox_testkit::dedup_checks!(checks!());
