//! The librdkafka client context of the producers: logs through `tracing`, and keeps
//! the last error so that "cannot connect" names its cause.

use std::sync::{Arc, Mutex, PoisonError};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

/// Forwards librdkafka's log lines and errors to `tracing` (target `librdkafka`) and
/// remembers the last error. Clones share the last error, so a clone kept aside reads
/// what the client's context recorded.
#[derive(Debug, Default, Clone)]
pub(crate) struct LoggingContext {
    last_error: Arc<Mutex<Option<String>>>,
    last_failure: Arc<Mutex<Option<String>>>,
}

impl LoggingContext {
    /// The last connection failure librdkafka logged, else the last error it reported.
    pub(crate) fn last_error(&self) -> Option<String> {
        let failure = self
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        failure.or_else(|| {
            self.last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
    }

    pub(crate) fn record(&self, error: &KafkaError, reason: &str) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(format!("{error}: {reason}"));
    }
}

impl ClientContext for LoggingContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log(level, facility, message);
        // Connection failures name their cause only in the log ("Failed to resolve
        // 'kafka:9092': Name or service not known", "Connection refused"); the error
        // callback only says that all brokers are down.
        if facility == "FAIL" {
            *self
                .last_failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(message.to_owned());
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Connection errors are reported here and retried by librdkafka on its own;
        // the operation that needs the broker reports them if they last.
        tracing::debug!(target: "librdkafka", %error, reason, "client error");
        self.record(&error, reason);
    }
}

/// Forwards one librdkafka log line to `tracing`.
pub(crate) fn log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", facility, message),
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, message),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", facility, message)
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, message),
    }
}
