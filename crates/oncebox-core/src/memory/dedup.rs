//! An exact in-memory dedup store.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::time::Instant;

use crate::store::{Begin, DedupRecord, DedupState, DedupStore, FencingToken};
use crate::{Error, Result};

const SHARDS: usize = 16;

/// A [`DedupStore`] in process memory, exact within its window.
///
/// Every id inserted is remembered until its lease or TTL ends: a live id (in progress,
/// or completed within its TTL) is never evicted, and there is no admission filter.
/// Memory stays bounded by `capacity`: when it is reached, expired ids make room, and if
/// none has expired, [`begin`](DedupStore::begin) of a new id is refused with
/// [`Error::AtCapacity`] (an outage for the consumer, which holds the delivery and tries
/// again; 503 with `Retry-After` in the HTTP layer) instead of forgetting a live id.
/// Refusals are counted in [`MemoryDedupStore::refusals`] and the metric
/// `oncebox_dedup_refused_total{store="memory"}`. Size `capacity` above the number of ids
/// your TTL window holds and refusals stay at zero.
///
/// Times follow `tokio::time`, so tests with a paused clock can move through leases and
/// TTLs instantly; [`inspect`](DedupStore::inspect) reports them as the time left added
/// to [`SystemTime::now`]. Lookups take a lock on one of 16 shards.
pub struct MemoryDedupStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    capacity: usize,
    /// Ids held across the shards (expired ones not yet dropped included).
    held: AtomicUsize,
    next_token: AtomicU64,
    refusals: AtomicU64,
    down: AtomicBool,
}

#[derive(Default)]
struct Shard {
    /// Keys are shared with `order`: one allocation per inserted id.
    entries: HashMap<Arc<str>, Slot>,
    /// Insertion order, to drop expired entries oldest first; stale pairs are skipped.
    order: VecDeque<(Arc<str>, u64)>,
    /// When the first entry expires, as the last sweep found (and inserts since lowered):
    /// until then a sweep would find nothing to drop. `None` before the first sweep.
    next_expiry: Option<Instant>,
}

struct Slot {
    generation: u64,
    state: State,
}

enum State {
    InProgress {
        token: FencingToken,
        until: Instant,
    },
    Completed {
        token: FencingToken,
        result: Bytes,
        until: Instant,
    },
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
            capacity: capacity.max(1),
            held: AtomicUsize::new(0),
            next_token: AtomicU64::new(1),
            refusals: AtomicU64::new(0),
            down: AtomicBool::new(false),
        }
    }

    /// How many `begin` calls for new ids were refused at capacity so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
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
        let mut swept = false;
        loop {
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
            let dropped = shard.drop_expired_front(now);
            self.held.fetch_sub(dropped, Ordering::Relaxed);
            // An expired id is replaced in place; a new one needs room.
            let new = !shard.entries.contains_key(id);
            if new && self.held.load(Ordering::Relaxed) >= self.capacity {
                drop(shard);
                if swept {
                    return Err(self.refuse(self.retry_after(now)));
                }
                // Expired ids anywhere make room; the shard's lock is released first, as
                // the sweep takes each shard's in turn.
                self.sweep(now);
                swept = true;
                continue;
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
            shard.expires(now + lease);
            if new {
                self.held.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Begin::Started(token));
        }
    }

    /// Drops the expired ids of every shard (each shard at most once per expiry).
    fn sweep(&self, now: Instant) {
        for shard in &self.shards {
            let removed = lock(shard).sweep(now);
            self.held.fetch_sub(removed, Ordering::Relaxed);
        }
    }

    /// How long until the first live id expires, as the shards' last sweeps found.
    fn retry_after(&self, now: Instant) -> Duration {
        self.shards
            .iter()
            .filter_map(|shard| lock(shard).next_expiry)
            .min()
            .map_or(Duration::ZERO, |next| next.saturating_duration_since(now))
    }

    /// Counts a refusal and builds its error.
    fn refuse(&self, retry_after: Duration) -> Error {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("oncebox_dedup_refused_total", "store" => "memory").increment(1);
        Error::AtCapacity {
            capacity: self.capacity,
            retry_after,
        }
    }

    fn extend_sync(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        self.check_up()?;
        let now = Instant::now();
        let mut shard = self.shard(id);
        match shard.entries.get_mut(id).map(|slot| &mut slot.state) {
            Some(State::InProgress { token: held, until }) if *held == token && *until > now => {
                *until = now + lease;
                // A sweep's earliest expiry may now come later: it stays an estimate.
                Ok(())
            }
            _ => Err(Error::LeaseLost),
        }
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
                    token,
                    result: Bytes::copy_from_slice(result),
                    until: now + ttl,
                };
                shard.expires(now + ttl);
            }
            None => {
                shard.entries.remove(id);
                self.held.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn inspect_sync(&self, id: &str) -> Result<Option<DedupRecord>> {
        self.check_up()?;
        let now = Instant::now();
        let shard = self.shard(id);
        let Some(slot) = shard.entries.get(id).filter(|s| s.state.until() > now) else {
            return Ok(None);
        };
        // The caller's clock, moved by the time left on this store's.
        let wall = SystemTime::now();
        let at = |until: Instant| wall + (until - now);
        let (state, token) = match &slot.state {
            State::InProgress { token, until } => (
                DedupState::InProgress {
                    lease_until: at(*until),
                },
                *token,
            ),
            State::Completed { token, result, .. } => (
                DedupState::Completed {
                    result: result.clone(),
                },
                *token,
            ),
        };
        Ok(Some(DedupRecord::new(
            state,
            token,
            Some(at(slot.state.until())),
        )))
    }
}

