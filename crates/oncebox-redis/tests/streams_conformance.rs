//! The `oncebox-testkit` transport suite against the Redis Streams transport, one test
//! per check: on the machine's Redis under a key prefix of the test's own, and, for the
//! restart check, on a `redis-server` the test starts, kills and starts again.

mod support;

use oncebox_core::Result;
use oncebox_testkit::transport;
use support::StreamsHarness;

/// One test per check, named after it, each with a harness (and key prefix) of its own.
macro_rules! each_check {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread")]
        async fn $check() -> Result<()> {
            transport::$check(&StreamsHarness::new().await).await
        }
    )*};
}

oncebox_testkit::transport_checks!(each_check!());

/// A real restart: `kill -9` of a server persisting to an append-only file, and a new
/// server on the same port and directory.
#[tokio::test(flavor = "multi_thread")]
async fn survives_restart() -> Result<()> {
    let harness = StreamsHarness::with_own_server(true).await;
    assert!(
        oncebox_testkit::transport::TransportHarness::capabilities(&harness).restart,
        "the harness with its own server declares the restart capability"
    );
    transport::survives_restart(&harness).await
}
