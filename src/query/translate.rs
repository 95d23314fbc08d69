//! A query in the old terms → the query for the normalised data, and the normalised
//! data's answer → the old terms (docs/query.md).
//!
//! The rewrite is the migrate engine's in keep-values mode ([`QueryRewriter`]), so the
//! values come back in the old unit. What the upstream then returns under the new terms
//! is put back here: `__name__` (for results that keep it), label names, mapped label
//! values and `le` texts. [`merge`] joins that with the answer to the original query,
//! which reads the history stored under the old names: per label set and per timestamp,
//! the new side wins where both have a point.

use std::collections::{BTreeMap, HashMap};

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{Expr, VectorSelector, token};
use serde_json::{Map, Value};

use crate::explain::rescale_le;
use crate::mapping::Rules;
use crate::mapping::number::{Factor, FloatStyle, StyleEvidence, parse_float, style_of};
use crate::migrate::{QueryRewriter, SelectorChange};

/// A query as promnorm asks it.
#[derive(Clone, Debug)]
pub struct Translation {
    /// The caller's text.
    pub original: String,
    /// The text for the normalised data (the original when nothing changed).
    pub rewritten: String,
    /// The text for the history under the old names: the original, but where the rules
    /// keep a name and rename a label, its selectors take only the series without the
    /// new label (the rewritten text takes only those with it), so that no series is
    /// read by both questions.
    pub old_query: String,
    /// Every selector the rules change (empty: the query passes through untouched).
    pub selectors: Vec<SelectorChange>,
    /// Labels renamed anywhere in the query (old → new).
    pub label_renames: Vec<(String, String)>,
    /// The result keeps `le` of a rescaled histogram: new bounds = old × this.
    pub le_factor: Option<Factor>,
    /// The old metric name every result series carries, when the original query's result
    /// keeps the name of one renamed selector (a raw selector, a filter, `topk`, …).
    pub result_name: Option<String>,
    /// What the migrate engine says needs a human, for the response's `warnings`.
    pub warnings: Vec<String>,
}

/// Why a query could not be translated: it does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadQuery(pub String);

impl Translation {
    /// True when the rules change anything the query selects.
    pub fn translates(&self) -> bool {
        !self.selectors.is_empty()
    }

    /// True when the two questions differ, so that the old names' history needs a
    /// question of its own.
    pub fn text_changed(&self) -> bool {
        self.rewritten != self.old_query
    }

    /// The old names the query reads that the rules rename or rescale.
    pub fn old_names(&self) -> impl Iterator<Item = &str> {
        self.selectors.iter().map(|s| s.from.as_str())
    }

    fn by_new_name(&self, name: &str) -> Option<&SelectorChange> {
        self.selectors
            .iter()
            .find(|s| s.to == name && s.from != s.to)
    }

    fn by_old_name(&self, name: &str) -> Option<&SelectorChange> {
        self.selectors.iter().find(|s| s.from == name)
    }
}

/// Translates one PromQL query with `rules`: its values come back in the old unit.
pub fn translate(rules: &Rules, query: &str) -> Result<Translation, BadQuery> {
    translate_with(rules, query, true)
}

fn translate_with(rules: &Rules, query: &str, keep_values: bool) -> Result<Translation, BadQuery> {
    let parsed = promql_parser::parser::parse(query).map_err(|e| BadQuery(e.trim().to_string()))?;
    let r = QueryRewriter::new(rules, keep_values).rewrite(query);
    let mut label_renames = r.label_renames.clone();
    for s in &r.selectors {
        for pair in &s.label_renames {
            if !label_renames.contains(pair) {
                label_renames.push(pair.clone());
            }
        }
    }
    let warnings = r
        .findings
        .iter()
        .filter(|f| f.reason.needs_human())
        .map(|f| format!("promnorm: {}: {}", f.reason.name(), f.detail))
        .collect();
    let result_name = kept_name(&parsed).filter(|n| r.selectors.iter().any(|s| s.from == *n));
    // Names the rules keep while renaming a label: both questions select them, so each
    // takes its side by the new label's presence.
    let parted: Vec<(&str, &str)> = r
        .selectors
        .iter()
        .filter(|s| s.from == s.to)
        .filter_map(|s| {
            s.label_renames
                .first()
                .map(|(_, n)| (s.from.as_str(), n.as_str()))
        })
        .collect();
    let (old_query, rewritten) = if parted.is_empty() {
        (query.to_string(), r.query.clone())
    } else {
        let side = |text: &str, op: fn() -> MatchOp| -> Option<String> {
            let mut e = promql_parser::parser::parse(text).ok()?;
            for_each_selector(&mut e, &mut |vs| {
                let name = selector_name(vs);
                if let Some((_, label)) = parted.iter().find(|(n, _)| Some(*n) == name.as_deref()) {
                    vs.matchers.matchers.push(Matcher::new(op(), label, ""));
                }
            });
            Some(e.to_string())
        };
        match (
            side(query, || MatchOp::Equal),
            side(&r.query, || MatchOp::NotEqual),
        ) {
            (Some(o), Some(n)) => (o, n),
            _ => (query.to_string(), r.query.clone()),
        }
    };
    Ok(Translation {
        original: query.to_string(),
        old_query,
        rewritten,
        selectors: r.selectors,
        label_renames,
        le_factor: r.le_factor,
        result_name,
        warnings,
    })
}

