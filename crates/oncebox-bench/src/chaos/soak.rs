//! `oncebox-bench chaos --soak DURATION`: the campaign without faults for a long time,
//! with each relay's and payment process's resident memory, open file descriptors and
//! database connections sampled at a fixed interval, and a verdict on whether they
//! stayed flat.
//!
//! What "flat" means, process by process:
//!
//! - The first quarter of the samples is the warm-up (pools filling, the allocator
//!   reaching its working set, the broker's buffers sized) and is not judged.
//! - The judged samples are split in an early and a late half. Resident memory is flat
//!   when the late maximum is within 10 % (and at least 4 MiB) of the early maximum: a
//!   leak of a few bytes a message shows over an hour at 1,000 messages a second,
//!   and the allocator's churn does not.
//! - File descriptors other than database connections are flat when the late maximum
//!   exceeds the early one by at most 2 (a broker reconnection holds one briefly).
//! - Database connections are bounded, not flat: a pool opens and closes them on demand,
//!   so the rule is that no sample exceeds the pool's size.
//! - A process that was started again during the soak (a crash) is not flat.
//!
//! Database connections are counted at the process's own proxy to PostgreSQL (every
//! connection a process makes goes through it), memory and descriptors in `/proc`.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::ChaosArgs;
use super::fleet::{Fleet, Usage};

/// `args` as a soak of `length`: orders at `--rate` for `length`, and no fault.
pub(super) fn campaign(args: ChaosArgs, length: Duration) -> anyhow::Result<ChaosArgs> {
    let orders = (length.as_secs_f64() * f64::from(args.rate)).round() as u64;
    anyhow::ensure!(
        orders >= 1,
        "--soak {} at --rate {}: not one order",
        humantime::format_duration(length),
        args.rate
    );
    Ok(ChaosArgs {
        orders,
        kills: 0,
        pauses: 0,
        terminations: 0,
        cuts: 0,
        stalls: 0,
        slowdowns: 0,
        broker_restarts: 0,
        postgres_restarts: 0,
        ..args
    })
}

/// What a sample of one process found.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Sample {
    /// Seconds since the soak started.
    pub(crate) at_s: f64,
    pub(crate) pid: u32,
    /// Resident set size (`VmRSS`), in KiB.
    pub(crate) rss_kib: u64,
    /// Open file descriptors, database connections included.
    pub(crate) fds: u64,
    /// Open connections to PostgreSQL.
    pub(crate) db_connections: u64,
}

/// One process's samples and its verdict.
#[derive(Debug, Serialize)]
pub(crate) struct ProcessSoak {
    /// `relay-0`, `payments-1`, …
    pub(crate) process: String,
    pub(crate) samples: Vec<Sample>,
    /// Empty when flat; each rule broken otherwise.
    pub(crate) not_flat: Vec<String>,
}

/// The soak's part of the report.
#[derive(Debug, Serialize)]
pub(crate) struct SoakReport {
    /// Seconds between samples.
    pub(crate) every_s: f64,
    /// Connections a process's pool may hold.
    pub(crate) pool_size: u64,
    pub(crate) processes: Vec<ProcessSoak>,
}

impl SoakReport {
    /// Every rule a process broke, named after the process.
    pub(crate) fn violations(&self) -> Vec<String> {
        self.processes
            .iter()
            .flat_map(|p| {
                p.not_flat
                    .iter()
                    .map(move |why| format!("{}: {why}", p.process))
            })
            .collect()
    }

    /// Prints, per process, the first judged sample, the last one and the verdict.
    pub(crate) fn print(&self) {
        println!(
            "  soak: sampled every {:.0} s · pool of {} connections",
            self.every_s, self.pool_size
        );
        for process in &self.processes {
            let (Some(first), Some(last)) = (
                process.samples.get(warm_up(process.samples.len())),
                process.samples.last(),
            ) else {
                println!("    {}: too few samples", process.process);
                continue;
            };
            let peak_db = process
                .samples
                .iter()
                .map(|s| s.db_connections)
                .max()
                .unwrap_or(0);
            let verdict = if process.not_flat.is_empty() {
                "flat".to_owned()
            } else {
                format!("NOT FLAT ({})", process.not_flat.join("; "))
            };
            println!(
                "    {:<11} rss {:.1} → {:.1} MiB · fds {} → {} · db connections {} → {} (peak {}) · {verdict}",
                process.process,
                mib(first.rss_kib),
                mib(last.rss_kib),
                first.fds,
                last.fds,
                first.db_connections,
                last.db_connections,
                peak_db,
            );
        }
    }
}

/// Takes a sample of every process of the fleet each `every`.
pub(crate) struct Sampler {
    every: Duration,
    pool_size: u64,
    started: Instant,
    next: Instant,
    processes: Vec<(String, Vec<Sample>)>,
}

impl Sampler {
    /// A sampler whose first sample is due one `every` from now. Not at once: the
    /// fleet's processes were spawned a moment ago, and a process caught between its
    /// fork and its exec is not yet the program (its resident memory reads a few KiB
    /// and its descriptors are its parent's).
    pub(crate) fn new(every: Duration, pool_size: u64) -> Self {
        let now = Instant::now();
        Self {
            every,
            pool_size,
            started: now,
            next: now + every,
            processes: Vec::new(),
        }
    }

