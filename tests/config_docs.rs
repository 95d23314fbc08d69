//! The README's configuration table and the configuration schema say the same thing:
//! every documented key exists, every key is documented, and the documented default is
//! the one the code uses (the defaults live once, on the configuration structs).

use std::collections::BTreeMap;

use promnorm::config::{Config, parse_byte_size, parse_duration, yaml};
use serde_json::Value;

/// The configuration's leaves (`limits.max_body_bytes`, `backends[].url`, …) with their
/// default values, as `check-config --print` writes them.
fn schema_defaults() -> BTreeMap<String, Value> {
    let printed = Config::default().to_redacted_yaml().expect("prints");
    let v: Value = yaml::from_str(&printed).expect("parses");
    let mut out = BTreeMap::new();
    flatten(&v, "", &mut out);
    out
}

fn flatten(v: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() && !FREE_FORM.contains(&last(prefix)) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(v, &p, out);
            }
        }
        Value::Array(items) if prefix == "backends" => {
            if let Some(first) = items.first() {
                flatten(first, "backends[]", out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

/// Maps whose keys are the user's (header names, pack names, label names).
const FREE_FORM: &[&str] = &[
    "headers",
    "keep_original",
    "sum_over_ranks",
    "builtin",
    "match",
];

fn last(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// The README's rows: key → default as written.
fn documented() -> BTreeMap<String, String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let table = readme
        .split("| key | default | meaning |")
        .nth(1)
        .expect("the configuration table");
    let mut out = BTreeMap::new();
    for line in table.lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let key = cells[0].trim_start_matches('|').trim().trim_matches('`');
        out.insert(key.to_string(), cells[1].trim().to_string());
    }
    out
}

/// Whether the README's `doc` default means the schema's `value`.
fn same_default(doc: &str, value: &Value) -> bool {
    let d = doc.replace('`', "");
    let d = d.trim();
    // Defaults the table describes in words.
    if d == "—" || d.starts_with("default, backend1") {
        return true;
    }
    match value {
        Value::Null => d == "none",
        Value::Bool(b) => d == b.to_string(),
        Value::Number(n) => {
            let want = n.as_f64().unwrap_or(f64::NAN);
            if let Some(mib) = d.strip_suffix(" MiB") {
                return mib.parse::<f64>().ok() == Some(want / (1u64 << 20) as f64);
            }
            d.replace(',', "").parse::<f64>().ok() == Some(want)
        }
        Value::String(s) => {
            if let (Ok(a), Ok(b)) = (parse_duration(d), parse_duration(s)) {
                return a == b;
            }
            // Sizes: `64 KiB` in the table, `64KiB` printed.
            if let (Ok(a), Ok(b)) = (parse_byte_size(d), parse_byte_size(s)) {
                return a == b;
            }
            d == s
        }
        Value::Array(items) => {
            let inner = d.trim_start_matches('[').trim_end_matches(']');
            let doc_items: Vec<&str> = inner
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            doc_items.len() == items.len()
                && doc_items
                    .iter()
                    .zip(items)
                    .all(|(a, b)| b.as_str() == Some(*a))
        }
        Value::Object(m) => m.is_empty() && d == "{}",
    }
}

#[test]
fn every_key_is_documented_with_its_default_and_every_documented_key_exists() {
    let schema = schema_defaults();
    let docs = documented();
    let mut problems = Vec::new();
    for (key, value) in &schema {
        // A section documented by its sub-keys (e.g. `ingest_auth.bearer_token`).
        let by_children = docs.keys().any(|d| d.starts_with(&format!("{key}.")));
        match docs.get(key) {
            Some(doc) if !same_default(doc, value) => problems.push(format!(
                "{key}: README says {doc:?}, the code's default is {value}"
            )),
            Some(_) => {}
            None if by_children && value.is_null() => {}
            None => problems.push(format!("{key}: not in README's configuration table")),
        }
    }
    for key in docs.keys() {
        let exists = schema.contains_key(key)
            || schema
                .iter()
                .any(|(k, v)| v.is_null() && key.starts_with(&format!("{k}.")));
        if !exists {
            problems.push(format!("{key}: documented, but no such configuration key"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
