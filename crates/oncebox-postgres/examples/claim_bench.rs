//! Measures the outbox's claim and settle on large tables and prints the claim's plans.
//!
//! Run with: cargo run -p oncebox-postgres --example claim_bench -- [rows]
//!
//! `rows` defaults to 2,000,000. The server is `ONCEBOX_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); the example works in schemas
//! `oncebox_claim_bench_*`, which it drops at the end. Scenarios:
//!
//! - **many keys**: `rows` pending rows over 50,000 keys; three other relays hold a batch
//!   each; one relay claims 256 rows and settles them as done, 50 times.
//! - **hot keys**: `rows / 2` pending rows over 10 keys, every key's first row held by
//!   another relay (the case that makes a naive claim walk the whole backlog); then the
//!   same with 300 more keys of one row each behind the backlog.
//! - **enqueue**: 4,000 one-message transactions from 16 tasks, with and without NOTIFY.

use std::time::{Duration, Instant};

use oncebox_core::Message;
use oncebox_core::spool::{ClaimRequest, LeaseToken, Settle, Settlement, SpoolStore};
use oncebox_postgres::{PgOutbox, PgStore};
use sqlx::postgres::PgPoolOptions;

type Error = Box<dyn std::error::Error + Send + Sync>;

const LEASE: Duration = Duration::from_secs(600);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let rows: u64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 2_000_000,
    };
    let url = std::env::var("ONCEBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(&url)
        .await?;

    let many = fresh(&pool, "oncebox_claim_bench_many").await?;
    fill(&many, rows, 50_000).await?;
    let outbox = many.outbox();
    for _ in 0..3 {
        claim(&outbox, 256).await?; // other relays' batches in flight
    }
    println!("== many keys: {rows} pending rows over 50,000 keys, 3 batches held\n");
    println!("{}", outbox.explain_claim(256).await?);
    measure(&outbox, 50).await?;

    let hot = fresh(&pool, "oncebox_claim_bench_hot").await?;
    fill(&hot, rows / 2, 10).await?;
    let outbox = hot.outbox();
    let held = claim(&outbox, 10).await?;
    println!(
        "== hot keys: {} pending rows over 10 keys, the first row of each key held ({} rows)\n",
        rows / 2,
        held.1
    );
    println!("{}", outbox.explain_claim(256).await?);
    let started = Instant::now();
    let (_, found) = claim(&outbox, 256).await?;
    println!(
        "claim with every key held: {found} rows in {:?}",
        started.elapsed()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (id, topic, key, payload)
         SELECT gen_random_uuid(), 'orders', 'cold-' || i, '\\x' FROM generate_series(1, 300) i",
        outbox.table()
    )))
    .execute(hot.pool())
    .await?;
    println!("{}", outbox.explain_claim(256).await?);
    let started = Instant::now();
    let (_, found) = claim(&outbox, 256).await?;
    println!(
        "claim with 300 free keys behind the backlog: {found} rows in {:?}\n",
        started.elapsed()
    );

    let enqueue = fresh(&pool, "oncebox_claim_bench_enqueue").await?;
    for notify in [false, true] {
        let outbox = enqueue.outbox().with_notify(notify);
        let started = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|task| {
                let (store, outbox) = (enqueue.clone(), outbox.clone());
                tokio::spawn(async move {
                    for i in 0..250 {
                        let key = format!("order-{task}-{}", i % 10);
                        let message = Message::new("orders", "{}").with_key(key);
                        let mut tx = store.pool().begin().await?;
                        outbox.enqueue(&mut tx, &message).await?;
                        tx.commit().await?;
                    }
                    Ok::<_, Error>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        let elapsed = started.elapsed();
        println!(
            "enqueue, 16 tasks, notify {notify}: 4,000 commits in {elapsed:?} ({:.0}/s)",
            4_000.0 / elapsed.as_secs_f64()
        );
    }

    for store in [&many, &hot, &enqueue] {
        drop_schema(store).await?;
    }
    Ok(())
}

async fn fresh(pool: &sqlx::PgPool, schema: &str) -> Result<PgStore, Error> {
    let store = PgStore::from_pool(pool.clone()).with_schema(schema)?;
    drop_schema(&store).await?;
    store.migrate().await?;
    Ok(store)
}

async fn drop_schema(store: &PgStore) -> Result<(), Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
        store.schema()
    )))
    .execute(store.pool())
    .await?;
    Ok(())
}

/// `rows` pending rows over `keys` keys, written server-side, then vacuumed.
async fn fill(store: &PgStore, rows: u64, keys: u64) -> Result<(), Error> {
    let started = Instant::now();
    let table = store.outbox().table().to_owned();
    let chunk = 250_000;
    let mut from = 1;
    while from <= rows {
        let to = (from + chunk - 1).min(rows);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (id, topic, key, kind, headers, payload)
             SELECT gen_random_uuid(), 'orders', 'order-' || (i % {keys}), 'OrderPlaced',
                    '{{\"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}}',
                    convert_to(repeat('x', 200), 'UTF8')
             FROM generate_series({from}, {to}) AS i"
        )))
        .execute(store.pool())
        .await?;
        from = to + 1;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
        .execute(store.pool())
        .await?;
    eprintln!("filled {table} with {rows} rows in {:?}", started.elapsed());
    Ok(())
}

async fn claim(outbox: &PgOutbox, limit: usize) -> Result<(LeaseToken, usize), Error> {
    let request = ClaimRequest {
        token: LeaseToken::new(),
        limit,
        lease: LEASE,
    };
    let rows = outbox.claim(&request).await?;
    Ok((request.token, rows.len()))
}

/// `rounds` of claim 256 → settle done; prints the mean and worst of each.
async fn measure(outbox: &PgOutbox, rounds: usize) -> Result<(), Error> {
    let (mut claims, mut settles) = (Vec::new(), Vec::new());
    let mut total = 0;
    for _ in 0..rounds {
        let request = ClaimRequest {
            token: LeaseToken::new(),
            limit: 256,
            lease: LEASE,
        };
        let started = Instant::now();
        let rows = outbox.claim(&request).await?;
        claims.push(started.elapsed());
        total += rows.len();
        let settlements: Vec<Settlement> = rows
            .iter()
            .map(|row| Settlement {
                seq: row.seq,
                outcome: Settle::Done,
            })
            .collect();
        let started = Instant::now();
        outbox.settle(request.token, &settlements).await?;
        settles.push(started.elapsed());
    }
    let spent: Duration = claims.iter().chain(&settles).sum();
    println!(
        "{rounds} rounds, {total} rows: claim mean {:?} (worst {:?}), settle mean {:?} \
         (worst {:?}); {:.0} rows/s claimed and settled by one relay\n",
        mean(&claims),
        claims.iter().max().copied().unwrap_or_default(),
        mean(&settles),
        settles.iter().max().copied().unwrap_or_default(),
        total as f64 / spent.as_secs_f64()
    );
    Ok(())
}

fn mean(samples: &[Duration]) -> Duration {
    let n = u32::try_from(samples.len().max(1)).unwrap_or(u32::MAX);
    samples.iter().sum::<Duration>() / n
}
