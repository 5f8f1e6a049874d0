//! A fresh database (or schema) per test on a shared server: a name no other test uses,
//! a bound on how many tests of one test binary hold one at once, and a clean-up that
//! runs when the test's value is dropped.
//!
//! The MySQL and PostgreSQL stores' tests, and the HTTP layer's on those stores, isolate
//! each test this way, so that tests run in parallel and rerun cleanly, and `cargo test`
//! stays far below the server's `max_connections` whatever `--test-threads` says. What
//! is created and dropped (a database, a schema) is the backend's; the rest is here:
//!
//! ```ignore
//! let slot = oncebox_testkit::fresh::slot().await;
//! let name = oncebox_testkit::fresh::unique_name("oncebox_t");
//! create_database(&name).await;
//! let cleanup = oncebox_testkit::fresh::Cleanup::new(format!("test database {name}"), move || {
//!     drop_database(name)
//! });
//! // … keep `slot` and `cleanup` as long as the database is used …
//! ```

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::{Semaphore, SemaphorePermit};

/// How many tests of one test binary hold a fresh database at once.
pub const PARALLEL_TESTS: usize = 4;

static SLOTS: Semaphore = Semaphore::const_new(PARALLEL_TESTS);

/// One of the [`PARALLEL_TESTS`] places of this test binary for a test holding a fresh
/// database, waiting until one is free; the place frees when the permit is dropped.
///
/// # Cancel safety
///
/// Cancel safe: a cancelled wait holds no place.
pub async fn slot() -> SemaphorePermit<'static> {
    SLOTS
        .acquire()
        .await
        .expect("the test semaphore is never closed")
}

/// `<prefix>_<32 hex digits>`, random: a database or schema name no other test (of this
/// run or an earlier one) uses.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{:032x}", fastrand::u128(..))
}

/// Runs `task` to its end on a thread of its own, with a runtime of its own, and waits
/// for it; an error it returns is printed, naming `what`, not raised. For clean-ups in
/// `Drop`, which cannot await and may run inside (or outside) a runtime.
pub fn finish_on_own_thread<F, E>(what: &str, task: F)
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: Display,
{
    let what = what.to_owned();
    let runner = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        if let Err(error) = runtime.block_on(task) {
            eprintln!("could not drop {what}: {error}");
        }
    });
    let _ = runner.join();
}

type Task = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A clean-up that runs when this value is dropped, by [`finish_on_own_thread`].
#[must_use = "the clean-up runs when this value is dropped"]
pub struct Cleanup {
    what: String,
    task: Option<Box<dyn FnOnce() -> Task + Send + Sync>>,
}

impl Cleanup {
    /// Runs `task()` when dropped; `what` names what it drops in the message printed if
    /// it fails.
    pub fn new<F, Fut, E>(what: impl Into<String>, task: F) -> Self
    where
        F: FnOnce() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        Self {
            what: what.into(),
            task: Some(Box::new(move || {
                let future = task();
                Box::pin(async move { future.await.map_err(|error| error.to_string()) })
            })),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            finish_on_own_thread(&self.what, task());
        }
    }
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleanup").field("what", &self.what).finish()
    }
}
