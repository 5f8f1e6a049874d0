//! A RabbitMQ `broker.url`: one node, or the nodes of a cluster.

use super::ConfigError;
use super::members::Members;

/// The nodes a RabbitMQ `broker.url` names: one URL, or the nodes of a cluster separated
/// by commas (`amqp://app@mq-1:5672/shop,amqp://app@mq-2:5672/shop`). Each is a whole
/// `amqp://` or `amqps://` URL; all name the same user (`broker.password` is that
/// user's) and the same vhost (a cluster's nodes share their vhosts). A vhost with a
/// comma in its name is written with `%2C`.
pub(crate) fn rabbitmq_nodes(url: &str) -> Result<Vec<&str>, ConfigError> {
    let nodes = Members {
        member: "node",
        cluster: "RabbitMQ",
        schemes: ["amqp", "amqps"],
        example: "amqp://mq-1:5672/%2f,amqp://mq-2:5672/%2f",
    };
    nodes.parse(url, |_, parsed, first| match first {
        Some(first) if first.username() != parsed.username() => Err(format!(
            "user {:?}, where node 1 names {:?}: broker.password is one user's",
            parsed.username(),
            first.username()
        )),
        Some(first) if first.path() != parsed.path() => Err(format!(
            "vhost {:?}, where node 1 names {:?}: the nodes of a cluster share their vhosts",
            parsed.path(),
            first.path()
        )),
        _ => Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rabbitmq_url_lists_the_nodes_of_a_cluster() {
        assert_eq!(
            rabbitmq_nodes("amqp://guest@127.0.0.1:5672/%2f").unwrap(),
            ["amqp://guest@127.0.0.1:5672/%2f"]
        );
        assert_eq!(
            rabbitmq_nodes("amqp://app@mq-1:5672/shop, amqps://app@mq-2:5671/shop").unwrap(),
            ["amqp://app@mq-1:5672/shop", "amqps://app@mq-2:5671/shop"]
        );
        for (url, problem) in [
            ("amqp://mq-1/%2f,,amqp://mq-2/%2f", "node 2 of 3: empty"),
            ("amqp://mq-1/%2f,", "node 2 of 2: empty"),
            ("amqp://mq-1/%2f,mq-2:5672", "node 2 of 2: \"mq-2:5672\""),
            ("amqp://mq-1/%2f,nats://mq-2:4222", "starting with amqp://"),
            ("amqp:///%2f", "names no host"),
            ("amqp://a@mq-1/%2f,amqp://b@mq-2/%2f", "user \"b\""),
            ("amqp://mq-1/shop,amqp://mq-2/%2f", "vhost \"/%2f\""),
        ] {
            let error = rabbitmq_nodes(url).expect_err(url);
            assert!(error.0.starts_with("broker.url: "), "{error}");
            assert!(error.0.contains(problem), "{url}: {error}");
        }
    }
}
