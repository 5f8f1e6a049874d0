//! The replication connection's TLS against the real server (`ONCEBOX_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`): what each `sslmode` negotiates, the
//! fall back to plain when the server refuses TLS, a certificate that cannot be checked.
//! Each session is gated: it authenticates and answers a query, and never starts
//! replicating, so it needs no slot.

use std::time::Duration;

use pgwire_replication::ReplicationClient;
use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn server_url() -> String {
    std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with `query` (`name=value&...`) added to its query; a later parameter wins.
fn with_query(url: &str, query: &str) -> String {
    match (query, url.contains('?')) {
        ("", _) => url.to_owned(),
        (_, true) => format!("{url}&{query}"),
        (_, false) => format!("{url}?{query}"),
    }
}

/// Whether the server accepts TLS (`ssl = on`), asked through the pool's driver.
async fn server_offers_tls() -> bool {
    let mut connection = sqlx::postgres::PgConnection::connect(&server_url())
        .await
        .expect("connect to PostgreSQL (set ONCEBOX_PG_URL)");
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut connection)
        .await
        .expect("SHOW ssl");
    ssl == "on"
}

/// Whether the replication session `url` names is encrypted, as the server sees it, or
/// why it did not open.
async fn session_is_encrypted(url: &str) -> std::result::Result<bool, String> {
    let connection = CdcConnection::from_url(url).map_err(|error| error.to_string())?;
    let session = async {
        let mut client =
            ReplicationClient::connect_gated(connection.replication("no_slot", "no_publication"))
                .await?;
        client
            .simple_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .await
    };
    let rows = tokio::time::timeout(Duration::from_secs(30), session)
        .await
        .map_err(|_| format!("{url}: no answer in 30 s"))?
        .map_err(|error| error.to_string())?;
    match rows.first().and_then(|row| row.first()).cloned().flatten() {
        Some(value) if &value[..] == b"t" => Ok(true),
        Some(value) if &value[..] == b"f" => Ok(false),
        other => Err(format!("{url}: pg_stat_ssl answered {other:?}")),
    }
}

/// The first 8 bytes a client sends to ask for TLS: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 4, 210, 22, 47];

/// Listens on a port of its own and passes each connection on to the server, answering
/// a request for TLS with "no" as a server without TLS does; returns the port.
async fn proxy_refusing_tls() -> u16 {
    let options: PgConnectOptions = server_url().parse().expect("a valid ONCEBOX_PG_URL");
    let server = (options.get_host().to_owned(), options.get_port());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let port = listener.local_addr().expect("a bound port").port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let server = server.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 8];
                if client.read_exact(&mut first).await.is_err() {
                    return;
                }
                let Ok(mut upstream) = TcpStream::connect(server).await else {
                    return;
                };
                let passed = if first == SSL_REQUEST {
                    client.write_all(b"N").await
                } else {
                    upstream.write_all(&first).await
                };
                if passed.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn each_sslmode_negotiates_what_it_says_with_the_server() {
    let url = server_url();
    let offers_tls = server_offers_tls().await;
    for (query, encrypted) in [
        ("", offers_tls),
        ("sslmode=allow", offers_tls),
        ("sslmode=prefer", offers_tls),
        ("sslmode=disable", false),
    ] {
        let url = with_query(&url, query);
        assert_eq!(session_is_encrypted(&url).await, Ok(encrypted), "{url}");
    }
    let url = with_query(&url, "sslmode=require");
    let require = session_is_encrypted(&url).await;
    if offers_tls {
        assert_eq!(require, Ok(true), "{url}");
    } else {
        assert!(
            require.as_ref().is_err_and(|error| error.contains("TLS")),
            "{url}: {require:?}"
        );
    }
}

#[tokio::test]
async fn prefer_falls_back_to_plain_when_the_server_refuses_tls() {
    let port = proxy_refusing_tls().await;
    let url = with_query(&server_url(), &format!("host=127.0.0.1&port={port}"));
    assert_eq!(session_is_encrypted(&url).await, Ok(false), "{url}");
    let prefer = with_query(&url, "sslmode=prefer");
    assert_eq!(session_is_encrypted(&prefer).await, Ok(false), "{prefer}");
    // A mode that needs TLS never falls back.
    for mode in ["require", "verify-ca", "verify-full"] {
        let url = with_query(&url, &format!("sslmode={mode}"));
        let refused = session_is_encrypted(&url).await;
        assert!(
            refused.as_ref().is_err_and(|error| error.contains("TLS")),
            "{url}: {refused:?}"
        );
    }
}

#[tokio::test]
async fn verification_refuses_a_certificate_it_cannot_check() {
    // Without `sslrootcert` the server's certificate is checked against the Mozilla
    // roots, which sign no test server's certificate (and a server without TLS is
    // refused all the same).
    let url = with_query(&server_url(), "sslmode=verify-ca");
    let refused = session_is_encrypted(&url).await;
    assert!(refused.is_err(), "{url}: {refused:?}");
    // A root certificate file that is not there is named.
    let missing = std::env::temp_dir().join(format!("oncebox-no-ca-{}.pem", uuid::Uuid::new_v4()));
    let url = with_query(
        &server_url(),
        &format!("sslmode=verify-ca&sslrootcert={}", missing.display()),
    );
    let refused = session_is_encrypted(&url).await;
    if server_offers_tls().await {
        assert!(
            refused
                .as_ref()
                .is_err_and(|error| error.contains("oncebox-no-ca-")),
            "{url}: {refused:?}"
        );
    } else {
        assert!(refused.is_err(), "{url}: {refused:?}");
    }
}
