//! The idempotent receiver's dedup store on Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use oncebox_core::store::{Begin, DedupRecord, DedupState, DedupStore, FencingToken};
use oncebox_core::{Bytes, Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use crate::error::store_error;

static BEGIN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/dedup_begin.lua")));
static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dedup_complete.lua")));
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dedup_extend.lua")));
static ABANDON: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dedup_abandon.lua")));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dedup_inspect.lua")));

/// The key prefix used unless [`RedisDedupStore::with_prefix`] sets another.
pub const DEFAULT_PREFIX: &str = "oncebox:";

/// How long one command may take before it fails with a transient error, for stores made
/// by [`RedisDedupStore::connect`].
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The dedup store of the idempotent receiver (and of the HTTP Idempotency-Key layer) on
/// Redis: `absent → in progress (token, lease) → completed (result, TTL) → expired`.
///
/// # Layout
///
/// Every key lives under the prefix (default [`DEFAULT_PREFIX`]):
///
/// | key | type | what |
/// |---|---|---|
/// | `{prefix}dedup:token` | string | the fencing-token counter (`INCR`), never expires |
/// | `{prefix}dedup:id:{id}` | hash | `s` state (`p` in progress, `c` completed), `t` token, `r` result |
///
/// A record's expiry (`PEXPIRE`) is its state's deadline: the lease while in progress,
/// the TTL once completed. When the lease of a holder that crashed ends, Redis drops the
/// record and the id is free again; the next holder's token comes from the counter, so
/// it is larger than every token issued before, even for an id whose record expired.
///
/// # Atomicity
///
/// `begin`, `extend`, `complete`, `abandon` and `inspect` are Lua scripts (`EVALSHA`, loaded on first use and
/// again after a server restart), so each is one atomic step on the server: of concurrent
/// `begin`s exactly one starts, and `complete` or `abandon` with a token that no longer
/// holds the id changes nothing and fails with [`Error::LeaseLost`].
///
/// Tokens are compared as Lua numbers, exact up to 2^53 issued tokens.
///
/// # Inspecting
///
/// [`inspect`](DedupStore::inspect) reads the record and its `PTTL` in one step and
/// reports the expiry as the time left added to the caller's now. A completed record
/// without an expiry (removed by hand) is reported with `expires_at: None`; an in-progress
/// record without one, which `begin` takes over as free, is reported as no record.
///
/// # Durability and clusters
///
/// Redis keeps what its persistence settings keep: a restart without AOF forgets records,
/// so a duplicate arriving afterwards runs again. The scripts touch two keys (the record
/// and the counter); on Redis Cluster they must share a slot, so give the store a prefix
/// with a hash tag (`{oncebox}:`), which puts all of its keys on one node.
///
/// # Errors
///
/// Lost connections, timeouts, and a server that is loading, failing over or read-only
/// give transient store errors (retry later); script and type errors give permanent ones.
/// [`ConnectionManager`] reconnects by itself.
#[derive(Clone)]
pub struct RedisDedupStore {
    connection: ConnectionManager,
    keys: Arc<Keys>,
}

struct Keys {
    counter: String,
    /// `{prefix}dedup:id:`, to which the id is appended.
    record: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        Self {
            counter: format!("{prefix}dedup:token"),
            record: format!("{prefix}dedup:id:"),
        }
    }

    fn record(&self, id: &str) -> String {
        let mut key = String::with_capacity(self.record.len() + id.len());
        key.push_str(&self.record);
        key.push_str(id);
        key
    }
}

impl fmt::Debug for RedisDedupStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection's Debug would print the URL, which may hold a password.
        f.debug_struct("RedisDedupStore")
            .field("counter", &self.keys.counter)
            .finish_non_exhaustive()
    }
}

impl RedisDedupStore {
    /// Connects to the Redis server at `url` (`redis://[user:password@]host[:port][/db]`),
    /// with a [`RESPONSE_TIMEOUT`] per command and reconnection on failure.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL that does not parse; a transient store error if
    /// the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the connection being made.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url)
            .map_err(|e| Error::InvalidOptions(format!("Redis URL: {}", e.category())))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2);
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(store_error)?;
        Ok(Self::new(connection))
    }

    /// A store on an existing connection manager (configured as you like), with the
    /// default prefix.
    pub fn new(connection: ConnectionManager) -> Self {
        Self {
            connection,
            keys: Arc::new(Keys::new(DEFAULT_PREFIX)),
        }
    }

    /// The same connection, with every key under `prefix` instead: stores with different
    /// prefixes never see each other's ids (tests isolate themselves this way).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<str>) -> Self {
        self.keys = Arc::new(Keys::new(prefix.as_ref()));
        self
    }

    /// The connection, for other commands on the same server.
    pub fn connection(&self) -> &ConnectionManager {
        &self.connection
    }

    async fn run(&self, invocation: &redis::ScriptInvocation<'_>) -> Result<Value> {
        let mut connection = self.connection.clone();
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(store_error)
    }
}

