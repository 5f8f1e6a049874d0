//! Stopping a service: the first SIGTERM or SIGINT asks the parts to finish what they
//! hold; the stop then has `stop_timeout` to complete; a second signal ends the process
//! at once.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Exit status of a stop cut short (by a second signal or the deadline): the parts may
/// have left claims or deliveries unsettled, which their leases and the broker's
/// redelivery take care of.
pub const CUT_SHORT: u8 = 3;

/// The termination signals, listened to from the start of the process.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Listens to SIGTERM and SIGINT: from now on they no longer kill the process.
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT; its name.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Runs `work` (which stops when `stopping` turns true) until it ends or a signal comes;
/// then gives it `deadline` to finish.
///
/// Returns success when the work ended by itself without error or finished within the
/// deadline after the first signal; [`CUT_SHORT`] when a second signal or the deadline
/// cut the stop short; the work's own error otherwise.
pub async fn run_until_signal<F>(
    mut signals: Signals,
    stopping: watch::Sender<bool>,
    deadline: Duration,
    work: F,
) -> anyhow::Result<ExitCode>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let mut work = std::pin::pin!(work);
    let signal = tokio::select! {
        ended = &mut work => return ended.map(|()| ExitCode::SUCCESS),
        signal = signals.next() => signal,
    };
    tracing::info!(
        signal,
        ?deadline,
        "stopping: no new claims or deliveries; finishing those in flight (a second signal stops at once)"
    );
    stopping.send_replace(true);
    tokio::select! {
        ended = &mut work => {
            ended?;
            tracing::info!("stopped cleanly");
            Ok(ExitCode::SUCCESS)
        }
        signal = signals.next() => {
            tracing::warn!(signal, "second signal: stopping at once; unsettled work is taken up again after its lease");
            Ok(ExitCode::from(CUT_SHORT))
        }
        () = tokio::time::sleep(deadline) => {
            tracing::warn!(?deadline, "the stop took longer than its deadline; unsettled work is taken up again after its lease");
            Ok(ExitCode::from(CUT_SHORT))
        }
    }
}

/// A future that completes once `stopping` turns true.
pub fn stopped(stopping: &watch::Sender<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut receiver = stopping.subscribe();
    async move {
        let _ = receiver.wait_for(|stop| *stop).await;
    }
}
