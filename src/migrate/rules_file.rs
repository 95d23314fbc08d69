//! `promnorm migrate rules`: Prometheus rule files (alerting and recording rules). The
//! expressions always keep their values (a threshold keeps its meaning); `$labels.x` in
//! annotations and labels follows label renames; a recording rule whose output name a
//! pack renames is reported. Changed expressions are replaced in the text (comments and
//! layout kept), checked by parsing the result back; else the file is re-emitted through
//! `config::yaml` (docs/migrations.md).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::grafana::rename_template_labels;
use super::promql::{Finding, QueryRewriter, Reason};
use super::{Entry, MigrateError};
use crate::config::yaml;

#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub groups: Vec<Group>,
}

/// A Kubernetes `PrometheusRule` (the Prometheus Operator's): the rule file is `spec`.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct PrometheusRule {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
    pub spec: RuleFile,
}

/// What holds a list of rule groups.
pub trait Groups: DeserializeOwned + Serialize + PartialEq {
    fn groups(&self) -> &[Group];
    fn groups_mut(&mut self) -> &mut [Group];
}

impl Groups for RuleFile {
    fn groups(&self) -> &[Group] {
        &self.groups
    }
    fn groups_mut(&mut self) -> &mut [Group] {
        &mut self.groups
    }
}

impl Groups for PrometheusRule {
    fn groups(&self) -> &[Group] {
        &self.spec.groups
    }
    fn groups_mut(&mut self) -> &mut [Group] {
        &mut self.spec.groups
    }
}

/// Fields other rule evaluators add (Thanos' `partial_response_strategy`, Mimir's
/// `source_tenants`, …) are kept as they are.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct Group {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_offset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    pub rules: Vec<Rule>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    pub expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_firing_for: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

pub struct Migrated {
    pub text: String,
    pub changed: bool,
    pub entries: Vec<Entry>,
}

/// A rule file (`groups:`). `rw` must keep values (rule files keep their thresholds'
/// meaning).
pub fn migrate(rw: &QueryRewriter<'_>, text: &str) -> Result<Migrated, MigrateError> {
    migrate_as::<RuleFile>(rw, text)
}

/// A `PrometheusRule` resource: its `spec` is migrated as a rule file, the rest is kept.
pub fn migrate_resource(rw: &QueryRewriter<'_>, text: &str) -> Result<Migrated, MigrateError> {
    migrate_as::<PrometheusRule>(rw, text)
}

fn migrate_as<F: Groups>(rw: &QueryRewriter<'_>, text: &str) -> Result<Migrated, MigrateError> {
    let mut file: F = yaml::from_str(text).map_err(|e| MigrateError::Rules(e.to_string()))?;
    let originals: Vec<String> = file
        .groups()
        .iter()
        .flat_map(|g| g.rules.iter())
        .map(|r| {
            [&r.annotations, &r.labels]
                .into_iter()
                .flatten()
                .flat_map(|m| m.values().cloned())
                .collect()
        })
        .collect();
    let mut entries = Vec::new();
    let mut changed = false;
    let mut new_exprs: Vec<Option<String>> = Vec::new();
    // Per rule: the label renames of its expression.
    let mut per_rule: Vec<Vec<(String, String)>> = Vec::new();
    for (gi, g) in file.groups_mut().iter_mut().enumerate() {
        for (ri, rule) in g.rules.iter_mut().enumerate() {
            let what = match (&rule.record, &rule.alert) {
                (Some(r), _) => format!("record {r:?}"),
                (_, Some(a)) => format!("alert {a:?}"),
                _ => "rule".to_string(),
            };
            let location = format!("groups[{gi}] ({:?}).rules[{ri}] ({what})", g.name);
            let before = rule.expr.clone();
            let r = rw.rewrite(&before);
            let mut findings = r.findings.clone();
            if let Some(record) = &rule.record
                && let Some(to) = rw.renamed_to(record)
            {
                findings.push(Finding {
                    reason: Reason::RecordRenamed,
                    detail: format!(
                        "this rule records {record}, which a pack renames to {to} when it \
                         passes through promnorm: queries of {record} are rewritten to {to}; \
                         rename the rule's output (or its readers) by hand"
                    ),
                });
            }
            for map in [&mut rule.annotations, &mut rule.labels]
                .into_iter()
                .flatten()
            {
                for v in map.values_mut() {
                    let new = rename_template_labels(v, &r.label_renames);
                    if new != *v {
                        *v = new;
                        changed = true;
                    }
                }
            }
            if r.changed {
                rule.expr = r.query.clone();
                changed = true;
            }
            new_exprs.push(r.changed.then(|| r.query.clone()));
            per_rule.push(r.label_renames.clone());
            if r.changed || !findings.is_empty() || !r.old_references.is_empty() {
                entries.push(Entry {
                    location,
                    before,
                    after: r.query.clone(),
                    findings,
                    old_references: r.old_references.clone(),
                });
            }
        }
    }
    let text = if !changed {
        text.to_string()
    } else if let Some(edited) =
        edit_in_place(text, &new_exprs, &safe_renames(&per_rule, &originals))
            .filter(|t| yaml::from_str::<F>(t).is_ok_and(|f| f == file))
    {
        // Comments and layout kept: the edited text parses to exactly the new rules.
        edited
    } else {
        yaml::to_string(&file).map_err(|e| MigrateError::Rules(e.to_string()))?
    };
    Ok(Migrated {
        text,
        changed,
        entries,
    })
}

