//! Dead letters grouped as operators think of them: by topic and by the shape of their
//! error (its *signature*: the reason with ids, numbers and hex taken out), so that a
//! thousand letters of one outage are one line, replayed or purged together.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::SystemTime;

use oncebox::MessageId;
use oncebox::spool::{DeadLetter, OutboxAdmin};
use regex::Regex;

/// Dead letters read per page while grouping.
const PAGE: usize = 500;

/// Dead letters grouped at most: beyond, the page says that only the first were.
pub(super) const MAX_GROUPED: usize = 100_000;

/// The longest signature kept, in characters.
const SIGNATURE_CHARS: usize = 200;

/// Dead letters of one topic with one signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Group {
    pub(super) topic: String,
    pub(super) signature: String,
    /// One of the reasons as written, to show what the signature stands for.
    pub(super) example: String,
    /// The members, in commit order.
    pub(super) ids: Vec<MessageId>,
    pub(super) first_dead: SystemTime,
    pub(super) last_dead: SystemTime,
}

/// The groups of the dead letters, largest first, and whether every dead letter was
/// read (`false` when there are more than [`MAX_GROUPED`]).
pub(super) struct Grouped {
    pub(super) groups: Vec<Group>,
    pub(super) complete: bool,
    /// The last position read: a group applied later takes no letter beyond it.
    pub(super) through: Option<i64>,
}

/// Reads the dead letters page by page (keeping no payload) and groups them.
pub(super) async fn group<A: OutboxAdmin + ?Sized>(admin: &A) -> oncebox::Result<Grouped> {
    let mut groups: HashMap<(String, String), Group> = HashMap::new();
    let mut read = 0;
    let mut after = None;
    let complete = loop {
        let page = admin.dead_letters(after, PAGE).await?;
        let full = page.len() == PAGE;
        for letter in page {
            after = Some(letter.seq);
            read += 1;
            add(&mut groups, &letter);
            if read == MAX_GROUPED {
                break;
            }
        }
        if read == MAX_GROUPED {
            break admin.dead_letters(after, 1).await?.is_empty();
        }
        if !full {
            break true;
        }
    };
    let mut groups: Vec<Group> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        b.ids
            .len()
            .cmp(&a.ids.len())
            .then_with(|| a.topic.cmp(&b.topic))
            .then_with(|| a.signature.cmp(&b.signature))
    });
    Ok(Grouped {
        groups,
        complete,
        through: after,
    })
}

/// The members of the group `topic`/`signature` at positions up to `through`.
pub(super) async fn members<A: OutboxAdmin + ?Sized>(
    admin: &A,
    topic: &str,
    signature: &str,
    through: i64,
) -> oncebox::Result<Vec<MessageId>> {
    let mut ids = Vec::new();
    let mut after = None;
    loop {
        let page = admin.dead_letters(after, PAGE).await?;
        let full = page.len() == PAGE;
        for letter in &page {
            if letter.seq > through {
                return Ok(ids);
            }
            if letter.message.topic == topic && self::signature(&letter.reason) == signature {
                ids.push(letter.id);
            }
        }
        after = page.last().map(|letter| letter.seq);
        if !full {
            return Ok(ids);
        }
    }
}

fn add(groups: &mut HashMap<(String, String), Group>, letter: &DeadLetter) {
    let signature = signature(&letter.reason);
    let group = groups
        .entry((letter.message.topic.clone(), signature.clone()))
        .or_insert_with(|| Group {
            topic: letter.message.topic.clone(),
            signature,
            example: letter.reason.clone(),
            ids: Vec::new(),
            first_dead: letter.dead_at,
            last_dead: letter.dead_at,
        });
    group.ids.push(letter.id);
    group.first_dead = group.first_dead.min(letter.dead_at);
    group.last_dead = group.last_dead.max(letter.dead_at);
}

/// The reason with what varies between occurrences replaced: UUIDs by `<id>`, hex
/// strings of 8 or more digits (with a decimal digit among them) by `<hex>`, other
/// numbers by `#`; whitespace collapsed; at most [`SIGNATURE_CHARS`] characters.
pub(super) fn signature(reason: &str) -> String {
    static UUID: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
            .expect("a valid pattern")
    });
    static HEX: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)\b[0-9a-f]{8,}\b").expect("a valid pattern"));
    static NUMBER: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"[0-9]+").expect("a valid pattern"));
    let words = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    let words = UUID.replace_all(&words, "<id>");
    let words = HEX.replace_all(&words, |found: &regex::Captures<'_>| {
        let hex = &found[0];
        if hex.bytes().any(|b| b.is_ascii_digit()) {
            "<hex>".to_owned()
        } else {
            hex.to_owned()
        }
    });
    let mut signature = NUMBER.replace_all(&words, "#").into_owned();
    if signature.chars().count() > SIGNATURE_CHARS {
        signature = signature.chars().take(SIGNATURE_CHARS).collect();
        signature.push('…');
    }
    if signature.is_empty() {
        signature.push_str("(no reason)");
    }
    signature
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_that_differ_only_in_ids_and_numbers_share_a_signature() {
        let a = signature(
            "publish failed: timed out after 5000 ms (message 0192f7a4-3b5e-7c9d-8e1f-a2b3c4d5e6f7)",
        );
        let b = signature(
            "publish failed: timed out after 3100 ms (message 0192f7a4-aaaa-7c9d-8e1f-a2b3c4d5e6f8)",
        );
        assert_eq!(a, b);
        assert_eq!(a, "publish failed: timed out after # ms (message <id>)");
    }

    #[test]
    fn words_made_of_hex_letters_stay_words() {
        assert_eq!(signature("decode failed"), "decode failed");
        assert_eq!(signature("a bad face"), "a bad face");
        assert_eq!(
            signature("deadbeefcafe"),
            "deadbeefcafe",
            "no digit: a word"
        );
    }

    #[test]
    fn long_hex_and_offsets_are_generalised() {
        assert_eq!(
            signature("partition 3 offset 1234567 checksum deadbeef01"),
            "partition # offset # checksum <hex>"
        );
        assert_eq!(signature("port 127.0.0.1:4222"), "port #.#.#.#:#");
    }

    #[test]
    fn whitespace_is_collapsed_and_empty_reasons_named() {
        assert_eq!(signature("  broker\n refused   it "), "broker refused it");
        assert_eq!(signature(""), "(no reason)");
    }

    #[test]
    fn long_reasons_are_cut() {
        let long = "x".repeat(500);
        let cut = signature(&long);
        assert_eq!(cut.chars().count(), SIGNATURE_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
