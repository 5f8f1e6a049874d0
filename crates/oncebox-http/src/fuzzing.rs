//! Entry points for the fuzz targets in `fuzz/` at the repository root. Compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets; not part of the crate's API.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::fingerprint::Fingerprint;
use crate::record::StoredResponse;

/// A stored idempotency record, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The request's fingerprint.
    pub fingerprint: [u8; 32],
    /// The response's status.
    pub status: StatusCode,
    /// The response's stored headers, in stored order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The response's body.
    pub body: Bytes,
}

/// Reads a record as the layer reads what its dedup store holds for a key.
///
/// # Errors
///
/// Why it is not a record, as text.
pub fn decode_record(record: &Bytes) -> Result<Record, String> {
    let stored = StoredResponse::decode(record).map_err(|error| error.to_string())?;
    Ok(Record {
        fingerprint: *stored.fingerprint.as_bytes(),
        status: stored.status,
        headers: stored.headers,
        body: stored.body,
    })
}

/// Writes `record` as the layer writes a response, keeping every header it has (the
/// values of one name together, names in the order they first appear).
pub fn encode_record(record: &Record) -> Bytes {
    let mut headers = HeaderMap::new();
    let mut keep: Vec<HeaderName> = Vec::new();
    for (name, value) in &record.headers {
        if !keep.contains(name) {
            keep.push(name.clone());
        }
        headers.append(name, value.clone());
    }
    let fingerprint = Fingerprint::from_slice(&record.fingerprint)
        .unwrap_or_else(|| unreachable!("a fingerprint is 32 bytes"));
    StoredResponse::encode(&fingerprint, record.status, &headers, &keep, &record.body)
}
