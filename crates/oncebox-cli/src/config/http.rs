//! `[http]`: the metrics and health endpoint.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct HttpConfig {
    /// Address of `/metrics`, `/healthz` and `/readyz`; `off` for none.
    pub(crate) listen: String,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".to_owned(),
        }
    }
}

impl HttpConfig {
    /// The address to listen on, or `None` when off.
    pub(crate) fn address(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen.parse().map(Some).map_err(|_| {
            ConfigError::key(
                "http.listen",
                format!(
                    "{:?} is not an address such as 127.0.0.1:9464 (or \"off\")",
                    self.listen
                ),
            )
        })
    }
}
