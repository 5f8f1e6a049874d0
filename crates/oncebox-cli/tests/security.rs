//! The claims of docs/security.md that need the `oncebox` binary: passwords given to it
//! (in the configuration file, the environment or a file named by a `_FILE` variable)
//! show in none of its outputs (logs at every level, the one-line errors of failed
//! connections, `/metrics`, `/healthz`, `/readyz`, `config check`, its command line),
//! and identifiers from its configuration that would change a statement are refused
//! before any statement runs.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::write_config;

/// A password no output has any other reason to hold.
fn secret(what: &str) -> String {
    format!("{what}-{:016x}", fastrand::u64(..))
}

/// `oncebox` with every log line on (`RUST_LOG=trace`, the client libraries' too).
fn oncebox_tracing() -> Command {
    let mut command = support::oncebox();
    command.env("RUST_LOG", "trace");
    command
}

/// Fails the test, without printing it, if `text` (named `what`) holds `secret`.
fn assert_hidden(what: &str, text: &str, secret: &str) {
    if let Some(at) = text.find(secret) {
        // The context of the leak, with the secret itself masked.
        let from = text[..at]
            .char_indices()
            .rev()
            .nth(200)
            .map_or(0, |(i, _)| i);
        let context =
            text[from..(at + secret.len() + 200).min(text.len())].replace(secret, "<SECRET>");
        panic!("{what} shows a password: …{context}…");
    }
}

/// `oncebox relay` over a PostgreSQL outbox and NATS JetStream, with `store.password`
/// in the file and `broker.password` in a file named by `ONCEBOX_BROKER__PASSWORD_FILE`
/// (the local servers do not ask for them, so the relay runs), and with the feature
/// `otel` a token header for its OTLP exporter (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`,
/// sent to a collector of the test's): while it publishes 20 orders with every log level
/// on, none of them is in its logs, its command line, `/metrics`, `/healthz`, `/readyz`,
/// nor in `oncebox migrate` and `config check`.
#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_relay_shows_its_passwords_nowhere() {
    use std::time::Instant;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let schema = support::unique("secrets");
    let store_password = secret("store");
    let broker_password = secret("broker");
    let password_file = dir.path().join("broker-password");
    std::fs::write(&password_file, format!("{broker_password}\n")).expect("written");
    // nats://oncebox@host: the user name in the URL, its password apart.
    let nats = support::nats_url().replacen("nats://", "nats://oncebox@", 1);
    let otlp_token = secret("otlp");
    let otlp = cfg!(feature = "otel").then(collector);
    let otel = otlp.as_ref().map_or_else(String::new, |(port, _)| {
        format!("[otel]\nendpoint = \"http://127.0.0.1:{port}\"\n")
    });
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            r#"
[store]
url = "{pg}"
schema = "{schema}"
password = "{store_password}"
[broker]
url = "{nats}"
subject_prefix = "{schema}."
stream = "{stream}"
[relay]
stats_interval = "100ms"
{otel}"#,
            pg = support::pg_url(),
            stream = schema.to_uppercase(),
        ),
    );
    let run = |args: &[&str]| {
        let out = oncebox_tracing()
            .env("ONCEBOX_BROKER__PASSWORD_FILE", &password_file)
            .env(
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                format!("x-token={otlp_token}"),
            )
            .arg("--config")
            .arg(&config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("the oncebox binary runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "oncebox {args:?} failed");
        text
    };
    let mut outputs = vec![
        ("oncebox migrate", run(&["migrate"])),
        ("oncebox config check", run(&["config", "check"])),
    ];
    let script = support::psql_orders(dir.path(), &schema, 20, 4);
    let producer = support::spawn_psql(&script, &schema)
        .wait_with_output()
        .expect("psql runs");
    assert!(producer.status.success(), "the producer failed");

    let port = support::free_port();
    let (stdout, stderr) = (dir.path().join("relay.out"), dir.path().join("relay.err"));
    let mut relay = oncebox_tracing()
        .env("ONCEBOX_BROKER__PASSWORD_FILE", &password_file)
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            format!("x-token={otlp_token}"),
        )
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{port}"), "relay"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("a file"))
        .stderr(std::fs::File::create(&stderr).expect("a file"))
        .spawn()
        .expect("the relay starts");
    let published = |metrics: &str| {
        support::sample(
            metrics,
            "oncebox_spool_rows_total",
            "spool=\"outbox\",outcome=\"done\"",
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        if let Some((200, metrics)) = support::http_get(port, "/metrics")
            && published(&metrics) == Some(20.0)
        {
            break metrics;
        }
        if let Ok(Some(status)) = relay.try_wait() {
            panic!("the relay exited with {status}");
        }
        assert!(Instant::now() < deadline, "20 orders not published in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    outputs.push(("/metrics", metrics));
    for path in ["/healthz", "/readyz"] {
        let (status, body) = support::http_get(port, path).expect("it answers");
        assert_eq!(status, 200, "{path}");
        outputs.push((path, body));
    }
    let command_line = std::fs::read(format!("/proc/{}/cmdline", relay.id()))
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    outputs.push(("the relay's command line", command_line));
    support::signal(relay.id(), "TERM");
    let status = relay.wait().expect("the relay exits");
    assert!(status.success(), "the relay stopped with {status}");
    let log = std::fs::read_to_string(&stderr).expect("the log");
    assert!(
        log.lines().count() > 100,
        "trace logs were written ({} lines)",
        log.lines().count()
    );
    outputs.push(("the relay's stderr", log));
    outputs.push((
        "the relay's stdout",
        std::fs::read_to_string(&stdout).expect("stdout"),
    ));
    for (what, text) in &outputs {
        assert_hidden(what, text, &store_password);
        assert_hidden(what, text, &broker_password);
        assert_hidden(what, text, &otlp_token);
    }
    if let Some((_, exports)) = otlp {
        // The token was in use: the exporter sent it with the spans.
        let exports: Vec<String> = exports.try_iter().collect();
        assert!(
            exports.iter().any(|request| request.contains(&otlp_token)),
            "the collector got {} exports, none with the token",
            exports.len()
        );
    }
    support::psql(&format!("DROP SCHEMA {schema} CASCADE"));
    if let Ok(nats) = oncebox::nats::async_nats::connect(support::nats_url()).await {
        let _ = oncebox::nats::async_nats::jetstream::new(nats)
            .delete_stream(schema.to_uppercase())
            .await;
    }
}

/// An OTLP/HTTP collector on a free port: it answers every request with 200 and hands
/// each request (head and body, as text) to the receiver.
#[cfg(feature = "nats")]
fn collector() -> (u16, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read as _, Write as _};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut request = Vec::new();
            let mut buffer = [0; 8192];
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => request.extend_from_slice(&buffer[..read]),
                }
                let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break;
                }
            }
            // Kept before it is answered: the relay may exit as soon as the answer is in,
            // and the test then reads what was kept.
            let _ = sender.send(String::from_utf8_lossy(&request).into_owned());
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    (port, receiver)
}

