//! The idempotent receiver's dedup store on Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use oncebox_core::store::{Begin, DedupRecord, DedupStore, FencingToken};
use oncebox_core::{Error, Result};
use redis::{Script, Value};

use crate::connection::{Endpoint, RedisConnection, Timeouts};
use crate::error::store_error;

mod reply;
pub(crate) use reply::{decode_begin, decode_finish, decode_inspect};

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

/// How many fencing-token counters the [sharded layout](DedupLayout::Sharded) has; an id's
/// shard is the 32-bit FNV-1a hash of its bytes modulo this. Fixed: another number would
/// move ids to other counters and records.
pub const DEDUP_SHARDS: u32 = 1024;

/// How a [`RedisDedupStore`] names its keys under its prefix.
///
/// Both keep the store's promises; they differ in where the keys live. A store's layout
/// must not change while records exist (see [Moving to a cluster](RedisDedupStore#moving-to-a-cluster)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DedupLayout {
    /// One fencing-token counter for every id: `{prefix}dedup:token`, and records
    /// `{prefix}dedup:id:<id>`. The default on a single server. On a cluster the
    /// record and the counter must share a slot, so the prefix needs a hash tag
    /// (`{payments}:`), which puts every key on one node.
    OneCounter,
    /// [`DEDUP_SHARDS`] counters, each id's record beside its shard's counter:
    /// `{prefix}dedup:{<shard>}:id:<id>` and `{prefix}dedup:{<shard>}:token`. The
    /// `{<shard>}` hash tag keeps the two in one slot and spreads the shards over the
    /// cluster's masters. The default on a cluster.
    Sharded,
}

/// The dedup store of the idempotent receiver (and of the HTTP Idempotency-Key layer) on
/// Redis: `absent → in progress (token, lease) → completed (result, TTL) → expired`.
///
/// It runs on one server ([`connect`](Self::connect)) or on a Redis Cluster
/// ([`connect_cluster`](Self::connect_cluster)).
///
/// # Layout
///
/// Every key lives under the prefix (default [`DEFAULT_PREFIX`]). On a single server
/// ([`DedupLayout::OneCounter`]):
///
/// | key | type | what |
/// |---|---|---|
/// | `{prefix}dedup:token` | string | the fencing-token counter (`INCR`), never expires |
/// | `{prefix}dedup:id:<id>` | hash | `s` state (`p` in progress, `c` completed), `t` token, `r` result |
///
/// On a cluster ([`DedupLayout::Sharded`]) each id belongs to one of [`DEDUP_SHARDS`]
/// shards, the FNV-1a hash of the id modulo that number, and the hash tag `{<shard>}`
/// puts its record and its shard's counter in one slot, while the shards spread over the
/// masters:
///
/// | key | type | what |
/// |---|---|---|
/// | `{prefix}dedup:{<shard>}:token` | string | the shard's fencing-token counter, never expires |
/// | `{prefix}dedup:{<shard>}:id:<id>` | hash | as above |
///
/// A record's expiry (`PEXPIRE`) is its state's deadline: the lease while in progress,
/// the TTL once completed. When the lease of a holder that crashed ends, Redis drops the
/// record and the id is free again; the next holder's token comes from the id's counter
/// (the same counter for an id, always), so it is larger than every token issued for
/// that id before, even when its record expired. Tokens of ids in different shards are
/// not comparable; fencing never compares them.
///
/// # Moving to a cluster
///
/// A single-server store keeps [`DedupLayout::OneCounter`], its layout before clusters
/// were supported: upgrading changes no key, and old and new versions of a service can
/// run side by side. Switching a store from one layout to the other (moving its data to
/// a cluster connection, or [`with_layout`](Self::with_layout)) makes every existing
/// record invisible: an id in progress or completed before the switch would run again.
/// Either keep the old layout (a store that ran on a cluster node with a hash-tagged
/// prefix can go on with `with_layout(DedupLayout::OneCounter)` on a cluster connection),
/// or switch once no record matters any more: after the longest TTL, with the
/// consumers stopped meanwhile or their duplicates acceptable.
///
/// # Atomicity
///
/// `begin`, `extend`, `complete`, `abandon` and `inspect` are Lua scripts (`EVALSHA`, loaded on first use and
/// again after a server restart or a failover), so each is one atomic step on the server:
/// of concurrent `begin`s exactly one starts, and `complete` or `abandon` with a token
/// that no longer holds the id changes nothing and fails with [`Error::LeaseLost`].
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
/// so a duplicate arriving afterwards runs again. A restart also forgets the counters:
/// the next tokens may repeat ones issued before it.
///
/// On Redis Cluster each master replicates to its replicas asynchronously: a `begin` or
/// `complete` that a master acknowledged but had not yet sent to its replica when it died
/// is gone once the replica is promoted. What that means for the receiver:
///
/// - a lost `complete`: a later duplicate finds the id free and runs again;
/// - a lost `begin`: the holder's `complete` fails with [`Error::LeaseLost`] (a transient
///   error: the message is retried and runs again), and a duplicate arriving meanwhile
///   may start beside the holder;
/// - a lost `INCR` of a shard's counter: the promoted master hands out a token that was
///   already issued for an id of that shard; if that id's holder also lost its record,
///   two holders share a token, and fencing cannot tell them apart.
///
/// So through a failover the store is at-least-once, like the effects it guards; the
/// window is the replication lag, usually below a millisecond. While a master is down
/// (the cluster's `cluster-node-timeout`, then the promotion), commands on its slots wait:
/// the cluster client retries within [`RESPONSE_TIMEOUT`] and follows the new master;
/// past that they fail with a transient error. Errors are transient and typed, nothing
/// panics, and the store serves the promoted master without a restart.
///
/// Measured on a local cluster (three masters and their replicas on one two-core machine,
/// `cluster-node-timeout 1000`), 16 workers delivering fresh ids (`begin`, `complete`,
/// retried as a consumer retries) while the master of a third of the slots was killed
/// with `SIGKILL` and its replica promoted, `scripts/services.sh redis-cluster` and
/// `cargo test -p oncebox-redis --test cluster_failover -- --nocapture`: in two runs,
/// 64,343 and 93,064 ids were delivered; 3 and 2 ran twice, each after its `complete`
/// failed with `LeaseLost` (its `begin` had not reached the replica); no confirmed
/// completion was lost; no other error reached the caller, as the client retried through
/// the failover; operations on the dead master's slots waited up to 2.6 s (the promotion
/// took 2.5-2.7 s).
///
/// `WAIT` would narrow the window (a reply only once a replica has the write) but not
/// close it: Redis Cluster promotes a replica whether or not it had everything. Where a
/// repeated effect is unacceptable, keep the dedup record in the database of the effect
/// (the transactional inbox).
///
/// # Errors
///
/// Lost connections, timeouts, and a server that is loading, failing over or read-only
/// give transient store errors (retry later); script and type errors give permanent ones.
/// Both connections reconnect by themselves.
#[derive(Clone)]
pub struct RedisDedupStore {
    connection: RedisConnection,
    keys: Arc<Keys>,
}

