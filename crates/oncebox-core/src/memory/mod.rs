//! In-process implementations: an exact dedup store, a window of completed results in
//! front of any dedup store, and a broker that misbehaves on request. Good for tests,
//! demos, single-process services and hot paths.

mod broker;
mod dedup;
mod layered;

pub use broker::{
    BrokerStats, Faults, MemoryBroker, MemoryDelivery, MemoryPublisher, MemorySubscriber,
};
pub use dedup::MemoryDedupStore;
pub use layered::{DEFAULT_REMOTE_WINDOW, LayeredDedupStore};