/// `oncebox relay` with a password the server refuses, or a server that is not there:
/// it exits with one line naming the key and the cause, and with every log level on,
/// the password is in none of its output.
#[test]
fn failed_connections_show_no_password() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = dir.path().join("outbox.db");
    let existing = write_config(
        dir.path(),
        "migrate.toml",
        &format!("[store]\nurl = \"sqlite://{}\"\n", sqlite.display()),
    );
    support::run_ok(&existing, &["migrate"]);
    let store = format!("sqlite://{}", sqlite.display());
    let closed = support::free_port();
    let mut cases: Vec<(&str, String, String)> = vec![
        // (the case, its configuration, what the error line names)
        (
            "PostgreSQL on a closed port",
            format!(
                "[store]\nurl = \"postgres://app@127.0.0.1:{closed}/app\"\npassword = \"{{secret}}\"\n\
                 [broker]\nurl = \"redis://127.0.0.1:6379\"\n"
            ),
            "store.url".to_owned(),
        ),
        (
            "Redis refusing the user and password",
            format!(
                "[store]\nurl = \"{store}\"\n[broker]\nurl = \"redis://oncebox@{redis}\"\npassword = \"{{secret}}\"\n",
                redis = support::redis_url().trim_start_matches("redis://"),
            ),
            "broker.url".to_owned(),
        ),
    ];
    if cfg!(feature = "mysql") {
        cases.push((
            "MariaDB refusing the password",
            format!(
                "[store]\nurl = \"{mysql}\"\npassword = \"{{secret}}\"\n[broker]\nurl = \"redis://127.0.0.1:6379\"\n",
                mysql = support::mysql_url(),
            ),
            "store.url".to_owned(),
        ));
    }
    if cfg!(feature = "rabbitmq") {
        cases.push((
            "RabbitMQ refusing the password",
            format!(
                "[store]\nurl = \"{store}\"\n[broker]\nurl = \"amqp://guest@127.0.0.1:5672/%2f\"\npassword = \"{{secret}}\"\n"
            ),
            "broker.url".to_owned(),
        ));
    }
    if cfg!(feature = "nats") {
        cases.push((
            "NATS on a closed port",
            format!(
                "[store]\nurl = \"{store}\"\n[broker]\nurl = \"nats://oncebox@127.0.0.1:{closed}\"\npassword = \"{{secret}}\"\nconnect_timeout = \"1s\"\n"
            ),
            "broker.url".to_owned(),
        ));
    }
    for (case, toml, key) in cases {
        let password = secret("pw");
        let config = write_config(
            dir.path(),
            "oncebox.toml",
            &toml.replace("{secret}", &password),
        );
        let out = refused_relay(&config);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(2), "{case}: exit status");
        // With every log level on, a client's own background thread (lapin's I/O loop)
        // may still log after the error line: the line is the one from `oncebox:`.
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|line| line.starts_with("oncebox: "))
            .collect();
        assert!(
            matches!(errors.as_slice(), [line] if line.contains(&key) && line.contains("cannot connect")),
            "{case}: one error line, naming {key} and the cause: {errors:?}\n{stderr}"
        );
        assert_hidden(&format!("{case}: stdout"), &stdout, &password);
        assert_hidden(&format!("{case}: stderr"), &stderr, &password);
    }
}

