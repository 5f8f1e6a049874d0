//! The relay and payment processes of a chaos run: started, killed, paused, resumed and
//! started again, each writing its log to a file of its own, each reaching PostgreSQL
//! and the broker through proxies of its own that cut, stall and slow its connections.
//!
//! A NATS cluster's seeds are proxied one by one, and a broker fault strikes them all:
//! every connection a process makes to a seed goes through its proxies. The servers
//! tell their clients the other nodes' own addresses too, and a client whose proxied
//! links are cut may fail over to one of those, unproxied, and stay there until the
//! process is started again: on a cluster a broker link fault is a forced failover to
//! another node more than an outage.
//!
//! A RabbitMQ cluster's nodes are proxied one by one too, and a broker fault strikes
//! them all; RabbitMQ tells its clients of no other node, so a process reaches the
//! cluster only through its proxies, and a cut link is an outage of the whole cluster
//! for it. A node killed by the restart command drops the connections through its
//! proxy, and refuses new ones, until it is back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use oncebox_testkit::proxy::Proxy;

use super::plan::{Link, Role, Trouble};

/// How long each chunk waits on a slowed link.
const SLOW_CHUNK: Duration = Duration::from_millis(50);

/// One supervised process.
struct Member {
    role: Role,
    index: usize,
    child: Child,
    /// When a pause ends (SIGCONT is due).
    paused_until: Option<Instant>,
    database: Route,
    /// One per server of the broker's URL (a NATS cluster's seeds); none where the
    /// broker cannot be proxied (Kafka).
    broker: Vec<Route>,
}

/// A process's way to one service: a proxy, and the URL that goes through it.
struct Route {
    proxy: Proxy,
    url: String,
    /// When its trouble ends.
    restore_at: Option<Instant>,
}

impl Route {
    async fn to(url: &str) -> anyhow::Result<Self> {
        let target = target_of(url)?;
        let proxy = Proxy::start(target.clone())
            .await
            .with_context(|| format!("starting a proxy to {target}"))?;
        let url = through(url, proxy.port())?;
        Ok(Self {
            proxy,
            url,
            restore_at: None,
        })
    }

    /// Ends the route's trouble.
    fn restore(&mut self) {
        self.proxy.restore();
        self.restore_at = None;
    }
}

/// Where the processes connect, before the proxies.
pub(crate) struct Targets {
    /// Each relay's store URL, by index (their connections named apart, to be
    /// terminated and, with log-tailing relays, to tell which one reads the slot).
    pub(crate) relay_store_urls: Vec<String>,
    /// The payment processes' store URL.
    pub(crate) payments_store_url: String,
    /// The broker's URL without its password, when it can be proxied (with NATS, one
    /// server or a cluster's seeds separated by commas).
    pub(crate) broker_url: Option<String>,
}

/// The processes, and what happened to them.
pub(crate) struct Fleet {
    exe: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    /// The payment processes' topic (the broker's destination of the orders).
    topic: String,
    /// The payment processes' consumer group.
    group: String,
    members: Vec<Member>,
    /// Processes that exited without being killed, and were started again.
    pub(crate) unplanned_exits: u64,
}

impl Fleet {
    /// Starts a relay per URL of `targets.relay_store_urls` and `consumers` payment
    /// processes of `exe` (this binary) on `config`, the payment processes consuming
    /// `topic` as `group`, connecting to `targets` through proxies, logging to `logs`.
    pub(crate) async fn start(
        exe: PathBuf,
        config: PathBuf,
        logs: PathBuf,
        topic: String,
        group: String,
        targets: &Targets,
        consumers: usize,
    ) -> anyhow::Result<Self> {
        let mut fleet = Self {
            exe,
            config,
            logs,
            topic,
            group,
            members: Vec::new(),
            unplanned_exits: 0,
        };
        let relays = targets.relay_store_urls.iter().enumerate();
        let consumers = (0..consumers).map(|index| (index, &targets.payments_store_url));
        let members = relays
            .map(|(index, url)| (Role::Relay, index, url))
            .chain(consumers.map(|(index, url)| (Role::Consumer, index, url)));
        for (role, index, store_url) in members {
            let database = Route::to(store_url).await?;
            let mut broker = Vec::new();
            for server in targets
                .broker_url
                .as_deref()
                .map(servers)
                .unwrap_or_default()
            {
                broker.push(Route::to(server).await?);
            }
            let child = fleet.spawn_with(role, index, &database, &broker)?;
            fleet.members.push(Member {
                role,
                index,
                child,
                paused_until: None,
                database,
                broker,
            });
        }
        Ok(fleet)
    }

