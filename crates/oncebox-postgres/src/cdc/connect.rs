//! Where the relay's replication connection goes, read from a `postgres://` URL.

use oncebox_core::{Error, Result};
use pgwire_replication::{ReplicationConfig, TlsConfig};

/// The replication connection's target: host (or socket directory), port, user,
/// password, database and TLS mode, read from the store's URL.
///
/// The replication protocol is its own connection, outside the pool: the URL is what it
/// needs. `sslmode` `disable`, `allow` and `prefer` connect without TLS; `require`,
/// `verify-ca` and `verify-full` with it (`sslrootcert` names the CA file); a `host`
/// query parameter starting with `/` is a socket directory.
#[derive(Clone)]
pub struct CdcConnection {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    tls: TlsConfig,
}

impl std::fmt::Debug for CdcConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcConnection")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl CdcConnection {
    /// Reads `postgres://user:password@host:port/database?sslmode=...`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL that is not a PostgreSQL URL, or names an
    /// `sslmode` PostgreSQL does not know.
    pub fn from_url(url: &str) -> Result<Self> {
        let invalid = |why: String| Error::InvalidOptions(format!("CDC connection URL: {why}"));
        let parsed = url::Url::parse(url).map_err(|error| invalid(error.to_string()))?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(invalid(format!(
                "scheme {:?} is not postgres",
                parsed.scheme()
            )));
        }
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8_lossy()
                .into_owned()
        };
        let mut host = parsed.host_str().unwrap_or("127.0.0.1").to_owned();
        let mut tls = TlsConfig::disabled();
        let mut root = None;
        let mut mode = None;
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "host" => host = value.into_owned(),
                "sslrootcert" => root = Some(std::path::PathBuf::from(&*value)),
                "sslmode" => mode = Some(value.into_owned()),
                _ => {}
            }
        }
        if let Some(mode) = mode {
            tls = match mode.as_str() {
                "disable" | "allow" | "prefer" => TlsConfig::disabled(),
                "require" => TlsConfig::require(),
                "verify-ca" => TlsConfig::verify_ca(root),
                "verify-full" => TlsConfig::verify_full(root),
                other => return Err(invalid(format!("unknown sslmode {other:?}"))),
            };
        }
        let user = match parsed.username() {
            "" => "postgres".to_owned(),
            user => decode(user),
        };
        let database = parsed.path().trim_start_matches('/');
        Ok(Self {
            host,
            port: parsed.port().unwrap_or(5432),
            database: if database.is_empty() {
                user.clone()
            } else {
                decode(database)
            },
            user,
            password: parsed.password().map(decode).unwrap_or_default(),
            tls,
        })
    }

    /// Sets the password (for configurations that keep it apart from the URL).
    #[must_use]
    pub fn with_password(mut self, password: impl Into<String>) -> Self {
        self.password = password.into();
        self
    }

    /// The database the relay reads.
    pub fn database(&self) -> &str {
        &self.database
    }

    pub(crate) fn replication(&self, slot: &str, publication: &str) -> ReplicationConfig {
        ReplicationConfig::new(
            self.host.clone(),
            self.user.clone(),
            self.password.clone(),
            self.database.clone(),
            slot,
            publication,
        )
        .with_port(self.port)
        .with_tls(self.tls.clone())
        .with_application_name("oncebox-cdc")
        // Text output in the forms the row decoder reads, whatever the role's settings.
        .with_options("-c datestyle=ISO -c timezone=UTC -c bytea_output=hex")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read() {
        let target = CdcConnection::from_url(
            "postgres://app%40eu:p%2Fss@db.example:6432/orders?sslmode=require&application_name=x",
        )
        .expect("a valid URL");
        assert_eq!(
            (
                &*target.host,
                target.port,
                &*target.user,
                &*target.password,
                &*target.database
            ),
            ("db.example", 6432, "app@eu", "p/ss", "orders")
        );
        let socket =
            CdcConnection::from_url("postgres:///test?host=/run/postgresql").expect("a valid URL");
        assert_eq!(
            (&*socket.host, &*socket.database),
            ("/run/postgresql", "test")
        );
        assert!(format!("{socket:?}").contains("test") && !format!("{target:?}").contains("p/ss"));
    }

    #[test]
    fn bad_urls_are_named() {
        for (url, why) in [
            ("mysql://h/db", "not postgres"),
            ("postgres://h/db?sslmode=sometimes", "unknown sslmode"),
            ("not a url", "CDC connection URL"),
        ] {
            let error = CdcConnection::from_url(url).unwrap_err().to_string();
            assert!(error.contains(why), "{url}: {error}");
        }
    }
}
