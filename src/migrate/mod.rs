//! `promnorm migrate`: rewriting users' PromQL, Grafana dashboards and Prometheus rule
//! files with the same compiled [`Rules`](crate::mapping::Rules) the proxy applies to the
//! series, so that queries written against the old names and units keep working after
//! promnorm is switched on (docs/migrations.md).
//!
//! One engine ([`promql::QueryRewriter`]) serves the three front ends; each returns the
//! new text and one [`Entry`] per expression it changed or has something to say about.

pub mod files;
pub mod grafana;
pub mod json_edit;
pub mod promql;
pub mod rules_file;
pub mod template;
pub mod tree;

pub use promql::{Finding, QueryRewriter, Reason, Rewritten, SelectorChange};

use crate::mapping::number::Factor;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("not a Grafana dashboard (JSON): {0}")]
    Json(String),
    #[error("not a Prometheus rule file: {0}")]
    Rules(String),
    /// Valid YAML, but no form `migrate` knows (a Service, a kustomization).
    #[error("{0}")]
    Unrecognized(String),
}

/// One expression (or unit, or legend) of a file: where, before, after, and why.
#[derive(Clone, Debug)]
pub struct Entry {
    pub location: String,
    pub before: String,
    pub after: String,
    pub findings: Vec<Finding>,
    /// Old names and labels it referenced (what `--check` lists).
    pub old_references: Vec<String>,
}

impl Entry {
    pub fn from_query(location: &str, before: &str, r: &Rewritten) -> Entry {
        Entry {
            location: location.to_string(),
            before: before.to_string(),
            after: r.query.clone(),
            findings: r.findings.clone(),
            old_references: r.old_references.clone(),
        }
    }

    pub fn needs_human(&self) -> bool {
        self.findings.iter().any(|f| f.reason.needs_human())
    }
}

/// How the old values are restored from new ones: `×1000` for a `÷1000` factor.
pub fn inverse_text(f: Factor) -> String {
    Factor {
        num: f.den,
        den: f.num,
    }
    .to_string()
}

/// The lines written to stderr: one per finding, `location: reason: detail`.
pub fn finding_lines(entries: &[Entry]) -> Vec<String> {
    let mut out = Vec::new();
    for e in entries {
        for f in &e.findings {
            let mark = if f.reason.needs_human() {
                "NEEDS A HUMAN "
            } else {
                ""
            };
            out.push(format!(
                "{}: {mark}{}: {}",
                e.location,
                f.reason.name(),
                f.detail
            ));
        }
    }
    out
}

/// `--check`: every old name or label still referenced, one line each.
pub fn check_lines(entries: &[Entry]) -> Vec<String> {
    let mut out = Vec::new();
    for e in entries {
        for r in &e.old_references {
            out.push(format!("{}: still references {r}", e.location));
        }
    }
    out
}

/// The JSON report (`--report FILE`).
pub fn report_json(entries: &[Entry], keep_values: bool) -> String {
    let items: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "location": e.location,
                "before": e.before,
                "after": e.after,
                "changed": e.before != e.after,
                "needs_human": e.needs_human(),
                "old_references": e.old_references,
                "findings": e.findings.iter().map(|f| serde_json::json!({
                    "reason": f.reason.name(),
                    "needs_human": f.reason.needs_human(),
                    "detail": f.detail,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let summary = serde_json::json!({
        "keep_values": keep_values,
        "entries": entries.len(),
        "changed": entries.iter().filter(|e| e.before != e.after).count(),
        "needs_human": entries.iter().filter(|e| e.needs_human()).count(),
    });
    let doc = serde_json::json!({ "summary": summary, "entries": items });
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// Rules of one pack written in YAML, for the tests of this module.
#[cfg(test)]
pub(crate) fn test_rules(pack_yaml: &str) -> crate::mapping::Rules {
    use crate::mapping::{GlobalOptions, PackOptions, PackSpec, Rules};
    let spec: PackSpec = crate::config::yaml::from_str(pack_yaml).expect("test pack parses");
    let name = spec.pack.clone();
    Rules::compile(
        &[(
            spec,
            PackOptions {
                name,
                keep_original: false,
                sum_over_ranks: None,
            },
        )],
        &GlobalOptions {
            drop_created_series: false,
            otel_names: Default::default(),
        },
    )
    .expect("test pack compiles")
}
