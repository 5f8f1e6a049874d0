//! How the replication connection reads a URL, against how the pool reads it.

use std::path::PathBuf;

use pgwire_replication::SslMode;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::*;

fn target(url: &str) -> ReplicationConfig {
    CdcConnection::from_url(url)
        .unwrap_or_else(|error| panic!("{url}: {error}"))
        .replication("slot", "publication")
}

fn tls(mode: SslMode, root: Option<&str>, client: Option<(&str, &str)>) -> TlsConfig {
    let tls = TlsConfig {
        mode,
        ca_pem_path: root.map(PathBuf::from),
        ..TlsConfig::default()
    };
    match client {
        Some((cert, key)) => tls.with_client_cert(cert, key),
        None => tls,
    }
}

/// Marks a run of this test binary started by [`in_environment`].
const CHILD: &str = "ONCEBOX_CDC_CONNECT_TEST_CHILD";

/// Whether this process is the one to check the test `name` in an environment of
/// `vars` only (no `PG*` variable of the machine's). Otherwise runs that test again
/// in a child process of this test binary with that environment, fails when that
/// run fails, and answers false.
fn in_environment(name: &str, vars: &[(&str, &str)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let module = module_path!().split_once("::").map_or("", |(_, path)| path);
    let test = format!("{module}::{name}");
    let output = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args([&*test, "--exact", "--test-threads=1", "--nocapture"])
        .env_clear()
        .envs(vars.iter().copied())
        // No password file found through the home directory.
        .env(
            "HOME",
            std::env::temp_dir().join("oncebox-cdc-connect-no-home"),
        )
        .env(CHILD, "1")
        .output()
        .expect("this test binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test} with {vars:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

#[test]
fn every_sslmode_maps_onto_the_replication_connection() {
    if !in_environment("every_sslmode_maps_onto_the_replication_connection", &[]) {
        return;
    }
    let base = "postgres://app@db.example/orders";
    for (query, expected) in [
        ("", tls(SslMode::Prefer, None, None)),
        ("?sslmode=disable", tls(SslMode::Disable, None, None)),
        ("?sslmode=allow", tls(SslMode::Prefer, None, None)),
        ("?sslmode=prefer", tls(SslMode::Prefer, None, None)),
        ("?sslmode=require", tls(SslMode::Require, None, None)),
        ("?sslmode=REQUIRE", tls(SslMode::Require, None, None)),
        ("?ssl-mode=require", tls(SslMode::Require, None, None)),
        ("?sslmode=verify-ca", tls(SslMode::VerifyCa, None, None)),
        ("?sslmode=verify-full", tls(SslMode::VerifyFull, None, None)),
        (
            "?sslmode=verify-ca&sslrootcert=/etc/pg/ca.pem",
            tls(SslMode::VerifyCa, Some("/etc/pg/ca.pem"), None),
        ),
        (
            "?sslmode=verify-full&ssl-root-cert=/etc/pg/ca.pem",
            tls(SslMode::VerifyFull, Some("/etc/pg/ca.pem"), None),
        ),
        (
            "?sslmode=verify-full&ssl-ca=/etc/pg/ca.pem",
            tls(SslMode::VerifyFull, Some("/etc/pg/ca.pem"), None),
        ),
        // Without verification the root certificate is not read, as in the pool.
        (
            "?sslmode=require&sslrootcert=/etc/pg/ca.pem",
            tls(SslMode::Require, None, None),
        ),
    ] {
        let url = format!("{base}{query}");
        assert_eq!(target(&url).tls, expected, "{url}");
    }
}

#[test]
fn client_certificates_are_passed_through() {
    if !in_environment("client_certificates_are_passed_through", &[]) {
        return;
    }
    let base = "postgres://app@db.example/orders";
    for (query, expected) in [
        (
            "?sslcert=/etc/pg/client.pem&sslkey=/etc/pg/client.key",
            tls(
                SslMode::Prefer,
                None,
                Some(("/etc/pg/client.pem", "/etc/pg/client.key")),
            ),
        ),
        (
            "?sslmode=require&ssl-cert=/c.pem&ssl-key=/k.pem",
            tls(SslMode::Require, None, Some(("/c.pem", "/k.pem"))),
        ),
        (
            "?sslmode=verify-full&sslrootcert=/ca%20dir/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
            tls(
                SslMode::VerifyFull,
                Some("/ca dir/ca.pem"),
                Some(("/c.pem", "/k.pem")),
            ),
        ),
        // A connection without TLS reads no certificate.
        (
            "?sslmode=disable&sslcert=/c.pem&sslkey=/k.pem",
            tls(SslMode::Disable, None, None),
        ),
    ] {
        let url = format!("{base}{query}");
        assert_eq!(target(&url).tls, expected, "{url}");
    }
}

#[test]
fn query_parameters_and_percent_encoding_name_the_target() {
    if !in_environment("query_parameters_and_percent_encoding_name_the_target", &[]) {
        return;
    }
    for (url, expected) in [
        (
            "postgres:///?host=db.example&port=6543&user=app&dbname=orders&password=pw",
            ("db.example", 6543, "app", "pw", "orders"),
        ),
        (
            "postgres://ignored:old@other:1/other?host=db.example&port=6543&user=app&password=pw&dbname=orders",
            ("db.example", 6543, "app", "pw", "orders"),
        ),
        (
            "postgres://app%40eu:p%2Fss@db.example:6432/my%20orders",
            ("db.example", 6432, "app@eu", "p/ss", "my orders"),
        ),
        (
            "postgres://x@db.example/orders?user=app%40eu&password=p%26ss&dbname=my%20orders",
            ("db.example", 5432, "app@eu", "p&ss", "my orders"),
        ),
        (
            "postgres://app@db.example/orders?hostaddr=10.1.2.3",
            ("10.1.2.3", 5432, "app", "", "orders"),
        ),
        (
            "postgresql://app:pw@[::1]:6432/orders",
            ("::1", 6432, "app", "pw", "orders"),
        ),
        // A socket directory, as a query parameter or as the percent-encoded host.
        (
            "postgres:///orders?host=/run/postgresql&user=app",
            ("/run/postgresql", 5432, "app", "", "orders"),
        ),
        (
            "postgres://app@%2Frun%2Fpostgresql:6543/orders",
            ("/run/postgresql", 6543, "app", "", "orders"),
        ),
        // No database: the server's default, the user's name.
        (
            "postgres://app@db.example",
            ("db.example", 5432, "app", "", "app"),
        ),
    ] {
        let config = target(url);
        assert_eq!(
            (
                &*config.host,
                config.port,
                &*config.user,
                &*config.password,
                &*config.database
            ),
            expected,
            "{url}"
        );
    }
}

/// What sqlx's pool would connect to for `url`, field by field, against the
/// replication connection's target. Password and certificates have no getter in
/// sqlx: they are read from its `Debug`, a channel `from_url` does not use.
fn assert_same_target_as_the_pool(url: &str) {
    let pool: PgConnectOptions = url.parse().expect("sqlx reads the URL");
    let config = target(url);
    // Without the brackets of an IPv6 address, which name no host to connect to.
    let host = pool.get_socket().map_or_else(
        || pool.get_host().trim_matches(['[', ']']).to_owned(),
        |socket| socket.to_string_lossy().into_owned(),
    );
    assert_eq!(config.host, host, "{url}");
    assert_eq!(config.port, pool.get_port(), "{url}");
    assert_eq!(config.user, pool.get_username(), "{url}");
    assert_eq!(
        config.database,
        pool.get_database().unwrap_or(pool.get_username()),
        "{url}"
    );
    let mode = match pool.get_ssl_mode() {
        PgSslMode::Disable => SslMode::Disable,
        PgSslMode::Allow | PgSslMode::Prefer => SslMode::Prefer,
        PgSslMode::Require => SslMode::Require,
        PgSslMode::VerifyCa => SslMode::VerifyCa,
        PgSslMode::VerifyFull => SslMode::VerifyFull,
    };
    assert_eq!(config.tls.mode, mode, "{url}");
    let debug = format!("{pool:?}");
    let password = if config.password.is_empty() {
        "password: None".to_owned()
    } else {
        format!("password: Some({:?})", config.password)
    };
    assert!(debug.contains(&password), "{url}: {password} in {debug}");
    let file = |name: &str, path: &Option<PathBuf>| match path {
        Some(path) => format!("{name}: Some(File({path:?}))"),
        None => format!("{name}: None"),
    };
    if mode.verifies_certificate() {
        let root = file("ssl_root_cert", &config.tls.ca_pem_path);
        assert!(debug.contains(&root), "{url}: {root} in {debug}");
    }
    if mode != SslMode::Disable {
        for wanted in [
            file("ssl_client_cert", &config.tls.client_cert_pem_path),
            file("ssl_client_key", &config.tls.client_key_pem_path),
        ] {
            assert!(debug.contains(&wanted), "{url}: {wanted} in {debug}");
        }
    }
}

#[test]
fn the_replication_connection_targets_what_the_pool_targets() {
    for url in [
        "postgres://app:pw@db.example:6432/orders",
        "postgres://app@db.example/orders?sslmode=allow",
        "postgres://app@db.example/orders?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
        "postgres://app@db.example/orders?sslmode=require&sslcert=/c.pem&sslkey=/k.pem",
        "postgres:///?host=db.example&port=6543&user=app&dbname=orders&password=pw",
        "postgres://app%40eu:p%2Fss@db.example/my%20orders",
        "postgres:///orders?host=/run/postgresql&port=6543&user=app",
        "postgresql://app:pw@[::1]:6432/orders",
        "postgres://app@%2Frun%2Fpostgresql/orders",
        "postgres://app@db.example/orders?hostaddr=10.1.2.3&application_name=x",
        "postgres://app@db.example",
    ] {
        assert_same_target_as_the_pool(url);
    }
}

#[test]
fn environment_variables_apply_as_in_the_pool() {
    let vars = [
        ("PGHOST", "db.example"),
        ("PGPORT", "6543"),
        ("PGUSER", "app"),
        ("PGPASSWORD", "pw"),
        ("PGDATABASE", "orders"),
        ("PGSSLMODE", "verify-full"),
        ("PGSSLROOTCERT", "/etc/pg/ca.pem"),
        ("PGSSLCERT", "/etc/pg/client.pem"),
        ("PGSSLKEY", "/etc/pg/client.key"),
    ];
    if !in_environment("environment_variables_apply_as_in_the_pool", &vars) {
        return;
    }
    let config = target("postgres:");
    assert_eq!(
        (
            &*config.host,
            config.port,
            &*config.user,
            &*config.password,
            &*config.database
        ),
        ("db.example", 6543, "app", "pw", "orders")
    );
    assert_eq!(
        config.tls,
        tls(
            SslMode::VerifyFull,
            Some("/etc/pg/ca.pem"),
            Some(("/etc/pg/client.pem", "/etc/pg/client.key"))
        )
    );
    // What the URL names wins.
    let config = target(
        "postgres://other:secret@db2.example:7000/sales?sslmode=verify-ca&sslrootcert=/ca.pem",
    );
    assert_eq!(
        (
            &*config.host,
            config.port,
            &*config.user,
            &*config.password,
            &*config.database
        ),
        ("db2.example", 7000, "other", "secret", "sales")
    );
    assert_eq!(
        config.tls,
        tls(
            SslMode::VerifyCa,
            Some("/ca.pem"),
            Some(("/etc/pg/client.pem", "/etc/pg/client.key"))
        )
    );
    for url in [
        "postgres:",
        "postgres://other@db2.example/sales?sslmode=require",
    ] {
        assert_same_target_as_the_pool(url);
    }
}

#[cfg(unix)]
#[test]
fn the_password_file_is_read_as_by_the_pool() {
    const NAME: &str = "the_password_file_is_read_as_by_the_pool";
    if std::env::var_os(CHILD).is_none() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;

        let path = std::env::temp_dir().join(format!("oncebox-pgpass-{}", uuid::Uuid::new_v4()));
        std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut file| file.write_all(b"db.example:6432:orders:app:from-file\n"))
            .expect("a password file");
        let path_text = path.to_str().expect("a UTF-8 temporary directory");
        let ran = in_environment(NAME, &[("PGPASSFILE", path_text)]);
        std::fs::remove_file(&path).expect("the password file is removed");
        assert!(!ran);
        return;
    }
    assert_eq!(
        target("postgres://app@db.example:6432/orders").password,
        "from-file"
    );
    assert_eq!(
        target("postgres://app:given@db.example:6432/orders").password,
        "given"
    );
    assert_eq!(target("postgres://app@db.example:6432/sales").password, "");
    assert_same_target_as_the_pool("postgres://app@db.example:6432/orders");
}

#[test]
fn options_with_a_password_give_it_to_both_connections() {
    let options: PgConnectOptions = "postgres://app@db.example/orders?sslmode=require"
        .parse::<PgConnectOptions>()
        .expect("a valid URL")
        .password("set apart");
    let config = CdcConnection::from_options(&options)
        .expect("valid options")
        .replication("slot", "publication");
    assert_eq!(
        (&*config.password, config.tls.mode),
        ("set apart", SslMode::Require)
    );
}

#[test]
fn certificates_given_as_pem_text_are_refused_where_used() {
    let pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec();
    let options = |query: &str| {
        format!("postgres://app@db.example/orders{query}")
            .parse::<PgConnectOptions>()
            .expect("a valid URL")
    };
    let refused = |options: PgConnectOptions| {
        CdcConnection::from_options(&options)
            .expect_err("PEM text is refused")
            .to_string()
    };
    let error = refused(options("?sslmode=verify-full").ssl_root_cert_from_pem(pem.clone()));
    assert!(
        error.contains("sslrootcert") && error.contains("file"),
        "{error}"
    );
    let error = refused(options("?sslkey=/k.pem").ssl_client_cert_from_pem(&pem));
    assert!(error.contains("sslcert"), "{error}");
    // Not read, so not refused: a root certificate without verification, any
    // certificate without TLS.
    for unused in [
        options("?sslmode=require").ssl_root_cert_from_pem(pem.clone()),
        options("?sslmode=disable").ssl_client_cert_from_pem(&pem),
    ] {
        CdcConnection::from_options(&unused).expect("an unused certificate is not read");
    }
}

#[test]
fn bad_urls_are_named() {
    for (url, why) in [
        ("mysql://h/db", "not postgres"),
        ("postgres://h/db?sslmode=sometimes", "sometimes"),
        ("postgres://h/db?port=99999", "CDC connection URL"),
        ("not a url", "CDC connection URL"),
    ] {
        let error = CdcConnection::from_url(url).unwrap_err().to_string();
        assert!(error.contains(why), "{url}: {error}");
    }
}

#[test]
fn debug_hides_the_password() {
    let connection =
        CdcConnection::from_url("postgres://app:p%2Fss@db.example/orders").expect("valid");
    let shown = format!("{connection:?}");
    assert!(
        shown.contains("orders") && !shown.contains("p/ss"),
        "{shown}"
    );
}
