//! Queue names and URLs, and the message group id of a key.

use sha2::{Digest, Sha256};

/// The suffix SQS requires of FIFO queue names.
pub(crate) const FIFO: &str = ".fifo";

/// A topic as a queue name: characters SQS does not allow (anything but ASCII letters,
/// digits, `-` and `_`) become `-`; a `.fifo` suffix is kept.
pub(crate) fn sanitize(topic: &str) -> String {
    let (base, suffix) = match topic.strip_suffix(FIFO) {
        Some(base) => (base, FIFO),
        None => (topic, ""),
    };
    let mut name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.push_str(suffix);
    name
}

/// Whether `queue` is a URL rather than a name.
pub(crate) fn is_url(queue: &str) -> bool {
    queue.starts_with("https://") || queue.starts_with("http://")
}

/// The queue name at the end of a queue URL.
pub(crate) fn name_of_url(url: &str) -> Result<&str, &'static str> {
    let name = url
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    if name.contains(':') || name.is_empty() || url.trim_end_matches('/').matches('/').count() < 3 {
        return Err("a queue URL ends with the account and the queue name");
    }
    check_queue_name(name)?;
    Ok(name)
}

/// Checks a queue name as SQS does: 1 to 80 characters, ASCII letters, digits, `-` and
/// `_`, with `.fifo` at the end of a FIFO queue's name (counted in the 80).
pub(crate) fn check_queue_name(name: &str) -> Result<(), &'static str> {
    let base = name.strip_suffix(FIFO).unwrap_or(name);
    if base.is_empty() || name.len() > 80 {
        return Err("queue names have 1 to 80 characters");
    }
    if !base
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(
            "queue names have only ASCII letters, digits, '-' and '_' (and a .fifo suffix)",
        );
    }
    Ok(())
}

/// Whether a queue (name or URL) is a FIFO queue.
pub(crate) fn is_fifo(queue: &str) -> bool {
    queue.trim_end_matches('/').ends_with(FIFO)
}

/// The dead-letter queue of `queue` (a name or URL): `suffix` inserted before `.fifo`.
pub(crate) fn dead_letter_queue(queue: &str, suffix: &str) -> String {
    let queue = queue.trim_end_matches('/');
    match queue.strip_suffix(FIFO) {
        Some(base) => format!("{base}{suffix}{FIFO}"),
        None => format!("{queue}{suffix}"),
    }
}

/// The `MessageGroupId` of a FIFO message: its key when SQS accepts it as one (1 to 128
/// printable ASCII characters), otherwise the hex SHA-256 of the key (one key, one
/// group, still); a message without key gets a group of its own, its id.
pub(crate) fn group_id(key: Option<&str>, id: &str) -> String {
    match key {
        Some(key)
            if !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            key.to_owned()
        }
        Some(key) => {
            let digest = Sha256::digest(key.as_bytes());
            digest.iter().map(|b| format!("{b:02x}")).collect()
        }
        None => id.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_become_queue_names() {
        assert_eq!(sanitize("orders"), "orders");
        assert_eq!(sanitize("shop.orders v1"), "shop-orders-v1");
        assert_eq!(sanitize("orders.fifo"), "orders.fifo");
        assert!(check_queue_name("orders.fifo").is_ok());
        assert!(check_queue_name(".fifo").is_err());
        assert!(check_queue_name("a.b").is_err());
    }

    #[test]
    fn urls_name_their_queue() {
        let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo";
        assert_eq!(name_of_url(url), Ok("orders.fifo"));
        assert!(is_fifo(url));
        assert_eq!(
            dead_letter_queue(url, "-dlq"),
            "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq.fifo"
        );
        assert_eq!(dead_letter_queue("orders", "-dlq"), "orders-dlq");
        assert!(name_of_url("https://sqs.example.com/").is_err());
    }

    #[test]
    fn keys_become_group_ids() {
        assert_eq!(group_id(Some("order-42"), "id"), "order-42");
        assert_eq!(group_id(None, "id"), "id");
        let hashed = group_id(Some("Zürich"), "id");
        assert_eq!(hashed.len(), 64);
        assert_eq!(hashed, group_id(Some("Zürich"), "other"));
        assert_eq!(group_id(Some(&"k".repeat(129)), "id").len(), 64);
    }
}
