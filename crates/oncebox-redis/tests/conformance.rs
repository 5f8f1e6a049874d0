//! The `oncebox-testkit` dedup suite against a real Redis (`ONCEBOX_REDIS_URL`, default
//! `redis://127.0.0.1:6379`), directly and behind the in-memory layer. Every check runs
//! under a prefix of its own.

use oncebox_core::memory::LayeredDedupStore;
use oncebox_redis::RedisDedupStore;
use oncebox_redis::redis as client;
use oncebox_testkit::dedup::DedupHarness;

fn redis_url() -> String {
    std::env::var("ONCEBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A store under a unique prefix, and the prefix.
async fn fresh() -> (RedisDedupStore, String) {
    let prefix = format!("oncebox-test:{}:", uuid::Uuid::new_v4());
    let store = RedisDedupStore::connect(&redis_url())
        .await
        .expect("connect to Redis (scripts/services.sh redis starts one)")
        .with_prefix(&prefix);
    (store, prefix)
}

/// Deletes every key under `prefix` (the records expire by themselves; the token counter
/// does not).
async fn clean(store: &RedisDedupStore, prefix: &str) {
    let mut connection = store.connection().clone();
    let keys: Vec<String> = client::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut connection)
        .await
        .expect("list the test's keys");
    if !keys.is_empty() {
        let _: i64 = client::cmd("DEL")
            .arg(&keys)
            .query_async(&mut connection)
            .await
            .expect("delete the test's keys");
    }
}

struct RedisHarness(RedisDedupStore, String);

impl DedupHarness for RedisHarness {
    type Store = RedisDedupStore;

    fn store(&self) -> RedisDedupStore {
        self.0.clone()
    }

    /// The keys under the check's prefix: the records Redis has not expired yet, and the
    /// token counter.
    async fn count_records(&self) -> oncebox_core::Result<Option<u64>> {
        let mut connection = self.0.connection().clone();
        let keys: Vec<String> = client::cmd("KEYS")
            .arg(format!("{}*", self.1))
            .query_async(&mut connection)
            .await
            .map_err(oncebox_core::Error::store_transient)?;
        Ok(Some(keys.len() as u64))
    }
}

struct LayeredHarness(std::sync::Arc<LayeredDedupStore<RedisDedupStore>>);

impl DedupHarness for LayeredHarness {
    type Store = std::sync::Arc<LayeredDedupStore<RedisDedupStore>>;

    fn store(&self) -> Self::Store {
        std::sync::Arc::clone(&self.0)
    }
}

macro_rules! suite {
    ($($check:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    let (store, prefix) = super::fresh().await;
                    let harness = super::RedisHarness(store.clone(), prefix.clone());
                    oncebox_testkit::dedup::$check(&harness).await;
                    super::clean(&store, &prefix).await;
                }
            )*
        }

        mod layered_over_redis {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    let (store, prefix) = super::fresh().await;
                    let layered = oncebox_core::memory::LayeredDedupStore::new(store.clone(), 10_000);
                    let harness = super::LayeredHarness(std::sync::Arc::new(layered));
                    oncebox_testkit::dedup::$check(&harness).await;
                    super::clean(&store, &prefix).await;
                }
            )*
        }
    };
}

oncebox_testkit::dedup_checks!(suite!());

/// Two stores on one server with different prefixes never see each other's ids.
#[tokio::test]
async fn prefixes_isolate() {
    use oncebox_core::store::{Begin, DedupStore};
    use std::time::Duration;
    let (a, a_prefix) = fresh().await;
    let (b, b_prefix) = fresh().await;
    let lease = Duration::from_secs(30);
    assert!(matches!(
        a.begin("same", lease).await,
        Ok(Begin::Started(_))
    ));
    assert!(matches!(
        b.begin("same", lease).await,
        Ok(Begin::Started(_))
    ));
    clean(&a, &a_prefix).await;
    clean(&b, &b_prefix).await;
}

