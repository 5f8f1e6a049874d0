//! The messages both relays publish: those of `oncebox-bench` (its `workload` module,
//! which this workspace cannot share).

/// The topic both relays publish to.
pub(crate) const TOPIC: &str = "bench";

/// The event type of every message.
pub(crate) const KIND: &str = "BenchEvent";

/// A 128-byte JSON document, every message's payload.
pub(crate) const PAYLOAD: &[u8; 128] = br#"{"order":"order-0000000042","customer":"customer-0042","amount_cents":12345,"note":"oncebox-bench payload, 128 bytes ........."}"#;
