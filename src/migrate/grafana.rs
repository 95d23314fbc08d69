//! `promnorm migrate grafana`: every PromQL expression of a dashboard (panels, rows,
//! nested panels, templating variables), legend templates naming renamed labels, and,
//! without `--keep-values`, each panel's unit. Every other byte of the file is kept.

use std::collections::HashMap;

use serde_json::Value;

use super::json_edit::{Path, Seg, replace_strings, show};
use super::promql::{Finding, QueryRewriter, Reason, Rewritten};
use super::{Entry, MigrateError};
use crate::mapping::number::Factor;

/// A dashboard's migration: the new text and one entry per expression looked at.
pub struct Migrated {
    pub text: String,
    pub entries: Vec<Entry>,
}

pub fn migrate(rw: &QueryRewriter<'_>, text: &str) -> Result<Migrated, MigrateError> {
    let root: Value = serde_json::from_str(text).map_err(|e| MigrateError::Json(e.to_string()))?;
    let mut m = Dashboard {
        rw,
        edits: HashMap::new(),
        entries: Vec::new(),
    };
    // The API's export wraps the dashboard: {"dashboard": {...}, "meta": {...}}.
    let (dash, base) = match root.get("dashboard") {
        Some(d) if d.is_object() => (d, vec![Seg::Key("dashboard".into())]),
        _ => (&root, Vec::new()),
    };
    for key in ["panels", "rows"] {
        if let Some(Value::Array(panels)) = dash.get(key) {
            for (i, p) in panels.iter().enumerate() {
                m.panel(p, at(&base, &[key.into(), i.into()]));
            }
        }
    }
    if let Some(Value::Array(vars)) = dash.pointer("/templating/list") {
        for (i, v) in vars.iter().enumerate() {
            m.variable(
                v,
                at(&base, &["templating".into(), "list".into(), i.into()]),
            );
        }
    }
    let text = replace_strings(text, &m.edits).map_err(|e| MigrateError::Json(e.to_string()))?;
    Ok(Migrated {
        text,
        entries: m.entries,
    })
}

impl From<&str> for Seg {
    fn from(k: &str) -> Seg {
        Seg::Key(k.to_string())
    }
}

impl From<usize> for Seg {
    fn from(i: usize) -> Seg {
        Seg::Index(i)
    }
}

fn at(base: &[Seg], more: &[Seg]) -> Path {
    base.iter().chain(more).cloned().collect()
}

struct Dashboard<'a, 'r> {
    rw: &'a QueryRewriter<'r>,
    edits: HashMap<Path, String>,
    entries: Vec<Entry>,
}

impl Dashboard<'_, '_> {
    fn record(&mut self, path: &Path, before: &str, r: &Rewritten, panel: Option<&str>) {
        if r.changed {
            self.edits.insert(path.clone(), r.query.clone());
        }
        if r.changed || !r.findings.is_empty() || !r.old_references.is_empty() {
            self.entries.push(Entry {
                location: match panel {
                    Some(t) => format!("{} (panel {t:?})", show(path)),
                    None => show(path),
                },
                before: before.to_string(),
                after: r.query.clone(),
                findings: r.findings.clone(),
                old_references: r.old_references.clone(),
            });
        }
    }

    fn panel(&mut self, p: &Value, path: Path) {
        let title = p.get("title").and_then(Value::as_str).unwrap_or("");
        let mut factors: Vec<Option<Factor>> = Vec::new();
        if let Some(Value::Array(targets)) = p.get("targets") {
            for (i, t) in targets.iter().enumerate() {
                let Some(expr) = t.get("expr").and_then(Value::as_str) else {
                    continue;
                };
                let tpath = at(&path, &["targets".into(), i.into()]);
                let r = self.rw.rewrite(expr);
                self.record(&at(&tpath, &["expr".into()]), expr, &r, Some(title));
                factors.push(r.value_factor);
                if let Some(legend) = t.get("legendFormat").and_then(Value::as_str) {
                    let new = rename_template_labels(legend, &r.label_renames);
                    if new != legend {
                        self.edits
                            .insert(at(&tpath, &["legendFormat".into()]), new.clone());
                        self.entries.push(Entry {
                            location: show(&at(&tpath, &["legendFormat".into()])),
                            before: legend.to_string(),
                            after: new,
                            findings: vec![Finding {
                                reason: Reason::LabelRenamed,
                                detail: "a legend names a renamed label".into(),
                            }],
                            old_references: Vec::new(),
                        });
                    }
                }
            }
        }
        if let Some(Value::Array(children)) = p.get("panels") {
            for (i, c) in children.iter().enumerate() {
                self.panel(c, at(&path, &["panels".into(), i.into()]));
            }
        }
        if !self.rw.keep_values() {
            self.panel_unit(p, &path, title, &factors);
        }
    }

