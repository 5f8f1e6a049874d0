//! Outbox rows as `pgoutput` sends them: a Relation message names the table's columns,
//! each Insert carries a row's values in PostgreSQL's text output.

use std::collections::HashMap;

use oncebox_core::{Headers, Message, MessageId};
use pg_walstream::{ColumnData, LogicalReplicationMessage, LogicalReplicationParser, TupleData};

/// An inserted outbox row.
#[derive(Debug)]
pub(crate) struct InsertedRow {
    pub(crate) seq: i64,
    /// Only `pending` rows are published: a row inserted `dead` (a message-mode dead
    /// letter, say) is not.
    pub(crate) pending: bool,
    /// The message, or why the row cannot be read as one.
    pub(crate) message: Result<Message, String>,
}

/// A change of the stream that concerns the outbox table.
#[derive(Debug)]
pub(crate) enum Change {
    /// A row was inserted.
    Inserted(InsertedRow),
    /// An insert whose `seq` could not be read: the row cannot even be named.
    Unreadable(String),
    /// Anything else (another table, a relation description).
    Other,
}

/// Where each needed column sits in the table's tuples.
#[derive(Debug, Clone, Copy)]
struct Columns {
    seq: usize,
    id: usize,
    topic: usize,
    key: usize,
    kind: usize,
    headers: usize,
    payload: usize,
    created_at: usize,
    status: usize,
}

/// Decodes the outbox table's changes, keeping the relation descriptions it was sent.
pub(crate) struct RowDecoder {
    schema: String,
    table: String,
    parser: LogicalReplicationParser,
    relations: HashMap<u32, Result<Columns, String>>,
}

impl RowDecoder {
    pub(crate) fn new(schema: &str, table: &str) -> Self {
        Self {
            schema: schema.to_owned(),
            table: table.to_owned(),
            parser: LogicalReplicationParser::with_protocol_version(1),
            relations: HashMap::new(),
        }
    }

    /// Decodes one pgoutput message (a change between Begin and Commit).
    pub(crate) fn decode(&mut self, data: &[u8]) -> Change {
        let message = match self.parser.parse_wal_message(data) {
            Ok(parsed) => parsed.message,
            Err(error) => return Change::Unreadable(format!("pgoutput message: {error}")),
        };
        match message {
            LogicalReplicationMessage::Relation {
                relation_id,
                namespace,
                relation_name,
                columns,
                ..
            } => {
                if *namespace == *self.schema && *relation_name == *self.table {
                    let names: Vec<&str> = columns.iter().map(|column| &*column.name).collect();
                    self.relations.insert(relation_id, Columns::find(&names));
                }
                Change::Other
            }
            LogicalReplicationMessage::Insert { relation_id, tuple } => {
                match self.relations.get(&relation_id) {
                    None => Change::Other,
                    Some(Err(missing)) => Change::Unreadable(missing.clone()),
                    Some(Ok(columns)) => columns.read(&tuple),
                }
            }
            _ => Change::Other,
        }
    }
}

impl Columns {
    fn find(names: &[&str]) -> Result<Self, String> {
        let at = |name: &str| {
            names
                .iter()
                .position(|found| *found == name)
                .ok_or_else(|| format!("the outbox table has no column {name:?}"))
        };
        Ok(Self {
            seq: at("seq")?,
            id: at("id")?,
            topic: at("topic")?,
            key: at("key")?,
            kind: at("kind")?,
            headers: at("headers")?,
            payload: at("payload")?,
            created_at: at("created_at")?,
            status: at("status")?,
        })
    }

    fn read(&self, tuple: &TupleData) -> Change {
        let seq = match text(tuple, self.seq, "seq").and_then(|seq| {
            seq.parse::<i64>()
                .map_err(|error| format!("column seq: {error}"))
        }) {
            Ok(seq) => seq,
            Err(reason) => return Change::Unreadable(reason),
        };
        let pending = text(tuple, self.status, "status").is_ok_and(|status| status == "pending");
        Change::Inserted(InsertedRow {
            seq,
            pending,
            message: self.message(tuple),
        })
    }

    fn message(&self, tuple: &TupleData) -> Result<Message, String> {
        let id = MessageId::parse(&text(tuple, self.id, "id")?).map_err(|e| e.to_string())?;
        let payload = hex_bytea(&text(tuple, self.payload, "payload")?)?;
        let headers = Headers::from_json(&text(tuple, self.headers, "headers")?)
            .map_err(|error| format!("column headers: {error}"))?;
        let created_at = timestamp(&text(tuple, self.created_at, "created_at")?)?;
        let mut message = Message::new(text(tuple, self.topic, "topic")?, payload).with_id(id);
        message.key = match tuple.get_column(self.key) {
            Some(column) if column.is_null() => None,
            _ => Some(text(tuple, self.key, "key")?),
        };
        message.kind = text(tuple, self.kind, "kind")?;
        message.headers = headers;
        message.created_at = created_at;
        Ok(message)
    }
}

/// A column's text value; NULL and unreadable values are errors naming the column.
fn text(tuple: &TupleData, index: usize, name: &str) -> Result<String, String> {
    let column: &ColumnData = tuple
        .get_column(index)
        .ok_or_else(|| format!("column {name} is missing from the row"))?;
    if column.is_null() {
        return Err(format!("column {name} is NULL"));
    }
    column
        .as_string()
        .ok_or_else(|| format!("column {name} is not UTF-8 text"))
}

/// `\x0a1b...`, PostgreSQL's hex output of `bytea`.
fn hex_bytea(text: &str) -> Result<Vec<u8>, String> {
    let hex = text
        .strip_prefix("\\x")
        .ok_or("column payload is not in bytea's hex output")?;
    let digit = |byte: u8| match byte {
        b'0'..=b'9' => Ok(byte - b'0'),
        b'a'..=b'f' => Ok(byte - b'a' + 10),
        b'A'..=b'F' => Ok(byte - b'A' + 10),
        _ => Err(format!(
            "column payload: {:?} is not a hex digit",
            byte as char
        )),
    };
    if hex.len() % 2 != 0 {
        return Err("column payload: odd number of hex digits".into());
    }
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// `2026-11-27 04:39:31.123456+00`, `timestamptz` in ISO style at UTC.
fn timestamp(text: &str) -> Result<std::time::SystemTime, String> {
    // PostgreSQL writes a whole-hour offset as `+00`; RFC 3339 wants `+00:00`.
    let full = match text.rfind(['+', '-']) {
        Some(at) if text.len() - at == 3 => format!("{text}:00"),
        _ => text.to_owned(),
    };
    full.parse::<jiff::Timestamp>()
        .map(Into::into)
        .map_err(|error| format!("column created_at {text:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_values_are_read() {
        assert_eq!(hex_bytea("\\x00ff7A").expect("hex"), [0, 255, 122]);
        assert_eq!(hex_bytea("\\x").expect("hex"), Vec::<u8>::new());
        for bad in ["00ff", "\\x0", "\\xzz"] {
            assert!(hex_bytea(bad).is_err(), "{bad}");
        }
        let at = timestamp("2026-11-27 04:39:31.123456+00").expect("a timestamp");
        let micros = at
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_micros();
        assert_eq!(micros % 1_000_000, 123_456);
        assert!(timestamp("2026-11-27 04:39:31+05:30").is_ok());
        assert!(timestamp("yesterday").is_err());
    }
}
