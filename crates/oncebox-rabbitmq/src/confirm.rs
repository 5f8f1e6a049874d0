//! A confirm-mode channel driven by one task: pipelined publishes, each answered only
//! once the broker confirmed it and it is known not to have been returned, and
//! reconnection with backoff.
//!
//! # Why one task, and why the flush
//!
//! lapin hands out a publish's delivery tag and queues its frames in two steps; two
//! publishes racing on two threads could take tags in one order and reach the broker
//! in the other, so that a confirm would be credited to the wrong message. Here every
//! `basic.publish` is started (polled once) by the driver task, one after the other.
//!
//! A mandatory publish that cannot be routed comes back as `basic.return` just before
//! its `basic.ack`. lapin attaches each returned message to the next confirmation it
//! resolves, but a `multiple` ack resolves its confirmations in no particular order, so
//! the returned message may ride on another message's confirmation — possibly one the
//! driver observes *after* the returned message's own. So the driver keeps a ledger of
//! returned message ids, whichever confirmation they came with, and answers a
//! confirmation only when every confirmation of the same ack frame has been seen:
//! either nothing of this channel is outstanding any more, or a `basic.qos` round trip
//! started after the confirmation was seen has completed (lapin handles frames in
//! order, so every ack frame received before the `qos-ok` has been fully handled by
//! then). Under load one round trip settles a whole window of confirmations.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::{FutureExt, Stream};
use lapin::options::{BasicPublishOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation};
use oncebox_core::{Bytes, Error, MessageId, Result};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Sleep;

use crate::connection::Link;
use crate::error::{RabbitError, publish_error};
use crate::options::Settings;

/// The header a publish without a `message_id` property gets, so that a return of it
/// can be recognised (only dead-letter copies of foreign messages lack an id).
pub(crate) const PUBLISH_ID_HEADER: &str = "x-oncebox-publish-id";

/// How many publishes may wait for the driver to take them.
const QUEUE: usize = 4096;

/// How many waiting publishes the driver takes at once.
const BATCH: usize = 256;

/// One publish: where to and what.
pub(crate) struct Outgoing {
    pub(crate) exchange: ShortString,
    pub(crate) routing_key: ShortString,
    pub(crate) properties: BasicProperties,
    pub(crate) body: Bytes,
}

/// What a confirm link is for: its connection's name, and whether it publishes to the
/// configured exchange (declared or checked on every connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Publisher,
    DeadLetters,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Publisher => "publisher",
            Self::DeadLetters => "dead letters",
        }
    }
}

/// The handle to a driver task. Cheap to clone; the task ends when every handle is
/// gone and every publish in flight is answered.
#[derive(Clone)]
pub(crate) struct ConfirmLink {
    requests: mpsc::Sender<(Outgoing, oneshot::Sender<Result<()>>)>,
    settings: Arc<Settings>,
}

impl ConfirmLink {
    /// Connects (failing if the first connection fails) and starts the driver task.
    pub(crate) async fn start(settings: Arc<Settings>, role: Role) -> Result<Self> {
        let link = connect(&settings, role).await?;
        let (requests, receiver) = mpsc::channel(QUEUE);
        let driver = Driver::new(Arc::clone(&settings), role, link);
        tokio::spawn(driver.run(receiver));
        Ok(Self { requests, settings })
    }

    /// Publishes and waits for the answer: the confirm, or why there is none.
    pub(crate) async fn publish(&self, outgoing: Outgoing) -> Result<()> {
        let (answer, answered) = oneshot::channel();
        let timeout = self.settings.confirm_timeout;
        let exchanged = async {
            self.requests
                .send((outgoing, answer))
                .await
                .map_err(|_| stopped())?;
            answered.await.map_err(|_| stopped())?
        };
        match tokio::time::timeout(timeout, exchanged).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}

fn stopped() -> Error {
    RabbitError::Disconnected {
        reason: "the connection task stopped".into(),
    }
    .transient()
}

/// Opens a link for `role`: connection, confirm channel, and the exchange if it
/// publishes to one.
async fn connect(settings: &Arc<Settings>, role: Role) -> Result<Link> {
    crate::connection::setting_up(settings, move |settings, node| async move {
        let settings = &*settings;
        let link = Link::open(settings, node, role.name()).await?;
        link.confirm().await?;
        if role == Role::Publisher {
            link.exchange(settings).await?;
        }
        Ok(link)
    })
    .await
}

/// A publish the driver has not answered yet.
struct Pending {
    /// The `message_id` (or publish id) a return of it carries.
    key: String,
    exchange: ShortString,
    routing_key: ShortString,
    body_size: usize,
    answer: oneshot::Sender<Result<()>>,
}

/// A returned message, from the `basic.return` that preceded its confirm.
struct Returned {
    reply_code: u16,
    reply_text: String,
}

type Seq = u64;

/// The connection state of the driver.
enum State {
    Up(Box<Up>),
    Connecting(BoxFuture<'static, Result<Link>>),
    Down(Pin<Box<Sleep>>),
}

struct Up {
    link: Link,
    /// The link's channel, shared by the publishes in flight.
    channel: Arc<lapin::Channel>,
    events: Pin<Box<dyn Stream<Item = lapin::Event> + Send>>,
}

/// What changed in the connection state.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per state change and unpacked at once, never stored"
)]
enum Transition {
    Connected(Result<Link>),
    RetryDue,
    Failed(lapin::Error),
}