    /// Without `--keep-values`, the panel's unit follows its values' new unit.
    fn panel_unit(&mut self, p: &Value, path: &Path, title: &str, factors: &[Option<Factor>]) {
        let changed: Vec<Factor> = factors.iter().flatten().copied().collect();
        let Some(&f) = changed.first() else {
            return;
        };
        let loc = format!("{} (panel {title:?})", show(path));
        let mut note = |detail: String| {
            self.entries.push(Entry {
                location: loc.clone(),
                before: String::new(),
                after: String::new(),
                findings: vec![Finding {
                    reason: Reason::UnitChanged,
                    detail,
                }],
                old_references: Vec::new(),
            })
        };
        if changed.iter().any(|g| *g != f) || changed.len() != factors.len() {
            note(
                "the panel's queries changed unit by different factors: one unit cannot fit \
                 them; rerun with --keep-values or split the panel"
                    .into(),
            );
            return;
        }
        let mut units: Vec<(Path, &str)> = Vec::new();
        if let Some(u) = p
            .pointer("/fieldConfig/defaults/unit")
            .and_then(Value::as_str)
        {
            units.push((
                at(
                    path,
                    &["fieldConfig".into(), "defaults".into(), "unit".into()],
                ),
                u,
            ));
        }
        if let Some(Value::Array(ovs)) = p.pointer("/fieldConfig/overrides") {
            for (i, o) in ovs.iter().enumerate() {
                let Some(Value::Array(props)) = o.get("properties") else {
                    continue;
                };
                for (j, prop) in props.iter().enumerate() {
                    if prop.get("id").and_then(Value::as_str) == Some("unit")
                        && let Some(u) = prop.get("value").and_then(Value::as_str)
                    {
                        units.push((
                            at(
                                path,
                                &[
                                    "fieldConfig".into(),
                                    "overrides".into(),
                                    i.into(),
                                    "properties".into(),
                                    j.into(),
                                    "value".into(),
                                ],
                            ),
                            u,
                        ));
                    }
                }
            }
        }
        if let Some(Value::Array(axes)) = p.get("yaxes") {
            for (i, a) in axes.iter().enumerate() {
                if let Some(u) = a.get("format").and_then(Value::as_str) {
                    units.push((at(path, &["yaxes".into(), i.into(), "format".into()]), u));
                }
            }
        }
        if units.is_empty() {
            note(format!(
                "values are now {f}; the panel sets no unit to change"
            ));
            return;
        }
        for (upath, unit) in units {
            match convert_unit(unit, f) {
                Some(new) if new == unit => {}
                Some(new) => {
                    self.edits.insert(upath.clone(), new.to_string());
                    self.entries.push(Entry {
                        location: format!("{} (panel {title:?})", show(&upath)),
                        before: unit.to_string(),
                        after: new.to_string(),
                        findings: vec![Finding {
                            reason: Reason::UnitChanged,
                            detail: format!("values are now {f}: unit {unit} → {new}"),
                        }],
                        old_references: Vec::new(),
                    });
                }
                None => self.entries.push(Entry {
                    location: format!("{} (panel {title:?})", show(&upath)),
                    before: unit.to_string(),
                    after: unit.to_string(),
                    findings: vec![Finding {
                        reason: Reason::Unsupported,
                        detail: format!(
                            "values are now {f}, and no Grafana unit is {unit} {}: set the \
                             unit by hand",
                            super::inverse_text(f)
                        ),
                    }],
                    old_references: Vec::new(),
                }),
            }
        }
    }

