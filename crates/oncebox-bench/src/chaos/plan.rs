//! The fault plan: which fault strikes when, drawn from a seed before the run starts, so
//! that a run's faults can be told and repeated (their effects still depend on timing).

use std::time::Duration;

use serde::Serialize;

/// A kind of process the chaos run supervises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// An `oncebox relay` process.
    Relay,
    /// A payment service process (`oncebox-bench chaos-payments`).
    Consumer,
    /// With log-tailing relays: the relay that reads the slot when the fault strikes
    /// (the one holding the slot's lock), whichever process that is by then.
    Reader,
    /// With log-tailing relays: a relay standing by when the fault strikes; `index`
    /// picks one of them (modulo their number).
    Standby,
}

/// One process's connections to a service, each through a proxy of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Link {
    /// To PostgreSQL.
    Database,
    /// To the broker.
    Broker,
}

/// What a link's proxy does to it for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Trouble {
    /// Open connections dropped, new ones closed at once.
    Cut,
    /// Connections kept open, nothing forwarded.
    Stall,
    /// Every chunk forwarded late.
    Slow,
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub(crate) enum Fault {
    /// SIGKILL, then a new process in its place.
    Kill { role: Role, index: usize },
    /// SIGSTOP for `millis`, then SIGCONT: a polling relay paused past its lease comes
    /// back to claims that are no longer its own; a paused reader of the slot keeps its
    /// lock and its walsender, so its standbys, which poll the lock every second, must
    /// keep standing by, and it comes back to publications that timed out.
    Pause {
        role: Role,
        index: usize,
        millis: u64,
    },
    /// `pg_terminate_backend` of every connection of the relays (with log-tailing relays,
    /// the slot's walsender too).
    TerminateRelayConnections,
    /// `pg_terminate_backend` of the slot's walsender alone (log-tailing relays): the
    /// reader's replication connection ends under it, its lock stays.
    TerminateWalsender,
    /// One process's link in trouble for `millis`, then restored.
    Link {
        role: Role,
        index: usize,
        link: Link,
        trouble: Trouble,
        millis: u64,
    },
    /// The broker restarted by its command.
    RestartBroker,
    /// PostgreSQL restarted by its command.
    RestartPostgres,
    /// PostgreSQL's primary killed and its standby promoted by the failover command;
    /// the database's address then moves to the standby.
    Failover,
}

impl Fault {
    /// The process it strikes, if it strikes one.
    pub(crate) fn process(self) -> Option<(Role, usize)> {
        match self {
            Self::Kill { role, index }
            | Self::Pause { role, index, .. }
            | Self::Link { role, index, .. } => Some((role, index)),
            Self::TerminateRelayConnections
            | Self::TerminateWalsender
            | Self::RestartBroker
            | Self::RestartPostgres
            | Self::Failover => None,
        }
    }

    /// The same fault striking process `index` of `role` instead (a fault that strikes
    /// no process is left as it is).
    pub(crate) fn striking(self, role: Role, index: usize) -> Self {
        match self {
            Self::Kill { .. } => Self::Kill { role, index },
            Self::Pause { millis, .. } => Self::Pause {
                role,
                index,
                millis,
            },
            Self::Link {
                link,
                trouble,
                millis,
                ..
            } => Self::Link {
                role,
                index,
                link,
                trouble,
                millis,
            },
            other => other,
        }
    }

    /// The fault's kind, as the report counts them.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Self::Kill { role, .. } => match role {
                Role::Relay => "kill_relay",
                Role::Consumer => "kill_consumer",
                Role::Reader => "kill_reader",
                Role::Standby => "kill_standby",
            },
            Self::Pause { role, .. } => match role {
                Role::Relay => "pause_relay",
                Role::Consumer => "pause_consumer",
                Role::Reader => "pause_reader",
                Role::Standby => "pause_standby",
            },
            Self::TerminateRelayConnections => "terminate_relay_connections",
            Self::TerminateWalsender => "terminate_walsender",
            Self::Link { link, trouble, .. } => match (trouble, link) {
                (Trouble::Cut, Link::Database) => "cut_database",
                (Trouble::Cut, Link::Broker) => "cut_broker",
                (Trouble::Stall, Link::Database) => "stall_database",
                (Trouble::Stall, Link::Broker) => "stall_broker",
                (Trouble::Slow, Link::Database) => "slow_database",
                (Trouble::Slow, Link::Broker) => "slow_broker",
            },
            Self::RestartBroker => "restart_broker",
            Self::RestartPostgres => "restart_postgres",
            Self::Failover => "failover_postgres",
        }
    }
}

