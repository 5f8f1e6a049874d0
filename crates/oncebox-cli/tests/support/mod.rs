//! Running the real `oncebox` binary as a service: configuration files, child
//! processes, signals, scrapes of its HTTP endpoint, and readers of what it wrote.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The PostgreSQL server of the tests.
pub fn pg_url() -> String {
    std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The NATS server of the tests.
pub fn nats_url() -> String {
    std::env::var("ONCEBOX_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// The Redis server of the tests.
pub fn redis_url() -> String {
    std::env::var("ONCEBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A connection to the Redis server of the tests.
pub async fn redis() -> oncebox::redis::redis::aio::MultiplexedConnection {
    oncebox::redis::redis::Client::open(redis_url())
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis answers")
}

/// The Kafka brokers of the tests (tansu, `scripts/services.sh kafka`).
pub fn kafka_brokers() -> String {
    std::env::var("ONCEBOX_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// The MySQL / MariaDB server of the tests.
pub fn mysql_url() -> String {
    std::env::var("ONCEBOX_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A name no other test (or run) uses: lower case letters, digits and `_`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}_{:08x}", std::process::id(), fastrand::u32(..))
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("an address").port()
}

/// The `oncebox` binary, with the logs the services write.
pub fn oncebox() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oncebox"));
    // Only the test's own configuration: no ONCEBOX_SECTION__KEY of the caller's.
    for (name, _) in std::env::vars() {
        if name.starts_with("ONCEBOX_") && name.contains("__") {
            command.env_remove(name);
        }
    }
    command.env("RUST_LOG", "info,oncebox=info");
    // SQS credentials come from the AWS chain; the local SQS server takes any.
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        command
            .env("AWS_ACCESS_KEY_ID", "oncebox-tests")
            .env("AWS_SECRET_ACCESS_KEY", "oncebox-tests");
    }
    command
}

/// Runs `oncebox ARGS` with `config` and waits for it.
pub fn run(config: &Path, args: &[&str]) -> Output {
    oncebox()
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the oncebox binary runs")
}

/// Runs `oncebox ARGS` with `config`, and fails the test unless it succeeded.
pub fn run_ok(config: &Path, args: &[&str]) -> String {
    let out = run(config, args);
    assert!(
        out.status.success(),
        "oncebox {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `toml` to `dir/name` and returns its path.
pub fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml).expect("the config file is written");
    path
}

/// A running `oncebox relay` or `oncebox receive`, killed when dropped.
pub struct Service {
    child: Child,
    /// Its `/metrics`, `/healthz` and `/readyz` port.
    pub port: u16,
    log: PathBuf,
    name: String,
}

impl Service {
    /// Starts `oncebox --config CONFIG --listen 127.0.0.1:PORT ARGS`, its stderr to
    /// `dir/NAME.log`.
    pub fn start(dir: &Path, name: &str, config: &Path, args: &[&str]) -> Self {
        Self::start_on(free_port(), dir, name, config, args)
    }

    /// [`Service::start`] on a given port (a service started again where a scraper
    /// looks for it).
    pub fn start_on(port: u16, dir: &Path, name: &str, config: &Path, args: &[&str]) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("the log file");
        let child = oncebox()
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("the oncebox binary starts");
        Self {
            child,
            port,
            log,
            name: name.to_owned(),
        }
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((200, _)) = http_get(self.port, "/readyz") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited with {status} before it was ready:\n{}",
                    self.name,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready after {timeout:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The current `/metrics` text, if it answers.
    pub fn metrics(&self) -> Option<String> {
        http_get(self.port, "/metrics").map(|(_, body)| body)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        signal(self.child.id(), "TERM");
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits at most `timeout` for the process to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then checks the process exits with status 0 within `timeout`.
    pub fn stop_cleanly(&mut self, timeout: Duration) {
        let started = Instant::now();
        self.terminate();
        let status = self.wait(timeout);
        assert!(
            matches!(status, Some(status) if status.success()),
            "{} did not exit 0 within {timeout:?} of SIGTERM ({status:?} after {:?}):\n{}",
            self.name,
            started.elapsed(),
            self.log()
        );
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `SIG{name}` to process `pid`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// `GET path` on 127.0.0.1:`port`: the status and the body, or `None` if it does not
/// answer.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The value of the sample `name{labels}` in Prometheus text (labels as written,
/// such as `spool="outbox",outcome="done"`; empty for none).
pub fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let rest = if labels.is_empty() {
            rest.strip_prefix(' ')?
        } else {
            let inner = rest.strip_prefix('{')?;
            let (found, value) = inner.split_once("} ")?;
            let mut found: Vec<&str> = found.split(',').collect();
            let mut wanted: Vec<&str> = labels.split(',').collect();
            found.sort_unstable();
            wanted.sort_unstable();
            if found != wanted {
                return None;
            }
            value
        };
        rest.trim().parse().ok()
    })
}

/// Polls `probe` every 50 ms until it returns `Some`, for at most `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One published order as a reader sees it: its message id and the order id, which
/// names the customer (the key) and the customer's order number: `c7-15`.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: String,
    pub order_id: String,
}

/// Checks what a reader found against `expected` orders of `customers` customers, each
/// customer's orders numbered from 1: every order present, each customer's orders in
/// order (by their first copy); returns how many copies were duplicates.
pub fn audit(seen: &[Seen], expected: usize, customers: usize) -> usize {
    let mut first: HashMap<&str, &str> = HashMap::new();
    let mut duplicates = 0;
    let mut next: HashMap<String, u64> = HashMap::new();
    for message in seen {
        if first.insert(&message.id, &message.order_id).is_some() {
            duplicates += 1;
            continue;
        }
        let (customer, number) = message
            .order_id
            .rsplit_once('-')
            .unwrap_or_else(|| panic!("an order id such as c7-15, not {:?}", message.order_id));
        let number: u64 = number.parse().expect("an order number");
        let expected_next = next.entry(customer.to_owned()).or_insert(1);
        assert_eq!(
            number, *expected_next,
            "customer {customer}: order {number} arrived where {expected_next} was due (per-key order broken)"
        );
        *expected_next += 1;
    }
    assert_eq!(
        first.len(),
        expected,
        "{} distinct messages of {expected}",
        first.len()
    );
    assert_eq!(
        next.len(),
        customers,
        "orders of {} customers of {customers}",
        next.len()
    );
    duplicates
}

/// The order id in an order event's JSON payload.
pub fn order_id(payload: &[u8]) -> String {
    let event: serde_json::Value = serde_json::from_slice(payload).expect("a JSON order event");
    event["order_id"].as_str().expect("an order_id").to_owned()
}

/// A psql script placing `count` orders of `customers` customers through the example
/// `examples/sql-producer/place_order.sql`, one transaction each, in `schema`.
pub fn psql_orders(dir: &Path, schema: &str, count: usize, customers: usize) -> PathBuf {
    let example = example("place_order.sql");
    let mut script = format!(
        "\\set ON_ERROR_STOP on\n\\set QUIET on\nSET search_path = {schema};\n\
         CREATE TABLE IF NOT EXISTS shop_orders (id text PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL);\n"
    );
    let mut placed = vec![0usize; customers];
    for i in 0..count {
        let customer = i % customers;
        placed[customer] += 1;
        script.push_str(&format!(
            "\\set order_id c{customer}-{n}\n\\set customer c{customer}\n\\set amount {amount}\n\\i {example}\n",
            n = placed[customer],
            amount = 100 + i,
            example = example.display()
        ));
    }
    let path = dir.join("orders.psql");
    std::fs::write(&path, script).expect("the psql script is written");
    path
}

/// Starts psql on `script` with `-v schema=SCHEMA`.
pub fn spawn_psql(script: &Path, schema: &str) -> Child {
    Command::new("psql")
        .arg(pg_url())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-v"])
        .arg(format!("schema={schema}"))
        .arg("-f")
        .arg(script)
        .stdout(Stdio::null())
        .spawn()
        .expect("psql starts")
}

/// Runs `sql` with psql and returns what it printed (unaligned, tuples only).
pub fn psql(sql: &str) -> String {
    let out = Command::new("psql")
        .arg(pg_url())
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql failed on {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A file of `examples/sql-producer`.
pub fn example(name: &str) -> PathBuf {
    example_of("sql-producer", name)
}

/// A file of `examples/DIR`.
pub fn example_of(dir: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(dir)
        .join(name)
        .canonicalize()
        .expect("the example exists")
}

/// `url` with its host and port replaced by 127.0.0.1:`port`.
pub fn through(url: &str, port: u16) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_host(Some("127.0.0.1")).expect("a host");
    url.set_port(Some(port)).expect("a port");
    url.to_string()
}

/// `host:port` of `url`.
pub fn address(url: &str, default_port: u16) -> String {
    let url = url::Url::parse(url).expect("a URL");
    format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(default_port)
    )
}

/// A span as a stand-in OTLP collector received it: ids in hex, the kind in lower case.
#[cfg(feature = "otel")]
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    pub service: String,
    pub name: String,
    pub kind: String,
    pub trace_id: String,
    pub parent_span_id: String,
    /// `(trace id, span id)` of each link.
    pub links: Vec<(String, String)>,
    /// String and integer attributes, as text.
    pub attributes: HashMap<String, String>,
}

/// A stand-in OTLP/HTTP collector: decodes every `POST /v1/traces` (protobuf) into
/// [`ExportedSpan`]s.
#[cfg(feature = "otel")]
pub struct Collector {
    port: u16,
    spans: std::sync::Arc<std::sync::Mutex<Vec<ExportedSpan>>>,
}

#[cfg(feature = "otel")]
impl Collector {
    pub async fn start() -> Self {
        use axum::body::Bytes;
        use axum::extract::State;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;

        type Spans = std::sync::Arc<std::sync::Mutex<Vec<ExportedSpan>>>;
        async fn export(State(spans): State<Spans>, body: Bytes) -> axum::http::StatusCode {
            let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                return axum::http::StatusCode::BAD_REQUEST;
            };
            let mut spans = spans.lock().expect("the spans");
            for resource in request.resource_spans {
                let service = resource
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| any_value(kv.value.as_ref()))
                    .unwrap_or_default();
                for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                    spans.push(ExportedSpan {
                        service: service.clone(),
                        kind: match span.kind {
                            1 => "internal",
                            2 => "server",
                            3 => "client",
                            4 => "producer",
                            5 => "consumer",
                            _ => "unspecified",
                        }
                        .to_owned(),
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        parent_span_id: hex(&span.parent_span_id),
                        links: span
                            .links
                            .iter()
                            .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                            .collect(),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), any_value(kv.value.as_ref())))
                            .collect(),
                    });
                }
            }
            axum::http::StatusCode::OK
        }

        let spans = Spans::default();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(export))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the collector listens");
        let port = listener.local_addr().expect("an address").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { port, spans }
    }

    /// The endpoint to configure (`otel.endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ExportedSpan> {
        self.spans.lock().expect("the spans").clone()
    }
}

