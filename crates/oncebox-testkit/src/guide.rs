//! The SQL statements of a guide, for tests that run each of them against the real
//! server, so that a guide cannot show a statement no test runs.
//!
//! A guide marks each statement with `<!-- sql: name -->`, followed by a ```` ```sql ````
//! block. A backend's tests read the statements by name, run them, and call
//! [`every_statement_is_tested`] with the names they ran:
//!
//! ```
//! let guide = "<!-- sql: pg_insert -->\n```sql\nINSERT INTO t VALUES ($1)\n```\n";
//! assert_eq!(oncebox_testkit::guide::statement(guide, "pg_insert"), "INSERT INTO t VALUES ($1)");
//! oncebox_testkit::guide::every_statement_is_tested(guide, &["mysql_"], &["pg_insert"]);
//! ```

use std::collections::BTreeSet;

/// The SQL block after `<!-- sql: name -->` in `guide`, trimmed.
///
/// # Panics
///
/// If the guide has no statement `name`, or its block does not end.
pub fn statement<'g>(guide: &'g str, name: &str) -> &'g str {
    let marker = format!("<!-- sql: {name} -->");
    let start = guide
        .find(&marker)
        .unwrap_or_else(|| panic!("the guide has no statement {name:?}"));
    let rest = &guide[start + marker.len()..];
    let open = rest
        .find("```sql\n")
        .expect("a ```sql block after the marker")
        + "```sql\n".len();
    let close = rest[open..].find("```").expect("the block ends");
    rest[open..open + close].trim()
}

/// Every statement name in `guide`.
pub fn names(guide: &str) -> BTreeSet<&str> {
    guide
        .split("<!-- sql: ")
        .skip(1)
        .filter_map(|rest| rest.split_once(" -->").map(|(name, _)| name))
        .collect()
}

/// Checks that `tested` names exactly the statements of `guide` that concern this
/// backend (all but those starting with one of `others`, the other backends' prefixes),
/// both ways, and that none of them is empty.
///
/// # Panics
///
/// If a statement of the guide is not tested, a tested one is not in the guide, or one
/// is empty.
pub fn every_statement_is_tested(guide: &str, others: &[&str], tested: &[&str]) {
    let in_guide: BTreeSet<&str> = names(guide)
        .into_iter()
        .filter(|name| !others.iter().any(|other| name.starts_with(other)))
        .collect();
    let tested: BTreeSet<&str> = tested.iter().copied().collect();
    assert_eq!(
        in_guide, tested,
        "the guide's statements (left) and the tested ones (right)"
    );
    for name in &tested {
        assert!(!statement(guide, name).is_empty(), "{name} is empty");
    }
}
