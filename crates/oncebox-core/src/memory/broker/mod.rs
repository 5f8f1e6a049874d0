//! An in-process broker that behaves like a real at-least-once broker, and misbehaves on
//! request.

mod client;
mod faults;
mod group;
mod stats;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Coordinates, Error, Limits, Message, Received, Result};

pub use client::{MemoryDelivery, MemoryPublisher, MemorySubscriber};
pub use faults::Faults;
pub use stats::BrokerStats;

use faults::Dice;
use group::{Env, Group, Handout, Poll, Token};

/// A broker in process memory with the semantics of a durable at-least-once broker
/// (a JetStream stream with durable consumers, Kafka topics with consumer groups).
///
/// - **Topics** keep every message published, in order, for as long as the broker lives.
///   [`MemoryBroker::published`] returns that log.
/// - **Groups**: [`MemoryBroker::subscribe`] joins a consumer group on a topic. Each group
///   gets every message of the topic, those published before it was created included;
///   within a group each message goes to one subscriber at a time.
/// - **Order**: without faults or redeliveries a group hands out messages in publish
///   order.
/// - **Settling**: a delivery is acked, nacked (redelivered after a delay) or
///   dead-lettered; one neither settled in time (the ack timeout, 30 s by default) nor
///   settled at all is redelivered. A late settlement, after the ack timeout, is
///   accepted and ignored, as brokers do.
/// - **Faults**: [`MemoryBroker::set_faults`] drops, duplicates and delays deliveries,
///   [`MemoryBroker::set_down`] simulates an outage. No confirmed message is ever lost.
///
/// Clones share the same broker. Times follow `tokio::time`, so tests with a paused
/// clock run through ack timeouts instantly.
///
/// ```
/// use std::time::Duration;
/// use oncebox_core::memory::MemoryBroker;
/// use oncebox_core::{Delivery, Message, Publisher, Subscriber};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> oncebox_core::Result<()> {
/// let broker = MemoryBroker::with_ack_timeout(Duration::from_secs(5));
/// let mut payments = broker.subscribe("orders", "payments");
/// broker.publisher().publish(&Message::new("orders", "order 42")).await?;
/// let delivery = payments.next().await?;
/// assert_eq!(&delivery.received().payload[..], b"order 42");
/// delivery.ack().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryBroker {
    shared: Arc<Shared>,
}

impl MemoryBroker {
    /// A broker with an ack timeout of 30 seconds.
    pub fn new() -> Self {
        Self::with_ack_timeout(Duration::from_secs(30))
    }

    /// A broker that redelivers a delivery not settled within `ack_timeout`.
    pub fn with_ack_timeout(ack_timeout: Duration) -> Self {
        let state = State {
            down: false,
            dice: Dice::new(),
            stats: BrokerStats::default(),
            topics: HashMap::new(),
        };
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                wake: Notify::new(),
                ack_timeout,
            }),
        }
    }

    /// The ack timeout this broker was created with.
    pub fn ack_timeout(&self) -> Duration {
        self.shared.ack_timeout
    }

    /// A publisher to any topic of this broker.
    pub fn publisher(&self) -> MemoryPublisher {
        MemoryPublisher::new(Arc::clone(&self.shared))
    }

    /// Joins consumer group `group` on `topic`, creating either if needed.
    ///
    /// A new group starts at the beginning of the topic's log. Subscribers of the same
    /// group share its messages; a group lives as long as the broker, so a subscriber
    /// that is dropped and replaced (a consumer restart) resumes where the group was.
    pub fn subscribe(&self, topic: &str, group: &str) -> MemorySubscriber {
        {
            let mut state = self.shared.lock();
            let topic = state.topics.entry(topic.to_owned()).or_default();
            if let Entry::Vacant(vacant) = topic.groups.entry(group.to_owned()) {
                let now = Instant::now();
                let group = vacant.insert(Group::default());
                for seq in 1..=topic.log.len() as u64 {
                    group.enqueue(seq, now);
                }
            }
        }
        MemorySubscriber::new(Arc::clone(&self.shared), topic, group)
    }

    /// Sets the faults injected from now on ([`Faults::none`] to stop).
    pub fn set_faults(&self, faults: Faults) {
        self.shared.lock().dice.set_faults(faults);
    }

    /// Seeds the random source of fault injection, so that a run can be repeated (as far
    /// as the order in which subscribers ask is repeatable).
    #[doc(alias = "seed")]
    pub fn set_seed(&self, seed: u64) {
        self.shared.lock().dice.seed(seed);
    }

    /// Takes the broker down or brings it back up.
    ///
    /// While down, publishing and settling fail with a transient transport error and
    /// subscribers receive nothing (they wait). The broker keeps its state: when it is
    /// back, deliveries that were in flight are redelivered once their ack timeout has
    /// passed, and every confirmed message is still there.
    pub fn set_down(&self, down: bool) {
        self.shared.lock().down = down;
        self.shared.wake.notify_waiters();
    }

    /// Whether the broker is down (see [`MemoryBroker::set_down`]).
    pub fn is_down(&self) -> bool {
        self.shared.lock().down
    }

    /// What the broker did so far.
    pub fn stats(&self) -> BrokerStats {
        self.shared.lock().stats.clone()
    }

    /// The log of `topic`: every message published to it, in publish order, re-publishes
    /// of the same id included.
    pub fn published(&self, topic: &str) -> Vec<Message> {
        self.shared
            .lock()
            .topics
            .get(topic)
            .map(|t| t.log.clone())
            .unwrap_or_default()
    }

    /// The messages of `topic` that were dead-lettered (by any group), with their reasons,
    /// in the order they were dead-lettered.
    pub fn dead_letters(&self, topic: &str) -> Vec<(Received, String)> {
        self.shared
            .lock()
            .topics
            .get(topic)
            .map(|t| t.dead_letters.clone())
            .unwrap_or_default()
    }

    /// How many messages of `topic` group `group` has neither acked nor dead-lettered
    /// (waiting or in flight). For a group not created yet, the length of the topic log:
    /// it would receive them all.
    pub fn unsettled(&self, topic: &str, group: &str) -> usize {
        let state = self.shared.lock();
        let Some(topic) = state.topics.get(topic) else {
            return 0;
        };
        topic
            .groups
            .get(group)
            .map_or(topic.log.len(), Group::unsettled)
    }
}

