//! The inbox conformance suite (being written).
