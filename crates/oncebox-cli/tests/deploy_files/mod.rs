//! Reading the deployment files of `deploy/` back: the rule files and the dashboard's
//! PromQL, the metric names those expressions query, the Kubernetes manifests.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use yaml_rust2::{Yaml, YamlLoader};

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The text of `path`, relative to the repository's root.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// Every YAML document of `path`.
pub fn yaml(path: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// The rules of the rule file at `path`: each rule's mapping, with its group.
pub fn rules(path: &str) -> Vec<Yaml> {
    let docs = yaml(path);
    let groups = docs[0]["groups"].as_vec().expect("a rule file has groups");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_vec().expect("a group has rules").clone())
        .collect()
}

/// The shipped rule file.
pub const RULES: &str = "deploy/prometheus/oncebox.rules.yml";
/// The shipped dashboard.
pub const DASHBOARD: &str = "deploy/grafana/oncebox.json";

/// Every PromQL expression of the rules and the dashboard, each with where it is.
pub fn expressions() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for rule in rules(RULES) {
        let name = rule["alert"]
            .as_str()
            .or_else(|| rule["record"].as_str())
            .expect("a rule is an alert or a record");
        let expr = rule["expr"].as_str().expect("a rule has an expression");
        found.push((format!("{RULES}: {name}"), expr.to_owned()));
    }
    let board: serde_json::Value =
        serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut panels: Vec<&serde_json::Value> = Vec::new();
    for panel in board["panels"]
        .as_array()
        .expect("the dashboard has panels")
    {
        panels.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            panels.extend(inner);
        }
    }
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target has an expression");
            found.push((format!("{DASHBOARD}: {}", panel["title"]), expr.to_owned()));
        }
    }
    // Grafana's `label_values(METRIC, LABEL)` queries METRIC.
    let values = regex::Regex::new(r"label_values\(([^,]+),[^)]*\)").expect("a regex");
    for variable in board["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(query) = variable["query"]["query"].as_str() {
            let query = values.replace_all(query, "$1");
            found.push((
                format!("{DASHBOARD}: ${}", variable["name"]),
                query.into_owned(),
            ));
        }
    }
    found
}

/// PromQL's keywords and special numbers: words that are not metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// The metric names an expression queries.
///
/// The extraction is a simple one, enough for the expressions this repository writes:
/// string literals, label matchers (`{…}`), ranges (`[…]`) and label lists after `by`,
/// `without`, `on`, `ignoring`, `group_left` and `group_right` are cut out; of the words
/// left (`[A-Za-z_:][A-Za-z0-9_:]*`), those followed by `(` are functions, PromQL's
/// keywords, Grafana's `$variables` and the letters of numbers (`1e3`) are dropped.
/// Every other word is a metric name.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut text = String::with_capacity(expr.len());
    let mut chars = expr.chars();
    // Cut strings, {…} and […].
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                let mut escaped = false;
                for inner in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if inner == '\\' {
                        escaped = true;
                    } else if inner == c {
                        break;
                    }
                }
                text.push(' ');
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                let mut inside_string = None;
                for inner in chars.by_ref() {
                    match inside_string {
                        Some(quote) if inner == quote => inside_string = None,
                        Some(_) => {}
                        None if inner == '"' || inner == '\'' => inside_string = Some(inner),
                        None if inner == close => break,
                        None => {}
                    }
                }
                text.push(' ');
            }
            c => text.push(c),
        }
    }
    let lists =
        regex::Regex::new(r"(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
            .expect("a regex");
    let text = lists.replace_all(&text, " ");
    let word = regex::Regex::new(r"[A-Za-z_:$][A-Za-z0-9_:]*").expect("a regex");
    let mut names = BTreeSet::new();
    for found in word.find_iter(&text) {
        let name = found.as_str();
        let after = text[found.end()..].trim_start();
        let preceded_by_digit = text[..found.start()]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_digit() || c == '.');
        if name.starts_with('$')
            || preceded_by_digit
            || KEYWORDS.contains(&name.to_ascii_lowercase().as_str())
            || after.starts_with('(')
        {
            continue;
        }
        names.insert(name.to_owned());
    }
    names
}

/// The metric families a Prometheus text exposition declares (`# TYPE name type`), with
/// their types.
pub fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// Metrics the rules query that no oncebox process can export, each with its source:
/// a process that has exited exports nothing, so a stop cut short by its deadline is
/// seen in the exit status the platform reports.
pub const PLATFORM_METRICS: &[(&str, &str)] = &[(
    "kube_pod_container_status_last_terminated_exitcode",
    "kube-state-metrics",
)];
