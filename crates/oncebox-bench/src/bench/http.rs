//! `oncebox-bench http`: requests per second through the Idempotency-Key layer, against
//! the bare handler, in the same run.
//!
//! An axum server on loopback serves the same handler twice: bare, and behind
//! `IdempotencyLayer` over the chosen store. A client in the same process keeps
//! `--concurrency` requests in flight over keep-alive connections. Each round measures
//! the bare handler, first requests (a unique key each: begin, handler, store) and
//! replays (the same keys again: answered from the store); the best run of each is
//! reported, with its ratio to the bare handler.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderName, StatusCode, header};
use axum::routing::post;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use oncebox::http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions};
use oncebox::memory::LayeredDedupStore;
use oncebox::store::DedupStore;
use serde::Serialize;

use super::dedup::{BenchStore, DedupStoreKind, StoreArgs};
use super::measure::{highest, per_second, ratio};

/// Flags of `oncebox-bench http`.
#[derive(Debug, Clone, Args)]
pub(crate) struct HttpArgs {
    #[command(flatten)]
    pub(crate) stores: StoreArgs,
    /// Requests per run (default: 60,000 in memory, 20,000 on Redis, 5,000 on
    /// PostgreSQL: runs of about a second each).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) requests: Option<u64>,
    /// Requests in flight at once (one keep-alive connection each).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: u32,
    /// Size of each request body, in bytes (fingerprinted by the layer).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    pub(crate) body_bytes: u32,
    /// Put a `LayeredDedupStore` (in-memory window of completed responses) in front of
    /// the store.
    #[arg(long)]
    pub(crate) layered: bool,
    /// Rounds (bare, first, replay each); the best run of each is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
}

/// What a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Variant {
    /// The handler without the layer.
    Bare,
    /// Through the layer, a new key per request.
    First,
    /// Through the layer, keys already completed: every request a replay.
    Replay,
}

#[derive(Debug, Clone, Serialize)]
struct HttpRun {
    variant: Variant,
    round: u32,
    requests: u64,
    seconds: f64,
    requests_per_s: f64,
}

/// The report of `oncebox-bench http`.
#[derive(Debug, Serialize)]
struct HttpReport {
    bench: &'static str,
    store: DedupStoreKind,
    layered: bool,
    requests: u64,
    concurrency: u32,
    body_bytes: u32,
    /// Best bare-handler run.
    bare_requests_per_s: f64,
    /// Best run of first requests through the layer.
    requests_per_s: f64,
    /// `requests_per_s / bare_requests_per_s`.
    ratio: f64,
    /// Best run of replays through the layer.
    replay_requests_per_s: f64,
    /// `replay_requests_per_s / bare_requests_per_s`.
    replay_ratio: f64,
    /// In memory: the process's resident memory grown over the run, divided by the keys
    /// the store held at its end (each with its stored response), in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_per_key: Option<f64>,
    /// In memory: the keys the store held at the end of the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    keys_held: Option<usize>,
    runs: Vec<HttpRun>,
}

/// Runs `oncebox-bench http`.
pub(crate) async fn run(mut args: HttpArgs) -> anyhow::Result<ExitCode> {
    let requests = args.requests.unwrap_or(match args.stores.store {
        DedupStoreKind::Memory => 60_000,
        DedupStoreKind::Redis => 20_000,
        DedupStoreKind::Postgres => 5_000,
    });
    args.requests = Some(requests);
    let capacity = usize::try_from(
        requests
            .saturating_mul(u64::from(args.rounds))
            .saturating_mul(2),
    )
    .unwrap_or(usize::MAX);
    let store = BenchStore::open(&args.stores, capacity).await?;
    let resident_before = crate::chaos::rss_kib(std::process::id());
    let body = async {
        match &store {
            BenchStore::Memory(memory) => with_store(Arc::clone(memory), &args, capacity).await,
            BenchStore::Redis { store, .. } => with_store(store.clone(), &args, capacity).await,
            BenchStore::Postgres { store, .. } => with_store(store.clone(), &args, capacity).await,
        }
    };
    let result = tokio::select! {
        result = body => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let held = match &store {
        BenchStore::Memory(memory) => Some(memory.len()),
        _ => None,
    };
    let resident_after = crate::chaos::rss_kib(std::process::id());
    let cleanup = store.close().await;
    let mut report = result?;
    cleanup.context("cleaning up after the benchmark")?;
    if let Some(held) = held {
        report.keys_held = Some(held);
        if let (Some(before), Some(after)) = (resident_before, resident_after)
            && held > 0
        {
            report.bytes_per_key = Some(after.saturating_sub(before) as f64 * 1024.0 / held as f64);
        }
    }
    if args.stores.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    Ok(ExitCode::SUCCESS)
}

async fn with_store<S: DedupStore + 'static>(
    store: S,
    args: &HttpArgs,
    capacity: usize,
) -> anyhow::Result<HttpReport> {
    if args.layered {
        measure(LayeredDedupStore::new(store, capacity), args).await
    } else {
        measure(store, args).await
    }
}