struct Keys {
    prefix: String,
    layout: DedupLayout,
}

impl Keys {
    fn new(prefix: &str, layout: DedupLayout) -> Self {
        Self {
            prefix: prefix.to_owned(),
            layout,
        }
    }

    /// The id's record and its fencing-token counter.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for the sharded layout under a prefix whose first `{` is
    /// followed by `}`: Redis Cluster then hashes whole keys, and a record and its
    /// counter would fall in different slots. (Any other prefix works: a hash tag of its
    /// own puts every key in its slot, a `{` without one takes in the shard's tag.)
    fn record_and_counter(&self, id: &str) -> Result<(String, String)> {
        let prefix = &self.prefix;
        match self.layout {
            DedupLayout::OneCounter => Ok((
                format!("{prefix}dedup:id:{id}"),
                format!("{prefix}dedup:token"),
            )),
            DedupLayout::Sharded => {
                if prefix
                    .find('{')
                    .is_some_and(|at| prefix[at + 1..].starts_with('}'))
                {
                    return Err(Error::InvalidOptions(format!(
                        "Redis dedup store: the prefix {prefix:?} has an empty hash tag `{{}}`, \
                         which keeps the sharded layout's keys from sharing a slot"
                    )));
                }
                let shard = shard(id);
                Ok((
                    format!("{prefix}dedup:{{{shard}}}:id:{id}"),
                    format!("{prefix}dedup:{{{shard}}}:token"),
                ))
            }
        }
    }

    fn record(&self, id: &str) -> Result<String> {
        self.record_and_counter(id).map(|(record, _)| record)
    }
}

/// The shard of `id` in the sharded layout: 32-bit FNV-1a of its bytes, modulo
/// [`DEDUP_SHARDS`]. Stable across versions and platforms: it decides where keys live.
fn shard(id: &str) -> u32 {
    let hash = id.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    hash % DEDUP_SHARDS
}

