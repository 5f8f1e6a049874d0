//! Conformance suites that every oncebox store and transport passes, run against the
//! real service.
//!
//! A backend crate implements a small harness trait for its store or transport (how to
//! make a fresh, isolated instance; how to enqueue on its own connection type; how to
//! restart its broker) and calls the suite from one `#[tokio::test]` per check. The
//! suites take capability flags, so a transport without consumer groups, say, skips
//! that check and says so.
//!
//! | suite | harness | checks |
//! |---|---|---|
//! | [`outbox`] | [`outbox::OutboxHarness`] | the spool store contract, atomic enqueue, the relay end to end |
//! | [`inbox`] | [`inbox::InboxHarness`] | transactional inbox and durable inbox |
//! | [`dedup`] | [`dedup::DedupHarness`] | the dedup store state machine, leases, fencing, TTL |
//! | [`transport`] | [`transport::TransportHarness`] | publish/confirm, redelivery, dead letters, order, groups, restarts |
//! | [`multi_relay`] | [`multi_relay::MultiRelayHarness`] | four relays killed at random keep each key in commit order |
//! | `trace` (feature `otel`) | a transport's, an outbox's and an inbox's | one trace from an HTTP request through the relay and the broker to the handler |
//!
//! [`sql_harness`] implements the four store harnesses once for an sqlx-based backend.
//! [`fresh`] gives each test a database (or schema) of its own on a shared server.
//! [`guide`] reads the SQL statements of a guide, for tests that run each of them.
//! [`proxy`] cuts, stalls and slows one client's connections to its database or broker,
//! and moves an address to another server; [`pg_pair`] runs a PostgreSQL primary with a
//! streaming standby, for failovers.
//! `browser` (feature `browser`) drives a headless Chromium through chromedriver, for
//! tests of web pages.
//!
//! [`checks`] lists every check of each suite, so that a backend's tests run them all, and
//! holds the compile-time contracts every store meets.

#[cfg(feature = "browser")]
pub mod browser;
pub mod checks;
pub mod dedup;
pub mod e2e;
pub mod fixtures;
pub mod fresh;
pub mod guide;
pub mod inbox;
#[cfg(feature = "sqlite")]
pub mod interop;
pub mod multi_relay;
pub mod outbox;
pub mod pg_pair;
pub mod proxy;
pub mod sql_harness;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod steady;
mod support;
#[cfg(feature = "otel")]
pub mod trace;
pub mod transport;
