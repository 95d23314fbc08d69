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
    "provider_names",
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

/// Every file a user reads for names and keys: README, ARCHITECTURE, docs/, the
/// example configuration, the deployment assets (dashboards, alerts, manifests).
fn user_facing_files() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut dirs = vec![
        root.join("docs"),
        root.join("deploy"),
        root.join("examples"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable folder").flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| ["md", "json", "yaml", "yml"].contains(&e))
            {
                files.push(p);
            }
        }
    }
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable file");
            (p.strip_prefix(root).unwrap().display().to_string(), text)
        })
        .collect()
}

/// Issue 26: every `promnorm_*` metric a document, dashboard or alert names is one
/// promnorm exports (a histogram's `_bucket`, `_sum` and `_count` included), and
/// docs/telemetry.md lists every metric promnorm exports.
#[test]
fn every_metric_named_in_the_docs_exists_and_telemetry_md_lists_them_all() {
    use promnorm::telemetry::{Kind, METRICS};
    let mut known: std::collections::BTreeSet<String> = Default::default();
    for (name, kind, _) in METRICS {
        known.insert(name.to_string());
        if matches!(kind, Kind::Histogram) {
            for s in ["_bucket", "_sum", "_count"] {
                known.insert(format!("{name}{s}"));
            }
        }
    }
    let re = regex::Regex::new(r"\bpromnorm_[a-z0-9_]*[a-z0-9]").unwrap();
    let mut problems = Vec::new();
    let mut telemetry_md = String::new();
    for (path, text) in user_facing_files() {
        if path == "docs/telemetry.md" {
            telemetry_md = text.clone();
        }
        for m in re.find_iter(&text) {
            // `promnorm_queue_*` names a family of metrics: some must start so.
            if text[m.end()..].starts_with("_*") {
                if !known
                    .iter()
                    .any(|k| k.starts_with(&format!("{}_", m.as_str())))
                {
                    problems.push(format!("{path}: no metric matches {}_*", m.as_str()));
                }
                continue;
            }
            if !known.contains(m.as_str()) {
                problems.push(format!(
                    "{path}: {} is not a metric promnorm exports",
                    m.as_str()
                ));
            }
        }
    }
    for (name, _, _) in METRICS {
        if !telemetry_md.contains(&format!("`{name}`")) {
            problems.push(format!("docs/telemetry.md does not list {name}"));
        }
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Issue 26: every configuration key the prose names in backticks
/// (`limits.max_inflight_bytes`, `backends[].queue.dir`, …) is a key of the schema,
/// that is, a row of README's configuration table (kept equal to the schema above).
#[test]
fn every_configuration_key_named_in_the_docs_exists() {
    let keys = documented();
    let sections: std::collections::BTreeSet<String> = keys
        .keys()
        .map(|k| {
            k.split('.')
                .next()
                .unwrap()
                .trim_end_matches("[]")
                .to_string()
        })
        .collect();
    let re = regex::Regex::new(r"`([a-z_]+(?:\[\])?(?:\.[a-z0-9_]+(?:\[\])?)+)`").unwrap();
    let mut problems = Vec::new();
    for (path, text) in user_facing_files() {
        for c in re.captures_iter(&text) {
            let key = &c[1];
            let section = key.split('.').next().unwrap().trim_end_matches("[]");
            if !sections.contains(section) {
                continue; // a file name, a metric, a Rust path, …
            }
            let exists =
                keys.contains_key(key) || keys.keys().any(|k| k.starts_with(&format!("{key}.")));
            if !exists {
                problems.push(format!("{path}: `{key}` is not a configuration key"));
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Issue 26: every command of README's command table runs, and takes every flag the
/// table gives it.
#[test]
fn every_command_in_the_readme_runs_with_the_flags_it_documents() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let table = readme
        .split("| command | what it does |")
        .nth(1)
        .expect("the command table");
    let flag = regex::Regex::new(r"--[a-z][a-z0-9.-]*").unwrap();
    let mut problems = Vec::new();
    let mut commands = 0;
    for line in table.lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let syntax = line.split(" | ").next().unwrap().trim_start_matches("| `");
        let syntax = syntax.split('`').next().unwrap();
        let mut words = syntax.split_whitespace();
        assert_eq!(words.next(), Some("promnorm"), "{line}");
        // `promnorm migrate query …`: nested subcommands are the leading plain words.
        let mut path: Vec<&str> = vec![words.next().expect("a subcommand")];
        path.extend(
            words
                .clone()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-')),
        );
        let sub = path.join(" ");
        commands += 1;
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_promnorm"))
            .args(path.iter().copied().chain(["--help"]))
            .output()
            .expect("runs");
        let help = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            problems.push(format!("`promnorm {sub} --help` failed"));
            continue;
        }
        for f in flag.find_iter(syntax) {
            if !help.contains(f.as_str()) {
                problems.push(format!("`promnorm {sub}` has no flag {}", f.as_str()));
            }
        }
    }
    assert!(commands >= 9, "{commands} commands in the table");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
