//! `IdempotencyKey::parse`, the `Idempotency-Key` header value of a request.
//!
//! Checks: it never panics; a key accepted is 1 to 255 visible ASCII characters, the
//! value itself or the value without its surrounding double quotes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_http::{IdempotencyKey, MAX_KEY_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(key) = IdempotencyKey::parse(data) else {
        return;
    };
    let key = key.as_str().as_bytes();
    assert!((1..=MAX_KEY_LEN).contains(&key.len()));
    assert!(key.iter().all(|b| (b'!'..=b'~').contains(b)));
    let unquoted = match data {
        [b'"', inner @ .., b'"'] => inner,
        _ => data,
    };
    assert_eq!(key, unquoted);
});
