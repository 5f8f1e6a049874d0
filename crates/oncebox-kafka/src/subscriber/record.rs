//! A fetched Kafka record, copied out of librdkafka and decoded.

use std::panic::{AssertUnwindSafe, catch_unwind};

use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, Coordinates, Received};
use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Headers as _, OwnedHeaders};

/// One record as fetched: decoded for the application, and raw for a dead-letter copy.
pub(crate) struct Record {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    /// The message, or why it cannot be decoded.
    pub(crate) received: Result<Received, String>,
    /// The record's key, as bytes.
    pub(crate) key: Option<Vec<u8>>,
    /// The record's value (a null value is empty).
    pub(crate) payload: Bytes,
    /// The record's headers, exactly as they came.
    pub(crate) headers: Option<OwnedHeaders>,
}

impl Record {
    /// Copies and decodes `message`.
    ///
    /// The key is the CloudEvents `subject` when the record has one, else the record's
    /// key if it is UTF-8 (a binary key, such as a schema-registry encoded one, leaves
    /// [`Received::key`] empty; the dead-letter copy keeps its bytes).
    pub(crate) fn copy(message: &BorrowedMessage<'_>, wire: &WireFormat) -> Self {
        let payload = Bytes::copy_from_slice(message.payload().unwrap_or_default());
        let coordinates = Coordinates {
            source: message.topic().to_owned(),
            partition: Some(message.partition()),
            position: message.offset().to_string(),
        };
        let decoded = catch_unwind(AssertUnwindSafe(|| {
            let fields = message
                .headers()
                .into_iter()
                .flat_map(|headers| headers.iter())
                .map(|header| (header.key.as_bytes(), header.value.unwrap_or_default()));
            wire.decode(message.topic(), fields, payload.clone(), coordinates, 1)
        }));
        let received = match decoded {
            Ok(Ok(mut received)) => {
                if received.key.is_none() {
                    received.key = message
                        .key()
                        .and_then(|key| std::str::from_utf8(key).ok())
                        .map(str::to_owned);
                }
                Ok(received)
            }
            Ok(Err(invalid)) => Err(format!("undecodable record: {invalid}")),
            // rdkafka 0.39 panics on a header name that is not UTF-8
            // (`BorrowedHeaders::try_get` unwraps it): contained here, and the record is
            // dead-lettered like any other undecodable one.
            Err(_) => Err("undecodable record: a header name is not UTF-8".to_owned()),
        };
        Self {
            partition: message.partition(),
            offset: message.offset(),
            received,
            key: message.key().map(<[u8]>::to_vec),
            payload,
            headers: message.headers().map(|headers| headers.detach()),
        }
    }
}
