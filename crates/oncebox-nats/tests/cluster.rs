//! The transport on a JetStream cluster of its own: three nats-server processes on free
//! ports, streams kept on all three (R3); the node leading a consumer killed under its
//! subscriber, and members of new groups joining together.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use oncebox_core::{Delivery, Error, Message, Publisher, Result, Subscriber};
use oncebox_nats::{
    JetStreamOptions, JetStreamSubscriber, JetStreamTransport, StreamSettings, SubscriberOptions,
};
use support::{LocalServer, free_port, stream_name, unique};

/// Three clustered nodes; node `i`'s server name is `n{i}`.
struct LocalCluster {
    nodes: Vec<LocalServer>,
}

impl LocalCluster {
    async fn start() -> Result<Self> {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_>>()?;
        let name = format!("obt-{}", unique());
        let mut nodes = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let others: Vec<String> = routes
                .iter()
                .filter(|other| *other != route)
                .map(|other| format!("nats://127.0.0.1:{other}"))
                .collect();
            let args = [
                "--server_name".to_owned(),
                format!("n{i}"),
                "--cluster_name".to_owned(),
                name.clone(),
                "--cluster".to_owned(),
                format!("nats://127.0.0.1:{route}"),
                "--routes".to_owned(),
                others.join(","),
            ];
            nodes.push(LocalServer::start_with(free_port()?, args.to_vec()).await?);
        }
        Ok(Self { nodes })
    }

    fn node(&self, name: &str) -> Option<&LocalServer> {
        let index: usize = name.strip_prefix('n')?.parse().ok()?;
        self.nodes.get(index)
    }

    async fn stop(&self) {
        for node in &self.nodes {
            node.stop().await;
        }
    }
}