impl State {
    async fn transition(&mut self) -> Transition {
        match self {
            Self::Up(up) => loop {
                match up.events.next().await {
                    Some(lapin::Event::Error(error)) => return Transition::Failed(error),
                    Some(lapin::Event::ConnectionBlocked(reason)) => {
                        tracing::warn!(%reason, "RabbitMQ blocked the publishing connection");
                    }
                    Some(lapin::Event::ConnectionUnblocked) => {
                        tracing::info!("RabbitMQ unblocked the publishing connection");
                    }
                    Some(_) => {}
                    None => std::future::pending::<()>().await,
                }
            },
            Self::Connecting(connecting) => Transition::Connected(connecting.await),
            Self::Down(sleep) => {
                sleep.as_mut().await;
                Transition::RetryDue
            }
        }
    }
}

struct Driver {
    settings: Arc<Settings>,
    role: Role,
    state: State,
    /// Consecutive failed connection attempts.
    failures: u32,
    /// Why the last connection ended or attempt failed.
    last_error: String,
    next_seq: Seq,
    pending: HashMap<Seq, Pending>,
    /// Publishes being written or waiting for the broker's confirm.
    inflight: FuturesUnordered<BoxFuture<'static, (Seq, lapin::Result<Confirmation>)>>,
    /// Confirmed (`true`) or nacked publishes, in the order seen, waiting to be answered.
    resolved: VecDeque<(Seq, bool)>,
    /// The `basic.qos` round trip under way, and how many of `resolved` (from the
    /// front) it settles.
    flush: Option<(BoxFuture<'static, lapin::Result<()>>, usize)>,
    /// Returned messages by key, not yet matched to their publish.
    returned: HashMap<String, Vec<Returned>>,
    /// Publishes received while connecting, sent once connected.
    waiting: Vec<(Outgoing, oneshot::Sender<Result<()>>)>,
}

impl Driver {
    fn new(settings: Arc<Settings>, role: Role, link: Link) -> Self {
        Self {
            settings,
            role,
            state: up(link),
            failures: 0,
            last_error: String::new(),
            next_seq: 0,
            pending: HashMap::new(),
            inflight: FuturesUnordered::new(),
            resolved: VecDeque::new(),
            flush: None,
            returned: HashMap::new(),
            waiting: Vec::new(),
        }
    }

    async fn run(mut self, mut requests: mpsc::Receiver<(Outgoing, oneshot::Sender<Result<()>>)>) {
        let mut open = true;
        let mut received = Vec::with_capacity(BATCH);
        while open || !self.pending.is_empty() || !self.waiting.is_empty() {
            tokio::select! {
                count = requests.recv_many(&mut received, BATCH), if open => {
                    if count == 0 {
                        open = false;
                    }
                    for (outgoing, answer) in received.drain(..) {
                        self.accept(outgoing, answer);
                    }
                }
                Some((seq, confirmed)) = self.inflight.next(), if !self.inflight.is_empty() => {
                    self.confirmed(seq, confirmed);
                }
                flushed = flush(&mut self.flush), if self.flush.is_some() => self.flushed(flushed),
                transition = self.state.transition() => self.transit(transition),
            }
            self.collect_ready();
            self.settle();
        }
        if let State::Up(up) = self.state {
            up.link.close().await;
        }
    }

    /// Takes a publish request: publishes it, holds it while connecting, or fails it
    /// while waiting to reconnect.
    fn accept(&mut self, outgoing: Outgoing, answer: oneshot::Sender<Result<()>>) {
        match &self.state {
            State::Up(up) if up.link.channel.status().connected() => {
                let channel = Arc::clone(&up.channel);
                self.publish(channel, outgoing, answer);
            }
            State::Up(_) => {
                self.waiting.push((outgoing, answer));
                self.fail("the channel was closed".to_owned(), None);
            }
            State::Connecting(_) => self.waiting.push((outgoing, answer)),
            State::Down(_) => {
                let reason = self.last_error.clone();
                let _ = answer.send(Err(RabbitError::Disconnected { reason }.transient()));
            }
        }
    }

