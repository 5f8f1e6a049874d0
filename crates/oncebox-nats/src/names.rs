//! NATS names: the subject of a topic, the names of streams and consumers.

/// Why `subject` cannot be published to, if it cannot: NATS subjects are dot-separated
/// tokens, none empty, without whitespace, and `*` and `>` are wildcards.
pub(crate) fn check_publish_subject(subject: &str) -> Result<(), &'static str> {
    check_tokens(subject)?;
    if subject.split('.').any(|token| token == "*" || token == ">") {
        return Err("a wildcard token (`*` or `>`) cannot be published to");
    }
    Ok(())
}

/// Why `pattern` cannot be a subject a stream listens on: like a subject, but `*` may
/// stand for any token and `>` for the rest of the subject.
pub(crate) fn check_subject_pattern(pattern: &str) -> Result<(), &'static str> {
    check_tokens(pattern)?;
    let mut tokens = pattern.split('.').peekable();
    while let Some(token) = tokens.next() {
        if token == ">" && tokens.peek().is_some() {
            return Err("`>` must be the last token");
        }
    }
    Ok(())
}

fn check_tokens(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("it is empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace or a control character");
    }
    if subject.split('.').any(str::is_empty) {
        return Err("it has an empty token (a leading, trailing or doubled `.`)");
    }
    Ok(())
}

/// Why `name` cannot name a stream or a consumer, if it cannot: JetStream puts these
/// names in API subjects and file names.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("it is longer than 200 bytes");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err("it contains whitespace, a control character, `.`, `*`, `>`, `/` or `\\`");
    }
    Ok(())
}

/// Longest stream or consumer name accepted (they become directory names on the server).
const MAX_NAME_LEN: usize = 200;

/// The durable consumer of `group` on `topic`: `{group}_{topic}`, with the characters a
/// consumer name cannot hold (`.`, `*`, `>`, whitespace, `/`, `\`) replaced by `_`.
///
/// A group may read several topics of one stream, and consumer names are per stream, so
/// the topic is part of the name. The transport checks that an existing consumer of that
/// name filters the expected subject, so two topics that map to the same name (`a.b` and
/// `a_b`) fail loudly instead of sharing a consumer.
pub(crate) fn durable_name(group: &str, topic: &str) -> String {
    let mut name = String::with_capacity(group.len() + 1 + topic.len());
    name.push_str(group);
    name.push('_');
    name.extend(topic.chars().map(|c| {
        if c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\') {
            '_'
        } else {
            c
        }
    }));
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_subjects() {
        assert!(check_publish_subject("orders").is_ok());
        assert!(check_publish_subject("app.orders.eu-1").is_ok());
        for bad in [
            "",
            "a b",
            "a..b",
            ".a",
            "a.",
            "a.*",
            ">",
            "a.>.b",
            "tab\there",
        ] {
            assert!(check_publish_subject(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn subject_patterns() {
        for good in ["orders", "orders.*", "orders.>", "*.eu.>", ">"] {
            assert!(check_subject_pattern(good).is_ok(), "{good:?}");
        }
        for bad in ["", "a.>.b", "a..b", "a b"] {
            assert!(check_subject_pattern(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names() {
        assert!(check_name("ORDERS_2").is_ok());
        assert!(check_name("payments-v2").is_ok());
        for bad in [
            "",
            "a.b",
            "a b",
            "a*",
            "a>",
            "a/b",
            "a\\b",
            &"x".repeat(201),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durable_names_keep_group_and_topic_readable() {
        assert_eq!(durable_name("payments", "orders"), "payments_orders");
        assert_eq!(
            durable_name("payments", "app.orders.>"),
            "payments_app_orders__"
        );
        assert!(check_name(&durable_name("g", "a.b c/d\\e*f")).is_ok());
    }
}
