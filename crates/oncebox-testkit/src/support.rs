//! Small helpers shared by the suites: bounded waits and readable failures.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// Awaits `future`, panicking with `what` if it takes longer than `limit`.
pub(crate) async fn within<F: Future>(what: &str, limit: Duration, future: F) -> F::Output {
    match tokio::time::timeout(limit, future).await {
        Ok(output) => output,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

/// Unwraps a store call, naming the step that failed.
pub(crate) fn ok<T, E: Debug>(step: &str, result: Result<T, E>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{step}: unexpected error: {error:?}"),
    }
}
