//! What goes wrong talking to SQS, and how it maps onto [`oncebox_core::Error`].

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use oncebox_core::Error;

/// The source of every transport error this crate returns, inside
/// [`Error::Transport`](oncebox_core::Error::Transport): reach it with
/// [`std::error::Error::source`] and `downcast_ref` to tell the cases apart; the
/// classification ([`Error::is_transient`](oncebox_core::Error::is_transient),
/// [`Error::is_outage`](oncebox_core::Error::is_outage)) is already made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// The message would be larger than SQS accepts (body and message attributes, as SQS
    /// counts them): refused before sending. Permanent.
    #[error(
        "the message would be {size} bytes on SQS (body and attributes), over the {limit}-byte limit"
    )]
    TooLarge {
        /// Its size as SQS counts it.
        size: usize,
        /// The limit ([`SqsOptions::max_message_size`](crate::SqsOptions::max_message_size)).
        limit: usize,
    },

    /// The queue does not exist. Transient: a configuration mistake fixed by creating
    /// the queue ([`SqsTransport::ensure_queue`](crate::SqsTransport::ensure_queue));
    /// until then the relay keeps its messages and retries with backoff.
    #[error(
        "SQS queue {queue:?} does not exist: create it (SqsTransport::ensure_queue); until then this is retried"
    )]
    NoQueue {
        /// The queue's name or URL.
        queue: String,
    },

    /// SQS answered with an error.
    #[error("{operation}: SQS refused ({code}): {message}")]
    Refused {
        /// What was being done.
        operation: &'static str,
        /// SQS's error code (`InvalidParameterValue`, `AccessDenied`, ...).
        code: String,
        /// SQS's explanation.
        message: String,
    },

    /// One entry of a batch was refused while the others were taken.
    #[error("{operation}: SQS refused the entry ({code}, {fault}'s fault): {message}")]
    EntryRefused {
        /// What was being done.
        operation: &'static str,
        /// SQS's error code for the entry.
        code: String,
        /// SQS's explanation.
        message: String,
        /// `sender` when SQS blames the request, `server` otherwise.
        fault: &'static str,
    },

    /// A batch response named neither success nor failure for an entry: it is not
    /// confirmed, so it counts as not sent.
    #[error("{operation}: SQS's answer did not mention entry {entry}")]
    Unconfirmed {
        /// What was being done.
        operation: &'static str,
        /// The entry's id in the batch.
        entry: String,
    },

    /// A whole `SendMessageBatch` request failed (its entries are not sent), for the
    /// reason given.
    #[error("sending a batch: {details}")]
    BatchFailed {
        /// What the request's error said.
        details: String,
    },

    /// SQS could not be reached or did not answer in time.
    #[error("{operation}: {details}")]
    Unreachable {
        /// What was being done.
        operation: &'static str,
        /// What the client reported, with its causes.
        details: String,
    },

    /// A delivery was settled after its receipt handle expired (the message became
    /// visible again and was probably delivered again). Transient.
    #[error("the delivery's receipt handle is no longer valid: the message was delivered again")]
    ReceiptExpired,
}

impl SqsError {
    pub(crate) fn transient(self) -> Error {
        Error::transport_transient(self)
    }

    pub(crate) fn permanent(self) -> Error {
        Error::transport_permanent(self)
    }
}

/// Error codes SQS answers with for a queue that does not exist (the JSON protocol's and
/// the query protocol's spellings).
const NO_QUEUE: [&str; 3] = [
    "QueueDoesNotExist",
    "AWS.SimpleQueueService.NonExistentQueue",
    "NonExistentQueue",
];

/// Codes of requests that may pass later: throttling, service trouble, credentials or
/// permissions being fixed (a configuration mistake is retried with backoff rather than
/// dead-lettering an outbox; the relay's attempt limit is the backstop).
const TRANSIENT_CODES: [&str; 14] = [
    "ThrottlingException",
    "Throttling",
    "RequestThrottled",
    "OverLimit",
    "KmsThrottled",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "RequestExpired",
];

/// Whether an error code names a missing queue.
pub(crate) fn is_no_queue(code: &str) -> bool {
    NO_QUEUE.contains(&code)
}

/// Whether a request failed because its queue does not exist.
pub(crate) fn names_no_queue<E: ProvideErrorMetadata>(error: &SdkError<E, HttpResponse>) -> bool {
    matches!(error, SdkError::ServiceError(service)
        if service.err().code().is_some_and(is_no_queue))
}

/// Whether an entry's or a request's error code may pass when retried.
pub(crate) fn code_is_transient(code: &str) -> bool {
    TRANSIENT_CODES.contains(&code) || code.starts_with("KmsThrottl") || code.contains("Throttl")
}

/// Maps an SDK error onto oncebox's: unreachable → outage, a missing queue → transient
/// [`SqsError::NoQueue`], other answers by their code (5xx and throttling transient).
pub(crate) fn sdk<E>(
    operation: &'static str,
    queue: &str,
    error: SdkError<E, HttpResponse>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &error {
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or("Unknown").to_owned();
            let message = service.err().message().unwrap_or_default().to_owned();
            if is_no_queue(&code) {
                return SqsError::NoQueue {
                    queue: queue.to_owned(),
                }
                .transient();
            }
            let refused = SqsError::Refused {
                operation,
                code: code.clone(),
                message,
            };
            let status = service.raw().status().as_u16();
            if status >= 500 || status == 429 || code_is_transient(&code) {
                refused.transient()
            } else {
                refused.permanent()
            }
        }
        SdkError::ConstructionFailure(_) => SqsError::Refused {
            operation,
            code: "ConstructionFailure".to_owned(),
            message: DisplayErrorContext(&error).to_string(),
        }
        .permanent(),
        // Dispatch failures (connection refused, DNS, TLS), timeouts, unreadable answers.
        _ => Error::transport_outage(SqsError::Unreachable {
            operation,
            details: DisplayErrorContext(&error).to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        assert!(is_no_queue("AWS.SimpleQueueService.NonExistentQueue"));
        assert!(is_no_queue("QueueDoesNotExist"));
        assert!(code_is_transient("ThrottlingException"));
        assert!(code_is_transient("AccessDenied"));
        assert!(!code_is_transient("InvalidParameterValue"));
        assert!(!code_is_transient("InvalidMessageContents"));
    }

    #[test]
    fn too_large_is_permanent_and_says_the_sizes() {
        let error = SqsError::TooLarge {
            size: 300_000,
            limit: 262_144,
        }
        .permanent();
        assert!(!error.is_transient());
        assert!(error.to_string().contains("300000"), "{error}");
    }
}
