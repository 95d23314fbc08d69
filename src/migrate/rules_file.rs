//! `promnorm migrate rules`: Prometheus rule files (alerting and recording rules). The
//! expressions always keep their values (a threshold keeps its meaning); `$labels.x` in
//! annotations and labels follows label renames; a recording rule whose output name a
//! pack renames is reported. The file is read and written through `config::yaml`
//! (comments are not kept; docs/migrations.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::grafana::rename_template_labels;
use super::promql::{Finding, QueryRewriter, Reason};
use super::{Entry, MigrateError};
use crate::config::yaml;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub groups: Vec<Group>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
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
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
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
}

pub struct Migrated {
    pub text: String,
    pub changed: bool,
    pub entries: Vec<Entry>,
}

/// `rw` must keep values (rule files keep their thresholds' meaning).
pub fn migrate(rw: &QueryRewriter<'_>, text: &str) -> Result<Migrated, MigrateError> {
    let mut file: RuleFile =
        yaml::from_str(text).map_err(|e| MigrateError::Rules(e.to_string()))?;
    let mut entries = Vec::new();
    let mut changed = false;
    for (gi, g) in file.groups.iter_mut().enumerate() {
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
    let text = if changed {
        yaml::to_string(&file).map_err(|e| MigrateError::Rules(e.to_string()))?
    } else {
        text.to_string()
    };
    Ok(Migrated {
        text,
        changed,
        entries,
    })
}