    /// Samples every process of `fleet` if a sample is due.
    pub(crate) fn tick(&mut self, fleet: &Fleet) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next += self.every;
        let at_s = now.duration_since(self.started).as_secs_f64();
        for usage in fleet.usage() {
            let Some(sample) = sample(at_s, &usage) else {
                continue; // exited between the listing and the read: the next one counts
            };
            let name = usage.process;
            match self.processes.iter_mut().find(|(p, _)| *p == name) {
                Some((_, samples)) => samples.push(sample),
                None => self.processes.push((name, vec![sample])),
            }
        }
    }

    /// The samples and the verdict on each process.
    pub(crate) fn report(self) -> SoakReport {
        let pool_size = self.pool_size;
        SoakReport {
            every_s: self.every.as_secs_f64(),
            pool_size,
            processes: self
                .processes
                .into_iter()
                .map(|(process, samples)| ProcessSoak {
                    not_flat: judge(&samples, pool_size),
                    process,
                    samples,
                })
                .collect(),
        }
    }
}

/// How many samples of `n` are the warm-up: a quarter, at least one.
fn warm_up(n: usize) -> usize {
    (n / 4).max(1)
}

/// The rules of the module's documentation that `samples` break.
fn judge(samples: &[Sample], pool_size: u64) -> Vec<String> {
    let mut broken = Vec::new();
    if samples.windows(2).any(|w| w[0].pid != w[1].pid) {
        broken.push("started again during the soak".to_owned());
    }
    if let Some(over) = samples.iter().find(|s| s.db_connections > pool_size) {
        broken.push(format!(
            "{} database connections at {:.0} s, above the pool's {pool_size}",
            over.db_connections, over.at_s
        ));
    }
    let judged = &samples[warm_up(samples.len()).min(samples.len())..];
    if judged.len() < 2 {
        broken.push(format!(
            "{} samples after the warm-up: too few to judge",
            judged.len()
        ));
        return broken;
    }
    let (early, late) = judged.split_at(judged.len() / 2);
    let peak = |part: &[Sample], of: fn(&Sample) -> u64| part.iter().map(of).max().unwrap_or(0);
    let (rss_early, rss_late) = (peak(early, |s| s.rss_kib), peak(late, |s| s.rss_kib));
    let rss_slack = (rss_early / 10).max(4 * 1024);
    if rss_late > rss_early + rss_slack {
        broken.push(format!(
            "resident memory grew from {:.1} to {:.1} MiB",
            mib(rss_early),
            mib(rss_late)
        ));
    }
    let other = |s: &Sample| s.fds.saturating_sub(s.db_connections);
    let (fds_early, fds_late) = (peak(early, other), peak(late, other));
    if fds_late > fds_early + 2 {
        broken.push(format!(
            "file descriptors besides the database's grew from {fds_early} to {fds_late}"
        ));
    }
    broken
}

/// Reads the sample of one process from `/proc`; `None` if it is gone.
fn sample(at_s: f64, usage: &Usage) -> Option<Sample> {
    let rss_kib = rss_kib(usage.pid)?;
    let fds = std::fs::read_dir(format!("/proc/{}/fd", usage.pid))
        .ok()?
        .count() as u64;
    Some(Sample {
        at_s,
        pid: usage.pid,
        rss_kib,
        fds,
        db_connections: usage.db_connections as u64,
    })
}

/// The resident set size (`VmRSS`) of process `pid`, in KiB; `None` if it is gone.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::{Sample, judge};

    fn series(rss_kib: &[u64], fds: u64) -> Vec<Sample> {
        rss_kib
            .iter()
            .enumerate()
            .map(|(i, &rss_kib)| Sample {
                at_s: i as f64 * 60.0,
                pid: 7,
                rss_kib,
                fds,
                db_connections: 3,
            })
            .collect()
    }

    #[test]
    fn memory_that_settles_after_the_warm_up_is_flat() {
        let samples = series(
            &[
                10_000, 30_000, 40_000, 41_000, 40_500, 41_500, 41_000, 42_000,
            ],
            20,
        );
        assert_eq!(judge(&samples, 8), Vec::<String>::new());
    }

    #[test]
    fn memory_that_keeps_growing_is_not() {
        let samples: Vec<u64> = (0..60).map(|minute| 40_000 + minute * 1_000).collect();
        let broken = judge(&series(&samples, 20), 8);
        assert_eq!(broken.len(), 1, "{broken:?}");
        assert!(broken[0].starts_with("resident memory grew"), "{broken:?}");
    }

    #[test]
    fn descriptors_that_pile_up_and_connections_above_the_pool_are_named() {
        let mut samples = series(&[40_000; 12], 20);
        for (i, sample) in samples.iter_mut().enumerate() {
            sample.fds += i as u64;
        }
        samples[5].db_connections = 9;
        samples[5].fds += 6;
        let broken = judge(&samples, 8);
        assert_eq!(broken.len(), 2, "{broken:?}");
        assert!(broken[0].contains("above the pool's 8"), "{broken:?}");
        assert!(broken[1].starts_with("file descriptors"), "{broken:?}");
    }

    #[test]
    fn a_process_started_again_or_sampled_too_little_is_not_flat() {
        let mut samples = series(&[40_000; 8], 20);
        samples[6].pid = 8;
        samples[7].pid = 8;
        assert_eq!(
            judge(&samples, 8),
            vec!["started again during the soak".to_owned()]
        );
        assert!(judge(&samples[..2], 8)[0].contains("too few to judge"));
    }
}