/// A URL that does not parse is an options error, a server that is not there a
/// transient store error.
#[tokio::test]
async fn connection_errors_are_classified() {
    let bad = RedisDedupStore::connect("not a url")
        .await
        .expect_err("bad URL");
    assert!(bad.is_invalid_input(), "{bad:?}");
    let down = RedisDedupStore::connect("redis://127.0.0.1:1")
        .await
        .expect_err("nothing listens on port 1");
    assert!(down.is_transient(), "{down:?}");
}

/// After a server restart (or `SCRIPT FLUSH`) the scripts are gone from the server's
/// cache: `EVALSHA` fails with `NOSCRIPT` and the store loads them again.
#[tokio::test]
async fn scripts_are_reloaded_after_a_flush() {
    use oncebox_core::store::{Begin, DedupStore};
    use std::time::Duration;
    let (store, prefix) = fresh().await;
    let lease = Duration::from_secs(30);
    let Ok(Begin::Started(token)) = store.begin("a", lease).await else {
        panic!("fresh id not started");
    };
    let mut connection = store.connection().clone();
    let _: String = client::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut connection)
        .await
        .expect("SCRIPT FLUSH");
    store
        .complete("a", token, b"r", Duration::from_secs(60))
        .await
        .expect("complete after the flush");
    assert!(matches!(
        store.begin("a", lease).await,
        Ok(Begin::Completed(_))
    ));
    clean(&store, &prefix).await;
}

/// Records damaged by something other than the store (another program writing under
/// the prefix, a hand edit): a key of another type, or a token counter that is not a
/// number, is a permanent store error, never a panic, and is left as it is; a hash in
/// an unknown state, or in progress without an expiry (a lease that would never end),
/// is taken over with a new token like an expired record; a completed record without a
/// result answers with an empty result.
#[tokio::test]
async fn damaged_records_are_errors_or_taken_over() {
    use oncebox_core::store::{Begin, DedupStore};
    use std::time::Duration;
    let (store, prefix) = fresh().await;
    let lease = Duration::from_secs(30);
    let mut connection = store.connection().clone();
    let record = |id: &str| format!("{prefix}dedup:id:{id}");

    let _: () = client::cmd("SET")
        .arg(record("string"))
        .arg("garbage")
        .query_async(&mut connection)
        .await
        .expect("SET");
    let error = store
        .begin("string", lease)
        .await
        .expect_err("a key of another type");
    assert!(!error.is_transient(), "{error:?}");
    let kept: String = client::cmd("GET")
        .arg(record("string"))
        .query_async(&mut connection)
        .await
        .expect("GET");
    assert_eq!(kept, "garbage", "the foreign key is left alone");

    let _: () = client::cmd("HSET")
        .arg(record("unknown"))
        .arg("s")
        .arg("zz")
        .query_async(&mut connection)
        .await
        .expect("HSET");
    assert!(matches!(
        store.begin("unknown", lease).await,
        Ok(Begin::Started(_))
    ));

    let _: () = client::cmd("HSET")
        .arg(record("forever"))
        .arg("s")
        .arg("p")
        .arg("t")
        .arg(1)
        .query_async(&mut connection)
        .await
        .expect("HSET");
    let taken = store.begin("forever", lease).await;
    assert!(matches!(taken, Ok(Begin::Started(_))), "{taken:?}");
    let ttl: i64 = client::cmd("PTTL")
        .arg(record("forever"))
        .query_async(&mut connection)
        .await
        .expect("PTTL");
    assert!(ttl > 0, "the new holder's lease has an end: {ttl}");

    let _: () = client::cmd("HSET")
        .arg(record("no-result"))
        .arg("s")
        .arg("c")
        .query_async(&mut connection)
        .await
        .expect("HSET");
    assert!(matches!(
        store.begin("no-result", lease).await,
        Ok(Begin::Completed(result)) if result.is_empty()
    ));

    let _: () = client::cmd("SET")
        .arg(format!("{prefix}dedup:token"))
        .arg("x")
        .query_async(&mut connection)
        .await
        .expect("SET");
    let error = store
        .begin("fresh", lease)
        .await
        .expect_err("a token counter that is not a number");
    assert!(!error.is_transient(), "{error:?}");
    clean(&store, &prefix).await;
}
