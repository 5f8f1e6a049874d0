//! [`SqsTransport`]: the SQS client, queue URLs, and the factory of the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::Credentials;
use aws_sdk_sqs::types::QueueAttributeName;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, Result};

use crate::error::{names_no_queue, sdk};
use crate::names;
use crate::options::{SqsOptions, invalid, seconds};
use crate::{SqsPublisher, SqsSubscriber};

/// The region used when only an endpoint is known (local servers ignore it).
const FALLBACK_REGION: &str = "us-east-1";

/// A connection to SQS: the AWS SDK's client, the [`SqsOptions`], and the queue URLs
/// looked up so far. Cheap to clone; clones share all three.
#[derive(Clone, Debug)]
pub struct SqsTransport {
    pub(crate) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) options: SqsOptions,
    pub(crate) format: WireFormat,
    urls: Mutex<HashMap<String, String>>,
}

/// What [`SqsTransport::ensure_queue`] creates: a topic's queue and its dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[must_use]
pub struct QueueSettings {
    max_receive_count: Option<u32>,
    content_based_deduplication: bool,
}

impl QueueSettings {
    /// No redrive policy, no content-based deduplication.
    pub const fn new() -> Self {
        Self {
            max_receive_count: None,
            content_based_deduplication: false,
        }
    }

    /// Gives the queue a redrive policy: SQS itself moves a message received more than
    /// `count` times to the dead-letter queue (without a reason: a consumer that
    /// crashed on it, or never settled it). Default: none, and oncebox's consumer
    /// dead-letters by its own attempt limit.
    pub const fn max_receive_count(mut self, count: u32) -> Self {
        self.max_receive_count = Some(count);
        self
    }

    /// Turns on content-based deduplication on a FIFO queue, for producers that send no
    /// `MessageDeduplicationId` (oncebox always sends one: the message id).
    pub const fn content_based_deduplication(mut self, yes: bool) -> Self {
        self.content_based_deduplication = yes;
        self
    }
}

