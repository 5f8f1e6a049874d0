//! `oncebox-bench relay --processes 1,2,4`: throughput as `oncebox relay` processes are
//! added over one PostgreSQL outbox, each count's best run against the first count's,
//! in the same run.
//!
//! Each run fills the outbox with `--messages` rows (not timed), starts that many
//! `oncebox relay` processes on a configuration of its own (this binary's hidden
//! `oncebox-bench oncebox relay`: the shipped command, built with this one), and waits
//! until the broker holds every message. The rate is timed from the broker's first
//! confirmed message to its last, so the processes' start (reading the configuration,
//! connecting, checking the stream) is not in it: it is reported on its own, as
//! `start_s`, the time from the start of the processes to the first confirmed message.
//! The relays claim `--batch` rows at a time with their default concurrency, and poll
//! every 50 ms at most when they find nothing, so that none idles through another's
//! drain.
//!
//! Counts and rounds alternate (1, 2, 4, 1, 2, 4, …) so that a noisy neighbour strikes
//! them alike; the best run of each count is reported.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::backend::Backend;
use super::backend::postgres::PgBench;
use super::measure::{highest, ratio};
use super::transport::BenchTransport;
use super::{RelayArgs, StoreKind, TransportKind};

/// How often the broker's count of messages is read.
const POLL: Duration = Duration::from_millis(10);

/// How long a run may go without a new message on the broker before it fails.
const STALL: Duration = Duration::from_secs(60);

/// `oncebox-bench relay --processes`: the best run of each count of relay processes.
#[derive(Debug, Serialize)]
pub(crate) struct ProcessesReport {
    /// `"relay-processes"`.
    pub(crate) bench: &'static str,
    pub(crate) store: StoreKind,
    pub(crate) transport: TransportKind,
    pub(crate) messages: u64,
    pub(crate) batch: u32,
    pub(crate) keys: u32,
    /// Each count's best run, in the order of `--processes`.
    pub(crate) counts: Vec<Count>,
    /// Every run, in the order they ran.
    pub(crate) runs: Vec<ProcessesRun>,
}

/// The best run of one count of relay processes.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Count {
    pub(crate) processes: u32,
    pub(crate) msgs_per_s: f64,
    /// `msgs_per_s` / the first count's.
    pub(crate) ratio: f64,
}

/// One timed run.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ProcessesRun {
    pub(crate) processes: u32,
    pub(crate) round: u32,
    /// Messages confirmed from the first to the last, the first excluded.
    pub(crate) messages: u64,
    /// From the first confirmed message to the last.
    pub(crate) seconds: f64,
    pub(crate) msgs_per_s: f64,
    /// From the start of the processes to the first confirmed message.
    pub(crate) start_s: f64,
}

/// Runs every count of `args.processes`, `args.rounds` times, over `pg`'s outbox into
/// `transport`.
pub(crate) async fn run<T: BenchTransport>(
    pg: &PgBench,
    transport: &mut T,
    args: &RelayArgs,
    counts: &[u32],
) -> anyhow::Result<ProcessesReport> {
    anyhow::ensure!(
        !counts.is_empty() && counts.iter().all(|&n| n >= 1),
        "--processes: counts of 1 or more, such as 1,2,4"
    );
    // The relays are this binary's hidden `oncebox` command.
    let exe = std::env::current_exe().context("finding the oncebox-bench binary")?;
    let dir = tempfile::Builder::new()
        .prefix("oncebox-bench-relays-")
        .tempdir()?;
    let config = dir.path().join("oncebox.toml");
    let (store_url, password) = crate::chaos::split_password(pg.url());
    let password = password.map_or_else(String::new, |p| format!("password = {p:?}\n"));
    let toml = format!(
        "[store]\nurl = {store_url:?}\n{password}schema = {:?}\n\n[broker]\n{}\n[relay]\n\
         batch_size = {}\npoll_max = \"50ms\"\n\n[http]\nlisten = \"off\"\n",
        pg.schema(),
        transport.relay_config()?,
        args.batch,
    );
    std::fs::write(&config, toml)?;
    // The file may hold the database's password: readable by its owner only.
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let progress = !args.common.json;
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        for &processes in counts {
            pg.reset_outbox().await?;
            transport.reset().await.context("preparing the broker")?;
            pg.prefill(transport.topic(), args.messages, args.keys)
                .await
                .context("filling the outbox")?;
            let run = match drain(
                &exe,
                &config,
                dir.path(),
                transport,
                args.messages,
                processes,
            )
            .await
            {
                Ok(run) => ProcessesRun { round, ..run },
                Err(error) => {
                    // A failed run's logs are the evidence.
                    let logs = dir.keep();
                    return Err(error.context(format!(
                        "round {round} with {processes} relays (their logs: {})",
                        logs.display()
                    )));
                }
            };
            if progress {
                eprintln!(
                    "  round {round} {processes:>2} relays {:>10.0} msg/s  ({:.2} s, start {:.2} s)",
                    run.msgs_per_s, run.seconds, run.start_s
                );
            }
            runs.push(run);
        }
    }
    pg.reset_outbox().await?;
    let best = |processes: u32| {
        highest(&runs, |run| {
            (run.processes == processes).then_some(run.msgs_per_s)
        })
    };
    let first = best(counts[0]);
    Ok(ProcessesReport {
        bench: "relay-processes",
        store: args.common.store,
        transport: args.common.transport,
        messages: args.messages,
        batch: args.batch,
        keys: args.keys,
        counts: counts
            .iter()
            .map(|&processes| Count {
                processes,
                msgs_per_s: best(processes),
                ratio: ratio(best(processes), first),
            })
            .collect(),
        runs,
    })
}

