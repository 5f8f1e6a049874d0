#![doc = include_str!("../../../docs/model-checking.md")]

pub mod cdc;
pub mod dedup;
pub mod inbox;
pub mod spool;

pub use cdc::{CdcBug, CdcModel};
pub use dedup::DedupModel;
pub use inbox::InboxModel;
pub use spool::{SpoolBug, SpoolModel};