    fn publish(
        &mut self,
        channel: Arc<lapin::Channel>,
        mut outgoing: Outgoing,
        answer: oneshot::Sender<Result<()>>,
    ) {
        let key = match outgoing.properties.message_id() {
            Some(id) => id.to_string(),
            None => {
                let id = MessageId::new().to_string();
                outgoing.properties = with_publish_id(outgoing.properties, &id);
                id
            }
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.insert(
            seq,
            Pending {
                key,
                exchange: outgoing.exchange.clone(),
                routing_key: outgoing.routing_key.clone(),
                body_size: outgoing.body.len(),
                answer,
            },
        );
        let mut publish: BoxFuture<'static, (Seq, lapin::Result<Confirmation>)> =
            Box::pin(async move {
                let options = BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                };
                let written = channel
                    .basic_publish(
                        outgoing.exchange,
                        outgoing.routing_key,
                        options,
                        &outgoing.body,
                        outgoing.properties,
                    )
                    .await;
                match written {
                    Ok(confirm) => (seq, confirm.await),
                    Err(error) => (seq, Err(error)),
                }
            });
        // The first poll takes the delivery tag and queues the frames; doing it here,
        // in order, keeps tags and frames in the same order (see the module docs).
        match (&mut publish).now_or_never() {
            Some((seq, confirmed)) => self.confirmed(seq, confirmed),
            None => self.inflight.push(publish),
        }
    }

    fn confirmed(&mut self, seq: Seq, confirmed: lapin::Result<Confirmation>) {
        match confirmed {
            Ok(confirmation) => self.record(seq, confirmation),
            Err(error) => self.fail(error.to_string(), Some(&error)),
        }
    }

    /// Notes a confirmation and the returned message it carries, if any.
    fn record(&mut self, seq: Seq, confirmation: Confirmation) {
        let (acked, returned) = match confirmation {
            Confirmation::Ack(returned) => (true, returned),
            Confirmation::Nack(returned) => (false, returned),
            Confirmation::NotRequested => (false, None),
        };
        if let Some(message) = returned {
            let key = message
                .properties
                .message_id()
                .as_ref()
                .map(ToString::to_string)
                .or_else(|| publish_id(&message.properties));
            match key {
                Some(key) => self.returned.entry(key).or_default().push(Returned {
                    reply_code: message.reply_code,
                    reply_text: message.reply_text.to_string(),
                }),
                None => tracing::warn!(
                    routing_key = %message.routing_key,
                    "RabbitMQ returned a message this publisher cannot match"
                ),
            }
        }
        self.resolved.push_back((seq, acked));
    }

    /// Takes every confirmation already resolved, without waiting.
    fn collect_ready(&mut self) {
        while let Some(Some((seq, confirmed))) = self.inflight.next().now_or_never() {
            self.confirmed(seq, confirmed);
        }
    }

    /// Answers what can be answered, or starts the round trip that will allow it.
    fn settle(&mut self) {
        if self.resolved.is_empty() {
            return;
        }
        if self.inflight.is_empty() {
            // Nothing of this channel is outstanding: every return has been seen.
            self.answer(self.resolved.len());
            if let Some((_, settles)) = &mut self.flush {
                *settles = 0;
            }
            return;
        }
        if self.flush.is_some() {
            return;
        }
        if let State::Up(up) = &self.state {
            let channel = Arc::clone(&up.channel);
            let round_trip: BoxFuture<'static, lapin::Result<()>> =
                Box::pin(async move { channel.basic_qos(0, BasicQosOptions::default()).await });
            self.flush = Some((round_trip, self.resolved.len()));
        }
    }

    fn flushed(&mut self, flushed: lapin::Result<()>) {
        let settles = self.flush.take().map_or(0, |(_, settles)| settles);
        match flushed {
            Ok(()) => {
                self.collect_ready();
                self.answer(settles);
            }
            Err(error) => self.fail(error.to_string(), Some(&error)),
        }
    }

