//! What a Redis Cluster failover does to the dedup store and the Streams transport: a
//! master is killed (`SIGKILL`) while work goes on, its replica is promoted, the killed
//! node rejoins as a replica (`scripts/services.sh restart redis-cluster-master`).
//!
//! The tests assert what oncebox promises (every error transient and typed, nothing
//! panics, everything works again after the promotion) and print what the failover cost:
//! duplicates, lost writes, errors, and how long operations failed. Redis replicates
//! asynchronously, so the counts vary from run to run; the store's docs quote a run.
//!
//! Run with `--nocapture` to see the figures.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncebox_core::store::{Begin, DedupStore};
use oncebox_core::{Error, Message, Publisher};
use oncebox_redis::redis;
use oncebox_redis::{RedisDedupStore, RedisStreams};
use support::{clean_cluster, cluster_urls, options, unique_prefix};

/// One failover at a time in this binary: both tests kill a master.
static FAILOVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long work goes on before the kill, and after the killed node is back.
const BEFORE: Duration = Duration::from_millis(1500);
const AFTER: Duration = Duration::from_secs(1);

/// Kills a master, waits for its replica's promotion, starts it again; returns when the
/// killed node follows the new master, with what the script printed.
async fn fail_over() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    let output = tokio::process::Command::new("bash")
        .arg(script)
        .args(["restart", "redis-cluster-master"])
        .output()
        .await
        .expect("run scripts/services.sh");
    let printed = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "the failover failed: {printed}");
    printed
}

