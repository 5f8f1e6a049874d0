//! What the SQL stores make of the columns of a row read back (an outbox row, a durable
//! inbox row): the headers column (`Headers::from_json`), the id column
//! (`MessageId::parse`), and the integer times (milliseconds on
//! SQLite and MySQL, microseconds on PostgreSQL), whatever another writer put there.
//!
//! Checks: nothing panics; headers read back obey the rules of `Headers` and are written
//! back to the same JSON meaning; times convert back to the integer they came from.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{Headers, MessageId};
use oncebox_postgres::fuzzing::{from_micros, to_micros};

#[derive(Debug, Arbitrary)]
struct Row<'a> {
    headers: &'a str,
    id: &'a str,
    millis: i64,
    micros: i64,
}

fuzz_target!(|row: Row<'_>| {
    if let Ok(headers) = Headers::from_json(row.headers) {
        assert!(headers.validate().is_ok());
        let again = Headers::from_json(&headers.to_json()).expect("written headers read back");
        assert_eq!(again, headers);
    }
    if let Ok(id) = MessageId::parse(row.id) {
        assert_eq!(MessageId::parse(&id.to_string()).ok(), Some(id));
    }
    assert_eq!(to_unix_millis(from_unix_millis(row.millis)), row.millis);
    assert_eq!(to_micros(from_micros(row.micros)), row.micros);
});
