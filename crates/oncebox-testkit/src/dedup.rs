//! The dedup conformance suite (being written).