impl SqsTransport {
    /// A client configured from `options` and the standard AWS chain.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when the options do not validate, or no region is known
    /// (neither set, nor in the chain, nor implied by an endpoint). Nothing is sent to
    /// SQS yet: an unreachable endpoint shows at the first request.
    pub async fn connect(options: SqsOptions) -> Result<Self> {
        options.validate()?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http);
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &options.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some((key, secret)) = &options.credentials {
            loader = loader.credentials_provider(Credentials::new(
                key.clone(),
                secret.clone(),
                None,
                None,
                "oncebox-sqs static credentials",
            ));
        }
        let config = loader.load().await;
        let mut builder = aws_sdk_sqs::config::Builder::from(&config);
        if config.region().is_none() {
            if options.endpoint.is_none() && config.endpoint_url().is_none() {
                return Err(invalid(
                    "no AWS region: set one (region, AWS_REGION, a profile) or an endpoint".into(),
                ));
            }
            builder = builder.region(Region::new(FALLBACK_REGION));
        }
        Ok(Self::with_client(
            Client::from_conf(builder.build()),
            options,
        ))
    }

    /// A transport on a client built elsewhere (other credentials providers, an HTTP
    /// client of your own); `options`' endpoint, region and credentials are then unused.
    pub fn with_client(client: Client, options: SqsOptions) -> Self {
        let format = WireFormat::sqs().with_source(options.source.clone());
        Self {
            shared: Arc::new(Shared {
                client,
                options,
                format,
                urls: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The SDK client, for what this crate does not cover.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The options.
    pub fn options(&self) -> &SqsOptions {
        &self.shared.options
    }

    /// A publisher (cheap: it shares this client; its batches start with its first
    /// publish).
    pub fn publisher(&self) -> SqsPublisher {
        SqsPublisher::new(self.clone())
    }

    /// A subscriber to `topic`'s queue. Every subscriber of a queue competes for its
    /// messages: SQS has no consumer groups (fan out with SNS, a queue per group).
    ///
    /// # Errors
    ///
    /// [`SqsError::NoQueue`](crate::SqsError::NoQueue) (transient) when the queue does
    /// not exist; other transport errors as their class says.
    pub async fn subscriber(&self, topic: &str) -> Result<SqsSubscriber> {
        let queue = self.shared.options.queue_of(topic)?;
        let url = self.queue_url(&queue).await?;
        Ok(SqsSubscriber::new(self.clone(), topic, &queue, url))
    }

    /// Creates `topic`'s queue and its dead-letter queue if they do not exist (FIFO
    /// when the queue's name says so), with a redrive policy when `settings` asks for
    /// one, and returns the queue's URL. Queues given by URL are not created: that
    /// account's queues are someone else's to manage; their URL is returned.
    ///
    /// # Errors
    ///
    /// Transport errors; SQS refuses (`QueueAlreadyExists`) a queue that exists with
    /// other attributes.
    pub async fn ensure_queue(&self, topic: &str, settings: &QueueSettings) -> Result<String> {
        let queue = self.shared.options.queue_of(topic)?;
        if names::is_url(&queue) {
            return Ok(queue);
        }
        let dead = names::dead_letter_queue(&queue, &self.shared.options.dead_letter_suffix);
        let dead_url = self.create_queue(&dead, settings, None).await?;
        let redrive = match settings.max_receive_count {
            Some(count) => {
                let arn = self
                    .shared
                    .client
                    .get_queue_attributes()
                    .queue_url(&dead_url)
                    .attribute_names(QueueAttributeName::QueueArn)
                    .send()
                    .await
                    .map_err(|e| sdk("reading a dead-letter queue's ARN", &dead, e))?
                    .attributes()
                    .and_then(|a| a.get(&QueueAttributeName::QueueArn))
                    .cloned()
                    .ok_or_else(|| {
                        Error::transport_transient("SQS did not return the dead-letter queue's ARN")
                    })?;
                Some(
                    serde_json::json!({ "deadLetterTargetArn": arn, "maxReceiveCount": count })
                        .to_string(),
                )
            }
            None => None,
        };
        self.create_queue(&queue, settings, redrive).await
    }

    /// Looks `topic`'s queue up on the server and returns its URL: by name, or for a
    /// queue given by URL, by reading one of its attributes. It tells whether the queue
    /// exists and these credentials reach it; nothing is created.
    ///
    /// # Errors
    ///
    /// [`SqsError::NoQueue`](crate::SqsError::NoQueue) (transient) when it does not
    /// exist; other transport errors as their class says.
    pub async fn find_queue(&self, topic: &str) -> Result<String> {
        let queue = self.shared.options.queue_of(topic)?;
        let client = &self.shared.client;
        if names::is_url(&queue) {
            client
                .get_queue_attributes()
                .queue_url(&queue)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| sdk("reading a queue's attributes", &queue, e))?;
            return Ok(queue);
        }
        // Looked up again, not taken from what this client remembers.
        self.urls().remove(&queue);
        self.queue_url(&queue).await
    }

    /// Deletes `topic`'s queue and its dead-letter queue, as
    /// [`ensure_queue`](Self::ensure_queue) makes them, with the messages they hold. A
    /// queue that does not exist is no error. Queues given by URL are not deleted:
    /// they are someone else's to manage. A topic without a queue of its own (one that
    /// falls to [`default_queue`](crate::SqsOptions::default_queue)) deletes the shared
    /// queue: delete only the topics whose queues you made.
    ///
    /// SQS forbids a queue of the same name for 60 seconds after its deletion.
    ///
    /// # Errors
    ///
    /// Transport errors.
    pub async fn delete_queues(&self, topic: &str) -> Result<()> {
        let queue = self.shared.options.queue_of(topic)?;
        if names::is_url(&queue) {
            return Ok(());
        }
        let dead = names::dead_letter_queue(&queue, &self.shared.options.dead_letter_suffix);
        let client = &self.shared.client;
        for name in [queue, dead] {
            self.urls().remove(&name);
            let url = match client.get_queue_url().queue_name(&name).send().await {
                Ok(found) => found.queue_url().map(str::to_owned),
                Err(error) if names_no_queue(&error) => None,
                Err(error) => return Err(sdk("looking up a queue", &name, error)),
            };
            let Some(url) = url else { continue };
            match client.delete_queue().queue_url(url).send().await {
                Ok(_) => {}
                Err(error) if names_no_queue(&error) => {}
                Err(error) => return Err(sdk("deleting a queue", &name, error)),
            }
        }
        Ok(())
    }

    async fn create_queue(
        &self,
        name: &str,
        settings: &QueueSettings,
        redrive: Option<String>,
    ) -> Result<String> {
        let mut request = self
            .shared
            .client
            .create_queue()
            .queue_name(name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                seconds(self.shared.options.subscriber.visibility_timeout).to_string(),
            );
        if names::is_fifo(name) {
            request = request
                .attributes(QueueAttributeName::FifoQueue, "true")
                .attributes(
                    QueueAttributeName::ContentBasedDeduplication,
                    settings.content_based_deduplication.to_string(),
                );
        }
        if let Some(redrive) = redrive {
            request = request.attributes(QueueAttributeName::RedrivePolicy, redrive);
        }
        let url = request
            .send()
            .await
            .map_err(|e| sdk("creating a queue", name, e))?
            .queue_url()
            .map(str::to_owned)
            .ok_or_else(|| Error::transport_transient("SQS did not return the queue's URL"))?;
        self.remember(name, &url);
        Ok(url)
    }

    /// The URL of `queue` (a name or URL), looked up once.
    pub(crate) async fn queue_url(&self, queue: &str) -> Result<String> {
        if names::is_url(queue) {
            return Ok(queue.to_owned());
        }
        if let Some(url) = self.urls().get(queue) {
            return Ok(url.clone());
        }
        let url = self
            .shared
            .client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| sdk("looking up a queue", queue, e))?
            .queue_url()
            .map(str::to_owned)
            .ok_or_else(|| Error::transport_transient("SQS did not return the queue's URL"))?;
        self.remember(queue, &url);
        Ok(url)
    }

    /// The URL of the dead-letter queue of `queue` (a name or URL).
    pub(crate) async fn dead_letter_url(&self, queue: &str) -> Result<String> {
        let dead = names::dead_letter_queue(queue, &self.shared.options.dead_letter_suffix);
        self.queue_url(&dead).await
    }

    fn remember(&self, name: &str, url: &str) {
        self.urls().insert(name.to_owned(), url.to_owned());
    }

    fn urls(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.shared
            .urls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
