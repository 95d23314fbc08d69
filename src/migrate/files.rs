//! `promnorm migrate` on whole files: what a file is and how each form is migrated. A
//! JSON file is a Grafana dashboard; a YAML file is a stream of documents, each a rule
//! file (`groups:`), a Kubernetes `PrometheusRule` (`spec.groups`), a `ConfigMap`
//! whose `data` embeds dashboards or rule files (the Grafana sidecar's and the
//! Prometheus chart's form), or a grafana-operator `GrafanaDashboard` (`spec.json`). Every byte the migration does not change is kept: documents
//! nobody migrates, separators, comments, the ConfigMap around an embedded file.

use std::ops::Range;

use serde_json::Value;

use super::promql::QueryRewriter;
use super::{Entry, MigrateError, grafana, rules_file};
use crate::config::yaml;

/// The rewriters of one run: dashboards follow `--keep-values`; rule files always keep
/// their values (a threshold keeps its meaning).
pub struct Rewriters<'a, 'r> {
    pub dashboards: &'a QueryRewriter<'r>,
    pub rules: &'a QueryRewriter<'r>,
}

/// What a file turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Dashboard,
    RuleFile,
    PrometheusRule,
    ConfigMap,
    /// The grafana-operator's `GrafanaDashboard` (`spec.json`).
    GrafanaDashboard,
    /// Several YAML documents (each of the forms above, or something else, kept).
    Documents,
}

impl Form {
    pub fn name(self) -> &'static str {
        match self {
            Form::Dashboard => "dashboard",
            Form::RuleFile => "rule file",
            Form::PrometheusRule => "PrometheusRule",
            Form::ConfigMap => "ConfigMap",
            Form::GrafanaDashboard => "GrafanaDashboard",
            Form::Documents => "YAML documents",
        }
    }
}

pub struct Migrated {
    pub text: String,
    pub changed: bool,
    pub entries: Vec<Entry>,
    pub form: Form,
}

/// Migrates one file of any form; an error when it is none of them.
pub fn migrate(rw: &Rewriters<'_, '_>, text: &str) -> Result<Migrated, MigrateError> {
    if looks_like_json(text) {
        return dashboard(rw.dashboards, text);
    }
    let docs = documents(text);
    if docs.len() <= 1 {
        let range = docs.first().cloned().unwrap_or(0..text.len());
        let doc = &text[range.clone()];
        return match document(rw, doc)? {
            Some(m) => Ok(Migrated {
                text: format!("{}{}{}", &text[..range.start], m.text, &text[range.end..]),
                ..m
            }),
            None => Err(MigrateError::Unrecognized(NOT_OURS.into())),
        };
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut entries = Vec::new();
    let mut changed = false;
    let mut any = false;
    for (i, range) in docs.iter().enumerate() {
        let doc = &text[range.clone()];
        out.push_str(&text[copied..range.start]);
        copied = range.end;
        if blank(doc) {
            out.push_str(doc);
            continue;
        }
        match document(rw, doc).map_err(|e| in_document(i, e))? {
            Some(m) => {
                any = true;
                changed |= m.changed;
                out.push_str(&m.text);
                entries.extend(m.entries.into_iter().map(|mut e| {
                    e.location = format!("documents[{i}] ({}): {}", m.form.name(), e.location);
                    e
                }));
            }
            None => out.push_str(doc),
        }
    }
    out.push_str(&text[copied..]);
    if !any {
        return Err(MigrateError::Unrecognized(NOT_OURS.into()));
    }
    Ok(Migrated {
        text: if changed { out } else { text.to_string() },
        changed,
        entries,
        form: Form::Documents,
    })
}

const NOT_OURS: &str = "neither a rule file (groups:), a PrometheusRule (spec.groups) nor a \
                        ConfigMap whose data holds a dashboard or a rule file";

fn in_document(i: usize, e: MigrateError) -> MigrateError {
    within(&format!("document {i}"), e)
}

/// `e`, said of a part of the file (`document 2`, `data["a.json"]`).
fn within(part: &str, e: MigrateError) -> MigrateError {
    match e {
        MigrateError::Rules(m) => MigrateError::Rules(format!("{part}: {m}")),
        MigrateError::Json(m) => MigrateError::Json(format!("{part}: {m}")),
        MigrateError::Unrecognized(m) => MigrateError::Unrecognized(format!("{part}: {m}")),
    }
}

fn looks_like_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

fn blank(text: &str) -> bool {
    text.lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
}

fn dashboard(rw: &QueryRewriter<'_>, text: &str) -> Result<Migrated, MigrateError> {
    let m = grafana::migrate(rw, text)?;
    Ok(Migrated {
        changed: m.text != text,
        text: m.text,
        entries: m.entries,
        form: Form::Dashboard,
    })
}

/// The byte ranges of a YAML stream's documents (separator lines `---` and end markers
/// `...` excluded). A stream without separators is one document.
pub fn documents(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut at = 0;
    let mut seen_separator = false;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let marker = bare == "---"
            || bare.starts_with("--- ")
            || bare.starts_with("---\t")
            || bare == "..."
            || bare.starts_with("... ");
        if marker {
            if seen_separator || !blank(&text[start..at]) {
                out.push(start..at);
            }
            seen_separator = true;
            start = at + line.len();
        }
        at += line.len();
    }
    if !seen_separator || !blank(&text[start..]) {
        out.push(start..text.len());
    }
    out
}