#[cfg(feature = "otel")]
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(feature = "otel")]
fn any_value(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(x)) => x.to_string(),
        _ => String::new(),
    }
}

/// Drops a test's log-tailing leftovers when it ends, also when it fails: the slot named
/// after the test's schema (ending whatever still reads it: a slot left behind keeps WAL
/// for good), the publication of that name, the schema, and the Redis keys given.
pub struct LogTailingCleanup {
    /// The slot's, publication's and schema's name.
    pub name: String,
    /// Redis keys deleted too.
    pub redis_keys: Vec<String>,
}

impl LogTailingCleanup {
    /// The slot, publication and schema named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            redis_keys: Vec::new(),
        }
    }

    /// Also the Redis key `key`.
    pub fn with_redis_key(mut self, key: String) -> Self {
        self.redis_keys.push(key);
        self
    }
}

impl Drop for LogTailingCleanup {
    fn drop(&mut self) {
        let name = &self.name;
        let _ = Command::new("psql")
            .arg(pg_url())
            .args(["-X", "-q", "-c"])
            .arg(format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = '{name}' AND active; SELECT pg_sleep(0.5); \
                 SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = '{name}'; DROP PUBLICATION IF EXISTS \"{name}\"; \
                 DROP SCHEMA IF EXISTS {name} CASCADE"
            ))
            .output();
        if !self.redis_keys.is_empty() {
            let _ = Command::new("redis-cli")
                .args(["-u", &redis_url(), "DEL"])
                .args(&self.redis_keys)
                .output();
        }
    }
}