    fn variable(&mut self, v: &Value, path: Path) {
        if v.get("type").and_then(Value::as_str) != Some("query") {
            return;
        }
        let (query, qpath) = match v.get("query") {
            Some(Value::String(q)) => (q.as_str(), at(&path, &["query".into()])),
            Some(Value::Object(o)) => match o.get("query").and_then(Value::as_str) {
                Some(q) => (q, at(&path, &["query".into(), "query".into()])),
                None => return,
            },
            _ => return,
        };
        let name = v.get("name").and_then(Value::as_str).unwrap_or("");
        let r = self.variable_query(query);
        self.record(&qpath, query, &r, None);
        if r.changed
            && let Some(def) = v.get("definition").and_then(Value::as_str)
            && def == query
        {
            self.edits
                .insert(at(&path, &["definition".into()]), r.query.clone());
        }
        if let Some(e) = self.entries.last_mut()
            && e.before == query
        {
            e.location = format!("{} (variable {name:?})", show(&qpath));
        }
    }

    /// `label_values(sel, label)`, `label_values(label)`, `query_result(q)`,
    /// `metrics(re)`, or a plain query.
    fn variable_query(&self, q: &str) -> Rewritten {
        let t = q.trim();
        let call = |f: &str| {
            t.strip_prefix(f)
                .and_then(|r| r.trim_start().strip_prefix('('))
                .and_then(|r| r.strip_suffix(')'))
        };
        if let Some(inner) = call("label_values") {
            // `label_values(sel, label)`: rewrite `group by (label) (sel)` and read both back.
            let Some((sel, label)) = inner.rsplit_once(',') else {
                return unchanged(q);
            };
            let label = label.trim();
            let probe = format!("group by ({label}) ({})", sel.trim());
            let r = self.rw.rewrite(&probe);
            if !r.changed {
                return Rewritten {
                    query: q.to_string(),
                    ..r
                };
            }
            let Some((new_label, new_sel)) = split_group_by(&r.query) else {
                return unchanged(q);
            };
            return Rewritten {
                query: format!("label_values({new_sel}, {new_label})"),
                ..r
            };
        }
        if let Some(inner) = call("query_result") {
            let r = self.rw.rewrite(inner);
            return Rewritten {
                query: format!("query_result({})", r.query),
                ..r
            };
        }
        if let Some(re) = call("metrics") {
            // `metrics(re)` lists names: say when it may match names the rules rename.
            let probe = format!("{{__name__=~{:?}}}", re.trim());
            let r = self.rw.rewrite(&probe);
            return Rewritten {
                findings: r.findings,
                ..unchanged(q)
            };
        }
        if t.contains("label_names") {
            return unchanged(q);
        }
        self.rw.rewrite(q)
    }
}

fn unchanged(q: &str) -> Rewritten {
    Rewritten {
        query: q.to_string(),
        changed: false,
        findings: Vec::new(),
        value_factor: None,
        le_factor: None,
        label_renames: Vec::new(),
        old_references: Vec::new(),
        selectors: Vec::new(),
    }
}

/// `group by (label) (sel)` as printed by the rewriter → (label, sel).
fn split_group_by(q: &str) -> Option<(String, String)> {
    let rest = q.strip_prefix("group by (")?;
    let (label, rest) = rest.split_once(')')?;
    let sel = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some((label.trim().to_string(), sel.to_string()))
}

/// `{{Hostname}}` → `{{hostname}}` for each renamed label.
pub fn rename_template_labels(text: &str, renames: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (from, to) in renames {
        for (open, close) in [("{{", "}}"), ("{{ ", " }}"), ("$labels.", "")] {
            let old = format!("{open}{from}{close}");
            if close.is_empty() {
                // `$labels.name` in alert annotations: only whole label names.
                let mut result = String::new();
                let mut rest = out.as_str();
                while let Some(i) = rest.find(&old) {
                    let after = &rest[i + old.len()..];
                    let whole = !after
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                    result.push_str(&rest[..i]);
                    if whole {
                        result.push_str(open);
                        result.push_str(to);
                    } else {
                        result.push_str(&old);
                    }
                    rest = after;
                }
                result.push_str(rest);
                out = result;
            } else {
                out = out.replace(&old, &format!("{open}{to}{close}"));
            }
        }
    }
    out
}