impl Default for MemoryBroker {
    /// [`MemoryBroker::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("MemoryBroker")
            .field("ack_timeout", &self.shared.ack_timeout)
            .field("down", &state.down)
            .field("topics", &state.topics.len())
            .field("stats", &state.stats)
            .finish_non_exhaustive()
    }
}

/// The broker behind every handle: its state and the signal that wakes subscribers.
struct Shared {
    state: Mutex<State>,
    /// Notified on every change that can make a delivery due sooner than a waiting
    /// subscriber expects: a publish, a nack, the broker coming back up.
    wake: Notify,
    ack_timeout: Duration,
}

struct State {
    down: bool,
    dice: Dice,
    stats: BrokerStats,
    topics: HashMap<String, Topic>,
}

#[derive(Default)]
struct Topic {
    log: Vec<Message>,
    groups: HashMap<String, Group>,
    dead_letters: Vec<(Received, String)>,
}

/// How a subscriber's delivery is settled.
enum Settlement<'a> {
    Ack,
    Nack(Duration),
    DeadLetter {
        received: &'a Received,
        reason: &'a str,
    },
}

/// The answer of [`Shared::poll`].
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per delivery and unpacked at once, never stored"
)]
enum Polled {
    Ready { token: Token, received: Received },
    Wait(Option<Instant>),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update below leaves the state consistent before anything that could
        // panic, so a poisoned lock holds a usable state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, message: &Message) -> Result<()> {
        message
            .validate(&Limits::new())
            .map_err(Error::transport_permanent)?;
        {
            let mut state = self.lock();
            if state.down {
                return Err(broker_down());
            }
            let now = Instant::now();
            state.stats.published += 1;
            let topic = state.topics.entry(message.topic.clone()).or_default();
            topic.log.push(message.clone());
            let seq = topic.log.len() as u64;
            for group in topic.groups.values_mut() {
                group.enqueue(seq, now);
            }
        }
        self.wake.notify_waiters();
        Ok(())
    }

    fn poll(&self, topic: &str, group: &str) -> Polled {
        let mut state = self.lock();
        let State {
            down,
            dice,
            stats,
            topics,
        } = &mut *state;
        if *down {
            return Polled::Wait(None);
        }
        let Some(topic_state) = topics.get_mut(topic) else {
            return Polled::Wait(None);
        };
        let Some(group) = topic_state.groups.get_mut(group) else {
            return Polled::Wait(None);
        };
        let mut env = Env {
            now: Instant::now(),
            ack_timeout: self.ack_timeout,
            dice,
            stats,
        };
        match group.poll(&mut env) {
            Poll::Wait(until) => Polled::Wait(until),
            Poll::Ready(Handout {
                seq,
                token,
                delivery_count,
            }) => {
                let coordinates = Coordinates {
                    source: topic.to_owned(),
                    partition: None,
                    position: seq.to_string(),
                };
                // Positions come from the log itself, so the index is always in range.
                let index = usize::try_from(seq - 1).unwrap_or(usize::MAX);
                match topic_state.log.get(index) {
                    Some(message) => Polled::Ready {
                        token,
                        received: Received::from_message(message, coordinates, delivery_count),
                    },
                    None => Polled::Wait(None),
                }
            }
        }
    }

    fn settle(
        &self,
        topic: &str,
        group: &str,
        token: Token,
        settlement: Settlement<'_>,
    ) -> Result<()> {
        let nacked = matches!(settlement, Settlement::Nack(_));
        {
            let mut state = self.lock();
            let State {
                down,
                stats,
                topics,
                ..
            } = &mut *state;
            if *down {
                return Err(broker_down());
            }
            let now = Instant::now();
            let topic = topics.get_mut(topic);
            let Some((group, dead_letters)) =
                topic.and_then(|t| Some((t.groups.get_mut(group)?, &mut t.dead_letters)))
            else {
                stats.stale_settlements += 1;
                return Ok(());
            };
            let live = match settlement {
                Settlement::Ack => group.settle(token, now).then(|| stats.acked += 1),
                Settlement::Nack(delay) => group.nack(token, delay, now).then(|| stats.nacked += 1),
                Settlement::DeadLetter { received, reason } => {
                    group.settle(token, now).then(|| {
                        stats.dead_lettered += 1;
                        dead_letters.push((received.clone(), reason.to_owned()));
                    })
                }
            };
            if live.is_none() {
                stats.stale_settlements += 1;
            }
        }
        if nacked {
            self.wake.notify_waiters();
        }
        Ok(())
    }
}

fn broker_down() -> Error {
    Error::transport_transient("the in-memory broker is down (fault injection)")
}
