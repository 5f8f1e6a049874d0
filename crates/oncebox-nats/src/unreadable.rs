//! Messages the NATS client cannot read: found through JetStream's raw message API,
//! dead-lettered, and removed from the stream.
//!
//! The client (async-nats) reads a message's header block as UTF-8 text. A block that
//! is not (a header value in Latin-1, which a client in another language may send), or
//! that is not `Name: value` lines, fails the whole connection: the client drops it and
//! reconnects, and the message never reaches the subscriber, nor do the messages of the
//! same pull batch behind it. The server delivers it again after the ack wait and the
//! connection drops again, until `max_deliver` gives up on it.
//!
//! So after every reconnection a subscriber looks at what its consumer has delivered
//! beyond its ack floor through `STREAM.MSG.GET`, whose JSON reply carries the header
//! block base64-encoded instead of parsed. A message whose block the client cannot read
//! is copied to the dead-letter subject with the reason, then deleted from the stream:
//! it cannot be terminated (its ack subject came with the delivery the client could not
//! read), and no consumer on this client could read it anyway. The server does not
//! deliver a deleted message again; the messages lost with it come back after the ack
//! wait.
//!
//! The deletion is the stream's, not the group's: every other group (durable consumer)
//! of the stream that has not received the message yet never will, and only the group
//! that found it holds the dead letter. A client in another language that can read the
//! header, consuming the same stream in a group of its own, loses it too. Give such
//! consumers a stream of their own (a mirror or a source) where that matters.

use std::str::FromStr;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::response::Response;
use async_nats::jetstream::stream::RawMessage;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use oncebox_core::{Bytes, Result};

use crate::dead_letter::publish_copy;
use crate::delivery::{Position, Route};
use crate::error::{client, refused};
use crate::transport::Shared;

/// The most messages one look examines (the window between the ack floor and the last
/// delivered message is usually the pull batches in flight).
const MAX_EXAMINED: u64 = 10_000;

#[derive(serde::Serialize)]
struct GetRequest<'a> {
    seq: u64,
    next_by_subj: &'a str,
}

#[derive(serde::Deserialize)]
struct GetReply {
    message: RawMessage,
}

/// Dead-letters and deletes the messages delivered to `consumer` and not acked whose
/// headers the client cannot read; returns how many.
pub(crate) async fn remove_unreadable(
    shared: &Shared,
    route: &Route,
    consumer: &PullConsumer,
) -> Result<usize> {
    let operation = || format!("look for unreadable messages of {}", route.consumer);
    let info = consumer
        .get_info()
        .await
        .map_err(|error| client(operation(), error))?;
    let last = info.delivered.stream_sequence;
    let mut sequence = info.ack_floor.stream_sequence + 1;
    let mut examined = 0;
    let mut removed = 0;
    while sequence <= last && examined < MAX_EXAMINED {
        let request = GetRequest {
            seq: sequence,
            next_by_subj: &route.subject,
        };
        let reply: Response<GetReply> = shared
            .context
            .request(format!("STREAM.MSG.GET.{}", route.stream), &request)
            .await
            .map_err(|error| client(operation(), error))?;
        let message = match reply {
            Response::Ok(reply) => reply.message,
            Response::Err { error } if error.error_code() == ErrorCode::NO_MESSAGE_FOUND => break,
            Response::Err { error } => return Err(refused(operation(), error)),
        };
        if message.sequence > last {
            break;
        }
        sequence = message.sequence + 1;
        examined += 1;
        let Some(encoded) = &message.headers else {
            continue;
        };
        let block = STANDARD
            .decode(encoded)
            .map_err(|error| client(operation(), error))?;
        if let Some(problem) = unreadable(&block) {
            remove(shared, route, &message, &block, &problem).await?;
            removed += 1;
        }
    }
    if examined == MAX_EXAMINED {
        tracing::warn!(
            consumer = %route.consumer, stream = %route.stream, next = sequence,
            "looked at {MAX_EXAMINED} messages for unreadable headers and stopped"
        );
    }
    Ok(removed)
}

