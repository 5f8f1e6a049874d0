//! Crash injection for the demo: a publisher that dies between publish and mark, a
//! consumer that dies between commit and ack.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use oncebox::{Delivery, Message, Publisher, Received, Result, Subscriber};
use tokio::sync::Notify;

/// Decides, at each chance, whether the process "crashes" there: at one forced chance
/// (so every run has at least one crash) and then at random with `probability`.
pub(crate) struct CrashSwitch {
    rng: Mutex<fastrand::Rng>,
    probability: f64,
    forced_at: u64,
    chances: AtomicU64,
    enabled: AtomicBool,
    crashed: Notify,
}

impl CrashSwitch {
    pub(crate) fn new(seed: u64, probability: f64, forced_at: u64) -> Self {
        Self {
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            probability,
            forced_at,
            chances: AtomicU64::new(0),
            enabled: AtomicBool::new(true),
            crashed: Notify::new(),
        }
    }

    /// Stops crashing (for the final drain).
    pub(crate) fn disable(&self) {
        self.enabled.store(false, Ordering::SeqCst);
    }

    /// Rolls the dice at one chance; on a hit, signals the supervisor and returns `true`.
    fn roll(&self) -> bool {
        if !self.enabled.load(Ordering::SeqCst) {
            return false;
        }
        let chance = self.chances.fetch_add(1, Ordering::SeqCst);
        let draw = self.rng.lock().map(|mut rng| rng.f64()).unwrap_or(1.0);
        let hit = chance == self.forced_at || draw < self.probability;
        if hit {
            self.crashed.notify_one();
        }
        hit
    }

    /// Completes when a crash was signalled.
    pub(crate) async fn crashed(&self) {
        self.crashed.notified().await;
    }
}

/// Publishes through the inner publisher; at a crash, the broker has the message but the
/// relay never hears back, so the outbox row is never marked published.
pub(crate) struct CrashingPublisher<P> {
    pub(crate) inner: P,
    pub(crate) switch: std::sync::Arc<CrashSwitch>,
}

impl<P: Publisher> Publisher for CrashingPublisher<P> {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.inner.publish(message).await?;
        if self.switch.roll() {
            // Hang until the supervisor drops the whole relay: a process that died here.
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}

/// Hands out deliveries whose ack can "crash" after the handler's transaction committed.
pub(crate) struct CrashingSubscriber<S> {
    pub(crate) inner: S,
    pub(crate) switch: std::sync::Arc<CrashSwitch>,
}

impl<S: Subscriber> Subscriber for CrashingSubscriber<S> {
    type Delivery = CrashingDelivery<S::Delivery>;

    async fn next(&mut self) -> Result<Self::Delivery> {
        let inner = self.inner.next().await?;
        Ok(CrashingDelivery {
            inner,
            switch: std::sync::Arc::clone(&self.switch),
        })
    }
}

/// A delivery whose `ack` may never reach the broker.
pub(crate) struct CrashingDelivery<D> {
    inner: D,
    switch: std::sync::Arc<CrashSwitch>,
}

impl<D: Delivery> Delivery for CrashingDelivery<D> {
    fn received(&self) -> &Received {
        self.inner.received()
    }

    async fn ack(self) -> Result<()> {
        if self.switch.roll() {
            std::future::pending::<()>().await;
        }
        self.inner.ack().await
    }

    async fn nack(self, delay: std::time::Duration) -> Result<()> {
        self.inner.nack(delay).await
    }

    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.inner.dead_letter(reason).await
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}