/// The label renames that can be applied to the whole text: those of which every rule
/// whose templates name `$labels.old` renames `old` the same way.
fn safe_renames(per_rule: &[Vec<(String, String)>], originals: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for renames in per_rule {
        for pair in renames {
            let mention = format!("$labels.{}", pair.0);
            let everywhere = per_rule
                .iter()
                .zip(originals)
                .filter(|(_, text)| text.contains(&mention))
                .all(|(r, _)| r.contains(pair));
            if everywhere && !out.contains(pair) {
                out.push(pair.clone());
            }
        }
    }
    out
}

/// The file with each changed `expr:` value replaced (as a double-quoted scalar) and
/// `$labels.old` written `$labels.new`; everything else, comments included, as it was.
/// `None` when the text's `expr:` keys cannot be matched to the rules one for one (the
/// caller then checks the result parses to the intended rules, else re-emits the file).
fn edit_in_place(
    text: &str,
    new_exprs: &[Option<String>],
    renames: &[(String, String)],
) -> Option<String> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let key_at = |line: &str| -> Option<usize> {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let rest = trimmed
            .strip_prefix("- ")
            .map(str::trim_start)
            .unwrap_or(trimmed);
        rest.starts_with("expr:")
            .then(|| indent + (trimmed.len() - rest.len()))
    };
    let mut out = String::with_capacity(text.len());
    let mut rule = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let Some(col) = key_at(line) else {
            out.push_str(line);
            i += 1;
            continue;
        };
        let expr = new_exprs.get(rule)?;
        rule += 1;
        // The value: the rest of the line and every following line indented past the key
        // (blank lines inside a block scalar included).
        let mut end = i + 1;
        let mut j = i + 1;
        while j < lines.len() {
            let l = lines[j];
            let blank = l.trim().is_empty();
            let indent = l.len() - l.trim_start().len();
            if blank {
                j += 1;
                continue;
            }
            if indent > col {
                j += 1;
                end = j;
            } else {
                break;
            }
        }
        match expr {
            Some(new) => {
                let newline = if lines[end - 1].ends_with('\n') {
                    "\n"
                } else {
                    ""
                };
                out.push_str(&line[..col]);
                out.push_str("expr: ");
                out.push_str(&serde_json::to_string(new).ok()?);
                out.push_str(newline);
            }
            None => {
                for l in &lines[i..end] {
                    out.push_str(l);
                }
            }
        }
        i = end;
    }
    if rule != new_exprs.len() {
        return None;
    }
    Some(super::grafana::rename_template_labels(&out, renames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Rules;

    fn rules() -> Rules {
        crate::migrate::test_rules(
            "pack: t\nrules:\n  - match: {family: lat_ms}\n    type: histogram\n    rename: lat_seconds\n    scale: 1/1000\n  - match: {prefix: dev_}\n    rename_labels: {Host: host}\n",
        )
    }

    const FILE: &str = "# Alerts of the serving team.\ngroups:\n  - name: serving # owned by SRE\n    rules:\n      # Slow transfers page.\n      - alert: Slow\n        expr: |\n          histogram_quantile(0.99, sum by (le) (rate(lat_ms_bucket[5m])))\n            > 500\n        for: 5m\n        annotations:\n          summary: \"p99 is slow\"\n      - record: unchanged:sum\n        expr: sum(up)\n      - alert: Hosts\n        expr: count by (Host) (dev_x) > 1\n        annotations:\n          summary: \"{{ $labels.Host }} has two\"\n";

    #[test]
    fn comments_and_layout_survive_a_rewrite() {
        let rules = rules();
        let m = migrate(&QueryRewriter::new(&rules, true), FILE).expect("migrates");
        assert!(m.changed);
        assert!(
            m.text.starts_with("# Alerts of the serving team.\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("- name: serving # owned by SRE"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("      # Slow transfers page.\n"),
            "{}",
            m.text
        );
        assert!(
            m.text.contains("expr: \"histogram_quantile(0.99, sum by (le) (rate(lat_seconds_bucket[5m]))) * 1000 > 500\"\n        for: 5m"),
            "{}",
            m.text
        );
        assert!(m.text.contains("expr: sum(up)\n"), "untouched: {}", m.text);
        assert!(
            m.text.contains("expr: \"count by (host) (dev_x) > 1\""),
            "{}",
            m.text
        );
        assert!(m.text.contains("{{ $labels.host }} has two"), "{}", m.text);
        let again = migrate(&QueryRewriter::new(&rules, true), &m.text).expect("migrates");
        assert!(!again.changed, "a migrated file is left alone");
    }
}
