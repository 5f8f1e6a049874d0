//! The web dashboard: what waits in the outbox, what failed and why, and the repair of
//! dead letters, in a browser.
//!
//! Served by `oncebox dashboard`, and by `oncebox relay` and `oncebox receive` when
//! `dashboard.listen` is set, for any store in the build through [`OutboxAdmin`],
//! [`InboxAdmin`] and [`DedupStore::inspect`]. Pages
//! are rendered on the server (maud escapes every value), use no JavaScript, and every
//! asset is embedded in the binary.
//!
//! Security: nothing is served without `dashboard.token`; an operator logs in with it
//! and gets an `HttpOnly`, `SameSite=Strict` session cookie; every form that changes
//! data carries the session's CSRF token, checked before anything is done; with
//! `dashboard.read_only` (the default) no action is shown and every change is refused; responses
//! forbid scripts and framing (`Content-Security-Policy`) and caching.
//!
//! [`OutboxAdmin`]: oncebox::spool::OutboxAdmin
//! [`InboxAdmin`]: oncebox::consumer::InboxAdmin
//! [`DedupStore::inspect`]: oncebox::store::DedupStore::inspect

mod actions;
mod failures;
mod form;
mod inbox;
mod pages;
mod session;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use oncebox::redis::RedisDedupStore;
use tokio::net::TcpListener;
use tokio::sync::OnceCell;

use crate::config::{Config, ConfigError, DashboardConfig, Secret};
use crate::service::backend::{AnyOutbox, Database};
use session::Sessions;

/// What every handler reads.
struct Dashboard {
    database: Arc<Database>,
    outbox: AnyOutbox,
    /// An idempotent receiver's dedup records in Redis (`dashboard.redis_dedup_url`).
    redis_dedup: Option<RedisDedup>,
    /// `""` or `"/segment…"`: prefixed to every link.
    base: String,
    read_only: bool,
    sessions: Sessions,
}

type Shared = State<Arc<Dashboard>>;

/// A Redis dedup store reached on first use, so that a Redis down when the process
/// starts costs the keys page its Redis lookups until it is back, never the relay or
/// receiver serving the dashboard its start.
struct RedisDedup {
    url: Secret,
    /// The URL names a cluster's nodes.
    cluster: bool,
    prefix: Option<String>,
    store: OnceCell<RedisDedupStore>,
}

impl RedisDedup {
    /// Checks the URL (without connecting).
    fn new(url: &Secret, cluster: bool, prefix: Option<String>) -> Result<Self, ConfigError> {
        if cluster {
            crate::config::cluster_nodes("dashboard.redis_dedup_url", url.expose(), None)?;
            return Ok(Self {
                url: url.clone(),
                cluster,
                prefix,
                store: OnceCell::new(),
            });
        }
        ::url::Url::parse(url.expose())
            .ok()
            .filter(|url| matches!(url.scheme(), "redis" | "rediss"))
            .ok_or_else(|| {
                ConfigError::key(
                    "dashboard.redis_dedup_url",
                    "not a redis:// or rediss:// URL",
                )
            })?;
        Ok(Self {
            url: url.clone(),
            cluster,
            prefix,
            store: OnceCell::new(),
        })
    }

    /// The store, connected now if it was not yet.
    async fn store(&self) -> oncebox::Result<&RedisDedupStore> {
        self.store
            .get_or_try_init(|| async {
                let store = if self.cluster {
                    let nodes = crate::config::cluster_nodes(
                        "dashboard.redis_dedup_url",
                        self.url.expose(),
                        None,
                    )
                    .map_err(|error| oncebox::Error::InvalidOptions(error.0))?;
                    RedisDedupStore::connect_cluster(nodes).await?
                } else {
                    RedisDedupStore::connect(self.url.expose()).await?
                };
                Ok(match &self.prefix {
                    Some(prefix) => store.with_prefix(prefix),
                    None => store,
                })
            })
            .await
    }
}

/// The dashboard, ready to serve: its listener bound and its store open.
pub(crate) struct Server {
    listener: TcpListener,
    app: Router,
}

impl Server {
    /// Binds `address` and builds the dashboard over `database`'s outbox.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if the address cannot be bound, the token is missing or
    /// weak, or the outbox cannot be opened.
    pub(crate) async fn new(
        config: &Config,
        database: Arc<Database>,
        address: SocketAddr,
    ) -> Result<Self, ConfigError> {
        let settings = &config.dashboard;
        let token = settings.checked_token()?.clone();
        let listener = TcpListener::bind(address).await.map_err(|error| {
            ConfigError::key(
                "dashboard.listen",
                format!("cannot listen on {address}: {error}"),
            )
        })?;
        let redis_dedup = settings
            .redis_dedup_url
            .as_ref()
            .map(|url| {
                RedisDedup::new(
                    url,
                    settings.redis_dedup_cluster,
                    settings.redis_dedup_prefix.clone(),
                )
            })
            .transpose()?;
        let dashboard = Arc::new(Dashboard {
            outbox: database.outbox(config)?,
            redis_dedup,
            database,
            base: settings.base().to_owned(),
            read_only: settings.read_only,
            sessions: Sessions::new(token, settings.session_ttl.get(), settings.secure_cookie),
        });
        Ok(Self {
            listener,
            app: router(dashboard),
        })
    }