/// One YAML document: `None` when it is not a form this module migrates.
fn document(rw: &Rewriters<'_, '_>, doc: &str) -> Result<Option<Migrated>, MigrateError> {
    let v: Value = yaml::from_str(doc).map_err(|e| MigrateError::Rules(e.to_string()))?;
    let kind = v.get("kind").and_then(Value::as_str);
    if v.get("groups").is_some_and(Value::is_array) && kind.is_none() {
        let m = rules_file::migrate(rw.rules, doc)?;
        return Ok(Some(Migrated {
            text: m.text,
            changed: m.changed,
            entries: m.entries,
            form: Form::RuleFile,
        }));
    }
    match kind {
        Some("PrometheusRule") => {
            let m = rules_file::migrate_resource(rw.rules, doc)?;
            Ok(Some(Migrated {
                text: m.text,
                changed: m.changed,
                entries: m.entries,
                form: Form::PrometheusRule,
            }))
        }
        Some("ConfigMap") => embedded(rw, doc, &v, "data", Form::ConfigMap),
        // The grafana-operator's resource: the dashboard is the string `spec.json`.
        Some("GrafanaDashboard") => embedded(rw, doc, &v, "spec", Form::GrafanaDashboard),
        _ => Ok(None),
    }
}

/// A ConfigMap (or a GrafanaDashboard): each string under `holder` (`data`, `spec`) that
/// is a dashboard or a rule file is migrated; the new values are written back into their
/// block scalars (everything else as it was), else the document is written anew.
fn embedded(
    rw: &Rewriters<'_, '_>,
    doc: &str,
    v: &Value,
    holder: &str,
    form: Form,
) -> Result<Option<Migrated>, MigrateError> {
    let Some(Value::Object(data)) = v.get(holder) else {
        return Ok(None);
    };
    let mut any = false;
    let mut entries = Vec::new();
    let mut changes: Vec<(String, String)> = Vec::new();
    for (key, value) in data {
        let Value::String(inner) = value else {
            continue;
        };
        let m = if looks_like_json(inner) {
            if !serde_json::from_str::<Value>(inner).is_ok_and(|d| is_dashboard(&d)) {
                continue;
            }
            dashboard(rw.dashboards, inner)
        } else {
            // A rule file (or a PrometheusRule) held as text; anything else is not ours.
            match yaml::from_str::<Value>(inner) {
                Ok(iv) if iv.get("groups").is_some_and(Value::is_array) => {
                    rules_file::migrate(rw.rules, inner).map(|m| Migrated {
                        text: m.text,
                        changed: m.changed,
                        entries: m.entries,
                        form: Form::RuleFile,
                    })
                }
                _ => continue,
            }
        };
        let m = m.map_err(|e| within(&format!("{holder}[{key:?}]"), e))?;
        any = true;
        entries.extend(m.entries.into_iter().map(|mut e| {
            e.location = format!("{holder}[{key:?}] ({}): {}", m.form.name(), e.location);
            e
        }));
        if m.changed {
            changes.push((key.clone(), m.text));
        }
    }
    if !any {
        return Ok(None);
    }
    if changes.is_empty() {
        return Ok(Some(Migrated {
            text: doc.to_string(),
            changed: false,
            entries,
            form,
        }));
    }
    let mut want = v.clone();
    if let Some(Value::Object(d)) = want.get_mut(holder) {
        for (k, new) in &changes {
            d.insert(k.clone(), Value::String(new.clone()));
        }
    }
    let text = match replace_block_scalars(doc, &changes)
        .filter(|t| yaml::from_str::<Value>(t).is_ok_and(|got| got == want))
    {
        Some(t) => t,
        None => yaml::to_string(&want).map_err(|e| MigrateError::Rules(e.to_string()))?,
    };
    Ok(Some(Migrated {
        text,
        changed: true,
        entries,
        form,
    }))
}