fn print(report: &HttpReport) {
    println!(
        "bench http  store={:?}{}  requests={}  concurrency={}  body={} B",
        report.store,
        if report.layered { " (layered)" } else { "" },
        report.requests,
        report.concurrency,
        report.body_bytes
    );
    for run in &report.runs {
        println!(
            "  round {}  {:<7} {:>10.0} req/s",
            run.round,
            format!("{:?}", run.variant).to_lowercase(),
            run.requests_per_s
        );
    }
    println!(
        "  bare handler     {:>10.0} req/s",
        report.bare_requests_per_s
    );
    println!(
        "  with the layer   {:>10.0} req/s   ratio {:.3}",
        report.requests_per_s, report.ratio
    );
    println!(
        "  replays          {:>10.0} req/s   ratio {:.3}",
        report.replay_requests_per_s, report.replay_ratio
    );
    if let (Some(bytes), Some(keys)) = (report.bytes_per_key, report.keys_held) {
        println!("  memory           {bytes:>10.0} B a key ({keys} keys held)");
    }
}

/// The handler: reads the body, answers `201` with a small JSON document.
async fn pay(body: Bytes) -> (StatusCode, [(HeaderName, &'static str); 1], String) {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        format!(
            "{{\"status\":\"captured\",\"request_bytes\":{}}}",
            body.len()
        ),
    )
}

async fn serve(router: Router) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((addr, task))
}

async fn measure<S: DedupStore + 'static>(store: S, args: &HttpArgs) -> anyhow::Result<HttpReport> {
    let layer = IdempotencyLayer::new(
        store,
        HeaderPrincipal::new(HeaderName::from_static("x-api-key")),
        IdempotencyOptions::new().ttl(Duration::from_secs(600)),
    )?;
    let (bare, bare_task) = serve(Router::new().route("/pay", post(pay))).await?;
    let (layered, layered_task) =
        serve(Router::new().route("/pay", post(pay)).layer(layer)).await?;
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(args.concurrency as usize)
        .build_http();
    let body = Bytes::from(vec![b'x'; args.body_bytes as usize]);
    let requests = args.requests.unwrap_or(1);
    let load = Load {
        client,
        body,
        requests,
        concurrency: args.concurrency,
    };
    let result = async {
        // Warm-up of both servers: connections, allocator, caches; not reported.
        load.run(bare, Variant::Bare, "warmup").await?;
        load.run(layered, Variant::First, "warmup").await?;
        let mut runs = Vec::new();
        for round in 1..=args.rounds {
            let keys = format!("r{round}");
            for (variant, addr) in [
                (Variant::Bare, bare),
                (Variant::First, layered),
                (Variant::Replay, layered),
            ] {
                let elapsed = load.run(addr, variant, &keys).await?;
                runs.push(HttpRun {
                    variant,
                    round,
                    requests,
                    seconds: elapsed.as_secs_f64(),
                    requests_per_s: per_second(requests, elapsed),
                });
            }
        }
        Ok::<_, anyhow::Error>(runs)
    }
    .await;
    bare_task.abort();
    layered_task.abort();
    let runs = result?;
    let best = |variant: Variant| {
        highest(&runs, |r| {
            (r.variant == variant).then_some(r.requests_per_s)
        })
    };
    let (bare, first, replay) = (
        best(Variant::Bare),
        best(Variant::First),
        best(Variant::Replay),
    );
    Ok(HttpReport {
        bench: "http",
        store: args.stores.store,
        layered: args.layered,
        requests,
        concurrency: args.concurrency,
        body_bytes: args.body_bytes,
        bare_requests_per_s: bare,
        requests_per_s: first,
        ratio: ratio(first, bare),
        replay_requests_per_s: replay,
        replay_ratio: ratio(replay, bare),
        bytes_per_key: None,
        keys_held: None,
        runs,
    })
}

/// The client side: `requests` POSTs with `concurrency` in flight.
struct Load {
    client: Client<HttpConnector, Full<Bytes>>,
    body: Bytes,
    requests: u64,
    concurrency: u32,
}

impl Load {
    /// Sends the requests of one run to `addr`, keys `{keys}-{i}`; checks every answer
    /// is what `variant` expects (a replay is a replay, a first request is not).
    async fn run(
        &self,
        addr: SocketAddr,
        variant: Variant,
        keys: &str,
    ) -> anyhow::Result<Duration> {
        let uri: axum::http::Uri = format!("http://{addr}/pay").parse()?;
        let next = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..self.concurrency {
            let (client, body, uri, next) = (
                self.client.clone(),
                self.body.clone(),
                uri.clone(),
                Arc::clone(&next),
            );
            let (requests, keys) = (self.requests, keys.to_owned());
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let request = axum::http::Request::post(uri.clone())
                        .header("idempotency-key", format!("{keys}-{i}"))
                        .header("x-api-key", "bench-client")
                        .body(Full::new(body.clone()))?;
                    let response = client.request(request).await?;
                    let status = response.status();
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    collect(response.into_body()).await?;
                    let expected = match variant {
                        Variant::Bare | Variant::First => !replayed,
                        Variant::Replay => replayed,
                    };
                    anyhow::ensure!(
                        status == StatusCode::CREATED && expected,
                        "{variant:?} request {i}: status {status}, replayed {replayed}"
                    );
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined??;
        }
        Ok(start.elapsed())
    }
}

async fn collect<B>(body: B) -> anyhow::Result<()>
where
    B: http_body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    body.collect().await?;
    Ok(())
}
