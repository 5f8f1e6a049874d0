//! The content of a logical decoding message, as PostgreSQL's log-tailing relay reads it
//! from the replication stream (`oncebox_postgres::cdc::decode`): a version byte, the
//! metadata's length, the metadata as JSON, the payload.
//!
//! Checks: decoding never panics; a message that decodes is one a producer could have
//! enqueued (a topic, valid headers), and encoding it again decodes to the same message.

#![no_main]

use std::time::SystemTime;

use libfuzzer_sys::fuzz_target;
use oncebox_core::Bytes;
use oncebox_postgres::cdc::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(message) = decode(&Bytes::copy_from_slice(data), SystemTime::UNIX_EPOCH) else {
        return;
    };
    assert!(!message.topic.is_empty());
    assert!(message.headers.validate().is_ok());
    let again = decode(
        &Bytes::from(encode(&message, &message.headers)),
        SystemTime::UNIX_EPOCH,
    )
    .expect("an encoded message decodes");
    assert_eq!(again, message);
});
