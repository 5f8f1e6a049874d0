//! `WireFormat::decode`, the CloudEvents binary mode every broker transport reads, over
//! header lists of any bytes in each broker's naming (Kafka, NATS, AMQP, Redis Streams).
//!
//! The input is a byte choosing the broker, then the headers' names and values in turn,
//! each a big-endian `u16` length and its bytes.
//!
//! Checks: it never panics; what it accepts holds only headers that obey the rules of
//! `Headers`; it refuses only for a header no `Headers` may hold.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, Coordinates, InvalidMessage};
use oncebox_fuzz::frames;

const PAYLOAD: &[u8] = b"{}";

fuzz_target!(|data: &[u8]| {
    let Some((&format, data)) = data.split_first() else {
        return;
    };
    let format = match format % 4 {
        0 => WireFormat::kafka(),
        1 => WireFormat::nats(),
        2 => WireFormat::amqp(),
        _ => WireFormat::redis(),
    };
    let parts: Vec<&[u8]> = frames(data).collect();
    let fields = parts.chunks_exact(2).map(|pair| (pair[0], pair[1]));
    let decoded = format.decode(
        "orders",
        fields,
        Bytes::from_static(PAYLOAD),
        Coordinates::default(),
        1,
    );
    match decoded {
        Ok(received) => {
            assert!(
                received.headers.validate().is_ok(),
                "decoded invalid headers"
            );
            assert_eq!(&received.payload[..], PAYLOAD);
        }
        Err(InvalidMessage::InvalidHeader { .. }) => {}
        Err(other) => panic!("decode refused with {other:?}"),
    }
});
