//! Opening connections and declaring what the transport needs: the exchange, a
//! group's queue and dead queue.

use lapin::options::{
    BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::future::Future;
use std::sync::Arc;

use lapin::{Channel, Connection, ConnectionProperties};
use oncebox_core::Result;

use crate::error::{RabbitError, setup_error};
use crate::options::Settings;

/// Runs `setup` (opening a [`Link`] to the node of the index it is given and declaring
/// what it needs) on each node in turn until it succeeds on one, each attempt within
/// the connect timeout. A broker that is starting accepts connections before it answers
/// on them (seen while RabbitMQ restarts its application): without the bound, a
/// reconnecting subscriber would wait there for good, holding its prefetched
/// deliveries.
///
/// Each attempt runs in a task of its own, which an expired timeout (or a caller that
/// drops this future) leaves running: what it sets up is dropped, and so closed, once
/// it is. Dropped half-way, a link stays open: lapin keeps a connection whose
/// `basic.consume` is unanswered, and the consumer the broker then registers is handed
/// deliveries that no one reads or requeues while the process lives.
///
/// # Errors
///
/// With one node, the errors of `setup` and a transient
/// [`RabbitError::ConnectTimeout`]. With several, when every node failed,
/// [`RabbitError::NoNodeReachable`] with each node's error, transient unless every
/// node refused for good (credentials, permissions, arguments of an existing queue).
pub(crate) async fn setting_up<T, F>(
    settings: &Arc<Settings>,
    setup: impl Fn(Arc<Settings>, usize) -> F,
) -> Result<T>
where
    F: Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let mut failures = Vec::new();
    for (index, node) in settings.nodes_in_turn() {
        let mut attempt = tokio::spawn(setup(Arc::clone(settings), index));
        let error = match tokio::time::timeout(settings.connect_timeout, &mut attempt).await {
            Ok(Ok(Ok(value))) => {
                settings.connected_to(index);
                return Ok(value);
            }
            Ok(Ok(Err(error))) => error,
            Ok(Err(join)) => oncebox_core::Error::TaskLost(format!(
                "connecting to RabbitMQ at {} ({join})",
                node.url
            )),
            Err(_) => setup_error(RabbitError::ConnectTimeout {
                url: node.url.clone(),
                timeout: settings.connect_timeout,
            }),
        };
        if settings.nodes.len() > 1 {
            tracing::debug!(node = %node.url, %error, "cannot connect to this RabbitMQ node; trying the next");
        }
        failures.push((node.url.clone(), error));
    }
    if failures.len() == 1
        && let Some((_, error)) = failures.pop()
    {
        return Err(error);
    }
    let transient = failures.iter().any(|(_, error)| error.is_transient());
    let error = RabbitError::NoNodeReachable { failures };
    Err(if transient {
        error.transient()
    } else {
        error.permanent()
    })
}

/// A connection with the one channel the transport uses on it.
///
/// Dropping it closes both (lapin closes a channel when its last handle goes, and the
/// connection with its last channel); the broker then requeues every delivery that
/// was not acked on them.
pub(crate) struct Link {
    pub(crate) connection: Connection,
    pub(crate) channel: Channel,
}

impl Link {
    /// Opens a connection to node `index` for `role` (named in the management UI) and
    /// a channel on it. Unbounded in time: callers run it in [`setting_up`].
    ///
    /// # Errors
    ///
    /// Transient when the broker cannot be reached, permanent when it refuses the
    /// credentials or the vhost.
    pub(crate) async fn open(settings: &Settings, index: usize, role: &str) -> Result<Self> {
        let node = settings.node(index);
        let name = format!("{} ({role})", settings.connection_name);
        let properties =
            ConnectionProperties::default().with_connection_name(LongString::from(name));
        let connection = Connection::connect_uri(node.uri.clone(), properties)
            .await
            .map_err(|source| {
                setup_error(RabbitError::Connect {
                    url: node.url.clone(),
                    source,
                })
            })?;
        let channel = connection.create_channel().await.map_err(|source| {
            setup_error(RabbitError::Channel {
                action: "opening a channel",
                source,
            })
        })?;
        Ok(Self {
            connection,
            channel,
        })
    }

