#![doc = include_str!("../../../docs/model-checking.md")]

pub mod dedup;
pub mod inbox;
pub mod spool;

pub use dedup::DedupModel;
pub use inbox::InboxModel;
pub use spool::{SpoolBug, SpoolModel};
