//! What the transport suite does not cover: SQS's own cases, each on queues of its own
//! on the local server of `scripts/services.sh sqs`.

mod support;

use std::time::Duration;

use oncebox_core::{Delivery, Error, Message, Publisher, Subscriber};
use oncebox_sqs::aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use oncebox_sqs::{QueueSettings, SqsError};
use support::SqsHarness;

const PATIENCE: Duration = Duration::from_secs(10);

async fn next<S: Subscriber>(subscriber: &mut S) -> S::Delivery {
    tokio::time::timeout(PATIENCE, subscriber.next())
        .await
        .expect("a delivery within the patience")
        .expect("a delivery")
}

fn sqs_error(error: &Error) -> &SqsError {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<SqsError>())
        .unwrap_or_else(|| panic!("not an SqsError: {error:?}"))
}

/// A message over the size limit (body and attributes as SQS counts them) is refused
/// with a typed, permanent error before anything is sent: the queue stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_messages_are_refused_before_sending() {
    let harness = SqsHarness::new(false).await;
    let topic = harness
        .topic("oversize", &QueueSettings::new())
        .await
        .unwrap();
    let publisher = harness.transport.publisher();
    // The body alone fits 256 KiB; with the attributes it does not.
    let message = Message::new(topic.clone(), "x".repeat(256 * 1024 - 10));
    let error = publisher.publish(&message).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        matches!(sqs_error(&error), SqsError::TooLarge { limit: 262_144, size } if *size > 262_144),
        "{error}"
    );
    publisher
        .publish(&Message::new(topic.clone(), "small"))
        .await
        .unwrap();
    let mut subscriber = harness.transport.subscriber(&topic).await.unwrap();
    let delivery = next(&mut subscriber).await;
    assert_eq!(&delivery.received().payload[..], b"small");
    delivery.ack().await.unwrap();
    harness.cleanup().await;
}

/// A batch in which SQS refuses one entry (the queue's own size limit is lower than the
/// publisher's) and takes the others: the refused publish fails permanently, the
/// others succeed, and exactly the confirmed ones are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_entry_fails_alone() {
    let harness = SqsHarness::new(false).await;
    let topic = harness
        .topic("partial", &QueueSettings::new())
        .await
        .unwrap();
    let url = harness
        .transport
        .ensure_queue(&topic, &QueueSettings::new())
        .await
        .unwrap();
    harness
        .transport
        .client()
        .set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::MaximumMessageSize, "1024")
        .send()
        .await
        .unwrap();
    let publisher = harness.transport.publisher();
    let messages: Vec<_> = (0..9)
        .map(|i| {
            let body = if i == 4 {
                "y".repeat(2_000)
            } else {
                format!("m{i}")
            };
            Message::new(topic.clone(), body)
        })
        .collect();
    // Concurrent publishes share batches.
    let results =
        futures_util::future::join_all(messages.iter().map(|m| publisher.publish(m))).await;
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (4, Err(error)) => {
                assert!(!error.is_transient(), "{error}");
                assert!(
                    matches!(sqs_error(error), SqsError::EntryRefused { code, .. } if code == "InvalidParameterValue"),
                    "{error}"
                );
            }
            (4, Ok(())) => panic!("the oversize entry was confirmed"),
            (_, Err(error)) => panic!("entry {i} failed: {error}"),
            (_, Ok(())) => {}
        }
    }
    let mut subscriber = harness.transport.subscriber(&topic).await.unwrap();
    let mut bodies = Vec::new();
    for _ in 0..8 {
        let delivery = next(&mut subscriber).await;
        bodies.push(String::from_utf8_lossy(&delivery.received().payload).into_owned());
        delivery.ack().await.unwrap();
    }
    bodies.sort();
    let expected: Vec<_> = (0..9)
        .filter(|i| *i != 4)
        .map(|i| format!("m{i}"))
        .collect();
    assert_eq!(bodies, expected);
    harness.cleanup().await;
}

/// On a FIFO queue the message id is the deduplication id: a relay's re-publish of a
/// confirmed message (crashed before marking it) is dropped by SQS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_queues_drop_a_republished_message() {
    let harness = SqsHarness::new(true).await;
    let topic = harness
        .topic("republish", &QueueSettings::new())
        .await
        .unwrap();
    let publisher = harness.transport.publisher();
    let first = Message::new(topic.clone(), "once").with_key("order-1");
    publisher.publish(&first).await.unwrap();
    publisher.publish(&first).await.unwrap();
    publisher
        .publish(&Message::new(topic.clone(), "next").with_key("order-1"))
        .await
        .unwrap();
    let mut subscriber = harness.transport.subscriber(&topic).await.unwrap();
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let delivery = next(&mut subscriber).await;
        bodies.push(String::from_utf8_lossy(&delivery.received().payload).into_owned());
        delivery.ack().await.unwrap();
    }
    assert_eq!(bodies, ["once", "next"]);
    let quiet = tokio::time::timeout(Duration::from_secs(2), subscriber.next()).await;
    assert!(quiet.is_err(), "a third delivery: the copy was not dropped");
    harness.cleanup().await;
}

