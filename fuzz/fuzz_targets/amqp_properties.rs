//! A RabbitMQ delivery's properties as they arrive: the bytes of an AMQP content
//! header's property list, parsed by lapin's frame parser, then read by the transport's
//! codec as the subscriber does (strict) and as the dead-letter reader does (lenient).
//!
//! Checks: nothing panics; the strict reading refuses only for a header no `Headers` may
//! hold; the lenient reading never refuses (it skips such headers), so that every dead
//! letter can be listed; both hold only headers that obey the rules.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_core::{Bytes, InvalidMessage};
use oncebox_rabbitmq::fuzzing::decode;
use oncebox_rabbitmq::lapin::protocol::basic::parse_properties;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, wire)) = data.split_first() else {
        return;
    };
    let Ok((_, properties)) = parse_properties(wire) else {
        return;
    };
    let redelivered = flags & 1 != 0;
    let body = Bytes::from_static(b"{}");
    match decode(&properties, "orders", redelivered, body.clone(), false) {
        Ok(received) => assert!(received.headers.validate().is_ok()),
        Err(InvalidMessage::InvalidHeader { .. }) => {}
        Err(other) => panic!("strict decode refused with {other:?}"),
    }
    match decode(&properties, "orders", redelivered, body, true) {
        Ok(received) => assert!(received.headers.validate().is_ok()),
        Err(error) => panic!("lenient decode refused: {error}"),
    }
});
