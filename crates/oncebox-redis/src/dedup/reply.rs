//! The dedup scripts' replies, decoded: what each script returns, and a permanent error
//! naming the script for anything else.

use std::time::{Duration, SystemTime};

use oncebox_core::store::{Begin, DedupRecord, DedupState, FencingToken};
use oncebox_core::{Bytes, Error, Result};
use redis::Value;

fn unexpected(script: &str, reply: &Value) -> Error {
    Error::store_permanent(format!(
        "unexpected reply from the dedup {script} script: {}",
        describe(reply)
    ))
}

/// The shape of a reply, never its content (a result may hold anything).
fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "nil".into(),
        Value::Int(n) => format!("integer {n}"),
        Value::BulkString(b) => format!("string of {} bytes", b.len()),
        Value::Array(items) => format!("array of {}", items.len()),
        _ => "a value of another type".into(),
    }
}

pub(crate) fn decode_begin(reply: Value) -> Result<Begin> {
    let Value::Array(items) = reply else {
        return Err(unexpected("begin", &reply));
    };
    match items.as_slice() {
        [Value::Int(0), Value::Int(token)] => u64::try_from(*token)
            .map(|token| Begin::Started(FencingToken(token)))
            .map_err(|_| Error::store_permanent(format!("negative fencing token {token}"))),
        [Value::Int(1), Value::Int(left)] => Ok(Begin::InProgress {
            retry_after: Duration::from_millis(u64::try_from(*left).unwrap_or(0)),
        }),
        [Value::Int(2), Value::BulkString(result)] => {
            Ok(Begin::Completed(Bytes::copy_from_slice(result)))
        }
        // Lua gives an empty string back as an empty bulk string; be lenient all the same.
        [Value::Int(2), Value::Nil] => Ok(Begin::Completed(Bytes::new())),
        _ => Err(unexpected("begin", &Value::Array(items))),
    }
}

/// The reply of the inspect script; `now` is the caller's clock when it came.
pub(crate) fn decode_inspect(reply: Value, now: SystemTime) -> Result<Option<DedupRecord>> {
    let items = match reply {
        Value::Nil => return Ok(None),
        Value::Array(items) => items,
        other => return Err(unexpected("inspect", &other)),
    };
    let [state, token, result, Value::Int(left)] = items.as_slice() else {
        return Err(unexpected("inspect", &Value::Array(items)));
    };
    let expires_at = u64::try_from(*left)
        .ok()
        .map(|ms| now + Duration::from_millis(ms));
    let Value::BulkString(state) = state else {
        return Err(unexpected("inspect", &Value::Array(items)));
    };
    let state = match (state.as_slice(), expires_at) {
        (b"p", Some(lease_until)) => DedupState::InProgress { lease_until },
        (b"c", _) => DedupState::Completed {
            result: match result {
                Value::BulkString(result) => Bytes::copy_from_slice(result),
                _ => Bytes::new(),
            },
        },
        // A lease without an expiry, or a state `begin` does not know: `begin` takes the
        // id as free.
        _ => return Ok(None),
    };
    let token = match token {
        Value::BulkString(token) => std::str::from_utf8(token)
            .ok()
            .and_then(|token| token.parse().ok()),
        _ => None,
    }
    .ok_or_else(|| unexpected("inspect", token))?;
    Ok(Some(DedupRecord::new(
        state,
        FencingToken(token),
        expires_at,
    )))
}

pub(crate) fn decode_finish(script: &str, reply: Value) -> Result<()> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(Error::LeaseLost),
        other => Err(unexpected(script, &other)),
    }
}
