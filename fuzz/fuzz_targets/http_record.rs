//! The idempotency record the HTTP layer reads from its dedup store for a key (magic,
//! fingerprint, status, headers, body), whatever the store holds.
//!
//! Checks: decoding never panics; a record that decodes is written back (its headers of
//! one name together) to a record that decodes to the same response.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_core::Bytes;
use oncebox_http::fuzzing::{Record, decode_record, encode_record};

fuzz_target!(|data: &[u8]| {
    let Ok(record) = decode_record(&Bytes::copy_from_slice(data)) else {
        return;
    };
    let again = decode_record(&encode_record(&record)).expect("a written record reads back");
    assert_eq!(again, grouped(record));
});

/// `record` with the values of each header name together, names in the order they first
/// appear: what the layer writes.
fn grouped(mut record: Record) -> Record {
    let mut order: Vec<_> = Vec::new();
    for (name, _) in &record.headers {
        if !order.contains(name) {
            order.push(name.clone());
        }
    }
    record
        .headers
        .sort_by_key(|(name, _)| order.iter().position(|n| n == name));
    record
}