/// The node leading consumer `consumer` of `stream`; empty while the cluster cannot say
/// (the info request fails without a leader).
async fn consumer_leader(transport: &JetStreamTransport, stream: &str, consumer: &str) -> String {
    let Ok(stream) = transport.jetstream().get_stream(stream).await else {
        return String::new();
    };
    match stream.consumer_info(consumer).await {
        Ok(info) => info
            .cluster
            .clone()
            .and_then(|cluster| cluster.leader)
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Moves the consumer's leadership until another node than `avoid` holds it; returns
/// that node's name.
async fn leader_other_than(
    transport: &JetStreamTransport,
    stream: &str,
    consumer: &str,
    avoid: &str,
) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leader = consumer_leader(transport, stream, consumer).await;
        if !leader.is_empty() && leader != avoid {
            return Ok(leader);
        }
        if leader == avoid {
            let subject = format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}");
            let _ = transport.client().request(subject, "".into()).await;
        }
        if Instant::now() > deadline {
            return Err(Error::transport_permanent(format!(
                "consumer {consumer} found no leader other than {avoid}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A transport connected to node `i` of `cluster` alone (the client learns the other
/// nodes, but stays on this one while it runs).
async fn connect_to(cluster: &LocalCluster, i: usize) -> Result<JetStreamTransport> {
    let options = JetStreamOptions::new(cluster.nodes[i].url())
        .name("oncebox-nats cluster test")
        .subscriber(SubscriberOptions::new().ack_wait(Duration::from_secs(60)));
    JetStreamTransport::connect(options).await
}

/// A new R3 stream capturing a new topic; returns the stream's name and the topic.
async fn replicated_stream(transport: &JetStreamTransport) -> Result<(String, String)> {
    let topic = format!("obt-cluster-{}", unique());
    let stream = stream_name("cluster");
    let settings = StreamSettings::new(stream.as_str())
        .topic(topic.as_str())
        .replicas(3);
    patiently(|| transport.ensure_stream(&settings)).await?;
    Ok((stream, topic))
}

/// Waits up to `patience` for `subscriber`'s next delivery, through transient errors
/// (missed heartbeats; no responders while no node leads the consumer).
async fn next_within(
    subscriber: &mut JetStreamSubscriber,
    patience: Duration,
) -> Result<Option<oncebox_nats::JetStreamDelivery>> {
    let deadline = Instant::now() + patience;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, subscriber.next()).await {
            Ok(Ok(delivery)) => return Ok(Some(delivery)),
            Ok(Err(error)) if error.is_transient() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(error)) => return Err(error),
            Err(_) => return Ok(None),
        }
    }
}

/// Retries what fails for want of a leader (a new stream or consumer in a young cluster,
/// a stream whose leader just died) for up to 60 s.
async fn patiently<T, F: Future<Output = Result<T>>>(mut attempt: impl FnMut() -> F) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() > deadline => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The node leading the subscriber's consumer is killed while the subscriber's own
/// connection (to another node) stays up: deliveries go on once another node leads the
/// consumer. Usually within seconds; once in twenty runs before the subscriber renewed
/// its pull request after missed heartbeats, nothing came within 25 s (the request lost
/// with the leader, and renewed by the client only 35 s after it was sent).
#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_pulls_again_when_its_consumer_leader_dies() {
    let cluster = LocalCluster::start().await.expect("a three-node cluster");
    let result = async {
        let transport = connect_to(&cluster, 0).await?;
        let (stream, topic) = replicated_stream(&transport).await?;
        let mut subscriber = patiently(|| transport.subscriber(&topic, "payments")).await?;
        let publisher = transport.publisher();
        let publish = |text: &'static str| {
            let message = Message::new(topic.as_str(), text);
            let publisher = &publisher;
            patiently(move || {
                let message = message.clone();
                async move { publisher.publish(&message).await }
            })
        };

        // The pull request is open and answered.
        publish("first").await?;
        let first = next_within(&mut subscriber, Duration::from_secs(30))
            .await?
            .ok_or_else(|| Error::transport_transient("the first message did not come in 30 s"))?;
        first.ack().await?;

        let consumer = subscriber.consumer_name().to_owned();
        let leader = leader_other_than(&transport, &stream, &consumer, "n0").await?;
        let node = cluster
            .node(&leader)
            .ok_or_else(|| Error::transport_permanent(format!("no node {leader}")))?;
        node.kill().await?;
        publish("second").await?;
        let second = next_within(&mut subscriber, Duration::from_secs(25))
            .await?
            .ok_or_else(|| {
                Error::transport_permanent(format!(
                    "nothing received within 25 s of killing {leader}, which led the consumer"
                ))
            })?;
        assert_eq!(second.received().payload.as_ref(), b"second");
        second.ack().await?;
        Ok::<_, Error>(())
    }
    .await;
    cluster.stop().await;
    result.expect("the subscriber goes on after its consumer's leader died");
}

/// Members joining a new group at the same time, on different nodes: the first pull
/// request of one of them could reach the new R3 consumer before any node led it, and
/// vanish (a pair in four, here). That member reported missed heartbeats every 10 s and
/// received nothing until the client renewed the request, 35 s after sending it: in a
/// chaos run one of the two payment processes, started together, sat idle that long.
/// Ten groups of two join at once; every member must receive within 25 s.
#[tokio::test(flavor = "multi_thread")]
async fn members_joining_a_new_group_together_all_receive() {
    let cluster = LocalCluster::start().await.expect("a three-node cluster");
    let result = async {
        let (a, b) = (
            connect_to(&cluster, 0).await?,
            connect_to(&cluster, 1).await?,
        );
        let (_, topic) = replicated_stream(&a).await?;
        let publisher = a.publisher();
        for _ in 0..200 {
            let message = Message::new(topic.as_str(), "order");
            patiently(|| publisher.publish(&message)).await?;
        }
        let members = (0..10).flat_map(|group| {
            let group = format!("payments-{group}");
            [(&a, group.clone()), (&b, group)]
        });
        let received = join_all(members.map(|(transport, group)| {
            let topic = &topic;
            async move {
                let mut subscriber = transport.subscriber(topic, &group).await?;
                let delivery = next_within(&mut subscriber, Duration::from_secs(25)).await?;
                Ok::<_, Error>((group, delivery.is_some()))
            }
        }))
        .await;
        for member in received {
            let (group, received) = member?;
            assert!(received, "a member of {group} received nothing within 25 s");
        }
        Ok::<_, Error>(())
    }
    .await;
    cluster.stop().await;
    result.expect("every member receives");
}
