//! The chromedriver process behind a [`Browser`](super::Browser).

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{Error, Result};

/// A chromedriver listening on a free port of 127.0.0.1. Dropping it kills it and the
/// Chromium it started.
#[derive(Debug)]
pub(super) struct Chromedriver {
    child: Child,
    port: u16,
}

impl Chromedriver {
    /// Starts `program` and waits up to `patience` for it to listen.
    pub(super) async fn start(program: &Path, patience: Duration) -> Result<Self> {
        let port = free_port().map_err(Error::Start)?;
        let mut command = Command::new(program);
        command
            .arg(format!("--port={port}"))
            .arg("--silent")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A process group of its own, which the Chromium processes it starts join: one
        // signal ends them all, whatever state the session is in.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => Error::NotInstalled {
                program: program.to_owned(),
            },
            _ => Error::Start(error),
        })?;
        let mut driver = Self { child, port };
        driver.until_listening(patience).await?;
        Ok(driver)
    }

    /// Where the WebDriver clients connect.
    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn until_listening(&mut self, patience: Duration) -> Result<()> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(status) = self.child.try_wait().map_err(Error::Start)? {
                return Err(Error::Exited { status });
            }
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::NotListening {
                    port: self.port,
                    waited: patience,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(group) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            // Chromium's crash handlers, in sessions of their own, exit with it.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port of 127.0.0.1 that nothing listens on, for chromedriver to take.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}
