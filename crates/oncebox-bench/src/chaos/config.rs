//! The configuration the chaos run writes for its relays and payment processes, and
//! the URLs it gives each of them.

use super::{ChaosArgs, LEASE};

/// The connections each relay and payment process may hold (its `store.pool_size`).
pub(super) const POOL_SIZE: u32 = 8;

/// The run's topic on the broker, where the relays publish the order events: on SQS a
/// FIFO queue (its name says so), whose message groups keep each customer's order.
pub(super) fn run_topic(broker: &str, schema: &str) -> String {
    if broker == "sqs" {
        format!("{schema}-orders.fifo")
    } else {
        format!("{schema}-orders")
    }
}

/// The configuration file of the relays and the payment processes, and the broker's
/// kind.
pub(super) fn config_toml(
    args: &ChaosArgs,
    schema: &str,
) -> anyhow::Result<(String, &'static str)> {
    let scheme = args.broker_url.split("://").next().unwrap_or_default();
    let (broker, isolation) = match scheme {
        "nats" => (
            "nats",
            format!(
                "subject_prefix = \"{schema}.\"\nstream = \"{schema}\"\nstream_replicas = {}\n",
                args.stream_replicas
            ),
        ),
        "amqp" | "amqps" => ("rabbitmq", format!("exchange = \"{schema}\"\n")),
        "kafka" => ("kafka", String::new()),
        "redis" | "rediss" => {
            // Redis Cluster: its nodes, separated by commas.
            let cluster = if is_redis_cluster(&args.broker_url) {
                "cluster = true\n"
            } else {
                ""
            };
            ("redis", format!("key_prefix = \"{schema}:\"\n{cluster}"))
        }
        "sqs" => ("sqs", String::new()),
        _ => anyhow::bail!(
            "--broker-url: nats://, amqp://, kafka://, redis:// or sqs://, not {scheme}://"
        ),
    };
    anyhow::ensure!(
        broker == "nats" || args.stream_replicas == 1,
        "--stream-replicas: a NATS stream's, not {broker}'s"
    );
    // Each process is given its store URL on its command line (through its proxy, its
    // connections named); this one is for the run's own look at the configuration.
    let store_url = &args.database_url;
    let (broker_url, password) = split_password(&args.broker_url);
    let password = password.map_or_else(String::new, |p| format!("password = {p:?}\n"));
    // The slot and its publication are named after the run's schema.
    let (mode, cdc) = args.relay.config(schema);
    let topic = run_topic(broker, schema);
    let toml = format!(
        r#"[store]
url = "{store_url}"
schema = "{schema}"
pool_size = {POOL_SIZE}

[broker]
url = "{broker_url}"
{password}{isolation}
[topics]
orders = "{topic}"

[relay]
mode = "{mode}"
lease = "{lease}s"
publish_timeout = "2s"
retry_initial = "100ms"
retry_max = "2s"
max_attempts = 1000
poll_max = "200ms"
stop_timeout = "5s"

[http]
listen = "off"
{cdc}"#,
        lease = LEASE.as_secs(),
    );
    Ok((toml, broker))
}

/// Whether `url` names a Redis Cluster's nodes (separated by commas), whose clients
/// follow the cluster's redirections to each node's own address: like Kafka's, their
/// broker links cannot be proxied.
pub(super) fn is_redis_cluster(url: &str) -> bool {
    url.starts_with("redis") && url.contains(',')
}

/// The start of the application name of the relays' connections: relay `i`'s are
/// named this and `i`, so that the run can terminate them, and them only, and tell
/// which relay holds a lock.
pub(super) fn relay_name_prefix(schema: &str) -> String {
    format!("{schema}-relay-")
}

