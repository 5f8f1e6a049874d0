//! The layer over a real HTTP server, on the Redis dedup store (`ONCEBOX_REDIS_URL`,
//! default `redis://127.0.0.1:6379`; a unique key prefix per test), directly and behind
//! the in-memory layer.

#[macro_use]
mod common;

use std::sync::Arc;

use common::Fresh;
use oncebox_core::memory::LayeredDedupStore;
use oncebox_redis::RedisDedupStore;

fn url() -> String {
    std::env::var("ONCEBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Deletes the test's keys when the test ends (on a blocking connection: drop cannot
/// await).
struct DeletePrefix(String);

impl Drop for DeletePrefix {
    fn drop(&mut self) {
        use oncebox_redis::redis;
        let Ok(mut connection) = redis::Client::open(url()).and_then(|c| c.get_connection()) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query(&mut connection)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query(&mut connection);
        }
    }
}

async fn redis() -> Fresh<RedisDedupStore> {
    let prefix = format!("oncebox-http-test:{}:", uuid::Uuid::new_v4());
    let store = RedisDedupStore::connect(&url())
        .await
        .expect("connect to Redis (scripts/services.sh redis starts one)")
        .with_prefix(&prefix);
    Fresh {
        store,
        keep: Box::new(DeletePrefix(prefix)),
    }
}

scenarios!(redis().await);

mod layered {
    use super::*;

    async fn layered() -> Fresh<Arc<LayeredDedupStore<RedisDedupStore>>> {
        let Fresh { store, keep } = redis().await;
        Fresh {
            store: Arc::new(LayeredDedupStore::new(store, 10_000)),
            keep,
        }
    }

    scenarios!(layered().await);
}