    /// Answers the first `count` resolved publishes.
    fn answer(&mut self, count: usize) {
        for (seq, acked) in self.resolved.drain(..count.min(self.resolved.len())) {
            let Some(pending) = self.pending.remove(&seq) else {
                continue;
            };
            let returned = self.returned.get_mut(&pending.key).and_then(Vec::pop);
            let result = match (returned, acked) {
                (Some(returned), _) => Err(RabbitError::Unroutable {
                    exchange: pending.exchange.to_string(),
                    routing_key: pending.routing_key.to_string(),
                    reply_code: returned.reply_code,
                    reply_text: returned.reply_text,
                }
                .transient()),
                (None, true) => Ok(()),
                (None, false) => Err(RabbitError::Nacked {
                    exchange: pending.exchange.to_string(),
                    routing_key: pending.routing_key.to_string(),
                }
                .transient()),
            };
            let _ = pending.answer.send(result);
        }
        if self.pending.is_empty() {
            self.returned.clear();
        } else {
            self.returned.retain(|_, returns| !returns.is_empty());
        }
    }

    /// The channel or connection failed: answers what the broker confirmed before,
    /// fails everything else in flight with the error, drops the link and reconnects.
    fn fail(&mut self, reason: String, error: Option<&lapin::Error>) {
        if matches!(self.state, State::Up(_)) {
            tracing::warn!(role = self.role.name(), %reason, "RabbitMQ channel failed; reconnecting");
        }
        // lapin handled every frame received before the failure: the confirmations
        // resolved by then, with their returns, are final.
        self.collect_resolved();
        self.answer(self.resolved.len());
        for (_, pending) in self.pending.drain() {
            let answer = match error {
                Some(error) => publish_error(error, pending.exchange.as_str(), pending.body_size),
                None => RabbitError::Disconnected {
                    reason: reason.clone(),
                }
                .transient(),
            };
            let _ = pending.answer.send(Err(answer));
        }
        self.inflight.clear();
        self.flush = None;
        self.returned.clear();
        self.last_error = reason;
        // Dropping the old link closes it; connect again at once the first time.
        self.state = self.connecting();
    }

    /// Records the confirmations already resolved, ignoring failed ones (the caller
    /// fails them).
    fn collect_resolved(&mut self) {
        while let Some(Some((seq, confirmed))) = self.inflight.next().now_or_never() {
            if let Ok(confirmation) = confirmed {
                self.record(seq, confirmation);
            }
        }
    }

    fn connecting(&self) -> State {
        let settings = Arc::clone(&self.settings);
        let role = self.role;
        State::Connecting(Box::pin(async move { connect(&settings, role).await }))
    }

    fn transit(&mut self, transition: Transition) {
        match transition {
            Transition::Failed(error) => self.fail(error.to_string(), Some(&error)),
            Transition::RetryDue => self.state = self.connecting(),
            Transition::Connected(Ok(link)) => {
                if self.failures > 0 || !self.last_error.is_empty() {
                    tracing::info!(role = self.role.name(), "reconnected to RabbitMQ");
                }
                self.failures = 0;
                self.state = up(link);
                for (outgoing, answer) in std::mem::take(&mut self.waiting) {
                    self.accept(outgoing, answer);
                }
            }
            Transition::Connected(Err(error)) => {
                self.failures = self.failures.saturating_add(1);
                let delay = self.settings.reconnect.delay(self.failures);
                tracing::warn!(role = self.role.name(), %error, ?delay, "cannot reconnect to RabbitMQ");
                self.last_error = error.to_string();
                for (_, answer) in self.waiting.drain(..) {
                    let reason = self.last_error.clone();
                    let _ = answer.send(Err(RabbitError::Disconnected { reason }.transient()));
                }
                self.state = State::Down(Box::pin(tokio::time::sleep(delay)));
            }
        }
    }
}

fn up(link: Link) -> State {
    let events = Box::pin(link.connection.events_listener());
    let channel = Arc::new(link.channel.clone());
    State::Up(Box::new(Up {
        link,
        channel,
        events,
    }))
}

/// Awaits the flush under way (the caller checks there is one).
async fn flush(
    flush: &mut Option<(BoxFuture<'static, lapin::Result<()>>, usize)>,
) -> lapin::Result<()> {
    match flush {
        Some((round_trip, _)) => round_trip.await,
        None => std::future::pending().await,
    }
}

fn with_publish_id(properties: BasicProperties, id: &str) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        ShortString::from(PUBLISH_ID_HEADER),
        AMQPValue::LongString(LongString::from(id)),
    );
    properties.with_headers(headers)
}

fn publish_id(properties: &BasicProperties) -> Option<String> {
    let headers: &FieldTable = properties.headers().as_ref()?;
    headers
        .inner()
        .get(PUBLISH_ID_HEADER)
        .and_then(crate::codec::string)
}