    /// The address it listens on.
    pub(crate) fn address(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the process ends or `shutdown` completes.
    pub(crate) async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.app)
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Serves in the background for as long as the process runs (beside a relay or a
    /// receiver).
    pub(crate) fn spawn(self) {
        if let Ok(address) = self.address() {
            tracing::info!(%address, "serving the dashboard");
        }
        tokio::spawn(async move {
            if let Err(error) = self.serve(std::future::pending()).await {
                tracing::error!(%error, "the dashboard stopped");
            }
        });
    }
}

/// `oncebox dashboard`: serves only the dashboard, until SIGTERM or SIGINT.
pub(crate) async fn run(config: &Config) -> anyhow::Result<std::process::ExitCode> {
    let address = match config.dashboard.address()? {
        Some(address) => address,
        None => DashboardConfig::COMMAND_DEFAULT
            .parse()
            .expect("the default address parses"),
    };
    let mut signals = crate::service::stop::Signals::listen()
        .map_err(|error| anyhow::anyhow!("cannot listen to SIGTERM and SIGINT: {error}"))?;
    let database = Arc::new(Database::connect(config).await?);
    let server = Server::new(config, database, address).await?;
    let address = server.address()?;
    tracing::info!(%address, base = config.dashboard.base(), "serving the dashboard");
    eprintln!(
        "oncebox dashboard: http://{address}{}/",
        config.dashboard.base()
    );
    server
        .serve(async move {
            let signal = signals.next().await;
            tracing::info!(signal, "stopping the dashboard");
        })
        .await?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// Every route under the base path: `{base}/` is the overview, and `{base}` alone
/// sends a browser there.
fn router(dashboard: Arc<Dashboard>) -> Router {
    let base = dashboard.base.clone();
    let at = |path: &str| format!("{base}{path}");
    let pages = Router::new()
        .route(&at("/"), get(pages::overview))
        .route(&at("/messages"), get(pages::messages))
        .route(&at("/messages/{id}"), get(pages::message))
        .route(&at("/inbox"), get(inbox::rows))
        .route(&at("/inbox/{seq}"), get(inbox::row))
        .route(&at("/failures"), get(pages::failures))
        .route(&at("/failures/group"), get(pages::failure_group))
        .route(&at("/keys"), get(pages::keys))
        .route(&at("/actions/confirm"), post(actions::confirm))
        .route(&at("/actions/apply"), post(actions::apply))
        .route(&at("/logout"), post(session::logout))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&dashboard),
            session::require,
        ));
    let mut open = Router::new()
        .route(&at("/login"), get(session::login_page).post(session::login))
        .route(&at("/assets/style.css"), get(view::stylesheet));
    if !base.is_empty() {
        let home = at("/");
        open = open.route(&base, get(move || async move { Redirect::to(&home) }));
    }
    pages
        .merge(open)
        .with_state(dashboard)
        .fallback(not_found)
        .layer(middleware::from_fn(protect))
}

async fn not_found(method: Method) -> Response {
    let status = if method == Method::GET {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::METHOD_NOT_ALLOWED
    };
    (status, "not found\n").into_response()
}

/// Headers on every response: no script may run, no other site may frame or read the
/// pages, and nothing is cached (pages show live data and the CSRF token).
async fn protect(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> Secret {
        serde_json::from_value(serde_json::Value::from(text)).expect("a string")
    }

    /// The relay or receiver serving the dashboard starts with Redis down: only a lookup
    /// fails, without the URL's password, and the next one tries again.
    #[tokio::test]
    async fn a_redis_down_at_start_fails_lookups_not_the_start() {
        assert!(RedisDedup::new(&secret("postgres://127.0.0.1/db"), false, None).is_err());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let url = format!("redis://user:hunter2-secret@127.0.0.1:{port}");
        let redis = RedisDedup::new(&secret(&url), false, None).expect("a Redis URL");
        for attempt in ["first", "second"] {
            let error = redis.store().await.expect_err("nothing listens there");
            assert!(
                !error.to_string().contains("hunter2"),
                "{attempt} lookup: the password is shown: {error}"
            );
        }
    }
}
