//! The Redis dedup store's replies as they arrive: RESP bytes, parsed by the redis
//! client, then read as the reply of the `begin` script and of the `complete`, `extend`
//! and `abandon` scripts (the idempotent receiver's stored record).
//!
//! Checks: nothing panics; a reply of another shape is a permanent store error, never a
//! transient one (which the receiver would retry forever); only `0` to a finishing
//! script is a lost lease.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_core::Error;
use oncebox_redis::fuzzing::{begin_reply, finish_reply};
use oncebox_redis::redis::Value;
use oncebox_redis::redis::parse_redis_value;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = parse_redis_value(data) else {
        return;
    };
    if let Err(error) = begin_reply(value.clone()) {
        assert!(!error.is_transient(), "{error}");
    }
    let zero = value == Value::Int(0);
    match finish_reply(value) {
        Err(Error::LeaseLost) => assert!(zero),
        Err(error) => assert!(!error.is_transient(), "{error}"),
        Ok(()) => {}
    }
});
