//! An exact in-memory window of completed results in front of any dedup store.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::Result;
use crate::store::{Begin, DedupRecord, DedupStore, FencingToken};

const SHARDS: usize = 16;

/// How long a completion learned from the backing store (not completed through this
/// layer, so its TTL is unknown here) is answered from memory, unless
/// [`LayeredDedupStore::remote_window`] sets another.
pub const DEFAULT_REMOTE_WINDOW: Duration = Duration::from_secs(60);

/// A [`DedupStore`] that answers duplicates of completed ids from process memory and
/// asks a backing store (Redis, SQL) for everything else: the hot path of a duplicate
/// costs a hash lookup instead of a round trip.
///
/// - [`begin`](DedupStore::begin) answers `Completed` from memory when the id's result
///   is held there; otherwise it asks the backing store, and keeps the result if the
///   answer is `Completed`.
/// - [`complete`](DedupStore::complete) writes to the backing store first and, once it
///   succeeded, keeps the result in memory for the same TTL.
/// - **In-progress state always lives in the backing store only**: `begin` that starts,
///   `complete` and `abandon` go to it, so leases, fencing tokens and the one-holder rule
///   stay correct across processes sharing it. Memory only ever holds completed results,
///   which never change until they expire, so no process can read a stale one.
/// - [`inspect`](DedupStore::inspect) asks the backing store, which holds every record
///   (memory only copies some completed results), so it reports the record's real
///   state, token and expiry. A completion learned from the backing store may still be
///   answered from memory for up to the remote window after `inspect` found it expired.
///
/// The window is exact, like [`MemoryDedupStore`](super::MemoryDedupStore): no admission
/// filter, oldest-first eviction past `capacity` (counted in
/// [`evictions`](Self::evictions)), and an evicted or expired entry only costs a trip to
/// the backing store, which still holds the truth.
///
/// A completion learned from the backing store is kept for at most
/// [`remote_window`](Self::remote_window) (default [`DEFAULT_REMOTE_WINDOW`]), since its
/// remaining TTL is unknown here: an id whose record expires in the backing store within
/// that window may still answer `Completed` from memory until the window ends. Keep the
/// remote window well below the TTL you complete with.
///
/// Times follow `tokio::time`, like the in-memory store.
pub struct LayeredDedupStore<D> {
    backing: D,
    window: CompletedWindow,
    remote_window: Duration,
}

impl<D: DedupStore> LayeredDedupStore<D> {
    /// `backing` behind a window of up to `capacity` completed results (at least one
    /// per shard).
    pub fn new(backing: D, capacity: usize) -> Self {
        Self {
            backing,
            window: CompletedWindow::new(capacity),
            remote_window: DEFAULT_REMOTE_WINDOW,
        }
    }

    /// How long a completion read from the backing store is answered from memory.
    /// Default: [`DEFAULT_REMOTE_WINDOW`]. `Duration::ZERO` keeps only the completions
    /// made through this layer.
    #[must_use]
    pub fn remote_window(mut self, window: Duration) -> Self {
        self.remote_window = window;
        self
    }

    /// The backing store.
    pub fn backing(&self) -> &D {
        &self.backing
    }

    /// How many completed results were evicted for capacity so far.
    pub fn evictions(&self) -> u64 {
        self.window.evictions.load(Ordering::Relaxed)
    }

    /// How many `begin` calls were answered from memory so far.
    pub fn memory_hits(&self) -> u64 {
        self.window.hits.load(Ordering::Relaxed)
    }

    /// Number of completed results held in memory (expired ones not yet dropped
    /// included).
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// Whether memory holds no completed result.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<D: DedupStore> DedupStore for LayeredDedupStore<D> {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        if let Some(result) = self.window.get(id, Instant::now()) {
            return Ok(Begin::Completed(result));
        }
        let begin = self.backing.begin(id, lease).await?;
        if let Begin::Completed(result) = &begin
            && !self.remote_window.is_zero()
        {
            self.window
                .insert(id, result.clone(), Instant::now() + self.remote_window);
        }
        Ok(begin)
    }

    async fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        // The expiry counts from before the write: memory never outlives the record.
        let until = Instant::now() + ttl;
        self.backing.complete(id, token, result, ttl).await?;
        self.window
            .insert(id, Bytes::copy_from_slice(result), until);
        Ok(())
    }

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        self.backing.extend(id, token, lease).await
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        self.backing.abandon(id, token).await
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        self.backing.inspect(id).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.backing.purge_expired(limit).await
    }
}

/// Completed results by id, sharded, evicting oldest-first past capacity.
struct CompletedWindow {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    shard_capacity: usize,
    next_generation: AtomicU64,
    evictions: AtomicU64,
    hits: AtomicU64,
}

#[derive(Default)]
struct Shard {
    /// Keys are shared with `order`: one allocation per inserted id.
    entries: HashMap<Arc<str>, Entry>,
    /// Insertion order, for oldest-first eviction; stale pairs are skipped.
    order: VecDeque<(Arc<str>, u64)>,
}

struct Entry {
    generation: u64,
    result: Bytes,
    until: Instant,
}

