//! The store and broker a configuration names, boxed once at the binary's edge: each
//! enum dispatches to the backend crate's type, so the relay, the receiver and the
//! admin commands are written once.
//! The stores are in `store`, the brokers in `broker`.

mod broker;
mod store;

pub(crate) use broker::AnyPublisher;
pub use broker::{AnyDelivery, AnySubscriber, Broker};
pub(crate) use store::AnyOutbox;
pub use store::Database;

use crate::config::{BrokerKind, StoreKind};

/// The stores and brokers in this build, for `oncebox --version`.
pub(crate) fn compiled_in() -> String {
    let stores: Vec<&str> = StoreKind::ALL
        .iter()
        .filter(|kind| kind.compiled())
        .map(|kind| kind.name())
        .collect();
    let brokers: Vec<&str> = BrokerKind::ALL
        .iter()
        .filter(|kind| kind.compiled())
        .map(|kind| kind.name())
        .collect();
    format!(
        "stores: {}\nbrokers: {}",
        stores.join(", "),
        brokers.join(", ")
    )
}
