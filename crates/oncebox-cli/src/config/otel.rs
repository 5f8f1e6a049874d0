//! `[otel]`: OpenTelemetry export of the services' spans.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Where `oncebox relay` and `oncebox receive` export their spans (feature `otel`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct OtelConfig {
    /// An OTLP/HTTP collector's base URL (`http://127.0.0.1:4318`); spans go to
    /// `{endpoint}/v1/traces`. None: nothing is exported.
    pub(crate) endpoint: Option<String>,
    /// `service.name` of the exported spans; default `oncebox-relay` or
    /// `oncebox-receive`.
    pub(crate) service_name: Option<String>,
}

impl OtelConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let Some(endpoint) = &self.endpoint else {
            return Ok(());
        };
        let key = |problem: &str| ConfigError::key("otel.endpoint", problem);
        if !crate::telemetry::can_trace() {
            return Err(key(
                "this build exports no spans: build the cli with the feature otel (or full)",
            ));
        }
        let url = ::url::Url::parse(endpoint)
            .map_err(|_| key("is not a URL such as http://127.0.0.1:4318"))?;
        if url.scheme() != "http" {
            return Err(key(
                "must be http:// (OTLP/HTTP to a collector beside the service; this build has no TLS for it)",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
            return Err(key("must hold no credentials and no query"));
        }
        Ok(())
    }
}
