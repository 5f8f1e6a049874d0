//! A PostgreSQL primary with a streaming standby of its own, for failover tests: two
//! local server processes made by the project's `scripts/pg-pair.sh` (with `initdb` and
//! `pg_basebackup`), on free ports, in a directory of their own, removed on drop. The
//! standby streams through a [`Proxy`] of the pair's, which a test slows to make it lag
//! (a standby in another zone) or cuts.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use oncebox_testkit::pg_pair::{PgPair, Replication};
//! use oncebox_testkit::proxy::Proxy;
//!
//! let pair = PgPair::start(Replication::Synchronous).await?;
//! // Clients reach the primary through an address that can move, as a service's does.
//! let address = Proxy::start(pair.primary_address()).await?;
//! // ... clients connect to address.port() and work ...
//! pair.fail_over().await?; // the primary killed, the standby promoted
//! address.retarget(pair.standby_address());
//! # Ok(()) }
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::proxy::Proxy;

/// How the primary's commits reach the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit returns once the standby flushed it: the promoted standby has every
    /// commit a client saw succeed.
    Synchronous,
    /// A commit returns at once; the standby follows as fast as it can, and a failover
    /// loses what it had not received.
    Asynchronous,
}

impl Replication {
    fn argument(self) -> &'static str {
        match self {
            Self::Synchronous => "sync",
            Self::Asynchronous => "async",
        }
    }
}

/// A primary and its standby, both running until [`fail_over`](Self::fail_over) kills
/// the primary; both stopped and their data removed on drop.
pub struct PgPair {
    dir: PathBuf,
    primary: u16,
    standby: u16,
    link: Proxy,
}

/// The script that makes and fails over a pair.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg-pair.sh")
}

impl PgPair {
    /// A new pair replicating as `replication` says, streaming once this returns.
    ///
    /// # Errors
    ///
    /// When the script fails (no PostgreSQL server binaries, a port taken meanwhile);
    /// the error holds what it printed.
    pub async fn start(replication: Replication) -> io::Result<Self> {
        // The ports are free when picked, not reserved: another process may take one
        // before the servers bind it. Such a pair fails to start; a new one is tried.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match Self::try_start(replication).await {
                Err(error) if attempts < 3 => {
                    tracing::warn!(%error, "a PostgreSQL pair did not start; trying other ports");
                }
                started => return started,
            }
        }
    }

    async fn try_start(replication: Replication) -> io::Result<Self> {
        let primary = free_port()?;
        let standby = loop {
            let port = free_port()?;
            if port != primary {
                break port;
            }
        };
        let link = Proxy::start(format!("127.0.0.1:{primary}")).await?;
        let dir = std::env::temp_dir().join(format!(
            "oncebox-pg-pair-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let upstream = link.port().to_string();
        // Made before the servers, so that dropping it (an error below) removes them.
        let pair = Self {
            dir,
            primary,
            standby,
            link,
        };
        let (dir, mode) = (pair.dir.clone(), replication.argument());
        run(&[
            "create",
            path_str(&dir)?,
            &primary.to_string(),
            &standby.to_string(),
            mode,
            &upstream,
        ])
        .await?;
        Ok(pair)
    }

    /// `host:port` of the primary.
    pub fn primary_address(&self) -> String {
        format!("127.0.0.1:{}", self.primary)
    }

    /// `host:port` of the standby (the primary after [`fail_over`](Self::fail_over)).
    pub fn standby_address(&self) -> String {
        format!("127.0.0.1:{}", self.standby)
    }

    /// The standby's replication connection to the primary: slowed, the standby lags
    /// behind (with synchronous replication, every commit waits for it); cut, it stops
    /// receiving until restored.
    pub fn replication_link(&self) -> &Proxy {
        &self.link
    }

    /// The URL of database `postgres` on the primary.
    pub fn primary_url(&self) -> String {
        url(self.primary)
    }

    /// The URL of database `postgres` on the standby.
    pub fn standby_url(&self) -> String {
        url(self.standby)
    }

    /// The shell command that fails this pair over, for a process that takes one
    /// (`oncebox-bench chaos --failover`).
    pub fn failover_command(&self) -> String {
        format!("'{}' failover '{}'", script().display(), self.dir.display())
    }

    /// Kills the primary (`pg_ctl stop -m immediate`: no shutdown checkpoint, clients
    /// cut mid-transaction) and promotes the standby; returns once it takes writes.
    ///
    /// # Errors
    ///
    /// When the script fails; the error holds what it printed.
    pub async fn fail_over(&self) -> io::Result<()> {
        run(&["failover", path_str(&self.dir)?]).await
    }
}

impl Drop for PgPair {
    fn drop(&mut self) {
        if let Ok(dir) = path_str(&self.dir) {
            let _ = Command::new(script()).args(["destroy", dir]).output();
        }
    }
}

fn url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str()
        .ok_or_else(|| io::Error::other("the temporary directory is not UTF-8"))
}

/// A port of 127.0.0.1 free when asked (a server started soon after takes it).
fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn run(args: &[&str]) -> io::Result<()> {
    let mut command = tokio::process::Command::new(script());
    command.args(args);
    let output = command.output().await?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "scripts/pg-pair.sh {}: {}{}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}
