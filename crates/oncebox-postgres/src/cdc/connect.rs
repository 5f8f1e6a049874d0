//! Where the relay's replication connection goes: the store's `postgres://` URL, read the
//! way the pool reads it.

use std::path::PathBuf;

use oncebox_core::{Error, Result};
use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The replication connection's target: host (or socket directory), port, user,
/// password, database and TLS settings.
///
/// The replication protocol is its own connection, outside the pool, and it is read
/// from the same settings as the pool: the URL (or [`PgConnectOptions`]) goes through
/// sqlx, so the query parameters (`host`, `hostaddr`, `port`, `user`, `password`,
/// `dbname`, `sslmode`, `sslrootcert`, `sslcert`, `sslkey` and their spellings
/// `ssl-mode`, `ssl-root-cert`, `ssl-ca`, `ssl-cert`, `ssl-key`), percent-encoding, the
/// `PG*` environment variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
/// `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`), the password
/// file (`PGPASSFILE`, `~/.pgpass`) and the defaults are the pool's. A host starting with
/// `/` (a `host` query parameter, or the URL's host percent-encoded) is a socket
/// directory; without a database the server's default, the user's name, is read.
///
/// `sslmode` maps onto the replication connection's TLS as follows:
///
/// | `sslmode` | replication connection |
/// |---|---|
/// | `disable` | no TLS; no certificate is read |
/// | `allow` | TLS when the server offers it, else none (as `prefer`: the replication client has no `allow`, and TLS when offered is at least as safe) |
/// | `prefer`, and no `sslmode` | TLS when the server offers it, else none; the server's certificate is not checked, and a failed handshake is an error, not a fall back to plain |
/// | `require` | TLS or no connection; the server's certificate is not checked |
/// | `verify-ca` | TLS, the server's certificate checked against `sslrootcert` (or the Mozilla roots without one) |
/// | `verify-full` | as `verify-ca`, and the certificate must name the host |
///
/// `sslcert` and `sslkey` are the client certificate and its key, presented whenever
/// TLS is used. The replication client reads certificates from files only: one given as
/// PEM text (a `PGSSLROOTCERT` holding the certificate itself) is refused when the mode
/// would use it. `options` and `application_name` are not taken: the relay sets its own
/// (`oncebox-cdc`, and the text formats its decoder reads).
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
            .field("sslmode", &self.tls.mode)
            .finish_non_exhaustive()
    }
}

fn invalid(why: impl std::fmt::Display) -> Error {
    Error::InvalidOptions(format!("CDC connection URL: {why}"))
}

impl CdcConnection {
    /// Reads `postgres://user:password@host:port/database?sslmode=...` as the pool reads
    /// it (see [`CdcConnection`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a URL that is not a PostgreSQL URL, or that sqlx
    /// refuses (an `sslmode` PostgreSQL does not know, a port that is not a number), or
    /// a certificate given as PEM text that the mode would use.
    pub fn from_url(url: &str) -> Result<Self> {
        let parsed = url::Url::parse(url).map_err(invalid)?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(invalid(format!(
                "scheme {:?} is not postgres",
                parsed.scheme()
            )));
        }
        let options: PgConnectOptions = url.parse().map_err(invalid)?;
        Self::from_options(&options)
    }

    /// Targets what a pool built from `options` targets (see [`CdcConnection`]): the same
    /// options, with a password set on them, give both connections the same password.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a certificate given as PEM text that the mode would
    /// use, or a socket directory whose name is not UTF-8.
    pub fn from_options(options: &PgConnectOptions) -> Result<Self> {
        let host = match options.get_socket() {
            Some(socket) => socket
                .to_str()
                .ok_or_else(|| invalid(format!("socket directory {socket:?} is not UTF-8")))?
                .to_owned(),
            // The URL keeps an IPv6 address's brackets, which name no host to connect to.
            None => {
                let host = options.get_host();
                host.strip_prefix('[')
                    .and_then(|inner| inner.strip_suffix(']'))
                    .unwrap_or(host)
                    .to_owned()
            }
        };
        let user = options.get_username().to_owned();
        let secrets = Secrets::of(options)?;
        let tls = match options.get_ssl_mode() {
            PgSslMode::Disable => TlsConfig::disabled(),
            PgSslMode::Allow | PgSslMode::Prefer => TlsConfig {
                mode: SslMode::Prefer,
                ..TlsConfig::disabled()
            },
            // The pool checks no certificate in this mode, whatever `sslrootcert` names.
            PgSslMode::Require => TlsConfig::require(),
            PgSslMode::VerifyCa => TlsConfig::verify_ca(file("sslrootcert", secrets.root)?),
            PgSslMode::VerifyFull => TlsConfig::verify_full(file("sslrootcert", secrets.root)?),
        };
        let tls = if tls.mode == SslMode::Disable {
            tls
        } else {
            // One without the other is the replication client's error once TLS is
            // negotiated, as it is the pool's.
            TlsConfig {
                client_cert_pem_path: file("sslcert", secrets.cert)?,
                client_key_pem_path: file("sslkey", secrets.key)?,
                ..tls
            }
        };
        Ok(Self {
            host,
            port: options.get_port(),
            database: options.get_database().unwrap_or(&user).to_owned(),
            user,
            password: secrets.password,
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

/// What sqlx holds for a connection but shows through no getter (sqlx 0.9 has none for
/// the password and the certificates): read from the one place it gives them out, the
/// URL it writes for its options ([`ConnectOptions::to_url_lossy`]). That URL carries
/// what sqlx settled on, wherever it came from: the URL's user info or query, a `PG*`
/// variable, the password file.
struct Secrets {
    password: String,
    root: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl Secrets {
    fn of(options: &PgConnectOptions) -> Result<Self> {
        // sqlx writes the user and host into that URL unescaped and panics on a result
        // that is no URL: both are replaced (they are read through getters, and the
        // password file was searched with the real ones when the options were made).
        let url = options
            .clone()
            .username("user")
            .host("localhost")
            .to_url_lossy();
        let password = match url.password() {
            Some(password) => percent_encoding::percent_decode_str(password)
                .decode_utf8()
                .map_err(|_| invalid("the password is not UTF-8"))?
                .into_owned(),
            None => String::new(),
        };
        let mut secrets = Self {
            password,
            root: None,
            cert: None,
            key: None,
        };
        for (name, value) in url.query_pairs() {
            let slot = match &*name {
                "sslrootcert" => &mut secrets.root,
                "sslcert" => &mut secrets.cert,
                "sslkey" => &mut secrets.key,
                _ => continue,
            };
            *slot = Some(value.into_owned());
        }
        Ok(secrets)
    }
}

/// The file a certificate setting names, as sqlx writes it: `file: <path>` for a file,
/// the PEM text itself for a certificate given inline.
fn file(setting: &str, written: Option<String>) -> Result<Option<PathBuf>> {
    let Some(written) = written else {
        return Ok(None);
    };
    match written.strip_prefix("file: ") {
        Some(path) => Ok(Some(PathBuf::from(path))),
        None if written.trim_start().starts_with("-----BEGIN") => Err(invalid(format!(
            "{setting} holds PEM text; the replication connection reads certificates from \
             files: name a file"
        ))),
        None => Ok(Some(PathBuf::from(written))),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