fn is_dashboard(d: &Value) -> bool {
    ["panels", "rows", "dashboard", "templating"]
        .iter()
        .any(|k| d.get(k).is_some())
}

/// `doc` with the literal block scalar (`key: |`) of each changed key replaced by its new
/// text, indented as the old one was. `None` when a key is not written as a literal
/// block scalar (the caller then writes the document anew).
fn replace_block_scalars(doc: &str, changes: &[(String, String)]) -> Option<String> {
    let lines: Vec<&str> = doc.split_inclusive('\n').collect();
    let mut out = doc.to_string();
    // Replaced from the last to the first, so the byte offsets found stay valid.
    let mut spans: Vec<(usize, usize, String)> = Vec::new();
    for (key, new) in changes {
        let (first, end, indent) = block_of(&lines, key)?;
        let start: usize = lines[..first].iter().map(|l| l.len()).sum();
        let stop: usize = lines[..end].iter().map(|l| l.len()).sum();
        let mut body = String::with_capacity(new.len() + new.len() / 8);
        for l in new.split_inclusive('\n') {
            if l.trim_end_matches(['\n', '\r']).is_empty() {
                body.push_str(l);
            } else {
                body.push_str(&" ".repeat(indent));
                body.push_str(l);
            }
        }
        if !body.ends_with('\n') && stop < doc.len() {
            body.push('\n');
        }
        spans.push((start, stop, body));
    }
    spans.sort_by_key(|s| std::cmp::Reverse(s.0));
    for (start, stop, body) in spans {
        out.replace_range(start..stop, &body);
    }
    Some(out)
}

