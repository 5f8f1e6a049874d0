//! The layer over a real HTTP server, on the in-memory store and on the layered store
//! (in-memory window over the in-memory store).

#[macro_use]
mod common;

use std::sync::Arc;

use common::Fresh;
use oncebox_core::memory::{LayeredDedupStore, MemoryDedupStore};

fn memory() -> Fresh<Arc<MemoryDedupStore>> {
    Fresh::new(Arc::new(MemoryDedupStore::new(100_000)))
}

scenarios!(memory());

mod layered {
    use super::*;

    fn layered() -> Fresh<Arc<LayeredDedupStore<MemoryDedupStore>>> {
        Fresh::new(Arc::new(LayeredDedupStore::new(
            MemoryDedupStore::new(100_000),
            10_000,
        )))
    }

    scenarios!(layered());
}
