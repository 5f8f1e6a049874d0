//! Entry points for the fuzz targets in `fuzz/` at the repository root. Compiled only
//! with `--cfg fuzzing`, which `cargo fuzz` sets; not part of the crate's API.

use std::time::SystemTime;

/// A `created_at` column (microseconds since the Unix epoch) as the stores read it.
pub fn from_micros(micros: i64) -> SystemTime {
    crate::time::from_micros(micros)
}

/// A time as the stores write it into a `created_at` column.
pub fn to_micros(time: SystemTime) -> i64 {
    crate::time::to_micros(time)
}

#[cfg(feature = "cdc")]
pub use cdc::{Change, RowDecoder, committed_at};

#[cfg(feature = "cdc")]
mod cdc {
    use std::time::SystemTime;

    use oncebox_core::Message;

    use crate::cdc::row;

    /// What the log-tailing relay makes of one `pgoutput` message in table mode.
    #[derive(Debug)]
    pub enum Change {
        /// An insert into the outbox table.
        Inserted {
            /// The row's `seq`.
            seq: i64,
            /// Whether the row is published (its status is `pending`).
            pending: bool,
            /// The message, or why the row cannot be read as one.
            message: Result<Message, String>,
        },
        /// An insert whose `seq` cannot be read.
        Unreadable(String),
        /// Anything else.
        Other,
    }

    /// The relay's decoder of the outbox table's changes (`oncebox.outbox`).
    pub struct RowDecoder(row::RowDecoder);

    impl RowDecoder {
        /// A decoder of the table `oncebox.outbox` that has seen no relation yet.
        #[allow(clippy::new_without_default)]
        pub fn new() -> Self {
            Self(row::RowDecoder::new("oncebox", "outbox"))
        }

        /// Decodes one `pgoutput` message, as the relay does inside a transaction.
        pub fn decode(&mut self, data: &[u8]) -> Change {
            match self.0.decode(data) {
                row::Change::Inserted(row) => Change::Inserted {
                    seq: row.seq,
                    pending: row.pending,
                    message: row.message,
                },
                row::Change::Unreadable(reason) => Change::Unreadable(reason),
                row::Change::Other => Change::Other,
            }
        }
    }

    /// A Begin message's commit time (microseconds since 2000-01-01) as the relay
    /// reads it.
    pub fn committed_at(micros: i64) -> SystemTime {
        crate::cdc::session::committed_at(micros)
    }
}
