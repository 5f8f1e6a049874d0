//! An exact in-memory dedup store.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::store::{Begin, DedupStore, FencingToken};
use crate::{Error, Result};

const SHARDS: usize = 16;

/// A [`DedupStore`] in process memory, exact within its window.
///
/// Every id inserted is remembered until its lease or TTL ends. There is no admission
/// filter: an insert is never refused or silently forgotten. Only when more than
/// `capacity` ids are held does the store evict, oldest insert first, and it counts
/// evictions in [`MemoryDedupStore::evictions`]. Size `capacity` above the number of ids
/// your TTL window can hold and evictions stay at zero.
///
/// Times follow `tokio::time`, so tests with a paused clock can move through leases and
/// TTLs instantly. Lookups take a lock on one of 16 shards.
pub struct MemoryDedupStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    shard_capacity: usize,
    next_token: AtomicU64,
    evictions: AtomicU64,
    down: AtomicBool,
}

#[derive(Default)]
struct Shard {
    /// Keys are shared with `order`: one allocation per inserted id.
    entries: HashMap<Arc<str>, Slot>,
    /// Insertion order, for oldest-first eviction; stale pairs are skipped.
    order: VecDeque<(Arc<str>, u64)>,
}

struct Slot {
    generation: u64,
    state: State,
}

enum State {
    InProgress { token: FencingToken, until: Instant },
    Completed { result: Bytes, until: Instant },
}

impl State {
    fn until(&self) -> Instant {
        match self {
            Self::InProgress { until, .. } | Self::Completed { until, .. } => *until,
        }
    }
}

impl MemoryDedupStore {
    /// A store holding up to `capacity` ids (at least one per shard).
    pub fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            shard_capacity: capacity.div_ceil(SHARDS).max(1),
            next_token: AtomicU64::new(1),
            evictions: AtomicU64::new(0),
            down: AtomicBool::new(false),
        }
    }

    /// How many ids were evicted for capacity so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Number of ids held (in progress or completed, expired ones not yet dropped
    /// included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fault injection: while down, every call fails with a store outage, like a Redis
    /// that cannot be reached.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn shard(&self, id: &str) -> std::sync::MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(id) as usize) % SHARDS;
        lock(&self.shards[index])
    }

    fn check_up(&self) -> Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::store_outage(
                "in-memory dedup store is down (fault injection)",
            ));
        }
        Ok(())
    }

    fn begin_sync(&self, id: &str, lease: Duration) -> Result<Begin> {
        self.check_up()?;
        let now = Instant::now();
        let mut shard = self.shard(id);
        // A held id (the duplicate's path) is answered without allocating.
        if let Some(held) = shard.entries.get(id).filter(|s| s.state.until() > now) {
            return Ok(match &held.state {
                State::InProgress { until, .. } => Begin::InProgress {
                    retry_after: *until - now,
                },
                State::Completed { result, .. } => Begin::Completed(result.clone()),
            });
        }
        let token = FencingToken(self.next_token.fetch_add(1, Ordering::Relaxed));
        let generation = token.0;
        let state = State::InProgress {
            token,
            until: now + lease,
        };
        let key: Arc<str> = Arc::from(id);
        // Absent or expired: (re)placed, with a new generation.
        shard
            .entries
            .insert(Arc::clone(&key), Slot { generation, state });
        shard.order.push_back((key, generation));
        let evicted = shard.shrink(self.shard_capacity, now);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        Ok(Begin::Started(token))
    }

    fn finish_sync(
        &self,
        id: &str,
        token: FencingToken,
        result: Option<(&[u8], Duration)>,
    ) -> Result<()> {
        self.check_up()?;
        let now = Instant::now();
        let mut shard = self.shard(id);
        let Some(slot) = shard.entries.get_mut(id) else {
            return Err(Error::LeaseLost);
        };
        match slot.state {
            State::InProgress { token: held, until } if held == token && until > now => {}
            _ => return Err(Error::LeaseLost),
        }
        match result {
            Some((result, ttl)) => {
                slot.state = State::Completed {
                    result: Bytes::copy_from_slice(result),
                    until: now + ttl,
                };
            }
            None => {
                shard.entries.remove(id);
            }
        }
        Ok(())
    }
}