/// Grafana units: (id, quantity, how many base units one is). The first unit of a
/// quantity with the wanted size wins, so base units come first.
const UNITS: &[(&str, &str, f64)] = &[
    ("s", "time", 1.0),
    ("ms", "time", 1e-3),
    ("µs", "time", 1e-6),
    ("ns", "time", 1e-9),
    ("m", "time", 60.0),
    ("h", "time", 3600.0),
    ("d", "time", 86400.0),
    ("dtdurations", "duration", 1.0),
    ("dtdurationms", "duration", 1e-3),
    ("bytes", "data", 1.0),
    ("decbytes", "data", 1.0),
    ("kbytes", "data", 1024.0),
    ("mbytes", "data", 1048576.0),
    ("gbytes", "data", 1073741824.0),
    ("tbytes", "data", 1099511627776.0),
    ("deckbytes", "data", 1e3),
    ("decmbytes", "data", 1e6),
    ("decgbytes", "data", 1e9),
    ("dectbytes", "data", 1e12),
    ("bits", "data", 0.125),
    ("Bps", "rate", 1.0),
    ("binBps", "rate", 1.0),
    ("KBs", "rate", 1e3),
    ("MBs", "rate", 1e6),
    ("GBs", "rate", 1e9),
    ("KiBs", "rate", 1024.0),
    ("MiBs", "rate", 1048576.0),
    ("GiBs", "rate", 1073741824.0),
    ("percentunit", "ratio", 1.0),
    ("percent", "ratio", 0.01),
    ("hertz", "frequency", 1.0),
    ("joule", "energy", 1.0),
    ("watt", "power", 1.0),
];

/// The unit that shows values `f` times the old ones as the same quantity.
pub fn convert_unit(unit: &str, f: Factor) -> Option<&'static str> {
    let &(_, quantity, size) = UNITS.iter().find(|(id, _, _)| *id == unit)?;
    // value × size = quantity = (value × f) × new_size
    let want = size / f.apply(1.0);
    UNITS
        .iter()
        .find(|(_, q, s)| *q == quantity && ((s - want) / want).abs() < 1e-9)
        .map(|(id, _, _)| *id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_rewritten_or_reported() {
        let rules = crate::migrate::test_rules(
            "pack: dcgm\nrules:\n  - match: {prefix: DCGM_}\n    rename_labels: {Hostname: hostname}\n  - match: {family: DCGM_FI_DEV_FB_USED}\n    type: gauge\n    rename: DCGM_FI_DEV_FB_USED_bytes\n    scale: \"1048576\"\n",
        );
        let rw = QueryRewriter::new(&rules, false);
        let d = Dashboard {
            rw: &rw,
            edits: HashMap::new(),
            entries: Vec::new(),
        };
        let r = d.variable_query("label_values(DCGM_FI_DEV_FB_USED{gpu=\"0\"}, Hostname)");
        assert_eq!(
            r.query,
            "label_values(DCGM_FI_DEV_FB_USED_bytes{gpu=\"0\"}, hostname)"
        );
        let r = d.variable_query("query_result(max by (Hostname) (DCGM_FI_DEV_FB_USED))");
        assert_eq!(
            r.query,
            "query_result(max by (hostname) (DCGM_FI_DEV_FB_USED_bytes))"
        );
        let r = d.variable_query("metrics(DCGM_FI_DEV_FB_.*)");
        assert!(!r.changed);
        assert!(
            r.findings.iter().any(|f| f.reason == Reason::NameRegex),
            "{:?}",
            r.findings
        );
        let r = d.variable_query("label_values(model_name)");
        assert!(!r.changed && r.findings.is_empty());
    }

    #[test]
    fn units_follow_the_factor() {
        let f = |s: &str| Factor::parse(s).expect("factor");
        assert_eq!(convert_unit("ms", f("1/1000")), Some("s"));
        assert_eq!(convert_unit("µs", f("1/1000000")), Some("s"));
        assert_eq!(convert_unit("decmbytes", f("1000000")), Some("bytes"));
        assert_eq!(convert_unit("mbytes", f("1048576")), Some("bytes"));
        assert_eq!(convert_unit("percent", f("1/100")), Some("percentunit"));
        assert_eq!(convert_unit("ms", f("1/7")), None);
        assert_eq!(convert_unit("short", f("1/1000")), None);
    }

    #[test]
    fn legend_and_annotation_labels_are_renamed() {
        let r = vec![("Hostname".to_string(), "hostname".to_string())];
        assert_eq!(
            rename_template_labels("{{Hostname}} / {{ Hostname }} {{gpu}}", &r),
            "{{hostname}} / {{ hostname }} {{gpu}}"
        );
        assert_eq!(
            rename_template_labels("on {{ $labels.Hostname }} ($labels.HostnameX)", &r),
            "on {{ $labels.hostname }} ($labels.HostnameX)"
        );
    }
}
