//! The relay and payment processes of a chaos run: started, killed, paused, resumed and
//! started again, each writing its log to a file of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::plan::Role;

/// One supervised process.
struct Member {
    role: Role,
    index: usize,
    child: Child,
    /// When a pause ends (SIGCONT is due).
    paused_until: Option<Instant>,
}

/// The processes, and what happened to them.
pub(crate) struct Fleet {
    exe: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    /// The payment processes' topic (the broker's destination of the orders).
    topic: String,
    /// The payment processes' store URL (their connections named apart from the
    /// relays').
    payments_store_url: String,
    members: Vec<Member>,
    /// Processes that exited without being killed, and were started again.
    pub(crate) unplanned_exits: u64,
}

impl Fleet {
    /// Starts `relays` relays and `consumers` payment processes of `exe` (this binary)
    /// on `config`, logging to `logs`.
    pub(crate) fn start(
        exe: PathBuf,
        config: PathBuf,
        logs: PathBuf,
        topic: String,
        payments_store_url: String,
        relays: usize,
        consumers: usize,
    ) -> anyhow::Result<Self> {
        let mut fleet = Self {
            exe,
            config,
            logs,
            topic,
            payments_store_url,
            members: Vec::new(),
            unplanned_exits: 0,
        };
        for (role, count) in [(Role::Relay, relays), (Role::Consumer, consumers)] {
            for index in 0..count {
                let child = fleet.spawn(role, index)?;
                fleet.members.push(Member {
                    role,
                    index,
                    child,
                    paused_until: None,
                });
            }
        }
        Ok(fleet)
    }

    fn spawn(&self, role: Role, index: usize) -> anyhow::Result<Child> {
        let log = self.log(role, index);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut command = Command::new(&self.exe);
        command.arg("--config").arg(&self.config);
        match role {
            Role::Relay => command.arg("relay"),
            Role::Consumer => command
                .args(["--store-url", &self.payments_store_url])
                .args(["chaos-payments", "--topic", &self.topic]),
        };
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {} {index}", name(role)))
    }

    fn log(&self, role: Role, index: usize) -> PathBuf {
        self.logs.join(format!("{}-{index}.log", name(role)))
    }

    fn member(&mut self, role: Role, index: usize) -> anyhow::Result<&mut Member> {
        self.members
            .iter_mut()
            .find(|m| m.role == role && m.index == index)
            .with_context(|| format!("no {} {index}", name(role)))
    }

    /// SIGKILL, then a new process in its place.
    pub(crate) fn kill(&mut self, role: Role, index: usize) -> anyhow::Result<()> {
        let member = self.member(role, index)?;
        // Killing a process that already exited fails harmlessly.
        let _ = member.child.kill();
        let _ = member.child.wait();
        member.paused_until = None;
        let child = self.spawn(role, index)?;
        self.member(role, index)?.child = child;
        Ok(())
    }

    /// SIGSTOP now, SIGCONT after `length` (by [`tick`](Self::tick)).
    pub(crate) fn pause(
        &mut self,
        role: Role,
        index: usize,
        length: Duration,
    ) -> anyhow::Result<()> {
        let member = self.member(role, index)?;
        signal(&member.child, "STOP")?;
        member.paused_until = Some(Instant::now() + length);
        Ok(())
    }

    /// Resumes the processes whose pause is over and starts again the ones that exited.
    pub(crate) fn tick(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut exited = Vec::new();
        for member in &mut self.members {
            if member.paused_until.is_some_and(|until| until <= now) {
                signal(&member.child, "CONT")?;
                member.paused_until = None;
            }
            if let Some(status) = member.child.try_wait()? {
                tracing::warn!(role = name(member.role), index = member.index, %status, "a chaos process exited; starting it again");
                exited.push((member.role, member.index));
            }
        }
        for (role, index) in exited {
            self.unplanned_exits += 1;
            let child = self.spawn(role, index)?;
            self.member(role, index)?.child = child;
        }
        Ok(())
    }

    /// Stops every process: SIGCONT where paused, SIGTERM, and SIGKILL after `grace`.
    pub(crate) fn stop(&mut self, grace: Duration) {
        for member in &mut self.members {
            if member.paused_until.take().is_some() {
                let _ = signal(&member.child, "CONT");
            }
            let _ = signal(&member.child, "TERM");
        }
        let deadline = Instant::now() + grace;
        for member in &mut self.members {
            while matches!(member.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = member.child.kill();
            let _ = member.child.wait();
        }
    }

    /// The directory of the logs.
    pub(crate) fn logs(&self) -> &Path {
        &self.logs
    }
}

/// A run that fails half-way (a process that cannot start, a panic) leaves no process
/// behind: what [`Fleet::stop`] did not stop is killed here.
impl Drop for Fleet {
    fn drop(&mut self) {
        for member in &mut self.members {
            // Killing a process already reaped does nothing.
            let _ = member.child.kill();
            let _ = member.child.wait();
        }
    }
}

/// The role's name in logs and file names.
pub(crate) fn name(role: Role) -> &'static str {
    match role {
        Role::Relay => "relay",
        Role::Consumer => "payments",
    }
}

/// Sends `SIG<signal>` to `child` with kill(1), which needs no unsafe code here. A
/// process that exited meanwhile makes kill(1) fail: not an error, [`Fleet::tick`]
/// starts it again.
fn signal(child: &Child, signal: &str) -> anyhow::Result<()> {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .stderr(Stdio::null())
        .status()
        .context("running kill")?;
    Ok(())
}
