//! The admin commands: `migrate`, `outbox stats | show`, `dead-letters list | replay |
//! purge`, `inbox purge`. Each works on any store in the build through
//! [`OutboxAdmin`], and prints a report, or one JSON object with `--json`.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context as _;
use clap::Subcommand;
use oncebox::spool::{
    DeadLetter, DeadLetterSelection, OutboxAdmin, OutboxRow, OutboxStats, RowStatus,
    select_dead_letters,
};
use oncebox::{Message, MessageId};
use serde_json::{Value, json};

use crate::config::{Config, ConfigError, Layout, Span, StoreKind};
use crate::service::backend::Database;

/// Flags of `oncebox migrate`.
#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// Print the SQL of every migration instead of running it, for teams that apply
    /// schema changes with their own tool.
    #[arg(long)]
    print: bool,
}

/// `oncebox outbox …`.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Rows pending, published and dead, and the oldest pending message's age.
    Stats {
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Drops the log-tailing relay's replication slot and publication (`[cdc]`), so that
    /// the slot keeps no more WAL. Stop the relays reading it first. The store still
    /// remembers the slot: a relay started on it later refuses, since what the slot held
    /// is gone, unless `on_lost_slot = "recreate"` or the slot was dropped with `--forget`.
    DropSlot {
        /// Retire the slot for good: forget it too, so that a relay started on the name
        /// later creates a fresh slot instead of refusing to.
        #[arg(long)]
        forget: bool,
    },
    /// One row: its status, attempts, last error, times, and its message.
    Show {
        /// The message id.
        id: String,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// `oncebox dead-letters …`.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadLetterCommand {
    /// The dead letters, oldest first, with why each was given up.
    List {
        /// Only those of this topic.
        #[arg(long)]
        topic: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back in line: pending, due now, attempts reset, each in its
    /// key's order (the log-tailing relay's are handed back to it, to be published after
    /// what it already read).
    Replay(Selection),
    /// Delete dead letters for good.
    Purge(Selection),
}

/// Which dead letters a replay or purge applies to, and how.
#[derive(Debug, clap::Args)]
pub(crate) struct Selection {
    #[command(flatten)]
    which: Which,
    /// Do not ask for confirmation.
    #[arg(long, short)]
    yes: bool,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// One id, a topic, or all: exactly one of them.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct Which {
    /// The dead letter of this message id.
    id: Option<String>,
    /// Every dead letter of this topic.
    #[arg(long)]
    topic: Option<String>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
}

/// `oncebox inbox …`.
#[derive(Debug, Subcommand)]
pub(crate) enum InboxCommand {
    /// Delete a consumer's inbox records (the transactional inbox's and the durable
    /// inbox's processed rows) older than a duration, which may not be shorter than the
    /// dedup window (`receive.dedup_window`).
    Purge {
        /// Records older than this go (such as "30d").
        #[arg(long, value_name = "DURATION")]
        older_than: Span,
        /// The consumer (default: `receive.consumer`).
        #[arg(long)]
        consumer: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// `oncebox migrate`.
pub(crate) async fn migrate(config: &Config, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    if args.print {
        print!("{}", migration_sql(config)?);
        return Ok(ExitCode::SUCCESS);
    }
    let database = Database::connect_creating(config).await?;
    database.migrate(config).await.context("migration failed")?;
    eprintln!("oncebox: the {} schema is up to date", database.kind());
    Ok(ExitCode::SUCCESS)
}

/// Every migration's SQL for the configured store, in order.
fn migration_sql(config: &Config) -> anyhow::Result<String> {
    let url = config.store_url()?;
    let sql = match url.kind() {
        StoreKind::Sqlite => {
            use oncebox::sqlite::{SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5};
            [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5].join("\n")
        }
        StoreKind::Postgres => {
            if config.outbox.layout == Layout::Debezium {
                return Err(ConfigError::key(
                    "outbox.layout",
                    "--print covers oncebox's own tables; the Debezium layout's columns and trigger are added by `oncebox migrate`",
                )
                .into());
            }
            oncebox::postgres::schema_sql(&config.store.schema)
                .map_err(|error| ConfigError::key("store.schema", error))?
        }
        #[cfg(feature = "mysql")]
        StoreKind::Mysql => {
            use oncebox::mysql::{SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5};
            [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5].join("\n")
        }
        #[cfg(not(feature = "mysql"))]
        StoreKind::Mysql => unreachable!("the URL parser refuses stores not in the build"),
    };
    Ok(sql)
}

/// `oncebox outbox …`.
pub(crate) async fn outbox(config: &Config, command: OutboxCommand) -> anyhow::Result<ExitCode> {
    let database = Database::connect(config).await?;
    let outbox = database.outbox(config)?;
    match command {
        OutboxCommand::Stats { json } => {
            let stats = OutboxAdmin::stats(&outbox).await?;
            // PostgreSQL's replication slots keep WAL for their readers: a slot that a
            // log-tailing relay left behind shows here.
            let slots = match &database {
                Database::Postgres(store) => Some(store.replication_slots().await?),
                _ => None,
            };
            if json {
                let mut value = stats_json(&stats);
                if let Some(slots) = &slots {
                    value["replication_slots"] = serde_json::to_value(slots)?;
                }
                println!("{value}");
            } else {
                print_stats(&stats);
                for slot in slots.iter().flatten() {
                    println!(
                        "slot {}  {}  retained WAL {} bytes  lag {} bytes{}",
                        slot.name,
                        if slot.active { "active" } else { "inactive" },
                        slot.retained_wal_bytes,
                        slot.lag_bytes,
                        if slot.wal_status == "lost" {
                            "  LOST"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        OutboxCommand::DropSlot { forget } => {
            let Database::Postgres(store) = &database else {
                anyhow::bail!("replication slots are PostgreSQL's: store.url is not postgres://");
            };
            let options = config.cdc_options()?;
            let slot = options.slot();
            let publication = config.cdc.publication.as_deref().unwrap_or(slot);
            store.drop_cdc(slot, publication).await?;
            if forget {
                store.forget_cdc(slot).await?;
                println!("dropped slot {slot} and publication {publication}, and forgot the slot");
            } else {
                println!(
                    "dropped slot {slot} and publication {publication}; a relay started on \
                     this slot refuses unless on_lost_slot = \"recreate\" (what the slot \
                     held is gone), or drop it with --forget to retire it for good"
                );
            }
        }
        OutboxCommand::Show { id, json } => {
            let id = parse_id(&id)?;
            let Some(row) = outbox.row(id).await? else {
                eprintln!("oncebox: no outbox row has id {id}");
                return Ok(ExitCode::FAILURE);
            };
            if json {
                println!("{}", row_json(&row));
            } else {
                print_row(&row);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `oncebox dead-letters …`.
pub(crate) async fn dead_letters(
    config: &Config,
    command: DeadLetterCommand,
) -> anyhow::Result<ExitCode> {
    let database = Database::connect(config).await?;
    let outbox = database.outbox(config)?;
    match command {
        DeadLetterCommand::List { topic, limit, json } => {
            let selection = topic.map_or(DeadLetterSelection::All, DeadLetterSelection::Topic);
            let letters = select_dead_letters(&outbox, &selection, limit).await?;
            if json {
                let letters: Vec<Value> = letters.iter().map(dead_letter_json).collect();
                println!("{}", json!({ "dead_letters": letters }));
            } else if letters.is_empty() {
                println!("no dead letters");
            } else {
                for letter in &letters {
                    print_dead_letter(letter);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLetterCommand::Replay(selection) => {
            apply(&outbox, &selection, "replay", |id| outbox.replay_dead(id)).await
        }
        DeadLetterCommand::Purge(selection) => {
            apply(&outbox, &selection, "purge", |id| outbox.purge_dead(id)).await
        }
    }
}

/// Finds the dead letters `selection` names, asks to confirm their count (unless
/// `--yes`), then runs `operation` on exactly those, by id (a letter that died in the
/// meantime is not touched), and reports the ids it applied to.
async fn apply<A, F, Fut>(
    outbox: &A,
    selection: &Selection,
    verb: &str,
    operation: F,
) -> anyhow::Result<ExitCode>
where
    A: OutboxAdmin,
    F: Fn(MessageId) -> Fut,
    Fut: std::future::Future<Output = oncebox::Result<bool>>,
{
    let which = match (&selection.which.id, &selection.which.topic) {
        (Some(id), _) => DeadLetterSelection::One(parse_id(id)?),
        (None, Some(topic)) => DeadLetterSelection::Topic(topic.clone()),
        (None, None) => DeadLetterSelection::All,
    };
    let ids: Vec<MessageId> = match &which {
        DeadLetterSelection::One(id) => match outbox.row(*id).await? {
            Some(row) if row.state.status == RowStatus::Dead => vec![*id],
            _ => Vec::new(),
        },
        _ => select_dead_letters(outbox, &which, usize::MAX)
            .await?
            .iter()
            .map(|letter| letter.id)
            .collect(),
    };
    if ids.is_empty() {
        report_applied(verb, &[], selection.json);
        return Ok(ExitCode::SUCCESS);
    }
    if !selection.yes
        && !confirm(&format!(
            "{verb} {} dead letter(s) ({})?",
            ids.len(),
            describe(&which)
        ))?
    {
        eprintln!("oncebox: nothing done");
        return Ok(ExitCode::FAILURE);
    }
    let mut applied = Vec::with_capacity(ids.len());
    for id in ids {
        if operation(id).await? {
            applied.push(id);
        }
    }
    report_applied(verb, &applied, selection.json);
    Ok(ExitCode::SUCCESS)
}

fn describe(selection: &DeadLetterSelection) -> String {
    match selection {
        DeadLetterSelection::One(id) => format!("id {id}"),
        DeadLetterSelection::Topic(topic) => format!("topic {topic}"),
        DeadLetterSelection::All => "all".to_owned(),
    }
}

/// Asks `question` on stderr; yes only for an answer starting with `y`.
fn confirm(question: &str) -> anyhow::Result<bool> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(answer.trim_start().to_ascii_lowercase().starts_with('y'))
}

fn report_applied(verb: &str, ids: &[MessageId], json: bool) {
    if json {
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        println!(
            "{}",
            json!({ "operation": verb, "count": ids.len(), "ids": ids })
        );
    } else {
        let done = if verb == "replay" {
            "replayed"
        } else {
            "purged"
        };
        println!("{done} {} dead letter(s)", ids.len());
        for id in ids {
            println!("  {id}");
        }
    }
}

/// `oncebox inbox …`.
pub(crate) async fn inbox(config: &Config, command: InboxCommand) -> anyhow::Result<ExitCode> {
    let InboxCommand::Purge {
        older_than,
        consumer,
        json,
    } = command;
    let window = config.receive.dedup_window;
    if older_than < window {
        return Err(ConfigError::key(
            "--older-than",
            format!(
                "{older_than} is inside the dedup window ({window}): records younger than it \
                 are what makes a redelivery a duplicate; lower receive.dedup_window to purge more"
            ),
        )
        .into());
    }
    let consumer = consumer.unwrap_or_else(|| config.receive.consumer.clone());
    let database = Database::connect(config).await?;
    let before = oncebox::time::ago(older_than.get());
    let deleted = database.purge_inbox(&consumer, before).await?;
    if json {
        println!("{}", json!({ "consumer": consumer, "deleted": deleted }));
    } else {
        println!("deleted {deleted} inbox record(s) of {consumer} older than {older_than}");
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_id(id: &str) -> anyhow::Result<MessageId> {
    MessageId::parse(id)
        .map_err(|_| ConfigError::key("ID", format!("{id:?} is not a message id (a UUID)")).into())
}

fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn seconds(age: Option<std::time::Duration>) -> Value {
    age.map_or(Value::Null, |age| json!(age.as_secs_f64()))
}

fn status_name(status: RowStatus) -> &'static str {
    match status {
        RowStatus::Pending => "pending",
        RowStatus::Done => "published",
        RowStatus::Dead => "dead",
        _ => "unknown",
    }
}

fn stats_json(stats: &OutboxStats) -> Value {
    json!({
        "pending": stats.pending,
        "scheduled": stats.scheduled,
        "published": stats.done,
        "dead": stats.dead,
        "oldest_pending_age_seconds": seconds(stats.oldest_pending_age),
    })
}

fn print_stats(stats: &OutboxStats) {
    println!("pending     {}", stats.pending);
    println!("scheduled   {}", stats.scheduled);
    println!("published   {}", stats.done);
    println!("dead        {}", stats.dead);
    match stats.oldest_pending_age {
        Some(age) => println!("oldest pending age  {:.1}s", age.as_secs_f64()),
        None => println!("oldest pending age  -"),
    }
}

/// The message without its payload's bytes: their length, and the text when it is UTF-8.
fn message_json(message: &Message) -> Value {
    let headers: serde_json::Map<String, Value> = message
        .headers
        .iter()
        .map(|(name, value)| (name.to_owned(), json!(value)))
        .collect();
    json!({
        "id": message.id.to_string(),
        "topic": message.topic,
        "key": message.key,
        "kind": message.kind,
        "headers": headers,
        "created_at": time(message.created_at),
        "payload_bytes": message.payload.len(),
        "payload": std::str::from_utf8(&message.payload).ok(),
    })
}

fn row_json(row: &OutboxRow) -> Value {
    let state = &row.state;
    json!({
        "seq": state.seq,
        "status": status_name(state.status),
        "attempts": state.attempts,
        "last_error": state.last_error,
        "available_at": time(state.available_at),
        "leased_until": state.leased_until.map(time),
        "settled_at": state.settled_at.map(time),
        "message": message_json(&row.message),
    })
}

fn print_row(row: &OutboxRow) {
    let state = &row.state;
    let message = &row.message;
    println!("id            {}", message.id);
    println!("status        {}", status_name(state.status));
    println!("topic         {}", message.topic);
    println!("key           {}", message.key.as_deref().unwrap_or("-"));
    println!("kind          {}", message.kind);
    println!("seq           {}", state.seq);
    println!("attempts      {}", state.attempts);
    println!(
        "last error    {}",
        state.last_error.as_deref().unwrap_or("-")
    );
    println!("created at    {}", time(message.created_at));
    println!("available at  {}", time(state.available_at));
    if let Some(until) = state.leased_until {
        println!("leased until  {}", time(until));
    }
    if let Some(at) = state.settled_at {
        println!("settled at    {}", time(at));
    }
    for (name, value) in message.headers.iter() {
        println!("header        {name}: {value}");
    }
    match std::str::from_utf8(&message.payload) {
        Ok(text) => println!("payload       {text}"),
        Err(_) => println!("payload       {} bytes, not UTF-8", message.payload.len()),
    }
}

fn dead_letter_json(letter: &DeadLetter) -> Value {
    json!({
        "id": letter.id.to_string(),
        "topic": letter.message.topic,
        "key": letter.message.key,
        "kind": letter.message.kind,
        "attempts": letter.attempts,
        "reason": letter.reason,
        "dead_at": time(letter.dead_at),
    })
}

fn print_dead_letter(letter: &DeadLetter) {
    println!(
        "{}  {}  key {}  {} attempt(s)  dead at {}\n    {}",
        letter.id,
        letter.message.topic,
        letter.message.key.as_deref().unwrap_or("-"),
        letter.attempts,
        time(letter.dead_at),
        letter.reason
    );
}
