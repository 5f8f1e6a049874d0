//! The `oncebox-testkit` transport suite against SQS (the local server of
//! `scripts/services.sh sqs`), on FIFO queues and on standard queues, each check on
//! queues of its own. Not run: consumer groups (SQS has none), a retained log (a queue
//! is consumed), a restart (the local server keeps nothing across one).

mod support;

use oncebox_core::Result;
use support::SqsHarness;

macro_rules! on_queues {
    ($fifo:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() -> Result<()> {
                let harness = SqsHarness::new($fifo).await;
                let result = oncebox_testkit::transport::$check(&harness).await;
                harness.cleanup().await;
                result
            }
        )*
    };
}

mod fifo {
    use super::*;

    macro_rules! fifo_queues {
        ($($check:ident),* $(,)?) => { on_queues!(true; $($check),*); };
    }

    oncebox_testkit::transport_checks!(fifo_queues!());
}

mod standard {
    use super::*;

    macro_rules! standard_queues {
        ($($check:ident),* $(,)?) => { on_queues!(false; $($check),*); };
    }

    oncebox_testkit::transport_checks!(standard_queues!());
}
