//! `[store]`, the database, and `[outbox]`, the outbox table's layout in it.

use serde::{Deserialize, Serialize};

use super::{Secret, Span, StoreUrl};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct StoreConfig {
    pub(crate) url: Option<StoreUrl>,
    pub(crate) password: Option<Secret>,
    /// PostgreSQL schema of oncebox's tables.
    pub(crate) schema: String,
    pub(crate) pool_size: u32,
    pub(crate) connect_timeout: Span,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: None,
            password: None,
            schema: "oncebox".to_owned(),
            pool_size: 8,
            connect_timeout: Span::secs(5),
        }
    }
}

/// The outbox table's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Layout {
    /// oncebox's own table.
    #[default]
    Oncebox,
    /// A Debezium-style table (PostgreSQL).
    Debezium,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct OutboxConfig {
    pub(crate) layout: Layout,
    /// The Debezium-style table, `schema.name` or `name` (in `public`).
    pub(crate) table: String,
    /// Prepended to `aggregatetype` to make the topic (Debezium layout).
    pub(crate) topic_prefix: String,
    /// PostgreSQL: wake on `NOTIFY` from producers that notify.
    pub(crate) listen: bool,
    /// PostgreSQL: hold claimed rows with the claim's transaction (else leases).
    pub(crate) held_claims: bool,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            layout: Layout::Oncebox,
            table: "public.outbox".to_owned(),
            topic_prefix: String::new(),
            listen: false,
            held_claims: true,
        }
    }
}