/// The local SQS-compatible server of the tests (`scripts/services.sh sqs`).
pub fn sqs_endpoint() -> String {
    std::env::var("ONCEBOX_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned())
}

/// A FIFO queue of a test's own on the local SQS server, the topic `orders` mapped to it,
/// with its dead-letter queue; deleted with [`SqsQueue::delete`].
#[cfg(feature = "sqs")]
pub struct SqsQueue {
    /// A client whose topic `orders` is the queue.
    pub sqs: oncebox::sqs::SqsTransport,
    /// The queue's name (`….fifo`).
    pub name: String,
    /// The queue's URL.
    pub url: String,
}

#[cfg(feature = "sqs")]
impl SqsQueue {
    /// Creates the queue `<prefix>_<unique>.fifo` and its dead-letter queue.
    pub async fn create(prefix: &str) -> Self {
        use oncebox::sqs::{QueueSettings, SqsOptions, SqsTransport};
        let name = format!("{}.fifo", unique(prefix).replace('_', "-"));
        let sqs = SqsTransport::connect(
            SqsOptions::new()
                .endpoint(sqs_endpoint())
                .region("us-east-1")
                .static_credentials("oncebox-tests", "oncebox-tests")
                .queue("orders", name.clone()),
        )
        .await
        .expect("an SQS client");
        let url = sqs
            .ensure_queue("orders", &QueueSettings::new())
            .await
            .expect("the queues are created");
        Self { sqs, name, url }
    }

    /// Deletes the queue and its dead-letter queue.
    pub async fn delete(&self) {
        let client = self.sqs.client();
        for name in [self.name.clone(), self.name.replace(".fifo", "-dlq.fifo")] {
            if let Ok(found) = client.get_queue_url().queue_name(&name).send().await
                && let Some(url) = found.queue_url()
            {
                let _ = client.delete_queue().queue_url(url).send().await;
            }
        }
    }
}