impl fmt::Debug for RedisDedupStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection's Debug would print the URL, which may hold a password.
        f.debug_struct("RedisDedupStore")
            .field("prefix", &self.keys.prefix)
            .field("layout", &self.keys.layout)
            .field("connection", &self.connection)
            .finish()
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
        Self::connect_to(Endpoint::server(url)?).await
    }

    /// Connects to the Redis Cluster that `nodes` belong to (URLs as for
    /// [`connect`](Self::connect); one reachable node is enough, the client learns the
    /// others from it), with a [`RESPONSE_TIMEOUT`] per command, retries and redirections
    /// included, and the [sharded layout](DedupLayout::Sharded).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for no URL or one that does not parse; a transient store
    /// error if no node can be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the connections being made.
    pub async fn connect_cluster<S: AsRef<str>>(
        nodes: impl IntoIterator<Item = S>,
    ) -> Result<Self> {
        Self::connect_to(Endpoint::cluster(nodes)?).await
    }

    async fn connect_to(endpoint: Endpoint) -> Result<Self> {
        let timeouts = Timeouts {
            response: RESPONSE_TIMEOUT,
            connect: RESPONSE_TIMEOUT,
        };
        let connection = endpoint.connect(timeouts).await.map_err(store_error)?;
        Ok(Self::new(connection))
    }

    /// A store on an existing connection (a [`ConnectionManager`](redis::aio::ConnectionManager)
    /// or a cluster's [`ClusterConnection`](redis::cluster_async::ClusterConnection),
    /// configured as you like), with the default prefix and the layout that suits it:
    /// [`DedupLayout::Sharded`] on a cluster, [`DedupLayout::OneCounter`] otherwise.
    pub fn new(connection: impl Into<RedisConnection>) -> Self {
        let connection = connection.into();
        let layout = if connection.is_cluster() {
            DedupLayout::Sharded
        } else {
            DedupLayout::OneCounter
        };
        Self {
            connection,
            keys: Arc::new(Keys::new(DEFAULT_PREFIX, layout)),
        }
    }

    /// The same connection, with every key under `prefix` instead: stores with different
    /// prefixes never see each other's ids (tests isolate themselves this way).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<str>) -> Self {
        self.keys = Arc::new(Keys::new(prefix.as_ref(), self.keys.layout));
        self
    }

    /// The same connection and prefix, with another key layout. Records written under
    /// the other layout are not seen: read [Moving to a cluster](Self#moving-to-a-cluster)
    /// first.
    #[must_use]
    pub fn with_layout(mut self, layout: DedupLayout) -> Self {
        self.keys = Arc::new(Keys::new(&self.keys.prefix, layout));
        self
    }

    /// The key layout.
    pub fn layout(&self) -> DedupLayout {
        self.keys.layout
    }

    /// The connection, for other commands on the same server or cluster.
    pub fn connection(&self) -> &RedisConnection {
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

impl DedupStore for RedisDedupStore {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        let (record, counter) = self.keys.record_and_counter(id)?;
        let reply = self
            .run(BEGIN.key(record).key(counter).arg(expiry_millis(lease)))
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
                    .key(self.keys.record(id)?)
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
                    .key(self.keys.record(id)?)
                    .arg(token.0)
                    .arg(expiry_millis(lease)),
            )
            .await?;
        decode_finish("extend", reply)
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        let reply = self
            .run(ABANDON.key(self.keys.record(id)?).arg(token.0))
            .await?;
        decode_finish("abandon", reply)
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        let reply = self.run(&INSPECT.key(self.keys.record(id)?)).await?;
        decode_inspect(reply, SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::Bytes;
    use oncebox_core::store::DedupState;

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
        let keys = Keys::new("{t1}:", DedupLayout::OneCounter);
        assert_eq!(
            keys.record_and_counter("a:b").ok(),
            Some((
                "{t1}:dedup:id:a:b".to_owned(),
                "{t1}:dedup:token".to_owned()
            ))
        );
        let keys = Keys::new("p:", DedupLayout::Sharded);
        assert_eq!(
            keys.record_and_counter("order-42").ok(),
            Some((
                "p:dedup:{756}:id:order-42".to_owned(),
                "p:dedup:{756}:token".to_owned()
            ))
        );
        let empty_tag = Keys::new("a{}b:", DedupLayout::Sharded).record_and_counter("x");
        assert!(matches!(empty_tag, Err(Error::InvalidOptions(_))));
    }

    /// The shard decides where an id's keys live: it must never change.
    #[test]
    fn shards_are_fixed() {
        // 32-bit FNV-1a: 0x811c9dc5 for no bytes, 0xe40c292c for "a".
        assert_eq!(shard(""), 0x811c_9dc5 % DEDUP_SHARDS);
        assert_eq!(shard("a"), 0xe40c_292c % DEDUP_SHARDS);
        assert_eq!(shard("order-42"), 756);
    }

    /// Whatever the prefix and the id, an id's record and counter hash to one slot.
    #[test]
    fn record_and_counter_share_a_slot() {
        use redis::cluster_routing::Slot;
        for prefix in ["", "p:", "{tag}:", "a{", "}{", "x}y{z", "}{x", "{{}"] {
            for id in ["", "a", "{b}", "}{", "order-42", "{", "}"] {
                let keys = Keys::new(prefix, DedupLayout::Sharded);
                let (record, counter) = keys.record_and_counter(id).expect("a valid prefix");
                assert_eq!(
                    Slot::for_key(&record),
                    Slot::for_key(&counter),
                    "{record} and {counter}"
                );
            }
        }
    }

    #[test]
    fn shards_spread_over_the_slots() {
        use redis::cluster_routing::Slot;
        use std::collections::HashSet;
        let keys = Keys::new("oncebox:", DedupLayout::Sharded);
        let slots: HashSet<_> = (0..10_000)
            .filter_map(|n| keys.record_and_counter(&format!("id-{n}")).ok())
            .map(|(_, counter)| Slot::for_key(counter))
            .collect();
        // 1024 shards, each a slot (a few may collide).
        assert!(slots.len() > 950, "{} slots", slots.len());
    }
}