/// `url` with connections named `name` (PostgreSQL's `application_name`).
pub(super) fn named_store_url(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// `text` without its password, and the password (decoded): the services take it as a
/// setting of their own, never in a URL. The inverse of the oncebox command's
/// `with_password` (its `config/url.rs`). A NATS cluster's seeds and a RabbitMQ
/// cluster's nodes (URLs separated by commas) each lose theirs; the first is the one
/// returned.
pub(crate) fn split_password(text: &str) -> (String, Option<String>) {
    if (text.starts_with("nats://") || text.starts_with("amqp")) && text.contains(',') {
        let (seeds, passwords): (Vec<_>, Vec<_>) = text.split(',').map(split_password).unzip();
        return (seeds.join(","), passwords.into_iter().flatten().next());
    }
    match ::url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let password = url.password().map(|p| {
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned()
            });
            // A URL with a password has an authority, so removing it cannot fail.
            let _ = url.set_password(None);
            (url.to_string(), password)
        }
        _ => (text.to_owned(), None),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{ChaosArgs, config_toml, split_password};

    #[derive(Parser)]
    struct Chaos {
        #[command(flatten)]
        args: ChaosArgs,
    }

    fn parse(flags: &[&str]) -> Result<ChaosArgs, clap::Error> {
        Chaos::try_parse_from(std::iter::once("chaos").chain(flags.iter().copied()))
            .map(|chaos| chaos.args)
    }

    #[test]
    fn a_nats_cluster_run_lists_its_seeds_and_replicates_its_stream() {
        let seeds = "nats://127.0.0.1:4251,nats://127.0.0.1:4252,nats://127.0.0.1:4253";
        let args = parse(&["--broker-url", seeds, "--stream-replicas", "3"]).expect("flags");
        let (toml, broker) = config_toml(&args, "chaos_x").expect("a configuration");
        assert_eq!(broker, "nats");
        assert!(toml.contains(&format!("url = \"{seeds}\"\n")), "{toml}");
        assert!(
            toml.contains("stream = \"chaos_x\"\nstream_replicas = 3\n"),
            "{toml}"
        );
        let single = parse(&[]).expect("the defaults");
        let (toml, _) = config_toml(&single, "chaos_x").expect("a configuration");
        assert!(toml.contains("stream_replicas = 1\n"), "{toml}");
        for flags in [&["--stream-replicas", "0"][..], &["--stream-replicas", "6"]] {
            assert!(parse(flags).is_err(), "{flags:?}");
        }
        let redis = parse(&[
            "--broker-url",
            "redis://127.0.0.1:6379",
            "--stream-replicas",
            "3",
        ])
        .expect("flags");
        let error = config_toml(&redis, "chaos_x").expect_err("no stream to replicate");
        assert!(error.to_string().contains("--stream-replicas"), "{error}");
    }

    #[test]
    fn a_password_leaves_the_url_decoded() {
        assert_eq!(
            split_password("amqp://guest:p%40ss@127.0.0.1:5672/%2f"),
            (
                "amqp://guest@127.0.0.1:5672/%2f".to_owned(),
                Some("p@ss".to_owned())
            )
        );
        assert_eq!(
            split_password("amqp://guest:pw@127.0.0.1:5681/%2f,amqp://guest:pw@127.0.0.1:5682/%2f"),
            (
                "amqp://guest@127.0.0.1:5681/%2f,amqp://guest@127.0.0.1:5682/%2f".to_owned(),
                Some("pw".to_owned())
            )
        );
        assert_eq!(
            split_password("nats://app:pw@127.0.0.1:4251,nats://app:pw@127.0.0.1:4252"),
            (
                "nats://app@127.0.0.1:4251,nats://app@127.0.0.1:4252".to_owned(),
                Some("pw".to_owned())
            )
        );
        for bare in [
            "nats://127.0.0.1:4222",
            "nats://127.0.0.1:4251,nats://127.0.0.1:4252,nats://127.0.0.1:4253",
            "kafka://127.0.0.1:9092",
            "redis://u@h:1",
        ] {
            assert_eq!(split_password(bare), (bare.to_owned(), None));
        }
    }
}