impl Shard {
    /// Notes that an entry expires at `until`, so that a sweep after it looks again.
    fn expires(&mut self, until: Instant) {
        if let Some(next) = &mut self.next_expiry {
            *next = (*next).min(until);
        }
    }

    /// Drops every expired entry, at most once per expiry (entries expire out of
    /// insertion order, as leases and TTLs differ); returns how many. Remembers when the
    /// first live entry expires.
    fn sweep(&mut self, now: Instant) -> usize {
        if self.next_expiry.is_some_and(|next| next > now) {
            return 0;
        }
        let before = self.entries.len();
        let mut next_expiry: Option<Instant> = None;
        self.entries.retain(|_, slot| {
            let until = slot.state.until();
            if until <= now {
                return false;
            }
            next_expiry = Some(next_expiry.map_or(until, |next| next.min(until)));
            true
        });
        self.next_expiry = next_expiry;
        self.compact_order();
        before - self.entries.len()
    }

    /// Drops expired entries from the front of the insertion order; returns how many.
    fn drop_expired_front(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
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
                Some(_) => break,
            }
            self.order.pop_front();
        }
        // Re-inserted ids leave stale pairs behind the front; keep the queue bounded.
        if self.order.len() > 2 * self.entries.len() + 16 {
            self.compact_order();
        }
        before - self.entries.len()
    }

    /// Drops the insertion-order pairs of entries that are gone or were replaced.
    fn compact_order(&mut self) {
        let entries = &self.entries;
        self.order
            .retain(|(id, g)| entries.get(&**id).is_some_and(|s| s.generation == *g));
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

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        self.extend_sync(id, token, lease)
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        self.finish_sync(id, token, None)
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        self.inspect_sync(id)
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

    fn extend(
        &self,
        id: &str,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<()>> + Send {
        (**self).extend(id, token, lease)
    }

    fn abandon(&self, id: &str, token: FencingToken) -> impl Future<Output = Result<()>> + Send {
        (**self).abandon(id, token)
    }

    fn inspect(&self, id: &str) -> impl Future<Output = Result<Option<DedupRecord>>> + Send {
        (**self).inspect(id)
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
        assert_eq!(store.refusals(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_refuses_new_ids_and_never_forgets_a_live_one() {
        let store = MemoryDedupStore::new(SHARDS); // one per shard
        let mut held = Vec::new();
        let mut refused = 0;
        for i in 0..200 {
            let id = format!("id-{i}");
            match store.begin(&id, LEASE).await {
                Ok(Begin::Started(token)) => {
                    store.complete(&id, token, b"done", TTL).await.unwrap();
                    held.push(id);
                }
                Err(Error::AtCapacity {
                    capacity,
                    retry_after,
                }) => {
                    assert_eq!(capacity, SHARDS);
                    assert!(retry_after > Duration::ZERO && retry_after <= TTL);
                    refused += 1;
                }
                other => panic!("{id}: {other:?}"),
            }
        }
        assert!(store.len() <= SHARDS);
        assert_eq!(store.refusals(), refused);
        assert_eq!(held.len() + refused as usize, 200);
        // Every id taken is still answered with its result: nothing live was evicted.
        for id in &held {
            assert_eq!(
                store.begin(id, LEASE).await.unwrap(),
                Begin::Completed(Bytes::from_static(b"done")),
                "{id} was forgotten"
            );
        }
        // Once they expire, new ids have room again.
        tokio::time::advance(TTL + Duration::from_secs(1)).await;
        assert!(matches!(
            store.begin("after-expiry", LEASE).await.unwrap(),
            Begin::Started(_)
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
