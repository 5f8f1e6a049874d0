//! What the Redis Streams tests share: a transport harness on the machine's Redis
//! (`ONCEBOX_REDIS_URL`, default `redis://127.0.0.1:6379`) under a key prefix of its own,
//! or on a `redis-server` of its own that it can restart.

#![allow(
    dead_code,
    reason = "each test crate uses a different part of this module"
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oncebox_core::{Received, Result};
use oncebox_redis::redis;
use oncebox_redis::{
    RedisStreamOptions, RedisStreamPublisher, RedisStreamSubscriber, RedisStreams,
};
use oncebox_testkit::transport::{Capabilities, TransportHarness};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Short, so that the checks awaiting redeliveries run fast; long enough for a loaded
/// two-core machine to settle deliveries within it.
pub(crate) const ACK_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) fn redis_url() -> String {
    std::env::var("ONCEBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The seed nodes of the Redis Cluster (`ONCEBOX_REDIS_CLUSTER_URLS`, comma-separated;
/// default the six nodes `scripts/services.sh redis-cluster` starts on 7001-7006).
pub(crate) fn cluster_urls() -> Vec<String> {
    std::env::var("ONCEBOX_REDIS_CLUSTER_URLS")
        .unwrap_or_else(|_| {
            (7001..=7006)
                .map(|port| format!("redis://127.0.0.1:{port}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .split(',')
        .map(str::to_owned)
        .collect()
}

/// Deletes every key under `prefix` on the cluster, one `DEL` per key (the keys live in
/// many slots). Best effort and synchronous, for `Drop`.
pub(crate) fn clean_cluster(prefix: &str) {
    let Ok(client) = redis::cluster::ClusterClient::new(cluster_urls()) else {
        return;
    };
    let Ok(mut connection) = client.get_connection() else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut connection)
        .unwrap_or_default();
    for key in keys {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query(&mut connection);
    }
}

/// A key prefix no other test uses.
pub(crate) fn unique_prefix() -> String {
    format!("oncebox-test:{}:", uuid::Uuid::new_v4())
}

/// The options of the tests: the harness's ack timeout, reads that block for a second.
pub(crate) fn options(prefix: &str) -> RedisStreamOptions {
    RedisStreamOptions::new()
        .key_prefix(prefix)
        .ack_timeout(ACK_TIMEOUT)
        .block(Duration::from_secs(1))
}

/// The transport under a unique key prefix, on the machine's Redis or on a server of its
/// own. Dropping it deletes its keys (best effort) or stops its server.
pub(crate) struct StreamsHarness {
    pub(crate) streams: RedisStreams,
    pub(crate) prefix: String,
    topics: AtomicU64,
    server: Option<OwnServer>,
}

/// Where a harness's keys live, for its cleanup.
fn on_cluster(streams: &RedisStreams) -> bool {
    streams.connection().is_cluster()
}

impl StreamsHarness {
    /// On the machine's Redis.
    pub(crate) async fn new() -> Self {
        Self::with_options(|options| options).await
    }

    /// On the machine's Redis, with options changed by `change`.
    pub(crate) async fn with_options(
        change: impl FnOnce(RedisStreamOptions) -> RedisStreamOptions,
    ) -> Self {
        let prefix = unique_prefix();
        let streams = RedisStreams::connect(&redis_url(), change(options(&prefix)))
            .await
            .expect("connect to Redis (scripts/services.sh redis starts one)");
        Self {
            streams,
            prefix,
            topics: AtomicU64::new(0),
            server: None,
        }
    }

    /// On the Redis Cluster (`scripts/services.sh redis-cluster`).
    pub(crate) async fn on_cluster() -> Self {
        let prefix = unique_prefix();
        let streams = RedisStreams::connect_cluster(cluster_urls(), options(&prefix))
            .await
            .expect("connect to the Redis Cluster (scripts/services.sh redis-cluster starts one)");
        Self {
            streams,
            prefix,
            topics: AtomicU64::new(0),
            server: None,
        }
    }

    /// On a `redis-server` of its own, with an append-only file so that a restart keeps
    /// what was confirmed, or without persistence (a restart forgets everything).
    pub(crate) async fn with_own_server(persistent: bool) -> Self {
        let server = OwnServer::start(persistent).await;
        let prefix = unique_prefix();
        let streams = RedisStreams::connect(&server.url(), options(&prefix))
            .await
            .expect("connect to the test's own redis-server");
        Self {
            streams,
            prefix,
            topics: AtomicU64::new(0),
            server: Some(server),
        }
    }

    /// A topic of its own.
    pub(crate) fn topic(&self, label: &str) -> String {
        format!("{label}-{}", self.topics.fetch_add(1, Ordering::Relaxed))
    }

    /// A command on the harness's server.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> T {
        let mut connection = self.streams.connection().clone();
        command
            .query_async(&mut connection)
            .await
            .expect("a test command")
    }
}

impl Drop for StreamsHarness {
    fn drop(&mut self) {
        if self.server.is_some() {
            // The server and its directory go with it.
            return;
        }
        // Best effort, and synchronous: it runs when a test ends, failed ones included.
        if on_cluster(&self.streams) {
            clean_cluster(&self.prefix);
            return;
        }
        let Ok(client) = redis::Client::open(redis_url()) else {
            return;
        };
        let Ok(mut connection) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut connection)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query(&mut connection);
        }
    }
}

impl TransportHarness for StreamsHarness {
    type Publisher = RedisStreamPublisher;
    type Subscriber = RedisStreamSubscriber;

    fn capabilities(&self) -> Capabilities {
        // Every delay is honoured (longer ones are parked); a group created late reads
        // the stream from its start; the restart check needs a server of our own.
        Capabilities::all().restart(self.server.is_some())
    }

    fn ack_timeout(&self) -> Duration {
        self.streams.options().ack_timeout_duration()
    }

    async fn fresh_topic(&self, label: &str) -> Result<String> {
        Ok(self.topic(label))
    }

    async fn publisher(&self) -> Result<RedisStreamPublisher> {
        Ok(self.streams.publisher())
    }

    async fn subscriber(&self, topic: &str, group: &str) -> Result<RedisStreamSubscriber> {
        self.streams.subscribe(topic, group).await
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<(Received, String)>> {
        let letters = self.streams.dead_letters(topic, 10_000).await?;
        Ok(letters
            .into_iter()
            .filter_map(|letter| Some((letter.received().ok()?, letter.reason().to_owned())))
            .collect())
    }

    async fn restart(&self) -> Result<()> {
        match &self.server {
            Some(server) => {
                server.restart().await;
                Ok(())
            }
            None => Err(oncebox_core::Error::transport_permanent(
                "this harness uses the machine's shared Redis, which it must not restart",
            )),
        }
    }
}

/// A `redis-server` of the test's own on a free port, persisting to an append-only file
/// in a temporary directory (`--appendfsync always`: every confirmed write survives even
/// `kill -9`), or not persisting at all. Killed when dropped.
pub(crate) struct OwnServer {
    port: u16,
    dir: tempfile::TempDir,
    persistent: bool,
    child: tokio::sync::Mutex<Child>,
}

impl OwnServer {
    pub(crate) async fn start(persistent: bool) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        // A port the system just handed out and released; a clash with another process
        // in between shows as a server that does not start, and is tried again.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port();
            if let Some(child) = spawn(port, &dir, persistent).await {
                return Self {
                    port,
                    dir,
                    persistent,
                    child: tokio::sync::Mutex::new(child),
                };
            }
        }
        panic!("redis-server did not start on any of 5 ports");
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (`SIGKILL`, no shutdown save) and starts it again on the same
    /// port and directory; returns once it accepts connections.
    pub(crate) async fn restart(&self) {
        let mut child = self.child.lock().await;
        child.kill().await.expect("kill redis-server");
        *child = spawn(self.port, &self.dir, self.persistent)
            .await
            .expect("redis-server restarts on its port");
    }
}

fn redis_server() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"))
}

/// Starts `redis-server` and waits for its "Ready to accept connections" line; `None` if
/// it exits first (the port was taken).
async fn spawn(port: u16, dir: &tempfile::TempDir, persistent: bool) -> Option<Child> {
    let appendonly = if persistent { "yes" } else { "no" };
    let mut child = Command::new(redis_server())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", appendonly])
        .args(["--appendfsync", "always"])
        .arg("--dir")
        .arg(dir.path())
        .args(["--logfile", "", "--daemonize", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run redis-server (apt-get install redis-server)");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("Ready to accept connections") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    if !ready {
        let _ = child.kill().await;
        return None;
    }
    // Keep reading its log, so that a full pipe never blocks the server.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Some(child)
}
