//! Identifiers formatted into SQL: validated once, quoted, never taken from data.

use oncebox_core::{Error, Result};

/// Longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`); longer ones are silently cut,
/// which could make two derived names collide.
const MAX_IDENT: usize = 63;

/// Advisory lock class of claims: `pg_advisory_xact_lock(CLAIM_CLASS, <table>)`
/// serialises the claims of one spool table ("oncb").
pub(crate) const CLAIM_CLASS: i32 = 0x6f6e_6362;

/// Advisory lock class of held claims: each held claim's transaction takes
/// `pg_advisory_xact_lock_shared(HOLD_CLASS, <table>)`, so held claims do not wait for
/// each other (nor for leased ones), and a replay, which takes it exclusively, waits for
/// every held claim in flight ("onch").
pub(crate) const HOLD_CLASS: i32 = 0x6f6e_6368;

/// Advisory lock class of per-key enqueue locks:
/// `pg_advisory_xact_lock(KEY_CLASS, hashtext(key) # <table oid>)` ("onck").
pub(crate) const KEY_CLASS: i32 = 0x6f6e_636b;

/// Checks a schema or table name: `[a-z_][a-z0-9_]*`, at most 63 bytes, not starting
/// with `pg_` (reserved by PostgreSQL).
pub(crate) fn validate(what: &str, name: &str) -> Result<()> {
    let invalid = |why: &str| {
        Err(Error::InvalidOptions(format!(
            "invalid {what} name {name:?}: {why}"
        )))
    };
    let mut bytes = name.bytes();
    match bytes.next() {
        None => return invalid("it is empty"),
        Some(b'a'..=b'z' | b'_') => {}
        Some(_) => return invalid("it must start with a-z or _"),
    }
    if !bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_')) {
        return invalid("only a-z, 0-9 and _ are allowed");
    }
    if name.len() > MAX_IDENT {
        return invalid("it is longer than 63 bytes");
    }
    if name.starts_with("pg_") {
        return invalid("the pg_ prefix is reserved by PostgreSQL");
    }
    Ok(())
}

/// A validated identifier, double-quoted (validation leaves nothing to escape).
pub(crate) fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

/// `"schema"."name"`.
pub(crate) fn qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", quote(schema), quote(name))
}

/// The `'"schema"."name"'::regclass::oid::int4` expression: the table's OID, which
/// names the table in advisory locks, whatever spelling the caller used.
pub(crate) fn table_oid(schema: &str, name: &str) -> String {
    format!("'{}'::regclass::oid::int4", qualified(schema, name))
}

/// A name derived from `base` (an index, a sequence, a notification channel): `base_suffix`
/// if that fits in 63 bytes, else `oncebox_<hash>_suffix`, so that derived names never
/// get cut into each other.
pub(crate) fn derived(base: &str, suffix: &str) -> String {
    let name = format!("{base}_{suffix}");
    if name.len() <= MAX_IDENT {
        name
    } else {
        format!("oncebox_{:016x}_{suffix}", fnv1a(base.as_bytes()))
    }
}

/// 64-bit FNV-1a: a stable hash for derived names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A `text` literal for a value checked to hold no quote or backslash.
pub(crate) fn literal(value: &str) -> String {
    format!("'{value}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["oncebox", "_t", "t_0190f0a0", &"a".repeat(63)] {
            assert!(validate("schema", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Oncebox",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "a;drop",
            "pg_temp",
            &"a".repeat(64),
            "é",
        ] {
            let err = validate("schema", bad).unwrap_err();
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
    }

    #[test]
    fn derived_names_fit() {
        assert_eq!(derived("outbox", "pending"), "outbox_pending");
        let long = "t".repeat(60);
        let name = derived(&long, "oncebox_pending");
        assert!(name.len() <= 63 && name.ends_with("_oncebox_pending"));
        assert_ne!(name, derived(&"u".repeat(60), "oncebox_pending"));
    }
}
