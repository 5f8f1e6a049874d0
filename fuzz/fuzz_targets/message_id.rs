//! The parsers of a message's id and time as they arrive in headers and columns:
//! `MessageId::parse_bytes` and `wire::parse_time` (RFC 3339).
//!
//! Checks: they never panic; an id read back is written again the way it is parsed
//! (hyphenated, and parsing that gives the same id); a time read back is written in
//! UTC and parses again to the same microsecond.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use oncebox_core::MessageId;
use oncebox_core::wire::{format_time, parse_time};

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = MessageId::parse_bytes(data) {
        let text = id.to_string();
        assert_eq!(MessageId::parse(&text).ok(), Some(id));
        assert_eq!(text.len(), 36);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(time) = parse_time(text) {
        let written = format_time(time);
        let again = parse_time(&written).unwrap_or_else(|| panic!("{written:?} does not parse"));
        let drift = again
            .duration_since(time)
            .unwrap_or_else(|before| before.duration());
        assert!(drift < Duration::from_micros(1), "{text:?} -> {written:?}");
    }
});
