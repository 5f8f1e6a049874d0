//! The outbox table's changes as PostgreSQL's log-tailing relay reads them in table
//! mode: `pgoutput` messages (a Relation describing `oncebox.outbox`, Inserts of its
//! rows in PostgreSQL's text output), parsed by pg_walstream and read by the relay's row
//! decoder, which keeps the relations it has seen.
//!
//! The input is a sequence of messages, each a big-endian `u16` length and its bytes.
//!
//! Checks: nothing panics; a row read as a message holds only headers that obey the
//! rules.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_fuzz::frames;
use oncebox_postgres::fuzzing::{Change, RowDecoder, committed_at};

fuzz_target!(|data: &[u8]| {
    let mut decoder = RowDecoder::new();
    for message in frames(data) {
        if let Change::Inserted {
            message: Ok(message),
            ..
        } = decoder.decode(message)
        {
            assert!(message.headers.validate().is_ok());
        }
    }
    if let Some(micros) = data.first_chunk::<8>() {
        let _ = committed_at(i64::from_be_bytes(*micros));
    }
});
