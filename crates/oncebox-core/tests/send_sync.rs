//! Compile-time checks: the handles are `Send + Sync` and the engines' futures are
//! `Send`, so they can be spawned on a multi-threaded runtime.

use oncebox_core::consumer::{
    Consumer, ConsumerOptions, Handler, IdempotentReceiver, process_delivery,
};
use oncebox_core::memory::{
    MemoryBroker, MemoryDedupStore, MemoryDelivery, MemoryPublisher, MemorySubscriber,
};
use oncebox_core::spool::{Relay, SpoolStore};
use oncebox_core::{Bytes, Error, Message, Received, Result};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(_: &T) {}

struct Noop;
impl Handler for Noop {
    type Output = Bytes;

    async fn handle(&self, _message: &Received) -> Result<Bytes> {
        Ok(Bytes::new())
    }
}

#[allow(dead_code)]
fn engine_futures_are_send<S: SpoolStore<Item = Message> + 'static>(
    relay: Relay<S, MemoryPublisher>,
    receiver: IdempotentReceiver<MemoryDedupStore, Noop>,
    delivery: MemoryDelivery,
    subscriber: MemorySubscriber,
) {
    send(&relay.run_once());
    send(&relay.run_until(std::future::pending()));
    send(&process_delivery(&receiver, delivery));
    let consumer = Consumer::new(subscriber, receiver).on_outcome(|_, _| {});
    send(&consumer.run_until(std::future::pending()));
}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<MemoryBroker>();
    send_sync::<MemoryDedupStore>();
    send_sync::<MemoryPublisher>();
    send_sync::<Error>();
    send_sync::<Message>();
    let _ = ConsumerOptions::new("x");
}
