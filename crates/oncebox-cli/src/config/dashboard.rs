//! `[dashboard]`: the web dashboard, its address, path and login.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret, Span};

/// The web dashboard: served by `oncebox dashboard`, and by `oncebox relay` and
/// `oncebox receive` when `listen` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DashboardConfig {
    /// Address to serve on; `off` (the default): `relay` and `receive` serve none, and
    /// `oncebox dashboard` serves on [`DashboardConfig::COMMAND_DEFAULT`].
    pub(crate) listen: String,
    /// The path the dashboard is served under, for a reverse proxy that forwards
    /// `/oncebox/…` as it is: `"/oncebox"`; `""` for the root.
    pub(crate) base_path: String,
    /// What operators log in with (`ONCEBOX_DASHBOARD__TOKEN` or `…_TOKEN_FILE`), at
    /// least [`DashboardConfig::MIN_TOKEN`] characters; the dashboard is not served
    /// without one.
    pub(crate) token: Option<Secret>,
    /// Shows no action and refuses every change (the default): `false` lets operators
    /// replay and purge dead letters.
    pub(crate) read_only: bool,
    /// Marks the session cookie `Secure`, for a dashboard reached over HTTPS.
    pub(crate) secure_cookie: bool,
    /// How long a login lasts.
    pub(crate) session_ttl: Span,
    /// The Redis server holding an idempotent receiver's dedup records (`redis://…`),
    /// for the keys page to look ids up in besides the store's own. A secret, as the URL
    /// may carry a password (`ONCEBOX_DASHBOARD__REDIS_DEDUP_URL` or `…_FILE`).
    pub(crate) redis_dedup_url: Option<Secret>,
    /// `redis_dedup_url` names seed nodes of a Redis Cluster,
    /// `redis://HOST:PORT[,HOST:PORT…]`, whose store uses the sharded key layout.
    pub(crate) redis_dedup_cluster: bool,
    /// The key prefix those records are under (`RedisDedupStore::with_prefix`); unset:
    /// the store's default.
    pub(crate) redis_dedup_prefix: Option<String>,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            listen: "off".to_owned(),
            base_path: String::new(),
            token: None,
            read_only: true,
            secure_cookie: false,
            session_ttl: Span::secs(12 * 3600),
            redis_dedup_url: None,
            redis_dedup_cluster: false,
            redis_dedup_prefix: None,
        }
    }
}

impl DashboardConfig {
    /// Where `oncebox dashboard` listens when `listen` is `off`.
    pub(crate) const COMMAND_DEFAULT: &str = "127.0.0.1:9465";
    /// The shortest token accepted: long enough that guessing it is hopeless.
    pub(crate) const MIN_TOKEN: usize = 16;

    /// The address `relay` and `receive` serve the dashboard on, or `None` when off.
    pub(crate) fn address(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen == "off" {
            return Ok(None);
        }
        self.listen.parse().map(Some).map_err(|_| {
            ConfigError::key(
                "dashboard.listen",
                format!(
                    "{:?} is not an address such as {} (or \"off\")",
                    self.listen,
                    Self::COMMAND_DEFAULT
                ),
            )
        })
    }

    /// The base path without its trailing slash: `""` or `"/segment[/segment…]"`.
    pub(crate) fn base(&self) -> &str {
        self.base_path.trim_end_matches('/')
    }

    /// The token, checked: what serving the dashboard needs.
    pub(crate) fn checked_token(&self) -> Result<&Secret, ConfigError> {
        let token = self.token.as_ref().ok_or_else(|| {
            ConfigError::key(
                "dashboard.token",
                "the dashboard needs a token to log in with: set ONCEBOX_DASHBOARD__TOKEN or ONCEBOX_DASHBOARD__TOKEN_FILE",
            )
        })?;
        let length = token.expose().chars().count();
        if length < Self::MIN_TOKEN || token.expose().trim() != token.expose() {
            return Err(ConfigError::key(
                "dashboard.token",
                format!(
                    "must be at least {} characters, without leading or trailing spaces",
                    Self::MIN_TOKEN
                ),
            ));
        }
        Ok(token)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let base = self.base();
        let segment_ok = |segment: &str| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
        };
        let clean = base.is_empty()
            || base
                .strip_prefix('/')
                .is_some_and(|path| path.split('/').all(segment_ok));
        if !clean {
            return Err(ConfigError::key(
                "dashboard.base_path",
                format!(
                    "{:?} is not a path such as \"/oncebox\" (segments of letters, digits, - . _ ~)",
                    self.base_path
                ),
            ));
        }
        if self.session_ttl.get().is_zero() {
            return Err(ConfigError::key(
                "dashboard.session_ttl",
                "must be above zero",
            ));
        }
        if self.address()?.is_some() {
            self.checked_token()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn a_served_dashboard_needs_a_strong_token_and_a_clean_base_path() {
        let load = |dashboard: &str, vars: &[(String, String)]| {
            Config::load_from_text(&format!("[dashboard]\n{dashboard}\n"), vars)
        };
        let off = load("", &[]).expect("off by default: no token needed");
        assert!(off.dashboard.read_only, "read-only by default");
        let error = load("listen = \"127.0.0.1:9465\"", &[]).expect_err("no token");
        assert!(error.0.starts_with("dashboard.token:"), "{error}");
        let error =
            load("listen = \"127.0.0.1:9465\"\ntoken = \"short\"", &[]).expect_err("a short token");
        assert!(error.0.contains("at least 16"), "{error}");

        let dir = tempfile::tempdir().expect("a directory");
        let file = dir.path().join("token");
        std::fs::write(&file, "a-token-from-a-file\n").expect("written");
        let vars = [(
            "ONCEBOX_DASHBOARD__TOKEN_FILE".to_owned(),
            file.display().to_string(),
        )];
        let config = load("listen = \"127.0.0.1:9465\"", &vars).expect("a token from a file");
        let token = config.dashboard.checked_token().expect("strong enough");
        assert_eq!(token.expose(), "a-token-from-a-file");
        assert!(
            !config.to_toml().contains("a-token-from-a-file"),
            "never printed"
        );

        for base in ["ops", "/a//b", "/a/../b", "/<x>", "/a b"] {
            let error = load(&format!("base_path = {base:?}"), &[]).expect_err(base);
            assert!(
                error.0.starts_with("dashboard.base_path:"),
                "{base}: {error}"
            );
        }
        let config = load("base_path = \"/ops/oncebox/\"", &[]).expect("a clean path");
        assert_eq!(config.dashboard.base(), "/ops/oncebox");
    }
}
