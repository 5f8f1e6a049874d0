//! The dedup conformance suite against [`MemoryDedupStore`], the reference store.

use std::sync::Arc;

use oncebox_core::memory::MemoryDedupStore;
use oncebox_testkit::dedup::{self, DedupHarness};

/// A fresh in-memory store per check.
struct Memory(Arc<MemoryDedupStore>);

impl Memory {
    fn new() -> Self {
        Self(Arc::new(MemoryDedupStore::new(10_000)))
    }
}

impl DedupHarness for Memory {
    type Store = Arc<MemoryDedupStore>;

    fn store(&self) -> Self::Store {
        Arc::clone(&self.0)
    }

    async fn count_records(&self) -> oncebox_core::Result<Option<u64>> {
        Ok(Some(self.0.len() as u64))
    }
}

macro_rules! checks {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $check() {
            dedup::$check(&Memory::new()).await;
        }
    )*};
}

oncebox_testkit::dedup_checks!(checks!());

/// Broken stores the suite must reject: proof that the checks can fail.
mod broken {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use oncebox_core::Result;
    use oncebox_core::memory::MemoryDedupStore;
    use oncebox_core::store::{Begin, DedupRecord, DedupStore, FencingToken};
    use oncebox_testkit::dedup::{self, DedupHarness};

    #[derive(Clone, Copy)]
    enum Fault {
        /// `complete` and `abandon` act for whoever holds the id, whatever the token.
        NoFencing,
        /// `complete` forgets the result, freeing the id.
        Forgets,
    }

    struct Broken {
        inner: MemoryDedupStore,
        holders: Mutex<HashMap<String, FencingToken>>,
        fault: Fault,
    }

    impl Broken {
        fn token(&self, id: &str, token: FencingToken) -> FencingToken {
            match self.fault {
                Fault::NoFencing => self
                    .holders
                    .lock()
                    .expect("holders lock poisoned")
                    .get(id)
                    .copied()
                    .unwrap_or(token),
                Fault::Forgets => token,
            }
        }
    }

    impl DedupStore for Broken {
        async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
            let begin = self.inner.begin(id, lease).await?;
            if let Begin::Started(token) = begin {
                self.holders
                    .lock()
                    .expect("holders lock poisoned")
                    .insert(id.to_owned(), token);
            }
            Ok(begin)
        }

        async fn complete(
            &self,
            id: &str,
            token: FencingToken,
            result: &[u8],
            ttl: Duration,
        ) -> Result<()> {
            let token = self.token(id, token);
            match self.fault {
                Fault::Forgets => self.inner.abandon(id, token).await,
                Fault::NoFencing => self.inner.complete(id, token, result, ttl).await,
            }
        }

        async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
            self.inner.extend(id, self.token(id, token), lease).await
        }

        async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
            self.inner.abandon(id, self.token(id, token)).await
        }

        async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
            self.inner.inspect(id).await
        }
    }

    struct Harness(Arc<Broken>);

    impl Harness {
        fn new(fault: Fault) -> Self {
            let inner = MemoryDedupStore::new(1000);
            Self(Arc::new(Broken {
                inner,
                holders: Mutex::default(),
                fault,
            }))
        }
    }

    impl DedupHarness for Harness {
        type Store = Arc<Broken>;

        fn store(&self) -> Self::Store {
            Arc::clone(&self.0)
        }
    }

    #[tokio::test]
    #[should_panic(expected = "expected Error::LeaseLost")]
    async fn unfenced_store_fails_expired_lease_is_fenced() {
        dedup::expired_lease_is_fenced(&Harness::new(Fault::NoFencing)).await;
    }

    #[tokio::test]
    #[should_panic(expected = "expected Error::LeaseLost")]
    async fn unfenced_store_fails_abandon_frees_at_once() {
        dedup::abandon_frees_at_once(&Harness::new(Fault::NoFencing)).await;
    }

    #[tokio::test]
    #[should_panic(expected = "expected Completed")]
    async fn forgetful_store_fails_complete_answers_duplicates() {
        dedup::complete_answers_duplicates(&Harness::new(Fault::Forgets)).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    #[should_panic(expected = "the handler must run once")]
    async fn forgetful_store_fails_receiver_runs_handler_once() {
        dedup::receiver_runs_handler_once(&Harness::new(Fault::Forgets)).await;
    }
}