/// A message the transport cannot read (an `oncebox_body` encoding that does not
/// decode, sent by some other producer) is dead-lettered with the reason, not handed
/// out, dropped or looped; the next message flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_messages_are_dead_lettered() {
    let harness = SqsHarness::new(false).await;
    let topic = harness
        .topic("unreadable", &QueueSettings::new())
        .await
        .unwrap();
    let url = harness
        .transport
        .ensure_queue(&topic, &QueueSettings::new())
        .await
        .unwrap();
    harness
        .transport
        .client()
        .send_message()
        .queue_url(&url)
        .message_body("%%% not base64")
        .message_attributes(
            oncebox_sqs::BODY_ATTRIBUTE,
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value("base64")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    harness
        .transport
        .publisher()
        .publish(&Message::new(topic.clone(), "readable"))
        .await
        .unwrap();
    let mut subscriber = harness.transport.subscriber(&topic).await.unwrap();
    let delivery = next(&mut subscriber).await;
    assert_eq!(&delivery.received().payload[..], b"readable");
    delivery.ack().await.unwrap();
    let quiet = tokio::time::timeout(Duration::from_secs(3), subscriber.next()).await;
    assert!(quiet.is_err(), "the unreadable message came back");
    let dead = harness.transport.dead_letters(&topic, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0].reason.contains("unreadable") && dead[0].reason.contains("base64"),
        "{}",
        dead[0].reason
    );
    harness.cleanup().await;
}

/// With a redrive policy, SQS itself moves a message that keeps coming back unsettled
/// (a consumer crashing on it) to the dead-letter queue, where it is read without a
/// reason of oncebox's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_policy_moves_what_keeps_failing() {
    let harness = SqsHarness::new(false).await;
    let topic = harness
        .topic("redrive", &QueueSettings::new().max_receive_count(2))
        .await
        .unwrap();
    harness
        .transport
        .publisher()
        .publish(&Message::new(topic.clone(), "poison"))
        .await
        .unwrap();
    let mut subscriber = harness.transport.subscriber(&topic).await.unwrap();
    for _ in 0..2 {
        // A crash: the delivery is dropped unsettled.
        drop(next(&mut subscriber).await);
    }
    let quiet = tokio::time::timeout(Duration::from_secs(4), subscriber.next()).await;
    assert!(
        quiet.is_err(),
        "delivered a third time despite maxReceiveCount 2"
    );
    let dead = harness.transport.dead_letters(&topic, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(&dead[0].received.payload[..], b"poison");
    assert!(dead[0].reason.contains("redrive"), "{}", dead[0].reason);
    harness.cleanup().await;
}

/// A queue that does not exist is a transient error naming it (a configuration mistake
/// the relay retries rather than dead-letter its outbox over), and so is an endpoint
/// nobody answers on (an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_queues_and_servers_are_transient() {
    let harness = SqsHarness::new(false).await;
    let error = harness
        .transport
        .publisher()
        .publish(&Message::new(
            format!("obt-missing-{}", support::unique()),
            "x",
        ))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(
        matches!(sqs_error(&error), SqsError::NoQueue { .. }),
        "{error}"
    );

    let nowhere =
        oncebox_sqs::SqsTransport::connect(support::local_options().endpoint("http://127.0.0.1:9"))
            .await
            .unwrap();
    let error = nowhere.subscriber("orders").await.unwrap_err();
    assert!(error.is_outage(), "{error}");
}

/// `delete_queues` removes what `ensure_queue` made, the dead-letter queue included, and
/// `find_queue` then says the queue is gone; a second deletion, with nothing left to
/// delete, is no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_queues_are_gone_and_deleting_again_is_no_error() {
    let harness = SqsHarness::new(true).await;
    let topic = harness
        .topic("deleted", &QueueSettings::new())
        .await
        .unwrap();
    let queue = harness.transport.options().queue_of(&topic).unwrap();
    let client = harness.transport.client();
    let names = || async {
        let listed = client
            .list_queues()
            .queue_name_prefix(queue.trim_end_matches(".fifo"))
            .send()
            .await
            .unwrap();
        listed.queue_urls().len()
    };
    assert_eq!(names().await, 2, "the queue and its dead-letter queue");
    let url = harness.transport.find_queue(&topic).await.unwrap();
    assert!(url.ends_with(&queue), "{url}");

    harness.transport.delete_queues(&topic).await.unwrap();
    assert_eq!(names().await, 0);
    let error = harness.transport.find_queue(&topic).await.unwrap_err();
    assert!(
        matches!(sqs_error(&error), SqsError::NoQueue { .. }),
        "{error}"
    );
    harness.transport.delete_queues(&topic).await.unwrap();
}