/// Errors seen, by kind, and when the first and last happened.
#[derive(Default)]
struct Errors {
    by_kind: HashMap<String, u64>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Errors {
    fn add(&mut self, error: &Error) {
        let kind = if matches!(error, Error::LeaseLost) {
            "lease lost".to_owned()
        } else if error.is_outage() {
            "outage (transient)".to_owned()
        } else if error.is_transient() {
            "transient".to_owned()
        } else {
            format!("PERMANENT: {error}")
        };
        *self.by_kind.entry(kind).or_default() += 1;
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    fn permanent(&self) -> Vec<&String> {
        self.by_kind
            .keys()
            .filter(|kind| kind.starts_with("PERMANENT"))
            .collect()
    }

    fn window(&self) -> Duration {
        match (self.first, self.last) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        }
    }
}

/// What happened to one id.
#[derive(Default, Clone, Copy)]
struct IdLog {
    /// Times `begin` started it (the handler ran).
    runs: u32,
    /// A `complete` returned `Ok`.
    completed: bool,
    /// A `complete` failed with an error other than a lost lease.
    complete_failed: bool,
    /// A `complete` failed with `LeaseLost`.
    lease_lost: bool,
}

/// Many concurrent deliveries of fresh ids (begin, run, complete; retried as a consumer
/// retries a message) while a master fails over, then every completed id delivered
/// again: it must answer `Completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dedup_store_through_a_master_failover() {
    let _one = FAILOVER.lock().await;
    let prefix = unique_prefix();
    let store = RedisDedupStore::connect_cluster(cluster_urls())
        .await
        .expect("connect to the Redis Cluster (scripts/services.sh redis-cluster)")
        .with_prefix(&prefix);
    let lease = Duration::from_secs(1);
    let ttl = Duration::from_secs(300);
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let ids: Arc<Mutex<HashMap<u64, IdLog>>> = Arc::default();
    let errors: Arc<Mutex<Errors>> = Arc::default();
    let slowest = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..16 {
        let (store, stop, next, ids, errors, slowest) = (
            store.clone(),
            Arc::clone(&stop),
            Arc::clone(&next),
            Arc::clone(&ids),
            Arc::clone(&errors),
            Arc::clone(&slowest),
        );
        workers.push(tokio::spawn(async move {
            let timed = |started: Instant| {
                let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                slowest.fetch_max(ms, Ordering::Relaxed);
            };
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let id = format!("id-{n}");
                // Delivered until done, as a consumer redelivers.
                loop {
                    let started = Instant::now();
                    let begun = store.begin(&id, lease).await;
                    timed(started);
                    match begun {
                        Ok(Begin::Started(token)) => {
                            ids.lock().unwrap().entry(n).or_default().runs += 1;
                            let started = Instant::now();
                            let completed = store.complete(&id, token, b"done", ttl).await;
                            timed(started);
                            let mut ids = ids.lock().unwrap();
                            let log = ids.entry(n).or_default();
                            match completed {
                                Ok(()) => {
                                    log.completed = true;
                                    break;
                                }
                                Err(error) => {
                                    if matches!(error, Error::LeaseLost) {
                                        log.lease_lost = true;
                                    } else {
                                        log.complete_failed = true;
                                    }
                                    errors.lock().unwrap().add(&error);
                                }
                            }
                        }
                        Ok(Begin::InProgress { retry_after }) => {
                            tokio::time::sleep(retry_after.min(Duration::from_millis(100))).await;
                        }
                        Ok(Begin::Completed(_)) => break,
                        Err(error) => {
                            errors.lock().unwrap().add(&error);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }
        }));
    }
    tokio::time::sleep(BEFORE).await;
    let killed_at = Instant::now();
    let printed = fail_over().await;
    let failover = killed_at.elapsed();
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("no worker panics");
    }

    // Every id whose completion was confirmed, delivered again, 16 at a time.
    let ids = ids.lock().unwrap().clone();
    let completed: Vec<u64> = ids
        .iter()
        .filter(|(_, log)| log.completed)
        .map(|(n, _)| *n)
        .collect();
    let mut checks = Vec::new();
    for chunk in completed.chunks(completed.len().div_ceil(16).max(1)) {
        let (store, chunk) = (store.clone(), chunk.to_vec());
        checks.push(tokio::spawn(async move {
            let mut lost = 0_u64;
            for n in chunk {
                match store.begin(&format!("id-{n}"), lease).await {
                    Ok(Begin::Completed(_)) => {}
                    Ok(_) => lost += 1,
                    Err(error) => panic!("the store fails after the failover: {error:?}"),
                }
            }
            lost
        }));
    }
    let mut completion_lost = 0;
    for check in checks {
        completion_lost += check.await.expect("no check panics");
    }
    let twice = ids.values().filter(|log| log.runs > 1).count();
    let twice_after_error = ids
        .values()
        .filter(|log| log.runs > 1 && (log.complete_failed || log.lease_lost))
        .count();
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    println!(
        "dedup store through a master failover ({printed}):\n  \
         {} ids, {} run once, {twice} run more than once ({twice_after_error} of them after \
         a failed or fenced complete), {completion_lost} confirmed completions lost;\n  \
         errors {:?} over {:?}; slowest operation {} ms; failover script {:?}",
        ids.len(),
        ids.values().filter(|log| log.runs == 1).count(),
        errors.by_kind,
        errors.window(),
        slowest.load(Ordering::Relaxed),
        failover,
    );
    assert!(
        errors.permanent().is_empty(),
        "only transient errors during a failover: {:?}",
        errors.by_kind
    );
    assert!(ids.len() > 100, "work went on: {} ids", ids.len());

    // Working again: fresh ids on every shard's node start and complete.
    for n in 0..200 {
        let id = format!("after-{n}");
        let Ok(Begin::Started(token)) = store.begin(&id, lease).await else {
            panic!("a fresh id after the failover does not start");
        };
        store
            .complete(&id, token, b"ok", ttl)
            .await
            .expect("complete after the failover");
    }
    clean_cluster(&prefix);
}

/// Nine topics, three of whose streams are on the master that fails over (the one
/// serving slot 0, slots 0-5460 in the cluster `scripts/services.sh` makes).
async fn topics_on_every_master(streams: &RedisStreams) -> Vec<String> {
    let mut connection = streams.connection().clone();
    let (mut killed, mut others) = (Vec::new(), Vec::new());
    for n in 0.. {
        let topic = format!("orders-{n}");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(streams.stream_key(&topic))
            .query_async(&mut connection)
            .await
            .expect("CLUSTER KEYSLOT");
        let side = if slot <= 5460 {
            &mut killed
        } else {
            &mut others
        };
        if side.len() < [3, 6][usize::from(slot > 5460)] {
            side.push(topic);
        }
        if killed.len() == 3 && others.len() == 6 {
            break;
        }
    }
    killed.extend(others);
    killed
}

/// Publishes with confirms (each `XADD` reply), retrying what failed as the relay does,
/// over several topics (streams on every master) while a master fails over; then reads
/// every stream and counts what was confirmed but is missing, and what is there twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_through_a_master_failover() {
    let _one = FAILOVER.lock().await;
    let prefix = unique_prefix();
    let streams = RedisStreams::connect_cluster(cluster_urls(), options(&prefix))
        .await
        .expect("connect to the Redis Cluster (scripts/services.sh redis-cluster)");
    let topics = topics_on_every_master(&streams).await;
    let stop = Arc::new(AtomicBool::new(false));
    let confirmed: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let errors: Arc<Mutex<Errors>> = Arc::default();
    let mut publishers = Vec::new();
    for topic in topics.clone() {
        let (publisher, stop, confirmed, errors) = (
            streams.publisher(),
            Arc::clone(&stop),
            Arc::clone(&confirmed),
            Arc::clone(&errors),
        );
        publishers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let message = Message::new(topic.as_str(), "order");
                loop {
                    match publisher.publish(&message).await {
                        Ok(()) => break,
                        Err(error) => {
                            errors.lock().unwrap().add(&error);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                confirmed
                    .lock()
                    .unwrap()
                    .push((topic.clone(), message.id.to_string()));
            }
        }));
    }
    tokio::time::sleep(BEFORE).await;
    let printed = fail_over().await;
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.await.expect("no publisher panics");
    }

    let mut present: HashMap<String, u32> = HashMap::new();
    let mut connection = streams.connection().clone();
    for topic in &topics {
        let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(streams.stream_key(topic))
            .arg("-")
            .arg("+")
            .query_async(&mut connection)
            .await
            .expect("read the stream after the failover");
        for (_, fields) in entries {
            if let Some([_, id]) = fields.chunks(2).find(|pair| pair[0] == b"ce_id") {
                *present
                    .entry(String::from_utf8_lossy(id).into_owned())
                    .or_default() += 1;
            }
        }
    }
    let confirmed = std::mem::take(&mut *confirmed.lock().unwrap());
    let lost = confirmed
        .iter()
        .filter(|(_, id)| !present.contains_key(id))
        .count();
    let twice = present.values().filter(|&&n| n > 1).count();
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    println!(
        "Redis Streams through a master failover ({printed}):\n  \
         {} messages confirmed, {lost} of them missing afterwards, {twice} stored more than \
         once; errors {:?} over {:?}",
        confirmed.len(),
        errors.by_kind,
        errors.window(),
    );
    assert!(
        errors.permanent().is_empty(),
        "only transient errors during a failover: {:?}",
        errors.by_kind
    );
    assert!(confirmed.len() > 100, "publishing went on");
    for topic in &topics {
        streams
            .publisher()
            .publish(&Message::new(topic.as_str(), "after"))
            .await
            .expect("publish after the failover");
    }
    clean_cluster(&prefix);
}