    /// Puts the channel in confirm mode.
    pub(crate) async fn confirm(&self) -> Result<()> {
        self.channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|source| {
                setup_error(RabbitError::Channel {
                    action: "enabling publisher confirms",
                    source,
                })
            })
    }

    /// Declares the exchange, or checks that it exists if the options say not to
    /// declare it.
    pub(crate) async fn exchange(&self, settings: &Settings) -> Result<()> {
        let options = ExchangeDeclareOptions {
            passive: !settings.declare_exchange,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = self
            .channel
            .exchange_declare(
                settings.exchange.clone(),
                settings.exchange_kind.to_lapin(),
                options,
                FieldTable::default(),
            )
            .await;
        declared.map_err(|source| {
            let error = if crate::error::is_soft(&source, lapin::protocol::AMQPSoftError::NOTFOUND)
            {
                RabbitError::ExchangeNotFound {
                    exchange: settings.exchange.to_string(),
                    vhost: settings.vhost.clone(),
                    source,
                }
            } else {
                RabbitError::Topology {
                    action: format!("declare exchange {:?}", settings.exchange.as_str()),
                    source,
                }
            };
            setup_error(error)
        })
    }

    /// Declares the queue of group `queue` and its dead queue, and binds the queue to
    /// the exchange for `topic`.
    pub(crate) async fn group(&self, settings: &Settings, names: &GroupNames) -> Result<()> {
        let dead_arguments = queue_type_argument(settings);
        self.declare_queue(&names.dead, dead_arguments).await?;
        let mut arguments = queue_type_argument(settings);
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from("")),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(LongString::from(names.dead.as_str())),
        );
        if settings.queue_type == crate::QueueType::Quorum
            && let Some(limit) = settings.delivery_limit
        {
            arguments.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(limit)),
            );
        }
        self.declare_queue(&names.queue, arguments).await?;
        self.channel
            .queue_bind(
                names.queue.clone(),
                settings.exchange.clone(),
                names.topic.clone(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|source| {
                let action = format!(
                    "bind queue {:?} to exchange {:?} for {:?}",
                    names.queue.as_str(),
                    settings.exchange.as_str(),
                    names.topic.as_str()
                );
                setup_error(RabbitError::Topology { action, source })
            })
    }

    async fn declare_queue(&self, queue: &ShortString, arguments: FieldTable) -> Result<()> {
        self.channel
            .queue_declare(queue.clone(), QueueDeclareOptions::durable(), arguments)
            .await
            .map(drop)
            .map_err(|source| {
                let action = format!("declare queue {:?}", queue.as_str());
                setup_error(RabbitError::Topology { action, source })
            })
    }

    /// Sets the channel's prefetch.
    pub(crate) async fn prefetch(&self, count: u16) -> Result<()> {
        self.channel
            .basic_qos(count, BasicQosOptions::default())
            .await
            .map_err(|source| {
                setup_error(RabbitError::Channel {
                    action: "setting the prefetch",
                    source,
                })
            })
    }

    /// Closes the channel and the connection politely (the broker requeues what was
    /// not acked), ignoring failures: the connection may be gone already.
    pub(crate) async fn close(self) {
        let _ = self.channel.close(200, "closing".into()).await;
        let _ = self.connection.close(200, "closing".into()).await;
    }
}

fn queue_type_argument(settings: &Settings) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from(settings.queue_type.name())),
    );
    arguments
}

/// The names a subscription uses: its topic (the binding's routing key), its group's
/// queue and dead queue.
#[derive(Debug, Clone)]
pub(crate) struct GroupNames {
    pub(crate) topic: ShortString,
    pub(crate) queue: ShortString,
    pub(crate) dead: ShortString,
}

impl GroupNames {
    pub(crate) fn new(topic: &str, group: &str) -> Result<Self> {
        if group.is_empty() {
            return Err(oncebox_core::Error::InvalidOptions(
                "the group (queue) name is empty".into(),
            ));
        }
        Ok(Self {
            topic: crate::options::short(topic, "topic")?,
            queue: crate::options::short(group, "group (queue) name")?,
            dead: crate::options::short(&dead_queue_name(group), "dead queue name")?,
        })
    }
}

/// The queue a group's dead letters go to: the group's queue name with `.dead`
/// appended.
pub fn dead_queue_name(group: &str) -> String {
    format!("{group}.dead")
}