/// The lines `[first, end)` holding the content of `key: |` and its indentation.
fn block_of(lines: &[&str], key: &str) -> Option<(usize, usize, usize)> {
    let spellings = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ];
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let key_indent = line.len() - trimmed.len();
        let Some(rest) = spellings
            .iter()
            .find_map(|s| trimmed.strip_prefix(s.as_str()))
        else {
            continue;
        };
        let header = rest.trim();
        let header = header.split(" #").next().unwrap_or(header).trim();
        if !matches!(header, "|" | "|-" | "|+") {
            return None;
        }
        let mut end = i + 1;
        let mut indent = None;
        for (j, l) in lines.iter().enumerate().skip(i + 1) {
            if l.trim().is_empty() {
                continue;
            }
            let ind = l.len() - l.trim_start().len();
            if ind <= key_indent {
                break;
            }
            indent.get_or_insert(ind);
            end = j + 1;
        }
        return Some((i + 1, end, indent?));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> crate::mapping::Rules {
        crate::migrate::test_rules(
            "pack: t\nrules:\n  - match: {family: lat_ms}\n    type: histogram\n    rename: lat_seconds\n    scale: 1/1000\n    unit: seconds\n  - match: {family: old_g}\n    type: gauge\n    rename: new_g\n",
        )
    }

    fn run(text: &str) -> Result<Migrated, MigrateError> {
        let rules = rules();
        let d = QueryRewriter::new(&rules, false);
        let r = QueryRewriter::new(&rules, true);
        migrate(
            &Rewriters {
                dashboards: &d,
                rules: &r,
            },
            text,
        )
    }

    #[test]
    fn documents_split_on_separators_only() {
        assert_eq!(documents("a: 1\n"), vec![0..5]);
        let t = "---\na: 1\n---\nb: |\n  --- not a separator\n...\n";
        let d = documents(t);
        assert_eq!(d.len(), 2);
        assert_eq!(&t[d[0].clone()], "a: 1\n");
        assert_eq!(&t[d[1].clone()], "b: |\n  --- not a separator\n");
    }

    #[test]
    fn a_prometheus_rule_keeps_everything_around_its_groups() {
        let text = "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: serving # ours\n  labels: {team: ml}\nspec:\n  groups:\n  - name: g\n    partial_response_strategy: warn\n    rules:\n    - alert: Slow\n      expr: histogram_quantile(0.99, sum by (le) (rate(lat_ms_bucket[5m]))) > 500\n      for: 5m\n";
        let m = run(text).expect("migrates");
        assert_eq!(m.form, Form::PrometheusRule);
        assert!(m.changed);
        assert!(m.text.contains("  name: serving # ours\n"), "{}", m.text);
        assert!(
            m.text.contains("partial_response_strategy: warn"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("lat_seconds_bucket[5m]))) * 1000 > 500"),
            "{}",
            m.text
        );
    }

    #[test]
    fn a_config_map_gets_its_embedded_files_back_in_place() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dash\n  labels:\n    grafana_dashboard: \"1\" # the sidecar's label\ndata:\n  serving.json: |\n    {\"panels\": [{\"title\": \"g\", \"targets\": [{\"expr\": \"old_g\"}]}]}\n  alerts.yaml: |-\n    groups:\n    - name: g\n      rules:\n      - alert: A\n        expr: old_g > 1\n  other: plain text\n";
        let m = run(text).expect("migrates");
        assert_eq!(m.form, Form::ConfigMap);
        assert!(m.text.contains("# the sidecar's label"), "{}", m.text);
        assert!(
            m.text.contains(
                "    {\"panels\": [{\"title\": \"g\", \"targets\": [{\"expr\": \"new_g\"}]}]}\n"
            ),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("        expr: \"new_g > 1\"\n"),
            "{}",
            m.text
        );
        assert!(m.text.ends_with("  other: plain text\n"), "{}", m.text);
        assert!(
            m.entries
                .iter()
                .any(|e| e.location.starts_with("data[\"serving.json\"]"))
        );
    }

    #[test]
    fn documents_nobody_migrates_are_kept_and_located() {
        let text = "# chart\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\ngroups:\n- name: g\n  rules:\n  - record: r\n    expr: sum(old_g)\n";
        let m = run(text).expect("migrates");
        assert_eq!(m.form, Form::Documents);
        assert!(
            m.text
                .starts_with("# chart\n---\napiVersion: v1\nkind: Service\n"),
            "{}",
            m.text
        );
        assert!(m.text.contains("expr: \"sum(new_g)\""), "{}", m.text);
        assert!(
            m.entries[0]
                .location
                .starts_with("documents[1] (rule file): "),
            "{:?}",
            m.entries[0].location
        );
        assert!(run("apiVersion: v1\nkind: Service\n").is_err());
    }
}
