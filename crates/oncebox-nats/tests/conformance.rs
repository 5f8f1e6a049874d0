//! The `oncebox-testkit` transport suite against NATS JetStream: every check on the
//! machine's server (`ONCEBOX_NATS_URL`, default `nats://127.0.0.1:4222`) with streams of
//! its own, except the restart check, which restarts a server of its own.

mod support;

use oncebox_core::Result;
use oncebox_testkit::transport::TransportHarness;
use support::NatsHarness;

macro_rules! on_the_shared_server {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $check() -> Result<()> {
                let harness = NatsHarness::shared().await;
                let result = oncebox_testkit::transport::$check(&harness).await;
                harness.cleanup().await;
                result
            }
        )*
    };
}

oncebox_testkit::transport_checks!(on_the_shared_server!());

/// Kills (SIGKILL) and restarts a private nats-server on the same port and store while a
/// delivery is in flight; the shared server is never restarted.
#[tokio::test(flavor = "multi_thread")]
async fn survives_restart() -> Result<()> {
    let harness = NatsHarness::private().await;
    // Without the capability the check would skip and prove nothing.
    assert!(harness.capabilities().restart);
    let result = oncebox_testkit::transport::survives_restart(&harness).await;
    harness.cleanup().await;
    result
}
