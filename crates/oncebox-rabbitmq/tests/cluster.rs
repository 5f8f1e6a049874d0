//! Several nodes: a node that cannot be reached is skipped (against the machine's
//! RabbitMQ, `ONCEBOX_AMQP_URL`), and on a three-node cluster of quorum queues
//! (`scripts/services.sh rabbitmq-cluster`, nodes on 127.0.0.1:5681-5683) the node
//! holding a queue's leader is killed under a publisher and a subscriber: every message
//! the broker confirmed is delivered. Alone in this file because the kill stops a node
//! of the cluster, and `cargo test` runs test binaries one after the other.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::{amqp_url, unique};
use oncebox_core::{Backoff, Delivery, Error, Message, Publisher, Result, Subscriber};
use oncebox_rabbitmq::lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use oncebox_rabbitmq::lapin::{Connection, ConnectionProperties};
use oncebox_rabbitmq::{RabbitError, RabbitOptions, RabbitPublisher, RabbitSubscriber};

/// The nodes of `scripts/services.sh rabbitmq-cluster`.
const CLUSTER: [&str; 3] = [
    "amqp://guest:guest@127.0.0.1:5681/%2f",
    "amqp://guest:guest@127.0.0.1:5682/%2f",
    "amqp://guest:guest@127.0.0.1:5683/%2f",
];

/// A URL where nothing listens: a port taken from the system and let go.
fn nowhere() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    format!("amqp://guest:secret@127.0.0.1:{port}/%2f")
}