impl Shard {
    /// Drops expired entries from the front, then evicts oldest-first while over
    /// `capacity`; returns how many live entries were evicted.
    fn shrink(&mut self, capacity: usize, now: Instant) -> u64 {
        let mut evicted = 0;
        while let Some((id, generation)) = self.order.front() {
            let current = self
                .entries
                .get(&**id)
                .filter(|slot| slot.generation == *generation);
            match current {
                // Stale pair: the id was removed or re-inserted since.
                None => {}
                Some(slot) if slot.state.until() <= now => {
                    self.entries.remove(&**id);
                }
                Some(_) if self.entries.len() > capacity => {
                    self.entries.remove(&**id);
                    evicted += 1;
                }
                Some(_) => break,
            }
            self.order.pop_front();
        }
        // Re-inserted ids leave stale pairs behind the front; keep the queue bounded.
        if self.order.len() > 2 * capacity + 16 {
            let entries = &self.entries;
            self.order
                .retain(|(id, g)| entries.get(&**id).is_some_and(|s| s.generation == *g));
        }
        evicted
    }
}

fn lock(shard: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a shard half-updated in a way that
    // matters more than losing the store, so recover the guard.
    shard
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Default for MemoryDedupStore {
    /// A store for one million ids.
    fn default() -> Self {
        Self::new(1_000_000)
    }
}

impl DedupStore for MemoryDedupStore {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        self.begin_sync(id, lease)
    }

    async fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        self.finish_sync(id, token, Some((result, ttl)))
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        self.finish_sync(id, token, None)
    }
}

impl<D: DedupStore> DedupStore for std::sync::Arc<D> {
    fn begin(&self, id: &str, lease: Duration) -> impl Future<Output = Result<Begin>> + Send {
        (**self).begin(id, lease)
    }

    fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).complete(id, token, result, ttl)
    }

    fn abandon(&self, id: &str, token: FencingToken) -> impl Future<Output = Result<()>> + Send {
        (**self).abandon(id, token)
    }

    fn purge_expired(&self, limit: usize) -> impl Future<Output = Result<u64>> + Send {
        (**self).purge_expired(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const TTL: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn remembers_every_insert_within_capacity() {
        // The property TinyLFU caches break: nothing seen in the window is forgotten.
        let store = MemoryDedupStore::new(20_000);
        for i in 0..10_000 {
            let Begin::Started(token) = store.begin(&i.to_string(), LEASE).await.unwrap() else {
                panic!("fresh id {i} not started");
            };
            store
                .complete(&i.to_string(), token, b"ok", TTL)
                .await
                .unwrap();
        }
        for i in 0..10_000 {
            assert_eq!(
                store.begin(&i.to_string(), LEASE).await.unwrap(),
                Begin::Completed(Bytes::from_static(b"ok"))
            );
        }
        assert_eq!(store.evictions(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn evicts_oldest_first_when_over_capacity() {
        let store = MemoryDedupStore::new(SHARDS); // one per shard
        for i in 0..200 {
            store.begin(&format!("id-{i}"), LEASE).await.unwrap();
        }
        assert!(store.len() <= SHARDS);
        assert!(store.evictions() >= 200 - SHARDS as u64);
        // The newest id is still held.
        assert!(matches!(
            store.begin("id-199", LEASE).await.unwrap(),
            Begin::InProgress { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_stale_queue_pairs_stay_bounded() {
        let store = MemoryDedupStore::new(64);
        for round in 0..1000 {
            let Begin::Started(token) = store.begin("same", LEASE).await.unwrap() else {
                panic!("round {round}: not free");
            };
            store
                .complete("same", token, b"", Duration::from_millis(1))
                .await
                .unwrap();
            tokio::time::advance(Duration::from_millis(2)).await;
        }
        assert!(
            lock(&store.shards[(store.hasher.hash_one("same") as usize) % SHARDS])
                .order
                .len()
                < 200
        );
    }
}
