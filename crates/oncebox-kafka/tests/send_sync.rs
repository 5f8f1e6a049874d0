//! The handles and futures of the transport can cross threads, as the engines need.

use oncebox_core::{Delivery, Message, Publisher, Subscriber};
use oncebox_kafka::{KafkaAdmin, KafkaDelivery, KafkaPublisher, KafkaSubscriber};

fn send_sync<T: Send + Sync>() {}
fn send_static<T: Send + 'static>() {}
fn future_send<F: Future + Send>(_: &F) {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<KafkaPublisher>();
    send_sync::<KafkaSubscriber>();
    send_sync::<KafkaDelivery>();
    send_sync::<KafkaAdmin>();
    send_static::<KafkaDelivery>();
}

/// Never called: it only has to compile.
#[allow(dead_code, clippy::manual_async_fn)]
async fn futures_are_send(
    publisher: KafkaPublisher,
    mut subscriber: KafkaSubscriber,
    delivery: KafkaDelivery,
    message: Message,
) {
    future_send(&publisher.publish(&message));
    future_send(&subscriber.next());
    future_send(&delivery.ack());
    future_send(&subscriber.closed());
}
