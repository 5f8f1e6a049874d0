//! A Redis Streams reply as it arrives: RESP bytes, parsed by the redis client, then read
//! by the transport as an `XREADGROUP` reply (the subscriber) and as an `XRANGE` reply of
//! a dead-letter stream (`dead_letters`), each entry decoded into a message.
//!
//! Checks: nothing panics; a reply of another shape is an error, and an entry that
//! cannot be decoded is an error of that entry alone; what decodes holds only headers
//! that obey the rules.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_redis::fuzzing::{Entries, dead_letters, read_reply};
use oncebox_redis::redis::parse_redis_value;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = parse_redis_value(data) else {
        return;
    };
    check(&read_reply("orders", value.clone()));
    check(&dead_letters("orders", value));
});

fn check(entries: &Entries) {
    for received in entries.iter().flatten().flatten() {
        assert!(received.headers.validate().is_ok());
    }
}