/// How many faults of each kind, over how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanSpec {
    /// The window the faults are spread over (the time the orders take to place).
    pub(crate) window: Duration,
    pub(crate) relays: usize,
    pub(crate) consumers: usize,
    pub(crate) kills: u32,
    pub(crate) pauses: u32,
    /// How long a pause lasts: longer than the relays' lease.
    pub(crate) pause: Duration,
    pub(crate) terminations: u32,
    /// Cuts, stalls and slowdowns of one process's link, each with how long it lasts.
    pub(crate) cuts: (u32, Duration),
    pub(crate) stalls: (u32, Duration),
    pub(crate) slowdowns: (u32, Duration),
    /// Whether the processes reach the broker through proxies (not Kafka's: its
    /// clients connect to the addresses its metadata gives).
    pub(crate) broker_link: bool,
    pub(crate) broker_restarts: u32,
    pub(crate) postgres_restarts: u32,
    /// PostgreSQL failovers (a pair has one standby: 0 or 1).
    pub(crate) failovers: u32,
    /// Whether the relays tail the log (one reads the slot, the others stand by)
    /// rather than poll the table.
    pub(crate) cdc: bool,
}

/// The faults of `spec` at instants drawn from `seed`, in time order.
///
/// Kills, pauses and connection terminations fall at random instants of the window;
/// restarts and failovers are spread evenly over its middle (one in the last instants
/// would test only the drain), each at a random point of its own slice.
///
/// With log-tailing relays (`spec.cdc`) a fault that strikes a relay strikes the
/// [`Role::Reader`] or a [`Role::Standby`] (one chance in `relays` for the reader,
/// as for any one relay), resolved when it strikes; a pause strikes the reader (a
/// paused standby does nothing it would not do awake); terminations alternate between
/// the walsender alone (first) and every connection of the relays.
pub(crate) fn plan(spec: &PlanSpec, seed: u64) -> Vec<(Duration, Fault)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let window = spec.window.as_millis().max(1) as u64;
    let mut faults = Vec::new();
    let anywhere = |rng: &mut fastrand::Rng| Duration::from_millis(rng.u64(0..window));
    let pick = |rng: &mut fastrand::Rng| {
        let relays = spec.relays;
        let consumers = spec.consumers;
        let n = rng.usize(0..(relays + consumers).max(1));
        if n < relays || consumers == 0 {
            let n = n.min(relays.saturating_sub(1));
            match (spec.cdc, n) {
                (false, _) => (Role::Relay, n),
                (true, 0) => (Role::Reader, 0),
                (true, _) => (Role::Standby, n - 1),
            }
        } else {
            (Role::Consumer, n - relays)
        }
    };
    for _ in 0..spec.kills {
        let (role, index) = pick(&mut rng);
        faults.push((anywhere(&mut rng), Fault::Kill { role, index }));
    }
    for _ in 0..spec.pauses {
        let (role, index) = match pick(&mut rng) {
            (Role::Standby, _) => (Role::Reader, 0),
            picked => picked,
        };
        let millis = spec.pause.as_millis() as u64;
        faults.push((
            anywhere(&mut rng),
            Fault::Pause {
                role,
                index,
                millis,
            },
        ));
    }
    for i in 0..spec.terminations {
        let fault = if spec.cdc && i % 2 == 0 {
            Fault::TerminateWalsender
        } else {
            Fault::TerminateRelayConnections
        };
        faults.push((anywhere(&mut rng), fault));
    }
    for (trouble, (count, length)) in [
        (Trouble::Cut, spec.cuts),
        (Trouble::Stall, spec.stalls),
        (Trouble::Slow, spec.slowdowns),
    ] {
        for _ in 0..count {
            let (role, index) = pick(&mut rng);
            let link = if spec.broker_link && rng.bool() {
                Link::Broker
            } else {
                Link::Database
            };
            let millis = length.as_millis() as u64;
            let fault = Fault::Link {
                role,
                index,
                link,
                trouble,
                millis,
            };
            faults.push((anywhere(&mut rng), fault));
        }
    }
    let mut restarts: Vec<Fault> =
        std::iter::repeat_n(Fault::RestartBroker, spec.broker_restarts as usize)
            .chain(std::iter::repeat_n(
                Fault::RestartPostgres,
                spec.postgres_restarts as usize,
            ))
            .chain(std::iter::repeat_n(
                Fault::Failover,
                spec.failovers as usize,
            ))
            .collect();
    rng.shuffle(&mut restarts);
    // Restarts fall in the middle 80 % of the window, one per slice.
    let slices = restarts.len() as u64;
    for (i, fault) in restarts.into_iter().enumerate() {
        let slice = window * 8 / 10 / slices.max(1);
        let at = window / 10 + slice * i as u64 + rng.u64(0..slice.max(1));
        faults.push((Duration::from_millis(at), fault));
    }
    faults.sort_by_key(|(at, _)| *at);
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PlanSpec {
        PlanSpec {
            window: Duration::from_secs(100),
            relays: 3,
            consumers: 2,
            kills: 50,
            pauses: 4,
            pause: Duration::from_secs(8),
            terminations: 3,
            cuts: (4, Duration::from_secs(3)),
            stalls: (4, Duration::from_secs(8)),
            slowdowns: (4, Duration::from_secs(10)),
            broker_link: true,
            broker_restarts: 2,
            postgres_restarts: 1,
            failovers: 1,
            cdc: false,
        }
    }

    #[test]
    fn a_seed_gives_one_plan_with_every_fault_asked_for() {
        let plan = plan(&spec(), 7);
        assert_eq!(
            plan,
            super::plan(&spec(), 7),
            "the same seed, the same plan"
        );
        assert_ne!(plan, super::plan(&spec(), 8));
        assert_eq!(plan.len(), 50 + 4 + 3 + 12 + 2 + 1 + 1);
        assert!(plan.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
        assert!(plan.iter().all(|(at, _)| *at < Duration::from_secs(100)));
        let count = |kind: &str| plan.iter().filter(|(_, f)| f.kind() == kind).count();
        assert_eq!(count("kill_relay") + count("kill_consumer"), 50);
        assert!(count("kill_relay") > 0 && count("kill_consumer") > 0);
        assert_eq!(count("pause_relay") + count("pause_consumer"), 4);
        assert_eq!(count("terminate_relay_connections"), 3);
        assert_eq!(count("restart_broker"), 2);
        assert_eq!(count("restart_postgres"), 1);
        assert_eq!(count("failover_postgres"), 1);
        for trouble in ["cut", "stall", "slow"] {
            let database = count(&format!("{trouble}_database"));
            let broker = count(&format!("{trouble}_broker"));
            assert_eq!(database + broker, 4, "{trouble}");
        }
        for (_, fault) in &plan {
            match *fault {
                Fault::Kill { role, index }
                | Fault::Pause { role, index, .. }
                | Fault::Link { role, index, .. } => match role {
                    Role::Relay => assert!(index < 3),
                    Role::Consumer => assert!(index < 2),
                    Role::Reader | Role::Standby => panic!("polling relays: {fault:?}"),
                },
                _ => {}
            }
        }
    }

    #[test]
    fn log_tailing_relays_are_struck_as_reader_or_standby() {
        let spec = PlanSpec {
            cdc: true,
            ..spec()
        };
        let plan = plan(&spec, 7);
        assert_eq!(
            plan.len(),
            50 + 4 + 3 + 12 + 2 + 1 + 1,
            "as many faults as asked"
        );
        let count = |kind: &str| plan.iter().filter(|(_, f)| f.kind() == kind).count();
        assert!(count("kill_reader") > 0 && count("kill_standby") > 0);
        assert_eq!(
            count("kill_reader") + count("kill_standby") + count("kill_consumer"),
            50
        );
        assert_eq!(
            count("kill_relay") + count("pause_relay"),
            0,
            "no relay by index"
        );
        assert_eq!(count("pause_standby"), 0, "a pause strikes the reader");
        assert_eq!(count("pause_reader") + count("pause_consumer"), 4);
        assert_eq!(count("terminate_walsender"), 2, "the 1st and 3rd");
        assert_eq!(count("terminate_relay_connections"), 1);
        for (_, fault) in &plan {
            match *fault {
                Fault::Kill { role, index }
                | Fault::Pause { role, index, .. }
                | Fault::Link { role, index, .. } => match role {
                    Role::Reader => assert_eq!(index, 0),
                    Role::Standby => assert!(index < 2, "two of the three relays stand by"),
                    Role::Consumer => assert!(index < 2),
                    Role::Relay => panic!("a relay by index: {fault:?}"),
                },
                _ => {}
            }
        }
        // One relay: it is the reader, there is no standby.
        let alone = super::plan(&PlanSpec { relays: 1, ..spec }, 7);
        assert!(
            alone
                .iter()
                .all(|(_, f)| !matches!(f.process(), Some((Role::Standby | Role::Relay, _))))
        );
        assert!(alone.iter().any(|(_, f)| f.kind() == "kill_reader"));
    }

    #[test]
    fn without_a_proxied_broker_only_database_links_fail() {
        let spec = PlanSpec {
            broker_link: false,
            ..spec()
        };
        let links: Vec<Link> = plan(&spec, 3)
            .into_iter()
            .filter_map(|(_, fault)| match fault {
                Fault::Link { link, .. } => Some(link),
                _ => None,
            })
            .collect();
        assert_eq!(links.len(), 12);
        assert!(links.iter().all(|link| *link == Link::Database));
    }

    #[test]
    fn restarts_are_spread_over_the_middle_of_the_window() {
        let plan = plan(&spec(), 42);
        let restarts: Vec<Duration> = plan
            .iter()
            .filter(|(_, f)| {
                matches!(
                    f,
                    Fault::RestartBroker | Fault::RestartPostgres | Fault::Failover
                )
            })
            .map(|(at, _)| *at)
            .collect();
        assert_eq!(restarts.len(), 4);
        assert!(
            restarts
                .iter()
                .all(|at| *at >= Duration::from_secs(10) && *at < Duration::from_secs(90))
        );
        // One per slice of the middle: never two in the same quarter.
        let slices: Vec<u64> = restarts
            .iter()
            .map(|at| (at.as_millis() as u64 - 10_000) * 4 / 80_000)
            .collect();
        assert_eq!(slices, [0, 1, 2, 3]);
    }
}