/// Milliseconds for `PEXPIRE`/`PX`: at least 1 (0 would delete the record at once), at
/// most what Redis accepts.
fn expiry_millis(duration: Duration) -> i64 {
    const MAX: i64 = i64::MAX / 2;
    i64::try_from(duration.as_millis()).map_or(MAX, |ms| ms.clamp(1, MAX))
}

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

impl DedupStore for RedisDedupStore {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        let reply = self
            .run(
                BEGIN
                    .key(self.keys.record(id))
                    .key(&self.keys.counter)
                    .arg(expiry_millis(lease)),
            )
            .await?;
        decode_begin(reply)
    }

    async fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        let reply = self
            .run(
                COMPLETE
                    .key(self.keys.record(id))
                    .arg(token.0)
                    .arg(result)
                    .arg(expiry_millis(ttl)),
            )
            .await?;
        decode_finish("complete", reply)
    }

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        let reply = self
            .run(
                EXTEND
                    .key(self.keys.record(id))
                    .arg(token.0)
                    .arg(expiry_millis(lease)),
            )
            .await?;
        decode_finish("extend", reply)
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        let reply = self
            .run(ABANDON.key(self.keys.record(id)).arg(token.0))
            .await?;
        decode_finish("abandon", reply)
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        let reply = self.run(&INSPECT.key(self.keys.record(id))).await?;
        decode_inspect(reply, SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_never_zero_nor_out_of_range() {
        assert_eq!(expiry_millis(Duration::ZERO), 1);
        assert_eq!(expiry_millis(Duration::from_micros(10)), 1);
        assert_eq!(expiry_millis(Duration::from_secs(2)), 2000);
        assert_eq!(expiry_millis(Duration::MAX), i64::MAX / 2);
    }

    #[test]
    fn decodes_replies() {
        assert_eq!(
            decode_begin(Value::Array(vec![Value::Int(0), Value::Int(7)])).ok(),
            Some(Begin::Started(FencingToken(7)))
        );
        assert_eq!(
            decode_begin(Value::Array(vec![Value::Int(1), Value::Int(250)])).ok(),
            Some(Begin::InProgress {
                retry_after: Duration::from_millis(250)
            })
        );
        assert_eq!(
            decode_begin(Value::Array(vec![
                Value::Int(2),
                Value::BulkString(b"ok".to_vec())
            ]))
            .ok(),
            Some(Begin::Completed(Bytes::from_static(b"ok")))
        );
        let bad = decode_begin(Value::Int(3)).expect_err("not an array");
        assert!(!bad.is_transient());
        assert!(matches!(
            decode_finish("complete", Value::Int(0)),
            Err(Error::LeaseLost)
        ));
        assert!(decode_finish("abandon", Value::Int(1)).is_ok());
    }

    #[test]
    fn decodes_inspect_replies() {
        let now = SystemTime::now();
        let reply = |state: &[u8], ttl: i64| {
            Value::Array(vec![
                Value::BulkString(state.to_vec()),
                Value::BulkString(b"12".to_vec()),
                Value::BulkString(b"ok".to_vec()),
                Value::Int(ttl),
            ])
        };
        let in_1s = now + Duration::from_secs(1);
        assert_eq!(
            decode_inspect(reply(b"p", 1000), now).ok(),
            Some(Some(DedupRecord::new(
                DedupState::InProgress { lease_until: in_1s },
                FencingToken(12),
                Some(in_1s)
            )))
        );
        let completed = DedupState::Completed {
            result: Bytes::from_static(b"ok"),
        };
        assert_eq!(
            decode_inspect(reply(b"c", -1), now).ok(),
            Some(Some(DedupRecord::new(completed, FencingToken(12), None)))
        );
        assert_eq!(decode_inspect(reply(b"p", -1), now).ok(), Some(None));
        assert_eq!(decode_inspect(Value::Nil, now).ok(), Some(None));
        assert!(decode_inspect(Value::Int(1), now).is_err());
    }

    #[test]
    fn keys_sit_under_the_prefix() {
        let keys = Keys::new("{t1}:");
        assert_eq!(keys.counter, "{t1}:dedup:token");
        assert_eq!(keys.record("a:b"), "{t1}:dedup:id:a:b");
    }
}
