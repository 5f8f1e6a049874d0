//! Strikes the plan's faults as they fall due: on the fleet's processes and their links,
//! on the relays' database connections, on the services by their restart commands.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use oncebox::postgres::PgStore;

use super::failover::MovingAddress;
use super::fleet::{self, Fleet};
use super::plan::{Fault, Role};
use super::{ChaosArgs, READER_WAIT, cdc};

/// What strikes, and what it struck.
pub(crate) struct Striker<'a> {
    pub(crate) args: &'a ChaosArgs,
    pub(crate) store: &'a PgStore,
    /// The start of the relays' application names.
    pub(crate) relay_names: String,
    /// The slot the relays read, with log-tailing relays.
    pub(crate) slot: Option<String>,
    /// Whether to tell each fault on stderr.
    pub(crate) progress: bool,
    /// Faults struck, by kind.
    pub(crate) struck: BTreeMap<&'static str, u64>,
    /// Walsenders terminated.
    pub(crate) walsenders_terminated: u64,
    /// With `--failover`: the database's address, which the failover moves.
    pub(crate) database: Option<&'a MovingAddress>,
    /// The payment service's queue (its consumer group), named to the restart commands
    /// in `ONCEBOX_QUEUE`: `scripts/services.sh restart rabbitmq-cluster` kills the node
    /// holding its leader.
    pub(crate) queue: String,
    /// The run's Redis stream, named to the restart commands in `ONCEBOX_REDIS_KEY`:
    /// `scripts/services.sh restart redis-cluster-master` kills the master serving it.
    pub(crate) redis_key: Option<String>,
}

impl Striker<'_> {
    /// Strikes `fault`, planned at `at`: a fault of the reader or a standby first finds
    /// which relay that is now.
    pub(crate) async fn strike(
        &mut self,
        fleet: &mut Fleet,
        at: Duration,
        fault: Fault,
    ) -> anyhow::Result<()> {
        let planned = fault.process();
        let (fault, kind) = match (&self.slot, planned) {
            (Some(slot), Some((Role::Reader | Role::Standby, _))) => {
                let reader = self.reader(fleet, slot).await?;
                cdc::resolve(fault, reader, self.args.relays as usize)
            }
            _ => (fault, fault.kind()),
        };
        if self.progress {
            let whom = match (fault.process(), planned) {
                (Some((role, index)), Some((planned @ (Role::Reader | Role::Standby), _))) => {
                    format!(" ({} {index}, {})", fleet::name(role), fleet::name(planned))
                }
                (Some((role, index)), _) => format!(" ({} {index})", fleet::name(role)),
                (None, _) => String::new(),
            };
            eprintln!("  {:>7.1} s  {kind}{whom}", at.as_secs_f64());
        }
        self.inject(fleet, fault).await?;
        *self.struck.entry(kind).or_default() += 1;
        Ok(())
    }

    /// The relay that reads `slot`, waiting up to [`READER_WAIT`] for one (the fleet
    /// goes on meanwhile); none if none came.
    async fn reader(&self, fleet: &mut Fleet, slot: &str) -> anyhow::Result<Option<usize>> {
        let deadline = Instant::now() + READER_WAIT;
        loop {
            let reader = cdc::reader(self.store, slot, &self.relay_names).await;
            if reader.is_some() || Instant::now() >= deadline {
                return Ok(reader);
            }
            tokio::task::block_in_place(|| fleet.tick())?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn inject(&mut self, fleet: &mut Fleet, fault: Fault) -> anyhow::Result<()> {
        match fault {
            Fault::Kill { role, index } => tokio::task::block_in_place(|| fleet.kill(role, index)),
            Fault::Pause {
                role,
                index,
                millis,
            } => fleet.pause(role, index, Duration::from_millis(millis)),
            Fault::TerminateRelayConnections => {
                let terminated: Vec<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE starts_with(application_name, $1)",
                )
                .bind(&self.relay_names)
                .fetch_all(self.store.pool())
                .await
                .context("terminating the relays' connections")?;
                tracing::info!(
                    connections = terminated.len(),
                    "terminated the relays' connections"
                );
                if let Some(slot) = &self.slot {
                    self.walsenders_terminated +=
                        cdc::terminate_walsender(self.store, slot).await?;
                }
                Ok(())
            }
            Fault::TerminateWalsender => {
                let slot = self.slot.as_deref().context("no slot: the relays poll")?;
                // Between two sessions no walsender reads: wait for the next one.
                let deadline = Instant::now() + READER_WAIT;
                loop {
                    let terminated = cdc::terminate_walsender(self.store, slot).await?;
                    self.walsenders_terminated += terminated;
                    if terminated > 0 || Instant::now() >= deadline {
                        return Ok(());
                    }
                    tokio::task::block_in_place(|| fleet.tick())?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Fault::Link {
                role,
                index,
                link,
                trouble,
                millis,
            } => fleet.trouble(role, index, link, trouble, Duration::from_millis(millis)),
            Fault::RestartBroker => {
                let command = self.args.restart_broker.as_deref();
                self.restart(command).await
            }
            Fault::RestartPostgres => {
                let command = self.args.restart_postgres.as_deref();
                self.restart(command).await
            }
            Fault::Failover => {
                let (Some(address), Some(command)) = (self.database, &self.args.failover) else {
                    anyhow::bail!("a failover was planned without --failover");
                };
                address.fail_over(command).await
            }
        }
    }
}

impl Striker<'_> {
    /// Runs a restart command with `ONCEBOX_STREAM` set to the run's NATS stream (named
    /// after its schema), whose leader `scripts/services.sh restart nats-cluster` kills,
    /// `ONCEBOX_QUEUE` to the payment service's RabbitMQ queue, the node holding whose
    /// leader `scripts/services.sh restart rabbitmq-cluster` kills, and
    /// `ONCEBOX_REDIS_KEY` to the run's Redis stream, whose master
    /// `scripts/services.sh restart redis-cluster-master` kills.
    async fn restart(&self, command: Option<&str>) -> anyhow::Result<()> {
        let command = command.context("a restart was planned without its command")?;
        run_command(
            command,
            &[
                ("ONCEBOX_STREAM", self.store.schema()),
                ("ONCEBOX_QUEUE", &self.queue),
                ("ONCEBOX_REDIS_KEY", self.redis_key.as_deref().unwrap_or("")),
            ],
        )
        .await
    }
}

/// Runs `command` with `sh -c`, with `env` added to its environment; its output other
/// than errors is not shown.
pub(crate) async fn run_command(command: &str, env: &[(&str, &str)]) -> anyhow::Result<()> {
    let status = tokio::process::Command::new("sh")
        .args(["-c", command])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .with_context(|| format!("running {command:?}"))?;
    anyhow::ensure!(status.success(), "{command:?} failed: {status}");
    Ok(())
}
