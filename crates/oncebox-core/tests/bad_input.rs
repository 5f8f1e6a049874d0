//! Outside data never panics: bad ids, headers and payloads are typed errors or dead
//! letters with a reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use oncebox_core::consumer::{
    ConsumerOptions, Handler, IdStrategy, IdempotentReceiver, Outcome, process_delivery,
};
use oncebox_core::memory::{MemoryBroker, MemoryDedupStore};
use oncebox_core::{
    Bytes, Headers, InvalidMessage, Limits, Message, MessageId, Publisher, Received, Result,
    Subscriber,
};

#[test]
fn wire_values_are_checked() {
    assert!(matches!(
        MessageId::parse("42"),
        Err(InvalidMessage::InvalidId { .. })
    ));
    assert!(matches!(
        MessageId::parse_bytes(b"\xff\x00"),
        Err(InvalidMessage::InvalidId { .. })
    ));
    let mut headers = Headers::new();
    assert!(matches!(
        headers.insert_bytes(b"x-ok", b"\xc3\x28"),
        Err(InvalidMessage::InvalidHeader { .. })
    ));
    assert!(matches!(
        headers.insert_bytes(b"bad name", b"v"),
        Err(InvalidMessage::InvalidHeader { .. })
    ));
    let limits = Limits::new().max_payload_bytes(1024);
    assert!(matches!(
        Message::new("t", vec![0u8; 1025]).validate(&limits),
        Err(InvalidMessage::PayloadTooLarge {
            size: 1025,
            limit: 1024
        })
    ));
    assert!(matches!(
        Message::new("", "x").validate(&limits),
        Err(InvalidMessage::EmptyTopic)
    ));
}

#[derive(Clone, Default)]
struct Count(Arc<AtomicU32>);

impl Handler for Count {
    type Output = Bytes;

    async fn handle(&self, _message: &Received) -> Result<Bytes> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Bytes::new())
    }
}

#[tokio::test]
async fn a_message_without_the_configured_id_is_dead_lettered_with_the_reason() {
    let broker = MemoryBroker::new();
    let runs = Count::default();
    let options =
        ConsumerOptions::new("c").id_strategy(IdStrategy::Header("Idempotency-Key".into()));
    let receiver = IdempotentReceiver::new(MemoryDedupStore::default(), runs.clone(), options)
        .expect("options");
    broker
        .publisher()
        .publish(&Message::new("no-key", "x"))
        .await
        .expect("published");
    let delivery = broker
        .subscribe("no-key", "c")
        .next()
        .await
        .expect("delivered");
    let outcome = process_delivery(&receiver, delivery)
        .await
        .expect("settled");
    let Outcome::DeadLettered { reason } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(reason.contains("Idempotency-Key"), "{reason}");
    assert_eq!(runs.0.load(Ordering::SeqCst), 0);
    assert_eq!(broker.dead_letters("no-key").len(), 1);
}
