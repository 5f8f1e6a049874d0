//! The idempotency record: the dedup store's result for a key is the request's
//! fingerprint and the response to replay, in a small versioned binary format.
//!
//! ```text
//! "OBH1"                  magic and version, 4 bytes
//! fingerprint             32 bytes (SHA-256)
//! status                  u16, big-endian
//! header count            u16
//! per header              name length u16, name, value length u32, value
//! body                    the rest, byte for byte
//! ```
//!
//! Decoding never panics: a record that does not parse (written by something else, or
//! damaged) is an error the layer treats like a store failure.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::fingerprint::{FINGERPRINT_LEN, Fingerprint};

const MAGIC: &[u8; 4] = b"OBH1";

/// A response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
}

/// A stored result that is not an idempotency record.
#[derive(Debug, thiserror::Error)]
#[error("the stored idempotency record is damaged or of an unknown format: {0}")]
pub(crate) struct RecordError(&'static str);

impl StoredResponse {
    /// The record of a response: `headers` filtered by the allow-list `keep`.
    pub(crate) fn encode(
        fingerprint: &Fingerprint,
        status: StatusCode,
        headers: &HeaderMap,
        keep: &[HeaderName],
        body: &[u8],
    ) -> Bytes {
        let kept: Vec<(&HeaderName, &HeaderValue)> = keep
            .iter()
            .flat_map(|name| headers.get_all(name).iter().map(move |value| (name, value)))
            // A header past the format's limits is not stored; nothing legitimate is.
            .filter(|(name, value)| {
                u16::try_from(name.as_str().len()).is_ok() && u32::try_from(value.len()).is_ok()
            })
            .take(usize::from(u16::MAX))
            .collect();
        let header_bytes: usize = kept
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum();
        let mut out =
            BytesMut::with_capacity(MAGIC.len() + FINGERPRINT_LEN + 4 + header_bytes + body.len());
        out.put_slice(MAGIC);
        out.put_slice(fingerprint.as_bytes());
        out.put_u16(status.as_u16());
        out.put_u16(u16::try_from(kept.len()).unwrap_or(u16::MAX));
        for (name, value) in kept {
            out.put_u16(u16::try_from(name.as_str().len()).unwrap_or(0));
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(u32::try_from(value.len()).unwrap_or(0));
            out.put_slice(value.as_bytes());
        }
        out.put_slice(body);
        out.freeze()
    }

    /// Parses a record; the body shares `record`'s memory.
    pub(crate) fn decode(record: &Bytes) -> Result<Self, RecordError> {
        let mut cursor = Cursor {
            data: record,
            at: 0,
        };
        if cursor.take(MAGIC.len())? != MAGIC {
            return Err(RecordError("unknown magic"));
        }
        let fingerprint = Fingerprint::from_slice(cursor.take(FINGERPRINT_LEN)?)
            .ok_or(RecordError("short fingerprint"))?;
        let status =
            StatusCode::from_u16(cursor.u16()?).map_err(|_| RecordError("invalid status"))?;
        let count = cursor.u16()?;
        let mut headers = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let len = usize::from(cursor.u16()?);
            let name = HeaderName::from_bytes(cursor.take(len)?)
                .map_err(|_| RecordError("invalid header name"))?;
            let len = usize::try_from(cursor.u32()?).map_err(|_| RecordError("huge header"))?;
            let value = HeaderValue::from_bytes(cursor.take(len)?)
                .map_err(|_| RecordError("invalid header value"))?;
            headers.push((name, value));
        }
        Ok(Self {
            fingerprint,
            status,
            headers,
            body: record.slice(cursor.at..),
        })
    }
}

struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], RecordError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|end| *end <= self.data.len())
            .ok_or(RecordError("truncated"))?;
        let slice = &self.data[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u16(&mut self) -> Result<u16, RecordError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use http::header;

    use super::*;

    fn sample() -> (Fingerprint, HeaderMap) {
        let fingerprint = Fingerprint::of(&http::Method::POST, "/pay?x=1", b"{}");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("secret=1"));
        headers.append(header::LINK, HeaderValue::from_static("</a>"));
        headers.append(header::LINK, HeaderValue::from_static("</b>"));
        (fingerprint, headers)
    }

    #[test]
    fn round_trips_only_allowed_headers() {
        let (fingerprint, headers) = sample();
        let record = StoredResponse::encode(
            &fingerprint,
            StatusCode::CREATED,
            &headers,
            &[header::CONTENT_TYPE, header::LINK, header::LOCATION],
            b"{\"id\":1}\x00\xff",
        );
        let decoded = StoredResponse::decode(&record).unwrap();
        assert_eq!(decoded.fingerprint, fingerprint);
        assert_eq!(decoded.status, StatusCode::CREATED);
        assert_eq!(
            decoded.headers,
            vec![
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json")
                ),
                (header::LINK, HeaderValue::from_static("</a>")),
                (header::LINK, HeaderValue::from_static("</b>")),
            ]
        );
        assert_eq!(&decoded.body[..], b"{\"id\":1}\x00\xff");
    }

    #[test]
    fn damaged_records_are_errors_never_panics() {
        let (fingerprint, headers) = sample();
        let record = StoredResponse::encode(
            &fingerprint,
            StatusCode::OK,
            &headers,
            &[header::CONTENT_TYPE],
            b"body",
        );
        // Every truncation up to the body, and garbage, fail cleanly.
        let body_start = record.len() - 4;
        for cut in 0..body_start {
            assert!(
                StoredResponse::decode(&record.slice(..cut)).is_err(),
                "cut {cut}"
            );
        }
        assert!(StoredResponse::decode(&Bytes::from_static(b"charged")).is_err());
        let mut bad_status = BytesMut::from(&record[..]);
        bad_status[36] = 0xff;
        assert!(StoredResponse::decode(&bad_status.freeze()).is_err());
        // Random bytes behind a valid magic.
        for seed in 0..200u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut junk = MAGIC.to_vec();
            junk.extend((0..rng.usize(0..128)).map(|_| rng.u8(..)));
            let _ = StoredResponse::decode(&Bytes::from(junk));
        }
    }
}