impl CompletedWindow {
    fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            shard_capacity: capacity.div_ceil(SHARDS).max(1),
            next_generation: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    fn shard(&self, id: &str) -> std::sync::MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(id) as usize) % SHARDS;
        lock(&self.shards[index])
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    fn get(&self, id: &str, now: Instant) -> Option<Bytes> {
        let shard = self.shard(id);
        let entry = shard.entries.get(id)?;
        if entry.until <= now {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(entry.result.clone())
    }

    fn insert(&self, id: &str, result: Bytes, until: Instant) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let key: Arc<str> = Arc::from(id);
        let mut shard = self.shard(id);
        shard.entries.insert(
            Arc::clone(&key),
            Entry {
                generation,
                result,
                until,
            },
        );
        shard.order.push_back((key, generation));
        let evicted = shard.shrink(self.shard_capacity, now);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
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
                .filter(|entry| entry.generation == *generation);
            match current {
                None => {}
                Some(entry) if entry.until <= now => {
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
        if self.order.len() > 2 * capacity + 16 {
            let entries = &self.entries;
            self.order
                .retain(|(id, g)| entries.get(&**id).is_some_and(|e| e.generation == *g));
        }
        evicted
    }
}

fn lock(shard: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    // Entries are replaced whole, so a panic elsewhere never leaves one half-written.
    shard
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::memory::MemoryDedupStore;

    const LEASE: Duration = Duration::from_secs(30);
    const TTL: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn duplicates_are_answered_from_memory() {
        let backing = Arc::new(MemoryDedupStore::new(1000));
        let layered = LayeredDedupStore::new(Arc::clone(&backing), 1000);
        let Ok(Begin::Started(token)) = layered.begin("a", LEASE).await else {
            panic!("fresh id not started");
        };
        layered.complete("a", token, b"done", TTL).await.unwrap();
        // The backing store going down does not matter for a held completion.
        backing.set_down(true);
        for _ in 0..3 {
            assert_eq!(
                layered.begin("a", LEASE).await.unwrap(),
                Begin::Completed(Bytes::from_static(b"done"))
            );
        }
        assert_eq!(layered.memory_hits(), 3);
        // Anything else still asks the backing store.
        assert!(layered.begin("b", LEASE).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn completions_from_elsewhere_are_cached_for_the_remote_window() {
        let backing = Arc::new(MemoryDedupStore::new(1000));
        let layered = LayeredDedupStore::new(Arc::clone(&backing), 1000)
            .remote_window(Duration::from_secs(5));
        // Another process completes through the backing store.
        let Ok(Begin::Started(token)) = backing.begin("x", LEASE).await else {
            panic!("fresh id not started");
        };
        assert!(matches!(
            layered.begin("x", LEASE).await.unwrap(),
            Begin::InProgress { .. }
        ));
        backing.complete("x", token, b"r", TTL).await.unwrap();
        assert_eq!(
            layered.begin("x", LEASE).await.unwrap(),
            Begin::Completed(Bytes::from_static(b"r"))
        );
        assert_eq!(layered.len(), 1);
        assert_eq!(layered.memory_hits(), 0);
        layered.begin("x", LEASE).await.unwrap();
        assert_eq!(layered.memory_hits(), 1);
        tokio::time::advance(Duration::from_secs(6)).await;
        layered.begin("x", LEASE).await.unwrap();
        assert_eq!(layered.memory_hits(), 1, "the remote window ended");
    }

    #[tokio::test(start_paused = true)]
    async fn window_is_exact_and_evicts_oldest_first() {
        let backing = MemoryDedupStore::new(100_000);
        let layered = LayeredDedupStore::new(backing, 20_000);
        for i in 0..10_000 {
            let id = i.to_string();
            let Ok(Begin::Started(token)) = layered.begin(&id, LEASE).await else {
                panic!("fresh id {i} not started");
            };
            layered.complete(&id, token, b"ok", TTL).await.unwrap();
        }
        assert_eq!(layered.len(), 10_000);
        assert_eq!(layered.evictions(), 0);

        let small = LayeredDedupStore::new(MemoryDedupStore::new(1000), SHARDS);
        for i in 0..200 {
            let id = format!("id-{i}");
            let Ok(Begin::Started(token)) = small.begin(&id, LEASE).await else {
                panic!("fresh id {i} not started");
            };
            small.complete(&id, token, b"ok", TTL).await.unwrap();
        }
        assert!(small.len() <= SHARDS);
        assert!(small.evictions() >= 200 - SHARDS as u64);
        // Evicted ids are still completed: the backing store answers.
        assert_eq!(
            small.begin("id-0", LEASE).await.unwrap(),
            Begin::Completed(Bytes::from_static(b"ok"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stale_tokens_are_fenced_by_the_backing_store() {
        let layered = LayeredDedupStore::new(MemoryDedupStore::new(100), 100);
        let Ok(Begin::Started(old)) = layered.begin("j", Duration::from_secs(1)).await else {
            panic!("fresh id not started");
        };
        tokio::time::advance(Duration::from_secs(2)).await;
        let Ok(Begin::Started(new)) = layered.begin("j", LEASE).await else {
            panic!("expired lease not freed");
        };
        assert!(matches!(
            layered.complete("j", old, b"stale", TTL).await,
            Err(crate::Error::LeaseLost)
        ));
        assert!(layered.is_empty(), "a refused completion is not cached");
        layered.complete("j", new, b"fresh", TTL).await.unwrap();
        assert_eq!(
            layered.begin("j", LEASE).await.unwrap(),
            Begin::Completed(Bytes::from_static(b"fresh"))
        );
    }
}