/// `oncebox relay` on `config` with every log level on, no HTTP endpoint.
fn refused_relay(config: &Path) -> std::process::Output {
    oncebox_tracing()
        .arg("--config")
        .arg(config)
        .args(["--listen", "off", "relay"])
        .stdin(Stdio::null())
        .output()
        .expect("the oncebox binary runs")
}

/// Schema, table, slot and publication names from the configuration are formatted into
/// SQL (they cannot be bound), so each is checked first: names carrying a statement of
/// their own are refused, naming the problem, and the statement never runs (the canary
/// table each would drop is still there).
#[test]
fn the_cli_refuses_sql_in_identifiers() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = write_config(
        dir.path(),
        "oncebox.toml",
        &format!(
            "[store]\nurl = \"{pg}\"\n[broker]\nurl = \"redis://127.0.0.1:6379\"\n",
            pg = support::pg_url()
        ),
    );
    let canary = support::unique("canary");
    support::psql(&format!("CREATE TABLE public.{canary} (x int)"));
    let drop = format!("DROP TABLE public.{canary}");
    let cases = [
        (
            "migrate",
            vec![("STORE__SCHEMA", format!("oncebox\"; {drop}; --"))],
            "invalid schema name",
        ),
        (
            "migrate",
            vec![
                ("OUTBOX__LAYOUT", "debezium".to_owned()),
                ("OUTBOX__TABLE", format!("public.outbox; {drop}")),
            ],
            "invalid table name",
        ),
        (
            "relay",
            vec![
                ("RELAY__MODE", "cdc".to_owned()),
                ("CDC__SLOT", format!("s'); {drop}; --")),
            ],
            "invalid replication slot name",
        ),
        (
            "relay",
            vec![
                ("RELAY__MODE", "cdc".to_owned()),
                ("CDC__PUBLICATION", format!("p\"; {drop}; --")),
            ],
            "invalid publication name",
        ),
        (
            "outbox drop-slot",
            vec![("CDC__PUBLICATION", format!("p\"; {drop}; --"))],
            "invalid publication name",
        ),
    ];
    for (command, settings, needle) in cases {
        let out = support::oncebox()
            .envs(
                settings
                    .iter()
                    .map(|(key, value)| (format!("ONCEBOX_{key}"), value)),
            )
            .arg("--config")
            .arg(&config)
            .args(["--listen", "off"])
            .args(command.split(' '))
            .stdin(Stdio::null())
            .output()
            .expect("the oncebox binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command} with {settings:?}: ran");
        assert!(
            stderr.contains(needle),
            "{command} with {settings:?}: the error says {needle:?}: {stderr}"
        );
        let still_there = support::psql(&format!(
            "SELECT to_regclass('public.{canary}') IS NOT NULL"
        ));
        assert_eq!(
            still_there, "t",
            "{command} with {settings:?}: the canary was dropped"
        );
    }
    support::psql(&drop);
}
