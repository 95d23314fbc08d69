//! `promnorm migrate grafana`: every PromQL expression of a dashboard (panels, rows,
//! nested panels, templating variables), legend templates naming renamed labels, and,
//! without `--keep-values`, each panel's unit. Every other byte of the file is kept.

use std::collections::HashMap;

use serde_json::Value;

use super::json_edit::{Path, Seg, replace_values, show};
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
    let text = replace_values(text, &m.edits).map_err(|e| MigrateError::Json(e.to_string()))?;
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
    edits: HashMap<Path, Value>,
    entries: Vec<Entry>,
}

impl Dashboard<'_, '_> {
    fn record(&mut self, path: &Path, before: &str, r: &Rewritten, panel: Option<&str>) {
        if r.changed {
            self.edits
                .insert(path.clone(), Value::String(r.query.clone()));
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
        // Empty expressions are normal in Grafana (a query row not filled in yet).
        let mut targets: Vec<(Path, &str, Option<&str>)> = Vec::new();
        if let Some(Value::Array(ts)) = p.get("targets") {
            for (i, t) in ts.iter().enumerate() {
                let Some(expr) = t.get("expr").and_then(Value::as_str) else {
                    continue;
                };
                if expr.trim().is_empty() {
                    continue;
                }
                let legend = t.get("legendFormat").and_then(Value::as_str);
                targets.push((at(&path, &["targets".into(), i.into()]), expr, legend));
            }
        }
        let mut rewrites: Vec<Rewritten> = targets.iter().map(|t| self.rw.rewrite(t.1)).collect();
        if !self.rw.keep_values() {
            let factors: Vec<Option<Factor>> = rewrites.iter().map(|r| r.value_factor).collect();
            // The unit the new values are in, when every changed query says the same.
            let mut now = rewrites
                .iter()
                .filter(|r| r.value_factor.is_some())
                .map(|r| r.value_unit.as_deref());
            let first = now.next().flatten();
            let values_unit = first.filter(|u| now.all(|o| o == Some(*u)));
            match unit_plan(p, &path, &factors, values_unit) {
                UnitPlan::Unchanged => {}
                UnitPlan::Follow { factor, units } => {
                    self.follow_unit(p, &path, title, factor, &units)
                }
                UnitPlan::KeepValues(why) => {
                    // Numbers and unit must agree: this panel's queries return the old values.
                    let keep = self.rw.keeping_values();
                    rewrites = targets.iter().map(|t| keep.rewrite(t.1)).collect();
                    self.entries.push(Entry {
                        location: format!("{} (panel {title:?})", show(&path)),
                        before: String::new(),
                        after: String::new(),
                        findings: vec![Finding {
                            reason: Reason::ValuesRestored,
                            detail: format!("{why}: the panel's queries keep their old values"),
                        }],
                        old_references: Vec::new(),
                    });
                }
            }
        }
        for ((tpath, expr, legend), r) in targets.iter().zip(&rewrites) {
            self.record(&at(tpath, &["expr".into()]), expr, r, Some(title));
            if let Some(legend) = legend {
                let new = rename_template_labels(legend, &r.label_renames);
                if new != *legend {
                    self.edits.insert(
                        at(tpath, &["legendFormat".into()]),
                        Value::String(new.clone()),
                    );
                    self.entries.push(Entry {
                        location: show(&at(tpath, &["legendFormat".into()])),
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
        if let Some(Value::Array(children)) = p.get("panels") {
            for (i, c) in children.iter().enumerate() {
                self.panel(c, at(&path, &["panels".into(), i.into()]));
            }
        }
    }

    /// Without `--keep-values`: the panel's units follow its values' new unit, and so do
    /// its thresholds, bounds and range mappings.
    fn follow_unit(
        &mut self,
        p: &Value,
        path: &Path,
        title: &str,
        f: Factor,
        units: &[(Path, String, &'static str, Fit)],
    ) {
        for (upath, unit, new, fit) in units {
            if *new == unit.as_str() && *fit == Fit::Exact {
                continue;
            }
            if *new != unit.as_str() {
                self.edits
                    .insert(upath.clone(), Value::String(new.to_string()));
            }
            let detail = if *fit == Fit::Exact {
                format!("values are now {f}: unit {unit} → {new}")
            } else if *new == unit.as_str() {
                format!(
                    "values are now {f}, in {new}: the panel's unit {unit} now fits them (the \
                     old values were not {unit})"
                )
            } else if *fit == Fit::ValuesUnit {
                format!(
                    "values are now {f}, in {new}: unit {unit} → {new} (no unit is exactly \
                     {unit} {}; the panel now shows the values' exact amount)",
                    super::inverse_text(f)
                )
            } else {
                format!(
                    "values are now {f}, and no Grafana unit is exactly {unit} {}: unit {unit} → \
                     {new}, the nearest (the panel now shows the values' exact amount)",
                    super::inverse_text(f)
                )
            };
            self.entries.push(Entry {
                location: format!("{} (panel {title:?})", show(upath)),
                before: unit.clone(),
                after: new.to_string(),
                findings: vec![Finding {
                    reason: Reason::UnitChanged,
                    detail,
                }],
                old_references: Vec::new(),
            });
        }
        for (npath, old, new) in scaled_numbers(p, path, f) {
            self.entries.push(Entry {
                location: format!("{} (panel {title:?})", show(&npath)),
                before: old.to_string(),
                after: new.to_string(),
                findings: vec![Finding {
                    reason: Reason::ThresholdRescaled,
                    detail: format!("{old} → {new} (values {f})"),
                }],
                old_references: Vec::new(),
            });
            self.edits.insert(npath, new);
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
        if query.trim().is_empty() {
            return;
        }
        let r = self.variable_query(query);
        self.record(&qpath, query, &r, None);
        if r.changed
            && let Some(def) = v.get("definition").and_then(Value::as_str)
            && def == query
        {
            self.edits.insert(
                at(&path, &["definition".into()]),
                Value::String(r.query.clone()),
            );
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

/// How a panel's new unit was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// It shows the new values as the old unit showed the old ones.
    Exact,
    /// It is the unit the new values are in (the rule's `unit`), of the panel's quantity.
    ValuesUnit,
    /// The nearest of the panel's quantity, within 10%.
    Nearest,
}

/// What a panel's unit does when its queries' values change unit.
enum UnitPlan {
    /// The values do not change.
    Unchanged,
    /// Every unit of the panel (path, old, new, exact) follows factor `factor`.
    Follow {
        factor: Factor,
        units: Vec<(Path, String, &'static str, Fit)>,
    },
    /// No unit can follow: the panel keeps its values (why).
    KeepValues(String),
}

fn unit_plan(
    p: &Value,
    path: &Path,
    factors: &[Option<Factor>],
    values_unit: Option<&str>,
) -> UnitPlan {
    let changed: Vec<Factor> = factors.iter().flatten().copied().collect();
    let Some(&f) = changed.first() else {
        return UnitPlan::Unchanged;
    };
    if changed.iter().any(|g| *g != f) || changed.len() != factors.len() {
        return UnitPlan::KeepValues(
            "the panel's queries would change unit by different factors, and one unit cannot \
             show them all"
                .into(),
        );
    }
    let units = panel_units(p, path);
    if units.is_empty() {
        return UnitPlan::KeepValues(format!(
            "the values would be {f}, and the panel sets no unit that could follow them"
        ));
    }
    let mut out = Vec::with_capacity(units.len());
    for (upath, unit) in units {
        // Exact; else the unit the values are now in, if the panel shows that quantity
        // (`hertz` over MHz values, now hertz); else the nearest within 10%.
        let fits = values_unit
            .and_then(unit_for)
            .filter(|g| same_quantity(g, &unit));
        match (convert_unit(&unit, f), fits) {
            (Some(new), _) => out.push((upath, unit, new, Fit::Exact)),
            (None, Some(g)) => out.push((upath, unit, g, Fit::ValuesUnit)),
            (None, None) => match nearest_unit(&unit, f) {
                Some(new) => out.push((upath, unit, new, Fit::Nearest)),
                None => {
                    return UnitPlan::KeepValues(format!(
                        "the values would be {f}, and no Grafana unit is {unit} {}",
                        super::inverse_text(f)
                    ));
                }
            },
        }
    }
    UnitPlan::Follow {
        factor: f,
        units: out,
    }
}

/// `fieldConfig.overrides[i].properties[j].value` of the panel at `path`.
fn override_value(path: &Path, i: usize, j: usize) -> Path {
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
    )
}

/// The units a panel sets: its default, its overrides', and a graph panel's left axis
/// (its right axis too when a series is drawn on it).
fn panel_units(p: &Value, path: &Path) -> Vec<(Path, String)> {
    let mut units: Vec<(Path, String)> = Vec::new();
    if let Some(u) = p
        .pointer("/fieldConfig/defaults/unit")
        .and_then(Value::as_str)
    {
        units.push((
            at(
                path,
                &["fieldConfig".into(), "defaults".into(), "unit".into()],
            ),
            u.to_string(),
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
                    units.push((override_value(path, i, j), u.to_string()));
                }
            }
        }
    }
    let right_axis_used = p
        .get("seriesOverrides")
        .and_then(Value::as_array)
        .is_some_and(|o| {
            o.iter()
                .any(|s| s.get("yaxis").and_then(Value::as_u64) == Some(2))
        });
    if let Some(Value::Array(axes)) = p.get("yaxes") {
        for (i, a) in axes
            .iter()
            .enumerate()
            .take(if right_axis_used { 2 } else { 1 })
        {
            if let Some(u) = a.get("format").and_then(Value::as_str) {
                units.push((
                    at(path, &["yaxes".into(), i.into(), "format".into()]),
                    u.to_string(),
                ));
            }
        }
    }
    units
}

/// The numbers of a panel read in its values' unit (bounds, absolute thresholds, range
/// mappings, a graph's axis bounds and thresholds), each with its value `f` times.
fn scaled_numbers(p: &Value, path: &Path, f: Factor) -> Vec<(Path, Value, Value)> {
    let mut out = Vec::new();
    let mut visit = |v: Option<&Value>, at_path: Path| {
        if let Some(new) = v.and_then(|v| scale_number(v, f)).filter(|n| Some(n) != v) {
            out.push((at_path, v.cloned().unwrap_or(Value::Null), new));
        }
    };
    // One field config (defaults, or an override's property by id).
    fn config_numbers(cfg: &Value, base: &Path, visit: &mut dyn FnMut(Option<&Value>, Path)) {
        for k in ["min", "max"] {
            visit(cfg.get(k), at(base, &[k.into()]));
        }
        thresholds(
            cfg.get("thresholds"),
            &at(base, &["thresholds".into()]),
            visit,
        );
        if let Some(Value::Array(maps)) = cfg.get("mappings") {
            mappings(maps, &at(base, &["mappings".into()]), visit);
        }
    }
    fn thresholds(t: Option<&Value>, base: &Path, visit: &mut dyn FnMut(Option<&Value>, Path)) {
        let Some(t) = t else { return };
        if t.get("mode").and_then(Value::as_str) == Some("percentage") {
            return;
        }
        if let Some(Value::Array(steps)) = t.get("steps") {
            for (i, s) in steps.iter().enumerate() {
                visit(
                    s.get("value"),
                    at(base, &["steps".into(), i.into(), "value".into()]),
                );
            }
        }
    }
    fn mappings(maps: &[Value], base: &Path, visit: &mut dyn FnMut(Option<&Value>, Path)) {
        for (i, m) in maps.iter().enumerate() {
            if m.get("type").and_then(Value::as_str) == Some("range") {
                for k in ["from", "to"] {
                    visit(
                        m.pointer(&format!("/options/{k}")),
                        at(base, &[i.into(), "options".into(), k.into()]),
                    );
                }
            }
        }
    }
    let defaults = at(path, &["fieldConfig".into(), "defaults".into()]);
    if let Some(d) = p.pointer("/fieldConfig/defaults") {
        config_numbers(d, &defaults, &mut visit);
    }
    if let Some(Value::Array(ovs)) = p.pointer("/fieldConfig/overrides") {
        for (i, o) in ovs.iter().enumerate() {
            let Some(Value::Array(props)) = o.get("properties") else {
                continue;
            };
            for (j, prop) in props.iter().enumerate() {
                let base = override_value(path, i, j);
                match prop.get("id").and_then(Value::as_str) {
                    Some("min" | "max") => visit(prop.get("value"), base),
                    Some("thresholds") => thresholds(prop.get("value"), &base, &mut visit),
                    Some("mappings") => {
                        if let Some(Value::Array(maps)) = prop.get("value") {
                            mappings(maps, &base, &mut visit);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    if let Some(Value::Array(axes)) = p.get("yaxes") {
        for (i, a) in axes.iter().enumerate().take(1) {
            for k in ["min", "max"] {
                visit(a.get(k), at(path, &["yaxes".into(), i.into(), k.into()]));
            }
        }
    }
    if let Some(Value::Array(ts)) = p.get("thresholds") {
        for (i, t) in ts.iter().enumerate() {
            visit(
                t.get("value"),
                at(path, &["thresholds".into(), i.into(), "value".into()]),
            );
        }
    }
    out
}

/// A number (or a number written as a string, as graph axes do) times `f`; `None` for
/// anything else (`null`, an empty bound).
fn scale_number(v: &Value, f: Factor) -> Option<Value> {
    let (x, as_string) = match v {
        Value::Number(n) => (n.as_f64()?, false),
        Value::String(s) if !s.trim().is_empty() => (s.trim().parse::<f64>().ok()?, true),
        _ => return None,
    };
    let y = f.apply(x);
    if !y.is_finite() {
        return None;
    }
    let num = if y.fract() == 0.0 && y.abs() < 9.0e15 {
        Value::from(y as i64)
    } else {
        Value::from(y)
    };
    Some(if as_string {
        Value::String(num.to_string())
    } else {
        num
    })
}

fn unchanged(q: &str) -> Rewritten {
    Rewritten {
        query: q.to_string(),
        changed: false,
        findings: Vec::new(),
        value_factor: None,
        value_unit: None,
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

/// The Grafana unit of values in a pack's `unit` (`seconds` → `s`).
pub fn unit_for(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "seconds" => "s",
        "bytes" => "bytes",
        "hertz" => "hertz",
        "ratio" => "percentunit",
        "watts" => "watt",
        "joules" => "joule",
        "bytes_per_second" => "Bps",
        _ => return None,
    })
}

/// Whether two Grafana units measure one quantity.
pub fn same_quantity(a: &str, b: &str) -> bool {
    let q = |u: &str| UNITS.iter().find(|(id, _, _)| *id == u).map(|(_, q, _)| *q);
    q(a).is_some() && q(a) == q(b)
}

/// The unit of the same quantity nearest (within 10%) to showing values `f` times the
/// old ones: `decmbytes` (10^6 bytes) over values that were MiB reads `bytes` once they
/// are bytes. `None` when nothing is that near.
pub fn nearest_unit(unit: &str, f: Factor) -> Option<&'static str> {
    let &(_, quantity, size) = UNITS.iter().find(|(id, _, _)| *id == unit)?;
    let want = size / f.apply(1.0);
    UNITS
        .iter()
        .filter(|(_, q, s)| *q == quantity && ((s - want) / want).abs() < 0.1)
        .min_by(|a, b| {
            let d = |s: f64| ((s - want) / want).abs();
            d(a.2).total_cmp(&d(b.2))
        })
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

    fn dcgm() -> crate::mapping::Rules {
        crate::migrate::test_rules(
            "pack: dcgm\nrules:\n  - match: {prefix: DCGM_}\n    rename_labels: {Hostname: hostname}\n  - match: {family: DCGM_FI_DEV_FB_USED}\n    type: gauge\n    rename: DCGM_FI_DEV_FB_USED_bytes\n    scale: \"1048576\"\n    unit: bytes\n  - match: {family: DCGM_FI_DEV_SM_CLOCK}\n    type: gauge\n    rename: DCGM_FI_DEV_SM_CLOCK_hertz\n    scale: \"1000000\"\n    unit: hertz\n  - match: {family: lat_ms}\n    type: gauge\n    rename: lat_seconds\n    scale: 1/1000\n    unit: seconds\n",
        )
    }

    fn panel(unit: &str, expr: &str) -> String {
        format!(
            r#"{{"panels": [{{"title": "p", "type": "timeseries", "fieldConfig": {{"defaults": {{"unit": "{unit}", "min": 0, "max": 2000, "thresholds": {{"mode": "absolute", "steps": [{{"color": "green", "value": null}}, {{"color": "red", "value": 500}}]}}, "mappings": [{{"type": "range", "options": {{"from": 100, "to": 200, "result": {{"text": "busy"}}}}}}]}}, "overrides": []}}, "targets": [{{"expr": "{expr}", "legendFormat": "{{{{Hostname}}}}"}}, {{"expr": ""}}]}}]}}"#
        )
    }

    fn migrated(unit: &str, expr: &str) -> (Value, Vec<Entry>) {
        let rules = dcgm();
        let m = migrate(&QueryRewriter::new(&rules, false), &panel(unit, expr)).expect("migrates");
        (
            serde_json::from_str(&m.text).expect("valid JSON"),
            m.entries,
        )
    }

    #[test]
    fn units_thresholds_and_bounds_follow_the_values_together() {
        let (d, entries) = migrated("ms", "lat_ms");
        let p = &d["panels"][0];
        assert_eq!(p["targets"][0]["expr"], "lat_seconds");
        assert_eq!(p["fieldConfig"]["defaults"]["unit"], "s");
        assert_eq!(p["fieldConfig"]["defaults"]["max"], 2.0);
        assert_eq!(
            p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"],
            0.5
        );
        assert!(p["fieldConfig"]["defaults"]["thresholds"]["steps"][0]["value"].is_null());
        assert_eq!(
            p["fieldConfig"]["defaults"]["mappings"][0]["options"]["from"],
            0.1
        );
        assert!(
            !entries
                .iter()
                .any(|e| e.findings.iter().any(|f| f.reason == Reason::ParseError)),
            "an empty expression is not an error: {:?}",
            entries.iter().map(|e| &e.location).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_unit_without_an_equivalent_is_never_left_disagreeing_with_its_numbers() {
        // decmbytes (10^6 bytes) over MiB: bytes, the nearest, shows the exact amount.
        let (d, _) = migrated("decmbytes", "DCGM_FI_DEV_FB_USED");
        let p = &d["panels"][0];
        assert_eq!(p["targets"][0]["expr"], "DCGM_FI_DEV_FB_USED_bytes");
        assert_eq!(p["fieldConfig"]["defaults"]["unit"], "bytes");
        assert_eq!(
            p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"],
            500 * 1048576
        );
        // The user's own conversion cancels the pack's: nothing left to scale.
        let (d, _) = migrated("bytes", "DCGM_FI_DEV_FB_USED * 1024 * 1024");
        let p = &d["panels"][0];
        assert_eq!(p["targets"][0]["expr"], "DCGM_FI_DEV_FB_USED_bytes");
        assert_eq!(p["fieldConfig"]["defaults"]["unit"], "bytes");
        assert_eq!(
            p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"],
            500
        );
        let (d, _) = migrated("hertz", "max by (gpu) (DCGM_FI_DEV_SM_CLOCK) * 1000000");
        assert_eq!(
            d["panels"][0]["targets"][0]["expr"],
            "max by (gpu) (DCGM_FI_DEV_SM_CLOCK_hertz)"
        );
        assert_eq!(d["panels"][0]["fieldConfig"]["defaults"]["unit"], "hertz");
        // No unit can say ×2^20 of "short": the panel keeps its values, exactly.
        let (d, entries) = migrated("short", "DCGM_FI_DEV_FB_USED");
        let p = &d["panels"][0];
        assert_eq!(
            p["targets"][0]["expr"],
            "DCGM_FI_DEV_FB_USED_bytes / 1048576"
        );
        assert_eq!(p["fieldConfig"]["defaults"]["unit"], "short");
        assert_eq!(
            p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"],
            500
        );
        assert!(
            entries.iter().any(|e| e
                .findings
                .iter()
                .any(|f| f.reason == Reason::ValuesRestored)),
            "said why"
        );
    }

    #[test]
    fn a_legend_follows_a_label_the_selector_does_not_name() {
        let (d, _) = migrated("percent", "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(d["panels"][0]["targets"][0]["legendFormat"], "{{hostname}}");
        assert_eq!(d["panels"][0]["targets"][0]["expr"], "DCGM_FI_DEV_GPU_UTIL");
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
