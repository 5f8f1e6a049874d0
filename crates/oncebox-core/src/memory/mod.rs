//! In-process implementations: an exact dedup store and a broker that misbehaves on
//! request. Good for tests, demos and single-process services.

mod broker;
mod dedup;

pub use broker::{
    BrokerStats, Faults, MemoryBroker, MemoryDelivery, MemoryPublisher, MemorySubscriber,
};
pub use dedup::MemoryDedupStore;
