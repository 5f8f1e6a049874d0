//! The messages the benchmarks produce.

use oncebox::{Bytes, Message};

/// The topic every benchmark publishes to.
pub(crate) const TOPIC: &str = "bench";

/// The event type of benchmark messages.
pub(crate) const KIND: &str = "BenchEvent";

/// A 128-byte JSON body, shared by every message (cloning `Bytes` does not copy it).
const PAYLOAD: &[u8; 128] = br#"{"order":"order-0000000042","customer":"customer-0042","amount_cents":12345,"note":"oncebox-bench payload, 128 bytes ........."}"#;

/// The ordering key of message number `n` when messages are spread over `keys` keys.
pub(crate) fn key(n: u64, keys: u32) -> String {
    format!("key-{:05}", n % u64::from(keys.max(1)))
}

/// Message number `n` on `topic`: a new id, key `n mod keys`, the shared payload.
pub(crate) fn message(topic: &str, n: u64, keys: u32) -> Message {
    Message::new(topic, Bytes::from_static(PAYLOAD))
        .with_key(key(n, keys))
        .with_kind(KIND)
}

/// The shared payload, for stores that fill their tables in SQL.
pub(crate) fn payload() -> &'static [u8] {
    PAYLOAD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_valid_and_spread_over_the_keys() {
        let m = message(TOPIC, 1234, 1000);
        assert_eq!(m.key.as_deref(), Some("key-00234"));
        assert_eq!(m.payload.len(), 128);
        assert!(m.validate(&oncebox::Limits::new()).is_ok());
        assert_eq!(payload().len(), 128);
    }
}
