//! Small helpers for a backend's own tests: labelled messages and one-call claims.

use std::time::Duration;

use oncebox_core::Message;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement, SpoolStore};

/// A message on topic `orders`, kind `OrderPlaced`, whose payload is `label`.
pub fn msg(key: Option<&str>, label: &str) -> Message {
    let message = Message::new("orders", label.to_owned()).with_kind("OrderPlaced");
    match key {
        Some(key) => message.with_key(key),
        None => message,
    }
}

/// The label of a message made by [`msg`]: its payload, as text.
pub fn label(message: &Message) -> String {
    String::from_utf8_lossy(&message.payload).into_owned()
}

/// The labels of claimed rows, in their order.
pub fn labels(rows: &[Claimed<Message>]) -> Vec<String> {
    rows.iter().map(|row| label(&row.item)).collect()
}

/// The same settlement for every claimed row.
pub fn settle_all<T>(rows: &[Claimed<T>], outcome: &Settle) -> Vec<Settlement> {
    rows.iter()
        .map(|row| Settlement {
            seq: row.seq,
            outcome: outcome.clone(),
        })
        .collect()
}

/// [`Settle::Done`] for every claimed row.
pub fn done<T>(rows: &[Claimed<T>]) -> Vec<Settlement> {
    settle_all(rows, &Settle::Done)
}

/// Claims at most `limit` rows with a new token and a lease of `lease`; panics if the
/// claim fails or returns a row under another token.
pub async fn claim<S: SpoolStore>(
    store: &S,
    limit: usize,
    lease: Duration,
) -> (LeaseToken, Vec<Claimed<S::Item>>) {
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit,
        lease,
    };
    let rows = match store.claim(&request).await {
        Ok(rows) => rows,
        Err(error) => panic!("claim: {error}"),
    };
    for row in &rows {
        assert_eq!(
            row.token, request.token,
            "a claimed row carries the claim's token"
        );
    }
    (request.token, rows)
}