#[tokio::test]
async fn a_node_that_cannot_be_reached_is_skipped() -> Result<()> {
    let exchange = unique("oncebox-nodes");
    let (topic, group) = (unique("orders"), unique("payments"));
    let options = RabbitOptions::new(nowhere())
        .node(amqp_url())
        .exchange(exchange.clone())
        .connection_name("oncebox-rabbitmq cluster tests");
    let mut subscriber = RabbitSubscriber::connect(&options, &topic, &group).await?;
    let publisher = RabbitPublisher::connect(&options).await?;
    publisher
        .publish(&Message::new(topic.as_str(), "order 1").with_key("c-1"))
        .await?;
    let delivery = tokio::time::timeout(Duration::from_secs(10), subscriber.next())
        .await
        .map_err(|_| Error::transport_transient("no delivery within 10 s"))??;
    assert_eq!(&delivery.received().payload[..], b"order 1");
    delivery.ack().await?;
    subscriber.close().await;
    common::delete(
        vec![group.clone(), oncebox_rabbitmq::dead_queue_name(&group)],
        exchange,
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn no_node_reachable_names_each_node_and_is_transient() {
    let (first, second) = (nowhere(), nowhere());
    let options = RabbitOptions::new(first.clone())
        .node(second.clone())
        .connect_timeout(Duration::from_secs(2));
    let error = RabbitPublisher::connect(&options)
        .await
        .expect_err("no node listens");
    assert!(error.is_transient(), "{error}");
    let Error::Transport { source, .. } = &error else {
        panic!("a transport error: {error:?}");
    };
    let Some(RabbitError::NoNodeReachable { failures }) = source.downcast_ref::<RabbitError>()
    else {
        panic!("NoNodeReachable: {error:?}");
    };
    let urls: Vec<&str> = failures.iter().map(|(url, _)| url.as_str()).collect();
    let redacted = |url: &str| url.replace("secret", "***");
    assert_eq!(urls, [redacted(&first), redacted(&second)], "{error}");
    let text = error.to_string();
    assert!(text.contains("any of the 2 RabbitMQ nodes"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

/// Starts the local cluster if it is not up (`scripts/services.sh rabbitmq-cluster`).
fn ensure_cluster() -> std::result::Result<(), String> {
    run_services(&["rabbitmq-cluster"], None)
}

/// Kills the node holding the leader of quorum queue `queue` and starts it again
/// (`scripts/services.sh restart rabbitmq-cluster`).
fn restart_leader(queue: &str) -> std::result::Result<(), String> {
    run_services(&["restart", "rabbitmq-cluster"], Some(queue))
}

fn run_services(args: &[&str], queue: Option<&str>) -> std::result::Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    let mut command = std::process::Command::new(script);
    command.args(args);
    if let Some(queue) = queue {
        command.env("ONCEBOX_QUEUE", queue);
    }
    let output = command.output().map_err(|error| error.to_string())?;
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    if output.status.success() {
        eprint!("{said}");
        Ok(())
    } else {
        Err(format!("services.sh {args:?} failed: {said}"))
    }
}

/// The cluster's nodes, starting with node `first`.
fn cluster_options(first: usize, exchange: &str) -> RabbitOptions {
    let mut options = RabbitOptions::new(CLUSTER[first % 3]);
    for offset in 1..3 {
        options = options.node(CLUSTER[(first + offset) % 3]);
    }
    options
        .exchange(exchange)
        .connect_timeout(Duration::from_secs(5))
        .confirm_timeout(Duration::from_secs(5))
        .reconnect(
            Backoff::new()
                .initial(Duration::from_millis(100))
                .max(Duration::from_secs(1)),
        )
        .connection_name("oncebox-rabbitmq cluster tests")
}

/// The subscriber starts on node 1, where it declares the queue, whose leader is
/// therefore node 1's; the publisher starts on node 2. Killing the leader's node cuts
/// the subscriber off (it reconnects to another node) and makes the publisher's
/// confirms wait for the new leader. Every message confirmed is delivered, at least
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_confirmed_message_is_delivered_after_the_queue_leader_node_is_killed() -> Result<()>
{
    tokio::task::spawn_blocking(ensure_cluster)
        .await
        .map_err(Error::transport_permanent)?
        .map_err(Error::transport_permanent)?;
    let exchange = unique("oncebox-cluster");
    let (topic, group) = (unique("orders"), unique("payments"));
    let _cleanup = Cleanup {
        queues: vec![group.clone(), oncebox_rabbitmq::dead_queue_name(&group)],
        exchange: exchange.clone(),
    };
    let mut subscriber =
        RabbitSubscriber::connect(&cluster_options(0, &exchange), &topic, &group).await?;
    let publisher = RabbitPublisher::connect(&cluster_options(1, &exchange)).await?;

    // Publishes one message at a time, retrying each until confirmed (as a relay
    // does), until 200 more were confirmed after the restart.
    let restarted = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let publishing = {
        let (restarted, topic) = (Arc::clone(&restarted), topic.clone());
        let errors = Arc::clone(&errors);
        tokio::spawn(async move {
            let mut confirmed = Vec::new();
            let mut after = 0;
            let mut failures = 0u32;
            while after < 200 {
                let id = confirmed.len();
                let message = Message::new(topic.as_str(), format!("{id}")).with_key("k");
                match publisher.publish(&message).await {
                    Ok(()) => {
                        confirmed.push(id);
                        if restarted.load(Ordering::SeqCst) {
                            after += 1;
                        }
                    }
                    Err(error) if error.is_transient() && failures < 600 => {
                        failures += 1;
                        errors
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(format!("message {id}: {error}"));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(error) => return Err(error),
                }
            }
            Ok::<_, Error>((confirmed.len(), failures))
        })
    };
    let restarting = {
        let (restarted, group) = (Arc::clone(&restarted), group.clone());
        tokio::spawn(async move {
            // Some messages in the queue first.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let killed = tokio::task::spawn_blocking(move || restart_leader(&group)).await;
            restarted.store(true, Ordering::SeqCst);
            killed
        })
    };

    let mut received = HashSet::new();
    let mut lost_links = 0;
    let mut published = None;
    let mut publishing = publishing;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        if published.is_none() && publishing.is_finished() {
            let (count, retried) = (&mut publishing)
                .await
                .map_err(Error::transport_permanent)??;
            eprintln!("{count} messages confirmed, {retried} publishes retried");
            published = Some(count);
        }
        // Only confirmed messages carry the ids below the count: a publish is retried
        // under its id until confirmed.
        if published.is_some_and(|count| received.len() >= count)
            || tokio::time::Instant::now() > deadline
        {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(500), subscriber.next()).await {
            Err(_) => {}
            Ok(Ok(delivery)) => {
                let id: usize = std::str::from_utf8(&delivery.received().payload)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .expect("a number");
                received.insert(id);
                // An ack on a connection that died is harmless: redelivered.
                let _ = delivery.ack().await;
            }
            Ok(Err(error)) if error.is_transient() => lost_links += 1,
            Ok(Err(error)) => return Err(error),
        }
    }
    restarting
        .await
        .map_err(Error::transport_permanent)?
        .map_err(Error::transport_permanent)?
        .map_err(Error::transport_permanent)?;
    let errors = errors
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let Some(published) = published else {
        panic!(
            "the publisher did not finish within 120 s: {} failed publishes, the last {:?}",
            errors.len(),
            &errors[errors.len().saturating_sub(5)..]
        );
    };
    let lost: Vec<usize> = (0..published).filter(|id| !received.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {published} confirmed messages never delivered: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(
        lost_links >= 1,
        "the subscriber's node was killed, yet it never lost its link"
    );
    subscriber.close().await;
    Ok(())
}

/// Deletes the test's queues and exchange from the cluster when dropped, whether the
/// test passed or not.
struct Cleanup {
    queues: Vec<String>,
    exchange: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (queues, exchange) = (std::mem::take(&mut self.queues), self.exchange.clone());
        // Its own runtime on its own thread: this runs inside the test's runtime, or
        // while a failed test unwinds.
        let cleanup = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(delete_on_cluster(&queues, &exchange));
            }
        });
        let _ = cleanup.join();
    }
}

/// Deletes `queues` and `exchange` through the first node that answers, best effort.
async fn delete_on_cluster(queues: &[String], exchange: &str) {
    for node in CLUSTER {
        let Ok(Ok(connection)) = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(node, ConnectionProperties::default()),
        )
        .await
        else {
            continue;
        };
        for queue in queues {
            if let Ok(channel) = connection.create_channel().await {
                let _ = channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
        }
        if let Ok(channel) = connection.create_channel().await {
            let _ = channel
                .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = connection.close(200, "cleanup".into()).await;
        return;
    }
    eprintln!("cleanup: no node of the cluster answers; leaving {queues:?} and {exchange}");
}