/// Starts `processes` relays on `config` and times them from the broker's first message
/// to its `messages`-th; stops them after.
async fn drain<T: BenchTransport>(
    exe: &Path,
    config: &Path,
    logs: &Path,
    transport: &T,
    messages: u64,
    processes: u32,
) -> anyhow::Result<ProcessesRun> {
    let mut relays = Relays(Vec::new());
    let started = Instant::now();
    for index in 0..processes {
        let log = std::fs::File::create(logs.join(format!("relay-{processes}-{index}.log")))?;
        let child = Command::new(exe)
            .args(["oncebox", "relay", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting an oncebox relay")?;
        relays.0.push(child);
    }
    let mut first: Option<(Instant, u64)> = None;
    let mut last = (0, Instant::now());
    loop {
        let published = transport.published().await?;
        let now = Instant::now();
        if published > 0 && first.is_none() {
            first = Some((now, published));
        }
        if published >= messages {
            anyhow::ensure!(
                published == messages,
                "the broker holds {published} messages, {messages} were in the outbox"
            );
            break;
        }
        if published > last.0 {
            last = (published, now);
        } else if now.duration_since(last.1) > STALL {
            anyhow::bail!("the relays published {published} of {messages} messages, then stalled");
        }
        if let Some(exited) = relays.exited()? {
            anyhow::bail!("a relay exited: {exited}");
        }
        tokio::time::sleep(POLL).await;
    }
    let end = Instant::now();
    tokio::task::block_in_place(|| relays.stop());
    // A backlog drained between two looks at the broker is timed from the start.
    let (first_at, first_count) = first.unwrap_or((started, 0));
    let counted = messages - first_count;
    let seconds = end.duration_since(first_at).as_secs_f64();
    Ok(ProcessesRun {
        processes,
        round: 0,
        messages: counted,
        seconds,
        msgs_per_s: if seconds > 0.0 {
            counted as f64 / seconds
        } else {
            0.0
        },
        start_s: first_at.duration_since(started).as_secs_f64(),
    })
}

/// The relay processes of a run, killed if the run ends early.
struct Relays(Vec<Child>);

impl Relays {
    /// The exit status of a relay that exited, if one did.
    fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        for child in &mut self.0 {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
        }
        Ok(None)
    }

    /// SIGTERM to every relay, SIGKILL to those still running after 10 s.
    fn stop(&mut self) {
        let mut children: Vec<&mut Child> = self.0.iter_mut().collect();
        crate::chaos::fleet::terminate(&mut children, Duration::from_secs(10));
        self.0.clear();
    }

    fn kill(&mut self) {
        for mut child in self.0.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.kill();
    }
}

impl ProcessesReport {
    /// Prints the report for a reader.
    pub(crate) fn print(&self) {
        println!(
            "relay processes · store {} · transport {} · {} messages · batch {} · {} keys",
            super::report::name(self.store),
            super::report::name(self.transport),
            self.messages,
            self.batch,
            self.keys
        );
        println!("  round  relays      msg/s   seconds   start s");
        for run in &self.runs {
            println!(
                "  {:>5}  {:>6} {:>10.0} {:>9.2} {:>9.2}",
                run.round, run.processes, run.msgs_per_s, run.seconds, run.start_s
            );
        }
        let best: Vec<String> = self
            .counts
            .iter()
            .map(|c| {
                format!(
                    "{} relays {:.0} msg/s (ratio {:.3})",
                    c.processes, c.msgs_per_s, c.ratio
                )
            })
            .collect();
        println!("  best: {}", best.join(" · "));
    }
}
