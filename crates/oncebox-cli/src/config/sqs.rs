//! An SQS `broker.url`: `sqs://[REGION][/QUEUE][?endpoint=URL&fifo=true]`.

use super::ConfigError;

/// What an `sqs://` URL names. Credentials never appear in it: they come from the
/// standard AWS chain (environment, profile, instance role).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(not(feature = "sqs"), allow(dead_code))]
pub(crate) struct SqsUrl {
    /// The region (the URL's host); `None`: the AWS chain's.
    pub(crate) region: Option<String>,
    /// One queue (name or URL) for every topic without a `[topics]` entry; `None`: each
    /// topic on the queue named after it.
    pub(crate) queue: Option<String>,
    /// An explicit endpoint (a local server, a VPC endpoint).
    pub(crate) endpoint: Option<String>,
    /// Queue names derived from topics end in `.fifo`.
    pub(crate) fifo: bool,
}

const EXAMPLE: &str = "sqs://eu-west-1/orders.fifo, sqs:///orders?endpoint=http://127.0.0.1:4566, or sqs:// (everything from the AWS chain)";

const NAME_RULE: &str = "1 to 80 of ASCII letters, digits, '-', '_', and a .fifo suffix";

fn is_queue_name(name: &str) -> bool {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    !base.is_empty()
        && name.len() <= 80
        && base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Checks a `[topics]` destination of SQS: a queue name or an `https://` (or `http://`)
/// queue URL.
///
/// SQS's naming rule is `oncebox-sqs`'s too; it is written again here because a
/// configuration is checked by every build, also those without the feature `sqs` (and
/// so without that crate).
pub(crate) fn check_queue(queue: &str) -> Result<(), String> {
    if queue.starts_with("https://") || queue.starts_with("http://") {
        let name = queue
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default();
        return if ::url::Url::parse(queue).is_ok() && is_queue_name(name) {
            Ok(())
        } else {
            Err(format!(
                "{queue:?}: a queue URL ends with the account and a queue name"
            ))
        };
    }
    if is_queue_name(queue) {
        Ok(())
    } else {
        Err(format!(
            "{queue:?} is neither a queue name ({NAME_RULE}) nor a queue URL"
        ))
    }
}

/// Parses an `sqs://` `broker.url`.
pub(crate) fn sqs_url(url: &str) -> Result<SqsUrl, ConfigError> {
    let bad = |problem: String| {
        ConfigError::key("broker.url", format!("{problem} (examples: {EXAMPLE})"))
    };
    let rest = url
        .strip_prefix("sqs://")
        .ok_or_else(|| bad(format!("{url:?} does not start with sqs://")))?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (region, path) = location.split_once('/').unwrap_or((location, ""));
    let mut parsed = SqsUrl::default();
    if !region.is_empty() {
        if region.contains(['@', ':']) {
            return Err(bad(format!(
                "{region:?}: the host of an sqs:// URL is the region (eu-west-1); credentials come from the AWS chain, an endpoint goes in ?endpoint="
            )));
        }
        if !region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(bad(format!("{region:?} is not an AWS region name")));
        }
        parsed.region = Some(region.to_owned());
    }
    let path = path.trim_end_matches('/');
    if !path.is_empty() {
        if path.contains('/') {
            return Err(bad(format!(
                "{path:?}: the path is one queue name; a queue URL goes in [topics]"
            )));
        }
        if !is_queue_name(path) {
            return Err(bad(format!("{path:?} is not a queue name ({NAME_RULE})")));
        }
        parsed.queue = Some(path.to_owned());
    }
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "endpoint" => {
                let endpoint = percent_decode(value);
                let web = ::url::Url::parse(&endpoint)
                    .is_ok_and(|parsed| matches!(parsed.scheme(), "http" | "https"));
                if !web {
                    return Err(bad(format!(
                        "endpoint {endpoint:?} is not an http:// or https:// URL"
                    )));
                }
                parsed.endpoint = Some(endpoint);
            }
            "fifo" => {
                parsed.fifo = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad(format!("fifo={value:?}: true or false"))),
                };
            }
            _ => {
                return Err(bad(format!(
                    "unknown parameter {key:?}: an sqs:// URL takes endpoint= and fifo="
                )));
            }
        }
    }
    Ok(parsed)
}

/// A query value, percent-decoded.
fn percent_decode(value: &str) -> String {
    ::url::form_urlencoded::parse(format!("v={value}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sqs_url_names_region_queue_and_endpoint() {
        assert_eq!(sqs_url("sqs://").unwrap(), SqsUrl::default());
        assert_eq!(
            sqs_url("sqs://eu-west-1/orders.fifo").unwrap(),
            SqsUrl {
                region: Some("eu-west-1".into()),
                queue: Some("orders.fifo".into()),
                ..SqsUrl::default()
            }
        );
        assert_eq!(
            sqs_url("sqs:///?endpoint=http://127.0.0.1:4566&fifo=true").unwrap(),
            SqsUrl {
                endpoint: Some("http://127.0.0.1:4566".into()),
                fifo: true,
                ..SqsUrl::default()
            }
        );
        assert_eq!(
            sqs_url("sqs://us-east-1?endpoint=http%3A%2F%2Flocalhost%3A4566")
                .unwrap()
                .endpoint
                .as_deref(),
            Some("http://localhost:4566")
        );
    }

    #[test]
    fn topics_name_queues() {
        assert!(check_queue("orders.fifo").is_ok());
        assert!(check_queue("https://sqs.eu-west-1.amazonaws.com/123456789012/orders").is_ok());
        assert!(
            check_queue("shop.orders")
                .unwrap_err()
                .contains("neither a queue name")
        );
        assert!(check_queue("https://sqs.eu-west-1.amazonaws.com/").is_err());
    }

    #[test]
    fn bad_sqs_urls_say_what_is_wrong() {
        for (url, needle) in [
            (
                "sqs://key:secret@eu-west-1",
                "credentials come from the AWS chain",
            ),
            ("sqs://127.0.0.1:4566", "an endpoint goes in ?endpoint="),
            ("sqs://EU_WEST/x", "not an AWS region"),
            ("sqs://eu-west-1/a/b", "a queue URL goes in [topics]"),
            ("sqs://eu-west-1/bad.name", "not a queue name"),
            (
                "sqs://?endpoint=localhost:4566",
                "not an http:// or https:// URL",
            ),
            ("sqs://?fifo=yes", "true or false"),
            ("sqs://?queue=x", "unknown parameter"),
        ] {
            let error = sqs_url(url).unwrap_err();
            assert!(error.0.starts_with("broker.url: "), "{url}: {error}");
            assert!(error.0.contains(needle), "{url}: {error}");
        }
    }
}
