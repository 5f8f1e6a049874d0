//! What the NATS tests share: the machine's NATS server (`ONCEBOX_NATS_URL`, default
//! `nats://127.0.0.1:4222`), private servers that can be restarted, and the transport
//! harness of the conformance suite.
//!
//! Every test works on streams, subjects and consumers of its own (a unique suffix in
//! each name), so tests run in parallel and can be rerun; streams are deleted at the end
//! of a test, and those a failed test left behind are swept an hour later by the next
//! run.

#![allow(
    dead_code,
    reason = "each test binary uses a part of the support module"
)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use oncebox_core::{Error, Received, Result};
use oncebox_nats::{
    JetStreamOptions, JetStreamPublisher, JetStreamSubscriber, JetStreamTransport, StreamSettings,
    SubscriberOptions,
};
use oncebox_testkit::transport::{Capabilities, TransportHarness};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The ack wait of the conformance harness.
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(1);

/// Prefix of every stream the tests create, followed by the creation time in seconds.
const STREAM_PREFIX: &str = "OBT_";

/// Streams left behind by failed runs are deleted after this.
const STALE_AFTER: Duration = Duration::from_secs(3600);

pub(crate) fn nats_url() -> String {
    std::env::var(oncebox_nats::URL_ENV).unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// A short name no other test (or run) uses.
pub(crate) fn unique() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A stream name for a test: `OBT_{seconds}_{label}_{unique}`.
pub(crate) fn stream_name(label: &str) -> String {
    format!("{STREAM_PREFIX}{}_{label}_{}", now_secs(), unique())
}

/// Connects to `url` with the tests' subscriber options.
pub(crate) async fn connect(url: &str, request_timeout: Duration) -> JetStreamTransport {
    let options = JetStreamOptions::new(url)
        .name("oncebox-nats tests")
        .request_timeout(request_timeout)
        .subscriber(
            SubscriberOptions::new()
                .ack_wait(ACK_WAIT)
                .prefetch(8)
                .max_deliver(50),
        );
    JetStreamTransport::connect(options)
        .await
        .expect("connect to NATS (set ONCEBOX_NATS_URL, or start nats-server -js)")
}

/// Deletes the test streams older than [`STALE_AFTER`] (best effort).
async fn sweep_stale(transport: &JetStreamTransport) {
    let context = transport.jetstream();
    let mut names = context.stream_names();
    let mut stale = Vec::new();
    while let Some(Ok(name)) = names.next().await {
        let created = name
            .strip_prefix(STREAM_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs + STALE_AFTER.as_secs() < now_secs()) {
            stale.push(name);
        }
    }
    for name in stale {
        let _ = context.delete_stream(&name).await;
    }
}

/// The conformance harness: topics with a stream and a dead-letter stream each.
pub(crate) struct NatsHarness {
    pub(crate) transport: JetStreamTransport,
    streams: Mutex<Vec<String>>,
    server: Option<LocalServer>,
}

impl NatsHarness {
    /// On the machine's NATS server.
    pub(crate) async fn shared() -> Self {
        let transport = connect(&nats_url(), Duration::from_secs(5)).await;
        sweep_stale(&transport).await;
        Self {
            transport,
            streams: Mutex::new(Vec::new()),
            server: None,
        }
    }

    /// On a server of its own, which [`TransportHarness::restart`] restarts.
    pub(crate) async fn private() -> Self {
        let server = LocalServer::start()
            .await
            .expect("start a private nats-server");
        let transport = connect(&server.url(), Duration::from_secs(2)).await;
        Self {
            transport,
            streams: Mutex::new(Vec::new()),
            server: Some(server),
        }
    }

    /// A stream for `topics` and one for their dead letters, deleted by
    /// [`NatsHarness::cleanup`]; returns their names.
    pub(crate) async fn streams_for(
        &self,
        label: &str,
        topics: &[&str],
    ) -> Result<(String, String)> {
        let name = stream_name(label);
        let dead = format!("{name}_DLQ");
        let settings = |name: &str| {
            StreamSettings::new(name)
                .topics(topics.iter().copied())
                .max_age(STALE_AFTER)
        };
        self.transport.ensure_stream(&settings(&name)).await?;
        self.remember(name.clone());
        self.transport
            .ensure_dead_letter_stream(&settings(&dead))
            .await?;
        self.remember(dead.clone());
        Ok((name, dead))
    }

    fn remember(&self, stream: String) {
        if let Ok(mut streams) = self.streams.lock() {
            streams.push(stream);
        }
    }

    /// Deletes the streams this harness created (best effort).
    pub(crate) async fn cleanup(&self) {
        let streams = self
            .streams
            .lock()
            .map(|mut streams| std::mem::take(&mut *streams))
            .unwrap_or_default();
        for stream in streams {
            let _ = self.transport.jetstream().delete_stream(&stream).await;
        }
        if let Some(server) = &self.server {
            server.stop().await;
        }
    }
}

impl TransportHarness for NatsHarness {
    type Publisher = JetStreamPublisher;
    type Subscriber = JetStreamSubscriber;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .per_key_order(true)
            .consumer_groups(true)
            .dead_letter_inspection(true)
            .delivery_count(true)
            .nack_delay(true)
            .retained_log(true)
            .restart(self.server.is_some())
    }

    fn ack_timeout(&self) -> Duration {
        ACK_WAIT
    }

    async fn fresh_topic(&self, label: &str) -> Result<String> {
        let topic = format!("obt-{label}-{}", unique());
        self.streams_for(&label.replace('-', "_"), &[&topic])
            .await?;
        Ok(topic)
    }

    async fn publisher(&self) -> Result<JetStreamPublisher> {
        Ok(self.transport.publisher())
    }

    async fn subscriber(&self, topic: &str, group: &str) -> Result<JetStreamSubscriber> {
        self.transport.subscriber(topic, group).await
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<(Received, String)>> {
        let letters = self.transport.dead_letters(topic, 1000).await?;
        Ok(letters
            .into_iter()
            .map(|letter| (letter.received, letter.reason))
            .collect())
    }

    async fn restart(&self) -> Result<()> {
        match &self.server {
            Some(server) => server.restart().await,
            None => Err(Error::transport_permanent(
                "the shared server is not restarted",
            )),
        }
    }
}

/// A nats-server of the test's own, with JetStream storing in a temporary directory, on a
/// free port; killed when dropped.
pub(crate) struct LocalServer {
    port: u16,
    store: tempfile::TempDir,
    /// Added to the command line (a cluster node's name and routes).
    args: Vec<String>,
    child: tokio::sync::Mutex<Option<Child>>,
}

/// A port free on 127.0.0.1 now.
pub(crate) fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(Error::transport_permanent)
}