/// Copies an unreadable message to the dead-letter subject, then deletes it.
async fn remove(
    shared: &Shared,
    route: &Route,
    message: &RawMessage,
    block: &[u8],
    problem: &str,
) -> Result<()> {
    let operation = || {
        format!(
            "dead-letter unreadable message {} of stream {}",
            message.sequence, route.stream
        )
    };
    let reason = format!(
        "the NATS client cannot read the message's headers: {problem}; the message was \
         deleted from stream {} (sequence {}) once this copy was stored",
        route.stream, message.sequence
    );
    tracing::warn!(
        topic = %route.topic, group = %route.group, sequence = message.sequence,
        %reason, "dead-lettering a message the NATS client cannot read"
    );
    let payload = STANDARD
        .decode(&message.payload)
        .map_err(|error| client(operation(), error))?;
    let position = Position {
        sequence: message.sequence,
        // At least once: the delivery the client could not read.
        deliveries: 1,
    };
    let headers = readable_headers(block);
    publish_copy(
        shared,
        route,
        Some(&headers),
        &Bytes::from(payload),
        position,
        &reason,
    )
    .await?;
    let stream = shared
        .context
        .get_stream_no_info(&route.stream)
        .await
        .map_err(|error| client(operation(), error))?;
    stream
        .delete_message(message.sequence)
        .await
        .map_err(|error| client(operation(), error))?;
    Ok(())
}

/// What makes `block` (a NATS header block, `NATS/1.0` and `Name: value` lines)
/// unreadable to the client, or `None` if it reads it.
pub(crate) fn unreadable(block: &[u8]) -> Option<String> {
    let Ok(text) = std::str::from_utf8(block) else {
        let line = block
            .split(|byte| *byte == b'\n')
            .find(|line| std::str::from_utf8(line).is_err())
            .unwrap_or(block);
        return Some(match line.iter().position(|byte| *byte == b':') {
            Some(colon) if std::str::from_utf8(&line[..colon]).is_ok() => format!(
                "the value of header {} is not UTF-8",
                String::from_utf8_lossy(&line[..colon]).trim()
            ),
            _ => format!(
                "a header name is not UTF-8 ({})",
                String::from_utf8_lossy(line).trim()
            ),
        });
    };
    let mut lines = text.lines();
    if !lines
        .next()
        .is_some_and(|line| line.starts_with("NATS/1.0"))
    {
        return Some("the header block does not begin with NATS/1.0".to_owned());
    }
    for line in lines {
        if line.is_empty() || line.starts_with(char::is_whitespace) {
            continue;
        }
        match line.split_once(':') {
            None => return Some(format!("header line {line:?} has no colon")),
            Some((name, _)) if HeaderName::from_str(name).is_err() => {
                return Some(format!("header name {name:?} is invalid"));
            }
            Some(_) => {}
        }
    }
    None
}

/// The headers of `block` the client could read, for the dead-letter copy (the reason
/// names the ones left out).
fn readable_headers(block: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in block.split(|byte| *byte == b'\n').skip(1) {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_str(name.trim()),
            HeaderValue::from_str(value.trim()),
        ) {
            headers.append(name, value);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_the_client_cannot_read_are_named() {
        assert_eq!(unreadable(b"NATS/1.0\r\nce-id: a\r\n\r\n"), None);
        let latin1 = unreadable(b"NATS/1.0\r\nce-id: a\r\nx-city: caf\xe9\r\n\r\n");
        assert_eq!(
            latin1.as_deref(),
            Some("the value of header x-city is not UTF-8")
        );
        assert!(
            unreadable(b"NATS/1.0\r\nx\xff: a\r\n\r\n")
                .is_some_and(|problem| problem.contains("name is not UTF-8"))
        );
        assert!(unreadable(b"NATS/1.0\r\nno colon\r\n\r\n").is_some());
        assert!(unreadable(b"HTTP/1.1\r\n\r\n").is_some());
    }

    #[test]
    fn the_copy_keeps_the_readable_headers() {
        let headers = readable_headers(b"NATS/1.0\r\nce-id: a\r\nx-city: caf\xe9\r\n\r\n");
        assert_eq!(headers.get("ce-id").map(HeaderValue::as_str), Some("a"));
        assert!(headers.get("x-city").is_none());
    }
}