    fn spawn(&self, role: Role, index: usize) -> anyhow::Result<Child> {
        let member = self
            .members
            .iter()
            .find(|m| m.role == role && m.index == index)
            .with_context(|| format!("no {} {index}", name(role)))?;
        self.spawn_with(role, index, &member.database, &member.broker)
    }

    fn spawn_with(
        &self,
        role: Role,
        index: usize,
        database: &Route,
        broker: &[Route],
    ) -> anyhow::Result<Child> {
        let log = self.log(role, index);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut command = Command::new(&self.exe);
        match role {
            Role::Relay | Role::Reader | Role::Standby => command.args(["oncebox", "relay"]),
            Role::Consumer => command.args([
                "chaos-payments",
                "--topic",
                &self.topic,
                "--group",
                &self.group,
            ]),
        };
        command.arg("--config").arg(&self.config);
        command.args(["--store-url", &database.url]);
        if !broker.is_empty() {
            let urls: Vec<&str> = broker.iter().map(|route| route.url.as_str()).collect();
            command.args(["--broker-url", &urls.join(",")]);
        }
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

    /// Puts the `link` of a process in `trouble` for `length`: the connections through
    /// its proxy are cut, stalled or slowed, then restored by [`tick`](Self::tick).
    pub(crate) fn trouble(
        &mut self,
        role: Role,
        index: usize,
        link: Link,
        trouble: Trouble,
        length: Duration,
    ) -> anyhow::Result<()> {
        let member = self.member(role, index)?;
        let routes = match link {
            Link::Database => std::slice::from_mut(&mut member.database),
            Link::Broker if member.broker.is_empty() => {
                anyhow::bail!("this broker is not reached through a proxy")
            }
            Link::Broker => member.broker.as_mut_slice(),
        };
        let until = Instant::now() + length;
        for route in routes {
            match trouble {
                Trouble::Cut => route.proxy.cut(),
                Trouble::Stall => route.proxy.stall(),
                Trouble::Slow => route.proxy.slow(SLOW_CHUNK),
            }
            route.restore_at = Some(route.restore_at.map_or(until, |at| at.max(until)));
        }
        Ok(())
    }

    /// Resumes the processes whose pause is over, restores the links whose trouble is
    /// over and starts again the processes that exited.
    pub(crate) fn tick(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut exited = Vec::new();
        for member in &mut self.members {
            if member.paused_until.is_some_and(|until| until <= now) {
                signal(&member.child, "CONT")?;
                member.paused_until = None;
            }
            for route in member.routes() {
                if route.restore_at.is_some_and(|at| at <= now) {
                    route.restore();
                }
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

    /// Stops every process: SIGCONT where paused, links restored, SIGTERM, and SIGKILL
    /// after `grace`.
    pub(crate) fn stop(&mut self, grace: Duration) {
        for member in &mut self.members {
            if member.paused_until.take().is_some() {
                let _ = signal(&member.child, "CONT");
            }
            for route in member.routes() {
                route.restore();
            }
        }
        let mut children: Vec<&mut Child> = self.members.iter_mut().map(|m| &mut m.child).collect();
        terminate(&mut children, grace);
    }

    /// The directory of the logs.
    pub(crate) fn logs(&self) -> &Path {
        &self.logs
    }

    /// Each process's id and connections to PostgreSQL now (a soak's samples).
    pub(crate) fn usage(&self) -> Vec<Usage> {
        self.members
            .iter()
            .map(|member| Usage {
                process: format!("{}-{}", name(member.role), member.index),
                pid: member.child.id(),
                db_connections: member.database.proxy.open_connections(),
            })
            .collect()
    }
}

/// A process of the fleet, as a soak samples it.
pub(crate) struct Usage {
    /// `relay-0`, `payments-1`, …
    pub(crate) process: String,
    pub(crate) pid: u32,
    /// Connections open through its proxy to PostgreSQL.
    pub(crate) db_connections: usize,
}

impl Member {
    fn routes(&mut self) -> impl Iterator<Item = &mut Route> {
        std::iter::once(&mut self.database).chain(self.broker.iter_mut())
    }
}

/// The servers of a broker URL: a NATS cluster's seeds or a RabbitMQ cluster's nodes,
/// separated by commas, or the one server of any other.
fn servers(url: &str) -> Vec<&str> {
    if url.starts_with("nats://") || url.starts_with("amqp://") || url.starts_with("amqps://") {
        url.split(',').map(str::trim).collect()
    } else {
        vec![url]
    }
}

/// `host:port` that `url` points at (with the scheme's default port).
fn target_of(url: &str) -> anyhow::Result<String> {
    let parsed = url::Url::parse(url).with_context(|| format!("{url} is not a URL"))?;
    let host = parsed
        .host_str()
        .filter(|host| !host.is_empty())
        .context("chaos reaches PostgreSQL and the broker over TCP: the URL needs a host")?;
    let port = parsed.port().or(match parsed.scheme() {
        "postgres" | "postgresql" => Some(5432),
        "nats" => Some(4222),
        "amqp" => Some(5672),
        "amqps" => Some(5671),
        "redis" | "rediss" => Some(6379),
        _ => None,
    });
    let port = port.with_context(|| format!("no port in {}", parsed.scheme()))?;
    Ok(format!("{host}:{port}"))
}

/// `url` pointed at 127.0.0.1:`port`, the rest kept.
fn through(url: &str, port: u16) -> anyhow::Result<String> {
    let mut parsed = url::Url::parse(url).with_context(|| format!("{url} is not a URL"))?;
    parsed
        .set_host(Some("127.0.0.1"))
        .context("pointing the URL at the proxy")?;
    parsed
        .set_port(Some(port))
        .map_err(|()| anyhow::anyhow!("pointing the URL at the proxy's port"))?;
    Ok(parsed.to_string())
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
        Role::Reader => "reader",
        Role::Standby => "standby",
    }
}

/// Sends `SIG<signal>` to `child` with kill(1), which needs no unsafe code here. A
/// process that exited meanwhile makes kill(1) fail: not an error, [`Fleet::tick`]
/// starts it again.
pub(crate) fn signal(child: &Child, signal: &str) -> anyhow::Result<()> {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .stderr(Stdio::null())
        .status()
        .context("running kill")?;
    Ok(())
}

/// SIGTERM to every child, then SIGKILL to those still running after `grace`; each one
/// is waited for.
pub(crate) fn terminate(children: &mut [&mut Child], grace: Duration) {
    for child in children.iter() {
        // One that exited already is waited for below.
        let _ = signal(child, "TERM");
    }
    let deadline = Instant::now() + grace;
    for child in children.iter_mut() {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::{servers, target_of, through};

    #[test]
    fn a_nats_cluster_is_proxied_seed_by_seed() {
        assert_eq!(
            servers("nats://127.0.0.1:4251,nats://127.0.0.1:4252"),
            ["nats://127.0.0.1:4251", "nats://127.0.0.1:4252"]
        );
        assert_eq!(servers("nats://127.0.0.1:4222"), ["nats://127.0.0.1:4222"]);
        assert_eq!(servers("redis://h:1/0?a=1,2"), ["redis://h:1/0?a=1,2"]);
        assert_eq!(
            servers("amqp://guest@127.0.0.1:5681/%2f,amqp://guest@127.0.0.1:5682/%2f"),
            [
                "amqp://guest@127.0.0.1:5681/%2f",
                "amqp://guest@127.0.0.1:5682/%2f"
            ]
        );
    }

    #[test]
    fn a_url_is_pointed_at_its_proxy_and_keeps_the_rest() {
        let pg = "postgres://postgres:pw@db.internal/app?application_name=x-relay";
        assert_eq!(target_of(pg).expect("a target"), "db.internal:5432");
        assert_eq!(
            through(pg, 40001).expect("a URL"),
            "postgres://postgres:pw@127.0.0.1:40001/app?application_name=x-relay"
        );
        assert_eq!(
            target_of("amqp://guest@127.0.0.1/%2f").expect("a target"),
            "127.0.0.1:5672"
        );
        assert_eq!(
            through("amqp://guest@10.0.0.7:5673/%2f", 40002).expect("a URL"),
            "amqp://guest@127.0.0.1:40002/%2f"
        );
        assert_eq!(
            through("nats://127.0.0.1:4222", 40003).expect("a URL"),
            "nats://127.0.0.1:40003"
        );
        assert!(target_of("postgres:///app?host=/run/postgresql").is_err());
    }
}
