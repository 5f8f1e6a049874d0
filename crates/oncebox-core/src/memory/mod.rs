//! In-process implementations: an exact dedup store and a broker that misbehaves on
//! request. Good for tests, demos and single-process services.

mod dedup;

pub use dedup::MemoryDedupStore;