/// A selector (`match[]` of the series and label APIs): only names, labels and label
/// values change (no values are read, so none are restored: the text stays a selector).
pub fn translate_selector(rules: &Rules, selector: &str) -> Result<Translation, BadQuery> {
    let parsed =
        promql_parser::parser::parse(selector).map_err(|e| BadQuery(e.trim().to_string()))?;
    if !matches!(parsed, Expr::VectorSelector(_)) {
        return Err(BadQuery(format!("{selector:?} is not a series selector")));
    }
    translate_with(rules, selector, false)
}

/// A selector's metric name: its own, or an equality `__name__` matcher's.
fn selector_name(vs: &VectorSelector) -> Option<String> {
    vs.name.clone().or_else(|| {
        vs.matchers
            .matchers
            .iter()
            .find(|m| m.name == "__name__" && matches!(m.op, MatchOp::Equal))
            .map(|m| m.value.clone())
    })
}

/// Calls `f` on every vector selector of `e` (those of range selectors included).
fn for_each_selector(e: &mut Expr, f: &mut dyn FnMut(&mut VectorSelector)) {
    match e {
        Expr::VectorSelector(vs) => f(vs),
        Expr::MatrixSelector(ms) => f(&mut ms.vs),
        Expr::Paren(p) => for_each_selector(&mut p.expr, f),
        Expr::Unary(u) => for_each_selector(&mut u.expr, f),
        Expr::Subquery(s) => for_each_selector(&mut s.expr, f),
        Expr::Aggregate(a) => {
            if let Some(p) = a.param.as_deref_mut() {
                for_each_selector(p, f);
            }
            for_each_selector(&mut a.expr, f);
        }
        Expr::Binary(b) => {
            for_each_selector(&mut b.lhs, f);
            for_each_selector(&mut b.rhs, f);
        }
        Expr::Call(c) => {
            for a in c.args.args.iter_mut() {
                for_each_selector(a, f);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// The metric name the query's result series carry, as Prometheus keeps it: a vector
/// selector's, through filters, set operators' left side, `topk`/`bottomk` and the few
/// functions that keep it.
fn kept_name(e: &Expr) -> Option<String> {
    match e {
        Expr::VectorSelector(vs) => selector_name(vs),
        Expr::MatrixSelector(ms) => selector_name(&ms.vs),
        Expr::Paren(p) => kept_name(&p.expr),
        Expr::Subquery(s) => kept_name(&s.expr),
        Expr::Aggregate(a) => {
            let op = a.op.id();
            if op == token::T_TOPK || op == token::T_BOTTOMK {
                kept_name(&a.expr)
            } else {
                None
            }
        }
        Expr::Binary(b) => {
            let op = b.op.id();
            let returns_bool = b.modifier.as_ref().is_some_and(|m| m.return_bool);
            let filter = b.op.is_comparison_operator() && !returns_bool;
            if op == token::T_LAND || op == token::T_LUNLESS || filter {
                kept_name(&b.lhs)
            } else {
                None
            }
        }
        Expr::Call(c) => match c.func.name {
            "sort" | "sort_desc" | "label_replace" | "label_join" | "last_over_time"
            | "first_over_time" | "sort_by_label" | "sort_by_label_desc" => {
                c.args.args.first().and_then(|a| kept_name(a))
            }
            _ => None,
        },
        _ => None,
    }
}

/// How the old `le` texts were written (`1` or `1.0`), learnt from an answer's texts.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeStyle(Option<FloatStyle>);

impl LeStyle {
    /// Learns from one `le` text.
    pub fn learn(&mut self, text: &str) {
        if self.0.is_none()
            && let StyleEvidence::Known(s) = style_of(text)
        {
            self.0 = Some(s);
        }
    }

    /// Learns from every `le` of a list of series objects (`metric` or a bare label set).
    pub fn learn_all(&mut self, items: &[Value], field: Option<&str>) {
        for item in items {
            let labels = match field {
                Some(f) => &item[f],
                None => item,
            };
            if let Some(le) = labels.get("le").and_then(Value::as_str) {
                self.learn(le);
            }
        }
    }
}

/// The old text of a new bound `le`: the new one divided by the factor, in `style`.
fn old_le(text: &str, f: Factor, style: LeStyle) -> String {
    let Some(v) = parse_float(text).filter(|v| v.is_finite()) else {
        return text.to_string();
    };
    let back = Factor {
        num: f.den,
        den: f.num,
    };
    let old = back.apply(v);
    match style.0 {
        Some(s) => crate::mapping::number::float_string(old, s),
        None => rescale_le(text, back),
    }
}

/// Puts one new-side label set back into the query's terms. Returns true when anything
/// changed.
pub fn restore_labels(t: &Translation, labels: &mut Map<String, Value>, style: LeStyle) -> bool {
    let name = labels
        .get("__name__")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut changed = false;
    // The selector these series came from: by their (new) name, else the one the
    // result keeps the name of.
    let sel = match &name {
        Some(n) => t.by_new_name(n).or_else(|| t.by_old_name(n)),
        None => t.result_name.as_deref().and_then(|n| t.by_old_name(n)),
    };
    if let Some(s) = sel
        && name.as_deref() == Some(s.to.as_str())
        && s.from != s.to
    {
        labels.insert("__name__".into(), Value::String(s.from.clone()));
        changed = true;
    }
    if name.is_none()
        && let (Some(n), Some(_)) = (&t.result_name, sel)
    {
        labels.insert("__name__".into(), Value::String(n.clone()));
        changed = true;
    }
    let (renames, maps, le) = match sel {
        Some(s) => (
            s.label_renames.as_slice(),
            s.value_maps.iter().collect::<Vec<_>>(),
            Some(s.le).filter(|f| !f.is_one()),
        ),
        None => (
            t.label_renames.as_slice(),
            t.selectors
                .iter()
                .flat_map(|s| s.value_maps.iter())
                .collect(),
            t.le_factor,
        ),
    };
    for (old, new) in renames {
        if !labels.contains_key(old)
            && let Some(v) = labels.remove(new)
        {
            labels.insert(old.clone(), v);
            changed = true;
        }
    }
    for (label, old_value, new_value) in maps {
        // The rule names the label as it is at its step: the old or the new name.
        let names = std::iter::once(label.as_str()).chain(
            renames
                .iter()
                .filter(|(_, n)| n == label)
                .map(|(o, _)| o.as_str()),
        );
        for l in names.collect::<Vec<_>>() {
            if let Some(v) = labels.get_mut(l)
                && v.as_str() == Some(new_value.as_str())
            {
                *v = Value::String(old_value.clone());
                changed = true;
            }
        }
    }
    if let Some(f) = le
        && let Some(v) = labels.get_mut("le")
        && let Some(text) = v.as_str()
    {
        let old = old_le(text, f, style);
        if old != text {
            *v = Value::String(old);
            changed = true;
        }
    }
    changed
}

/// A label set as a merge key: sorted pairs, `le` by its number (`1` and `1.0` are one
/// bound).
fn key_of(labels: &Value) -> Vec<(String, String)> {
    labels.as_object().map(label_key).unwrap_or_default()
}

/// [`key_of`] of a label set.
pub fn label_key(m: &Map<String, Value>) -> Vec<(String, String)> {
    let mut k: Vec<(String, String)> = m
        .iter()
        .map(|(n, v)| {
            let v = v.as_str().unwrap_or_default();
            let v = match (n.as_str(), parse_float(v)) {
                ("le", Some(f)) => format!("{:x}", f.to_bits()),
                _ => v.to_string(),
            };
            (n.clone(), v)
        })
        .collect();
    k.sort();
    k
}

/// Whether a series of an answer that read both periods is the new side's: it carries a
/// label only the rules write (a renamed label's new name, without the old one).
pub fn is_new_side(t: &Translation, m: &Map<String, Value>) -> bool {
    t.label_renames
        .iter()
        .any(|(o, n)| m.contains_key(n) && !m.contains_key(o))
}

/// A sample's timestamp (`[1700000000.5, "1"]`) in milliseconds.
fn ts_ms(point: &Value) -> Option<i64> {
    point
        .get(0)
        .and_then(Value::as_f64)
        .map(|t| (t * 1000.0).round() as i64)
}

/// The new side's `data` of a query answer, put back into the old terms in place.
pub fn restore_query_data(t: &Translation, data: &mut Value, old: Option<&Value>) {
    let mut style = LeStyle::default();
    for d in std::iter::once(&*data).chain(old) {
        if let Some(items) = d["result"].as_array() {
            style.learn_all(items, Some("metric"));
        }
    }
    if let Some(items) = data["result"].as_array_mut() {
        for item in items {
            if let Some(m) = item.get_mut("metric").and_then(Value::as_object_mut) {
                restore_labels(t, m, style);
            }
        }
    }
}

/// One answer that read both periods (the query's text unchanged: only labels it does
/// not name change) split by its series, before [`restore_query_data`]: those that
/// carry a label only the rules write (the new side) and the others (the old side).
pub fn split_sides(t: &Translation, mut data: Value) -> (Value, Value) {
    let kind = data["resultType"].clone();
    if !matches!(kind.as_str(), Some("vector" | "matrix")) {
        return (data, Value::Null);
    }
    let Value::Array(items) = data["result"].take() else {
        return (data, Value::Null);
    };
    let (mut new, mut old) = (Vec::new(), Vec::new());
    for item in items {
        let is_new = item["metric"]
            .as_object()
            .is_some_and(|m| is_new_side(t, m));
        if is_new {
            new.push(item);
        } else {
            old.push(item);
        }
    }
    (
        serde_json::json!({"resultType": kind.clone(), "result": new}),
        serde_json::json!({"resultType": kind, "result": old}),
    )
}

/// Merges the answer to the original query (`old`, the history under the old names)
/// into the restored new-side answer `new`: per label set and, for matrices, per
/// timestamp, the new side's point wins. Both are a query answer's `data`.
pub fn merge(mut new: Value, mut old: Value) -> Value {
    let kind = new["resultType"].as_str().unwrap_or_default().to_string();
    if old["resultType"].as_str() != Some(kind.as_str()) {
        return new;
    }
    match kind.as_str() {
        "vector" => {
            let mut out: Vec<Value> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for item in take_array(&mut new["result"])
                .into_iter()
                .chain(take_array(&mut old["result"]))
            {
                if seen.insert(key_of(&item["metric"])) {
                    out.push(item);
                }
            }
            serde_json::json!({"resultType": "vector", "result": out})
        }
        "matrix" => {
            // Series are moved, never copied: a label set on one side only (the usual
            // case: a name before the cut-over, another after) is taken whole; one on
            // both sides has its two sorted point lists merged in one pass.
            let mut by_key: BTreeMap<Vec<(String, String)>, Value> = BTreeMap::new();
            for item in take_array(&mut old["result"]) {
                merge_series(&mut by_key, item, false);
            }
            for item in take_array(&mut new["result"]) {
                merge_series(&mut by_key, item, true);
            }
            let result: Vec<Value> = by_key.into_values().collect();
            serde_json::json!({"resultType": "matrix", "result": result})
        }
        "scalar" => {
            let nan = new["result"].get(1).and_then(Value::as_str) == Some("NaN");
            if nan { old } else { new }
        }
        _ => new,
    }
}

fn take_array(v: &mut Value) -> Vec<Value> {
    match v.take() {
        Value::Array(a) => a,
        _ => Vec::new(),
    }
}

/// Adds one matrix series to `by_key`, merging it with one of the same label set; with
/// `wins` its points replace the other's at a timestamp both have (a float and a
/// histogram at one timestamp are one point: the winner's kind stays).
fn merge_series(by_key: &mut BTreeMap<Vec<(String, String)>, Value>, item: Value, wins: bool) {
    use std::collections::btree_map::Entry;
    match by_key.entry(key_of(&item["metric"])) {
        Entry::Vacant(v) => {
            v.insert(item);
        }
        Entry::Occupied(mut o) => {
            let (mut winner, mut loser) = if wins {
                (item, o.get_mut().take())
            } else {
                (o.get_mut().take(), item)
            };
            let taken: Vec<i64> = ["values", "histograms"]
                .iter()
                .flat_map(|f| array(&winner[*f]).iter().filter_map(ts_ms))
                .collect();
            let taken: std::collections::HashSet<i64> = taken.into_iter().collect();
            for field in ["values", "histograms"] {
                let mine = take_array(&mut winner[field]);
                let theirs: Vec<Value> = take_array(&mut loser[field])
                    .into_iter()
                    .filter(|p| ts_ms(p).is_none_or(|t| !taken.contains(&t)))
                    .collect();
                let points = merge_sorted(mine, theirs);
                if let Some(obj) = winner.as_object_mut() {
                    if points.is_empty() {
                        obj.remove(field);
                    } else {
                        obj.insert(field.into(), Value::Array(points));
                    }
                }
            }
            o.insert(winner);
        }
    }
}

/// Two lists of points, each sorted by timestamp, as one sorted list.
fn merge_sorted(a: Vec<Value>, b: Vec<Value>) -> Vec<Value> {
    if a.is_empty() {
        return b;
    }
    if b.is_empty() {
        return a;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => {
                if ts_ms(x).unwrap_or(i64::MIN) <= ts_ms(y).unwrap_or(i64::MIN) {
                    a.next()
                } else {
                    b.next()
                }
            }
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        };
        out.extend(next);
    }
    out
}

fn array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Label sets (the series API's `data`): each new-side one restored, duplicates (one
/// series under both names) given once.
pub fn restore_series(translations: &[Translation], data: Vec<Value>) -> Vec<Value> {
    let mut style = LeStyle::default();
    style.learn_all(&data, None);
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(data.len());
    for mut item in data {
        if let Some(m) = item.as_object_mut() {
            let name = m
                .get("__name__")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if let Some(t) = translations
                .iter()
                .find(|t| t.by_new_name(&name).is_some() || t.by_old_name(&name).is_some())
            {
                restore_labels(t, m, style);
            }
        }
        if seen.insert(key_of(&item)) {
            out.push(item);
        }
    }
    out
}

/// Label names (the labels API's `data`): renamed ones under their old names.
pub fn restore_label_names(translations: &[Translation], data: Vec<Value>) -> Vec<Value> {
    let renamed: HashMap<&str, &str> = translations
        .iter()
        .flat_map(|t| t.label_renames.iter())
        .map(|(o, n)| (n.as_str(), o.as_str()))
        .collect();
    let mut names: Vec<String> = data
        .iter()
        .filter_map(Value::as_str)
        .map(|n| renamed.get(n).copied().unwrap_or(n).to_string())
        .collect();
    names.sort();
    names.dedup();
    names.into_iter().map(Value::String).collect()
}

/// What the label-values API asks of the new side for the old label `label`: the new
/// label's name.
pub fn new_label_name<'a>(translations: &'a [Translation], label: &'a str) -> &'a str {
    translations
        .iter()
        .flat_map(|t| t.label_renames.iter())
        .find(|(o, _)| o == label)
        .map(|(_, n)| n.as_str())
        .unwrap_or(label)
}

/// The new side's values of `label` put back: names, mapped values, `le` texts.
pub fn restore_label_values(
    translations: &[Translation],
    label: &str,
    data: Vec<Value>,
) -> Vec<Value> {
    let mut style = LeStyle::default();
    for v in data.iter().filter_map(Value::as_str) {
        style.learn(v);
    }
    data.into_iter()
        .map(|v| {
            let Some(text) = v.as_str() else { return v };
            for t in translations {
                if label == "__name__" {
                    if let Some(s) = t.by_new_name(text) {
                        return Value::String(s.from.clone());
                    }
                    continue;
                }
                for s in &t.selectors {
                    if label == "le" && !s.le.is_one() {
                        return Value::String(old_le(text, s.le, style));
                    }
                    let new_label = s
                        .label_renames
                        .iter()
                        .find(|(o, _)| o == label)
                        .map(|(_, n)| n.as_str())
                        .unwrap_or(label);
                    if let Some((_, old, _)) = s
                        .value_maps
                        .iter()
                        .find(|(l, _, n)| (l == label || l == new_label) && n == text)
                    {
                        return Value::String(old.clone());
                    }
                }
            }
            v
        })
        .collect()
}

/// Merges lists of strings (label names or values): sorted, each once.
pub fn union_strings(a: Vec<Value>, b: Vec<Value>) -> Vec<Value> {
    let mut all: Vec<String> = a
        .into_iter()
        .chain(b)
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    all.sort();
    all.dedup();
    all.into_iter().map(Value::String).collect()
}

/// The new side's exemplars put back: series labels restored, values (observations, in
/// the unit of `le` for buckets, else of the values) divided by the factor.
pub fn restore_exemplars(t: &Translation, data: &mut [Value]) {
    let mut style = LeStyle::default();
    style.learn_all(data, Some("seriesLabels"));
    for item in data {
        let name = item["seriesLabels"]["__name__"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let factor = t
            .by_new_name(&name)
            .map(|s| if s.le.is_one() { s.factor } else { s.le });
        if let Some(m) = item.get_mut("seriesLabels").and_then(Value::as_object_mut) {
            restore_labels(t, m, style);
        }
        if let Some(f) = factor.filter(|f| !f.is_one())
            && let Some(list) = item.get_mut("exemplars").and_then(Value::as_array_mut)
        {
            let back = Factor {
                num: f.den,
                den: f.num,
            };
            for e in list {
                if let Some(v) = e["value"].as_str().and_then(|s| s.parse::<f64>().ok()) {
                    e["value"] = Value::String(format_value(back.apply(v)));
                }
            }
        }
    }
}

/// Merges exemplar lists: one entry per series label set, the new side first.
pub fn merge_exemplars(new: Vec<Value>, old: Vec<Value>) -> Vec<Value> {
    let mut seen = std::collections::HashSet::new();
    new.into_iter()
        .chain(old)
        .filter(|item| seen.insert(key_of(&item["seriesLabels"])))
        .collect()
}

/// A sample value as Prometheus writes it in JSON (Go's `strconv.FormatFloat(v, 'f', -1,
/// 64)` for ordinary numbers: Rust's shortest round-trip text).
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACK: &str = r#"
pack: t
rules:
  - match: {prefix: "gpu_"}
    rename_labels: {Hostname: hostname}
  - match: {family: gpu_fb_used}
    type: gauge
    rename: gpu_fb_used_bytes
    scale: "1048576"
  - match: {family: kv_latency_ms}
    type: histogram
    rename: kv_latency_seconds
    scale: 1/1000
"#;

    fn rules() -> Rules {
        crate::migrate::test_rules(PACK)
    }

    #[test]
    fn a_raw_selector_keeps_its_old_name_labels_and_values() {
        let r = rules();
        let t = translate(&r, "gpu_fb_used{Hostname=\"h1\"}").unwrap();
        assert!(t.translates());
        assert!(t.rewritten.contains("gpu_fb_used_bytes"), "{}", t.rewritten);
        assert!(t.rewritten.contains("hostname=\"h1\""), "{}", t.rewritten);
        assert_eq!(t.result_name.as_deref(), Some("gpu_fb_used"));
        // The upstream's answer to the rewritten (restoring) query: no name, new label.
        let mut data = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"hostname": "h1", "gpu": "0"}, "value": [10, "5"]}
        ]});
        restore_query_data(&t, &mut data, None);
        assert_eq!(
            data["result"][0]["metric"],
            serde_json::json!({"__name__": "gpu_fb_used", "Hostname": "h1", "gpu": "0"})
        );
    }

    #[test]
    fn an_untouched_query_passes_through() {
        let r = rules();
        let t = translate(&r, "sum(rate(other_total[5m]))").unwrap();
        assert!(!t.translates());
        assert_eq!(t.rewritten, t.original);
    }

    #[test]
    fn a_query_that_does_not_parse_is_bad_data() {
        let r = rules();
        assert!(translate(&r, "sum(rate(x[5m])").is_err());
    }

    #[test]
    fn le_comes_back_in_the_old_text() {
        let r = rules();
        let t = translate(&r, "sum by (le) (rate(kv_latency_ms_bucket[5m]))").unwrap();
        assert_eq!(t.le_factor, Some(Factor { num: 1, den: 1000 }));
        let mut data = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"le": "0.1"}, "value": [10, "5"]},
            {"metric": {"le": "5.0"}, "value": [10, "7"]},
            {"metric": {"le": "+Inf"}, "value": [10, "9"]}
        ]});
        restore_query_data(&t, &mut data, None);
        let les: Vec<&str> = data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metric"]["le"].as_str().unwrap())
            .collect();
        // "5.0" says the exporter writes Python's floats: 100.0, 5000.0.
        assert_eq!(les, ["100.0", "5000.0", "+Inf"]);
    }

    #[test]
    fn matrices_merge_per_label_set_and_timestamp_the_new_side_winning() {
        let old = serde_json::json!({"resultType": "matrix", "result": [
            {"metric": {"a": "1"}, "values": [[1, "1"], [2, "2"], [3, "3"]]},
            {"metric": {"a": "only-old"}, "values": [[1, "1"]]}
        ]});
        let new = serde_json::json!({"resultType": "matrix", "result": [
            {"metric": {"a": "1"}, "values": [[3, "30"], [4, "40"]]}
        ]});
        let m = merge(new, old);
        assert_eq!(
            m,
            serde_json::json!({"resultType": "matrix", "result": [
                {"metric": {"a": "1"}, "values": [[1, "1"], [2, "2"], [3, "30"], [4, "40"]]},
                {"metric": {"a": "only-old"}, "values": [[1, "1"]]}
            ]})
        );
    }

    #[test]
    fn a_point_is_one_timestamp_whatever_its_kind() {
        let old = serde_json::json!({"resultType": "matrix", "result": [
            {"metric": {"a": "1"}, "values": [[1, "1"], [2, "2"]]}
        ]});
        let new = serde_json::json!({"resultType": "matrix", "result": [
            {"metric": {"a": "1"}, "histograms": [[2, {"count": "3"}], [3, {"count": "4"}]]}
        ]});
        assert_eq!(
            merge(new, old),
            serde_json::json!({"resultType": "matrix", "result": [
                {"metric": {"a": "1"}, "values": [[1, "1"]],
                 "histograms": [[2, {"count": "3"}], [3, {"count": "4"}]]}
            ]})
        );
    }

    #[test]
    fn vectors_merge_per_label_set_with_le_by_number() {
        let old = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"le": "100"}, "value": [1, "1"]},
            {"metric": {"le": "200"}, "value": [1, "2"]}
        ]});
        let new = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"le": "100.0"}, "value": [1, "10"]}
        ]});
        let m = merge(new, old);
        let r = m["result"].as_array().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["value"][1], "10");
        assert_eq!(r[1]["metric"]["le"], "200");
    }

    #[test]
    fn a_nan_scalar_gives_way_to_the_old_side() {
        let old = serde_json::json!({"resultType": "scalar", "result": [1, "4"]});
        let new = serde_json::json!({"resultType": "scalar", "result": [1, "NaN"]});
        assert_eq!(merge(new, old)["result"][1], "4");
    }

    #[test]
    fn series_labels_and_values_come_back_in_the_old_terms() {
        let r = rules();
        let t = translate_selector(&r, "gpu_fb_used").unwrap();
        let data = vec![
            serde_json::json!({"__name__": "gpu_fb_used_bytes", "hostname": "h1"}),
            serde_json::json!({"__name__": "gpu_fb_used", "Hostname": "h1"}),
        ];
        let out = restore_series(std::slice::from_ref(&t), data);
        assert_eq!(
            out,
            vec![serde_json::json!({"__name__": "gpu_fb_used", "Hostname": "h1"})]
        );
        let names = restore_label_names(
            std::slice::from_ref(&t),
            vec!["__name__".into(), "hostname".into(), "gpu".into()],
        );
        assert_eq!(names, vec!["Hostname", "__name__", "gpu"]);
        assert_eq!(
            new_label_name(std::slice::from_ref(&t), "Hostname"),
            "hostname"
        );
        let values = restore_label_values(
            std::slice::from_ref(&t),
            "__name__",
            vec!["gpu_fb_used_bytes".into()],
        );
        assert_eq!(values, vec!["gpu_fb_used"]);
    }

    #[test]
    fn exemplar_values_come_back_in_the_old_unit() {
        let r = rules();
        let t = translate(&r, "kv_latency_ms_bucket").unwrap();
        let mut data = vec![serde_json::json!({
            "seriesLabels": {"__name__": "kv_latency_seconds_bucket", "le": "0.1"},
            "exemplars": [{"labels": {"trace_id": "x"}, "value": "0.25", "timestamp": 1}]
        })];
        restore_exemplars(&t, &mut data);
        assert_eq!(data[0]["seriesLabels"]["__name__"], "kv_latency_ms_bucket");
        assert_eq!(data[0]["exemplars"][0]["value"], "250");
    }
}
