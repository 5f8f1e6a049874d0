//! The transport conformance suite (being written).