impl LocalServer {
    /// Starts one and returns once it is ready for clients.
    pub(crate) async fn start() -> Result<Self> {
        Self::start_with(free_port()?, Vec::new()).await
    }

    /// Starts one for clients on `port`, with `args` added to its command line, and
    /// returns once it is ready for clients.
    pub(crate) async fn start_with(port: u16, args: Vec<String>) -> Result<Self> {
        let store = tempfile::tempdir().map_err(Error::transport_permanent)?;
        let child = spawn(port, store.path().to_path_buf(), &args).await?;
        Ok(Self {
            port,
            store,
            args,
            child: tokio::sync::Mutex::new(Some(child)),
        })
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Where the server keeps stream `name` of the default account.
    pub(crate) fn stream_dir(&self, name: &str) -> PathBuf {
        self.store.path().join("jetstream/$G/streams").join(name)
    }

    /// Stops the server and waits for it to exit.
    pub(crate) async fn stop(&self) {
        if let Some(mut running) = self.child.lock().await.take() {
            let _ = running.kill().await;
        }
    }

    /// Kills the server (SIGKILL: nothing is flushed or said goodbye) and starts it again
    /// on the same port and store; returns once it is ready for clients.
    pub(crate) async fn restart(&self) -> Result<()> {
        self.kill().await?;
        self.start_again().await
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub(crate) async fn kill(&self) -> Result<()> {
        if let Some(mut running) = self.child.lock().await.take() {
            running.kill().await.map_err(Error::transport_permanent)?;
        }
        Ok(())
    }

    /// Starts the server again on the same port and store (after [`LocalServer::kill`]);
    /// returns once it is ready for clients.
    pub(crate) async fn start_again(&self) -> Result<()> {
        let mut child = self.child.lock().await;
        if child.is_none() {
            *child = Some(spawn(self.port, self.store.path().to_path_buf(), &self.args).await?);
        }
        Ok(())
    }
}

fn binary() -> PathBuf {
    let packaged = PathBuf::from("/usr/sbin/nats-server");
    if packaged.exists() {
        packaged
    } else {
        PathBuf::from("nats-server")
    }
}

/// Starts nats-server and waits for its "Server is ready" log line.
async fn spawn(port: u16, store: PathBuf, args: &[String]) -> Result<Child> {
    let mut child = Command::new(binary())
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(&store)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| {
            Error::transport_permanent(format!("start {}: {error}", binary().display()))
        })?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| Error::transport_permanent("nats-server's stderr is not piped"))?;
    let mut lines = BufReader::new(stderr).lines();
    // The server's last lines, for the error if it never gets ready.
    let mut said = VecDeque::new();
    let ready = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("Server is ready") {
                return true;
            }
            if said.len() == 5 {
                said.pop_front();
            }
            said.push_back(line);
        }
        false
    })
    .await;
    match ready {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::transport_permanent(format!(
                "nats-server on port {port} exited before it was ready; its last lines: {said:?}"
            )));
        }
        Err(_) => {
            return Err(Error::transport_permanent(format!(
                "nats-server on port {port} did not report ready within 20 s; its last \
                 lines: {said:?}"
            )));
        }
    }
    // Keep reading, so that the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}
