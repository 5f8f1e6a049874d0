//! The `oncebox-testkit` dedup and transport suites on a real Redis Cluster (three
//! masters, three replicas: `scripts/services.sh redis-cluster`; other nodes with
//! `ONCEBOX_REDIS_CLUSTER_URLS`). Every test works under a key prefix of its own, and
//! the keys spread over every master.

mod support;

use std::time::Duration;

use oncebox_core::Result;
use oncebox_core::store::{Begin, DedupStore};
use oncebox_redis::redis as client;
use oncebox_redis::{DedupLayout, RedisDedupStore, RedisStreamOptions, RedisStreams};
use oncebox_testkit::dedup::DedupHarness;
use oncebox_testkit::transport;
use support::{StreamsHarness, clean_cluster, cluster_urls, unique_prefix};

/// A dedup store on the cluster under a prefix of its own, and the prefix; the prefix's
/// keys are deleted when it is dropped.
struct ClusterDedup(RedisDedupStore, String);

impl ClusterDedup {
    async fn new() -> Self {
        let prefix = unique_prefix();
        let store = RedisDedupStore::connect_cluster(cluster_urls())
            .await
            .expect("connect to the Redis Cluster (scripts/services.sh redis-cluster starts one)")
            .with_prefix(&prefix);
        Self(store, prefix)
    }
}

impl Drop for ClusterDedup {
    fn drop(&mut self) {
        clean_cluster(&self.1);
    }
}

impl DedupHarness for ClusterDedup {
    type Store = RedisDedupStore;

    fn store(&self) -> RedisDedupStore {
        self.0.clone()
    }

    /// The records under the check's prefix on every master (the cluster client sends
    /// `KEYS` to each and joins the answers), not the shard counters, which stay.
    async fn count_records(&self) -> Result<Option<u64>> {
        let mut connection = self.0.connection().clone();
        let keys: Vec<String> = client::cmd("KEYS")
            .arg(format!("{}*:id:*", self.1))
            .query_async(&mut connection)
            .await
            .map_err(oncebox_core::Error::store_transient)?;
        Ok(Some(keys.len() as u64))
    }
}

macro_rules! dedup_suite {
    ($($check:ident),* $(,)?) => {
        mod dedup {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    oncebox_testkit::dedup::$check(&super::ClusterDedup::new().await).await;
                }
            )*
        }
    };
}

oncebox_testkit::dedup_checks!(dedup_suite!());

macro_rules! transport_suite {
    ($($check:ident),* $(,)?) => {
        mod streams {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() -> oncebox_core::Result<()> {
                    super::transport::$check(&super::StreamsHarness::on_cluster().await).await
                }
            )*
        }
    };
}

oncebox_testkit::transport_checks!(transport_suite!());

/// The store's keys on a cluster: the sharded layout, its ids on every master, each
/// record beside its shard's counter.
#[tokio::test]
async fn dedup_keys_spread_over_the_masters() {
    let harness = ClusterDedup::new().await;
    let store = &harness.0;
    assert_eq!(store.layout(), DedupLayout::Sharded);
    let lease = Duration::from_secs(30);
    for n in 0..64 {
        let begun = store.begin(&format!("order-{n}"), lease).await;
        assert!(matches!(begun, Ok(Begin::Started(_))), "{begun:?}");
    }
    let mut masters = 0;
    for url in cluster_urls() {
        let node = client::Client::open(url.as_str()).expect("a node URL");
        let mut node = node
            .get_multiplexed_async_connection()
            .await
            .expect("reach every node");
        let role: Vec<client::Value> = client::cmd("ROLE")
            .query_async(&mut node)
            .await
            .expect("ROLE");
        if role.first() != Some(&client::Value::BulkString(b"master".to_vec())) {
            continue;
        }
        let keys: Vec<String> = client::cmd("KEYS")
            .arg(format!("{}*", harness.1))
            .query_async(&mut node)
            .await
            .expect("KEYS");
        assert!(
            keys.iter().any(|key| key.contains(":id:")),
            "no record on the master {url}"
        );
        masters += 1;
    }
    assert!(masters >= 3, "{masters} masters");
}

/// A single-server layout on a cluster needs a hash-tagged prefix; without one its
/// record and counter fall in different slots, which Redis refuses: a permanent error.
#[tokio::test]
async fn one_counter_on_a_cluster_needs_a_hash_tag() {
    let harness = ClusterDedup::new().await;
    let lease = Duration::from_secs(30);
    let untagged = harness.0.clone().with_layout(DedupLayout::OneCounter);
    let error = untagged
        .begin("order-1", lease)
        .await
        .expect_err("CROSSSLOT");
    assert!(!error.is_transient(), "{error:?}");
    let tagged = harness
        .0
        .clone()
        .with_prefix(format!("{{{}}}", harness.1))
        .with_layout(DedupLayout::OneCounter);
    let begun = tagged.begin("order-1", lease).await;
    assert!(matches!(begun, Ok(Begin::Started(_))), "{begun:?}");
    clean_cluster(&format!("{{{}}}", harness.1));
}

/// Stream keys with braces but no hash tag cannot keep a topic's keys in one slot:
/// subscribing says so instead of failing later with `CROSSSLOT`.
#[tokio::test]
async fn stream_keys_that_cannot_share_a_slot_are_refused() {
    let prefix = unique_prefix();
    let streams = RedisStreams::connect_cluster(
        cluster_urls(),
        RedisStreamOptions::new().key_prefix(&prefix),
    )
    .await
    .expect("connect to the cluster");
    let error = streams
        .subscribe("bad}topic", "g")
        .await
        .expect_err("three slots");
    assert!(error.is_invalid_input(), "{error:?}");
    assert!(streams.subscribe("fine", "g").await.is_ok());
    clean_cluster(&prefix);
}

/// No cluster node listening: a transient error; no URL, or one that does not parse:
/// an options error.
#[tokio::test]
async fn cluster_connection_errors_are_classified() {
    let none: [&str; 0] = [];
    let empty = RedisDedupStore::connect_cluster(none)
        .await
        .expect_err("no node");
    assert!(empty.is_invalid_input(), "{empty:?}");
    let bad = RedisDedupStore::connect_cluster(["not a url"])
        .await
        .expect_err("bad URL");
    assert!(bad.is_invalid_input(), "{bad:?}");
    let down = RedisDedupStore::connect_cluster(["redis://127.0.0.1:1"])
        .await
        .expect_err("nothing listens on port 1");
    assert!(down.is_transient(), "{down:?}");
}
