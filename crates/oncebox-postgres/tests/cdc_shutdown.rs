//! A reading log-tailing relay does not hold a PostgreSQL fast shutdown: the server ends
//! the relay's connections, walsender included, and stops within moments.
//! (A reader that is *paused*, SIGSTOPped, does hold it: its walsender waits to send it
//! what is left, up to `wal_sender_timeout`; no client can help that.)
//!
//! The test runs a PostgreSQL server of its own (initdb in a temporary directory, its own
//! port), so that stopping it strikes no other test.

#![cfg(feature = "cdc")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cdc::{Recorder, Slot, keyed};
use oncebox_core::Message;
use oncebox_postgres::PgStore;
use oncebox_postgres::cdc::{CdcConnection, CdcMode, CdcRelay};

/// PostgreSQL's programs: `pg_config --bindir`, else Debian's place for the version
/// on the machine.
fn bindir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if Path::new(&dir).join("initdb").exists() {
            return PathBuf::from(dir);
        }
    }
    let versions = std::fs::read_dir("/usr/lib/postgresql").expect("PostgreSQL is installed");
    let newest = versions
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .max()
        .expect("a PostgreSQL version");
    newest.join("bin")
}

/// A server of the test's own, stopped and removed on drop.
struct Server {
    dir: PathBuf,
    port: u16,
}

impl Server {
    /// PostgreSQL refuses to run as root: as root, the server's programs run as the
    /// `postgres` user.
    fn command(program: &str) -> Command {
        let path = bindir().join(program);
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        if root {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("oncebox-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("the directory is made");
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status();
        let server = Self { dir, port };
        let status = Self::command("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(server.data())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb failed");
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c wal_level=logical -c fsync=off -c max_wal_senders=4 -c max_replication_slots=4",
            server.dir.display()
        );
        let status = Self::command("pg_ctl")
            .args(["-w", "-l"])
            .arg(server.dir.join("log"))
            .args(["-o", &options, "-D"])
            .arg(server.data())
            .arg("start")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "the server starts");
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl stop -m fast`, waiting at most `wait`; whether the server stopped.
    fn stop_fast(&self, wait: Duration) -> bool {
        Self::command("pg_ctl")
            .args(["-m", "fast", "-w", "-t", &wait.as_secs().to_string(), "-D"])
            .arg(self.data())
            .arg("stop")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Self::command("pg_ctl")
            .args(["-m", "immediate", "-w", "-D"])
            .arg(self.data())
            .arg("stop")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_shutdown_is_not_held_by_a_reading_relay() {
    let server = Server::start();
    let store = PgStore::connect(&server.url())
        .await
        .expect("the store connects");
    store.migrate().await.expect("the schema is migrated");
    let slot = Slot::new();
    let recorder = Recorder::default();
    let relay = CdcRelay::new(
        &store,
        CdcConnection::from_url(&server.url()).expect("a valid URL"),
        recorder.clone(),
        slot.options(CdcMode::Messages),
    )
    .expect("valid options");
    relay.prepare().await.expect("the slot is ready");
    let task = tokio::spawn(async move { relay.run_until(std::future::pending()).await });

    let outbox = store.message_outbox();
    let mut tx = store.pool().begin().await.expect("a transaction begins");
    let message: Message = keyed("a", 0);
    outbox.enqueue(&mut tx, &message).await.expect("enqueued");
    tx.commit().await.expect("committed");
    recorder.wait_for(1).await;
    store.pool().close().await;

    let asked = Instant::now();
    let stopped = tokio::task::spawn_blocking(move || {
        let stopped = server.stop_fast(Duration::from_secs(20));
        (stopped, server)
    })
    .await
    .expect("pg_ctl returns");
    let took = asked.elapsed();
    task.abort();
    drop(stopped.1);
    assert!(
        stopped.0,
        "a fast shutdown did not finish within 20 s while the relay read the slot"
    );
    println!("the server stopped in {took:?} while the relay read its slot");
}
