//! `[cdc]`: the log-tailing relay (`relay.mode = "cdc"`), and its mapping onto the
//! library's `CdcOptions`.

use serde::{Deserialize, Serialize};

use super::{Config, Span};

/// What the log-tailing relay reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CdcSource {
    /// Logical decoding messages (`emit`), no table.
    #[default]
    Messages,
    /// Inserts into the outbox table.
    Table,
}

/// What the relay does with a lost slot: invalidated, or gone although the store
/// remembers reading it (a failover, a drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LostSlotPolicy {
    /// Refuse to start, naming the range of WAL positions that may be lost.
    #[default]
    Fail,
    /// Drop and recreate it, saying what may be lost.
    Recreate,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct CdcConfig {
    /// Logical decoding messages or the outbox table's inserts.
    pub(crate) source: CdcSource,
    /// The replication slot (created when absent).
    pub(crate) slot: String,
    /// The publication (created when absent); default: the slot's name.
    pub(crate) publication: Option<String>,
    /// Messages published at once across keys.
    pub(crate) max_in_flight: i64,
    /// How often an idle outbox's slot is moved on.
    pub(crate) heartbeat: Span,
    /// How often the confirmed position is reported to the server.
    pub(crate) status_interval: Span,
    /// What to do with an invalidated slot.
    pub(crate) on_lost_slot: LostSlotPolicy,
}

impl Default for CdcConfig {
    fn default() -> Self {
        Self {
            source: CdcSource::Messages,
            slot: "oncebox_outbox".to_owned(),
            publication: None,
            max_in_flight: 1024,
            heartbeat: Span::secs(10),
            status_interval: Span::secs(1),
            on_lost_slot: LostSlotPolicy::Fail,
        }
    }
}

impl Config {
    /// The log-tailing relay's options, from `[cdc]` and `[relay]`.
    ///
    /// # Errors
    ///
    /// The options' own check failed (see `CdcOptions::validate`).
    pub fn cdc_options(&self) -> oncebox::Result<oncebox::postgres::cdc::CdcOptions> {
        use oncebox::postgres::cdc::{CdcMode, CdcOptions, LostSlot};
        let cdc = &self.cdc;
        let mode = match cdc.source {
            CdcSource::Messages => CdcMode::Messages,
            CdcSource::Table => CdcMode::Table,
        };
        let options = CdcOptions::new(mode, cdc.slot.clone())
            .publication(cdc.publication.clone().unwrap_or_else(|| cdc.slot.clone()))
            .max_in_flight(usize::try_from(cdc.max_in_flight).unwrap_or(1))
            .max_attempts(u32::try_from(self.relay.max_attempts).unwrap_or(u32::MAX))
            .backoff(
                oncebox::Backoff::new()
                    .initial(self.relay.retry_initial.get())
                    .max(self.relay.retry_max.get()),
            )
            .publish_timeout(self.relay.publish_timeout.get())
            .heartbeat(cdc.heartbeat.get())
            .status_interval(cdc.status_interval.get())
            .stats_interval(self.relay.stats_interval.get())
            .on_lost_slot(match cdc.on_lost_slot {
                LostSlotPolicy::Fail => LostSlot::Fail,
                LostSlotPolicy::Recreate => LostSlot::Recreate,
            });
        options.validate()?;
        Ok(options)
    }
}
