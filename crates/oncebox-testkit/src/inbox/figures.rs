//! The check of what operators read about the inboxes: each consumer's figures.

use std::time::{Duration, SystemTime};

use oncebox_core::consumer::{
    ConsumerOptions, ConsumerStats, DurableInbox, InboxAdmin, Outcome, Process,
};
use oncebox_core::spool::{ClaimRequest, LeaseToken, Settle, Settlement, SpoolStore};

use super::{DurableInboxHarness, EffectHandler, LONG_LEASE, STEP, handle, inbox, received};
use crate::support::{ok, within};

const MILLI: Duration = Duration::from_millis(1);

/// Each consumer's figures, in name order, as the engine leaves them: `shipping`
/// handles three messages through the transactional inbox and skips two redeliveries;
/// `billing` stores four deliveries in its durable inbox and skips one redelivery, then
/// one row is done, one dead and two pending (one of them claimed and released). Handled
/// counts the records and the done rows, duplicates what the engine skipped, and the last
/// handled time is the later of the last record and the last done row.
pub async fn consumer_figures<H: DurableInboxHarness>(harness: &H) {
    let admin = harness.store();
    let empty = ok(
        "the figures of empty inboxes",
        within("consumers", STEP, admin.consumers()).await,
    );
    assert_eq!(empty, [], "empty inboxes have no consumers");

    // Stores keep milliseconds: a time read back may be up to 1 ms before the clock
    // reading that preceded it.
    let start = SystemTime::now() - MILLI;
    let shipping = inbox(
        harness,
        EffectHandler::new("shipping"),
        ConsumerOptions::new("shipping"),
    );
    let messages = ["s1", "s2", "s3"].map(|label| received(None, label));
    for message in &messages {
        let (outcome, _) = handle("a first delivery", &shipping, message).await;
        assert_eq!(outcome, Outcome::Handled);
    }
    for count in [2, 3] {
        let mut again = messages[0].clone();
        again.delivery_count = count;
        let (outcome, _) = handle("a redelivery", &shipping, &again).await;
        assert_eq!(outcome, Outcome::Duplicate);
    }

    let billing = ok(
        "DurableInbox::new",
        DurableInbox::new(harness.durable("billing"), ConsumerOptions::new("billing")),
    );
    let deliveries = ["d1", "d2", "d3", "d4"].map(|label| received(None, label));
    for delivery in &deliveries {
        let outcome = ok(
            "store a delivery",
            within("store a delivery", STEP, billing.process(delivery)).await,
        );
        assert_eq!(outcome, Outcome::Stored);
    }
    let outcome = ok(
        "store a redelivery",
        within("store a redelivery", STEP, billing.process(&deliveries[0])).await,
    );
    assert_eq!(outcome, Outcome::Duplicate);

    tokio::time::sleep(Duration::from_millis(20)).await;
    let before_done = SystemTime::now() - MILLI;
    let durable = harness.durable("billing");
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit: 3,
        lease: LONG_LEASE,
    };
    let rows = ok(
        "claim three rows",
        within("claim three rows", STEP, durable.claim(&request)).await,
    );
    assert_eq!(rows.len(), 3, "three of four pending rows are claimed");
    let outcomes = [
        Settle::Done,
        Settle::Dead {
            reason: "refused".into(),
        },
        Settle::Release,
    ];
    let settlements: Vec<Settlement> = rows
        .iter()
        .zip(outcomes)
        .map(|(row, outcome)| Settlement {
            seq: row.seq,
            outcome,
        })
        .collect();
    ok(
        "settle the claim",
        within(
            "settle the claim",
            STEP,
            durable.settle(request.token, &settlements),
        )
        .await,
    );
    let end = SystemTime::now();

    let figures = ok(
        "the figures",
        within("the figures", STEP, admin.consumers()).await,
    );
    let names: Vec<&str> = figures.iter().map(|f| f.consumer.as_str()).collect();
    assert_eq!(
        names,
        ["billing", "shipping"],
        "one entry per consumer, in name order"
    );
    let billing_last = figures[0]
        .last_handled_at
        .expect("billing handled a message");
    let shipping_last = figures[1]
        .last_handled_at
        .expect("shipping handled messages");
    assert!(
        (before_done..=end).contains(&billing_last),
        "billing's last handled time is its done row's: {billing_last:?}"
    );
    assert!(
        (start..before_done).contains(&shipping_last),
        "shipping's last handled time is its last record's: {shipping_last:?}"
    );
    assert_eq!(
        figures,
        [
            ConsumerStats {
                consumer: "billing".into(),
                handled: 1,
                pending: 2,
                dead: 1,
                duplicates: 1,
                last_handled_at: Some(billing_last),
            },
            ConsumerStats {
                consumer: "shipping".into(),
                handled: 3,
                pending: 0,
                dead: 0,
                duplicates: 2,
                last_handled_at: Some(shipping_last),
            },
        ]
    );
}
