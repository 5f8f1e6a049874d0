//! The outbox conformance suite (being written).
