//! `promnorm explain`: what the rules do to a series name or selector, in words.
//!
//! The query is a metric name, a histogram or summary family name (as `# TYPE` lines and
//! dashboards write it: its `_bucket`, `_sum` and `_count` series are explained), or a
//! selector `name{a="b",…}` whose labels decide label-dependent steps (label-matched
//! rules, rank dedup, splits); then the series it leaves as is shown too.

use std::fmt::Write as _;

use crate::derive::Deriver;
use crate::derive::defs::Formula;
use crate::mapping::Rules;
use crate::mapping::compile::{Action, Plan, Resolution, ScaleTarget};
use crate::mapping::number::{
    Factor, FloatStyle, StyleEvidence, parse_float, style_of, write_float,
};

#[derive(Debug, thiserror::Error)]
#[error("invalid series name or selector {query:?}: {msg}")]
pub struct ExplainError {
    query: String,
    msg: String,
}

/// A parsed query: a name and, when braces were given, `=` label matchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub name: String,
    /// `None` without braces: the label-dependent steps are described, not decided.
    pub labels: Option<Vec<(String, String)>>,
}

/// Parses `name`, `name{a="b",…}` or `{"dotted.name",a="b"}` / `{__name__="x",…}`.
pub fn parse_selector(query: &str) -> Result<Selector, ExplainError> {
    let err = |msg: String| ExplainError {
        query: query.to_string(),
        msg,
    };
    let q = query.trim();
    if q.is_empty() {
        return Err(err("empty".into()));
    }
    let (name_part, rest) = match q.find(['{', '}']) {
        Some(i) => (q[..i].trim_end(), Some(&q[i..])),
        None => (q, None),
    };
    let mut name = None;
    if !name_part.is_empty() {
        let bad = name_part.char_indices().find(|&(i, c)| {
            !(c.is_ascii_alphabetic()
                || c == '_'
                || c == ':'
                || (i > 0 && (c.is_ascii_digit() || c == '.')))
        });
        if let Some((i, c)) = bad {
            return Err(err(format!(
                "{c:?} at byte {i} is not allowed in a metric name \
                 ([a-zA-Z_:][a-zA-Z0-9_:.]*; quote other names: {{\"name\"}})"
            )));
        }
        name = Some(name_part.to_string());
    }
    let labels = match rest {
        None => None,
        Some(body) => {
            let Some(inner) = body.strip_prefix('{') else {
                return Err(err("unbalanced braces: '}' without '{'".into()));
            };
            let mut p = Parser {
                s: inner.as_bytes(),
                i: 0,
            };
            let mut labels: Vec<(String, String)> = Vec::new();
            p.items(&mut name, &mut labels).map_err(err)?;
            Some(labels)
        }
    };
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(err("no metric name".into()));
    };
    Ok(Selector { name, labels })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// The matchers up to the closing brace, which must end the query.
    fn items(
        &mut self,
        name: &mut Option<String>,
        labels: &mut Vec<(String, String)>,
    ) -> Result<(), String> {
        loop {
            self.ws();
            match self.peek() {
                None => return Err("unbalanced braces: '{' without '}'".into()),
                Some(b'}') => {
                    self.i += 1;
                    self.ws();
                    if self.i < self.s.len() {
                        return Err("unexpected text after '}'".into());
                    }
                    return Ok(());
                }
                Some(b'"') => {
                    // A quoted name (Prometheus 3 UTF-8 names), e.g. {"lmcache_mp.lookup_hit"}.
                    let n = self.string()?;
                    self.set_name(name, n)?;
                }
                Some(_) => {
                    let l = self.label_name()?;
                    self.ws();
                    match (self.peek(), self.s.get(self.i + 1)) {
                        (Some(b'='), Some(b'~')) | (Some(b'!'), _) => {
                            return Err(format!(
                                "label {l}: only = matchers name a series (no !=, =~, !~)"
                            ));
                        }
                        (Some(b'='), _) => self.i += 1,
                        _ => return Err(format!("label {l}: expected '='")),
                    }
                    self.ws();
                    if self.peek() != Some(b'"') {
                        return Err(format!("label {l}: the value must be a \"quoted\" string"));
                    }
                    let v = self.string()?;
                    if l == "__name__" {
                        self.set_name(name, v)?;
                    } else if labels.iter().any(|(n, _)| *n == l) {
                        return Err(format!("label {l} given twice"));
                    } else {
                        labels.push((l, v));
                    }
                }
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {}
                None => return Err("unbalanced braces: '{' without '}'".into()),
                Some(c) => {
                    return Err(format!(
                        "expected ',' or '}}' at {:?}",
                        char::from(c).escape_default().to_string()
                    ));
                }
            }
        }
    }

    fn set_name(&self, name: &mut Option<String>, n: String) -> Result<(), String> {
        match name {
            Some(prev) if *prev != n => Err(format!("two metric names: {prev:?} and {n:?}")),
            _ => {
                *name = Some(n);
                Ok(())
            }
        }
    }

    fn label_name(&mut self) -> Result<String, String> {
        let start = self.i;
        while let Some(c) = self.peek() {
            let ok = c.is_ascii_alphabetic() || c == b'_' || (self.i > start && c.is_ascii_digit());
            if !ok {
                break;
            }
            self.i += 1;
        }
        if self.i == start {
            let shown = self.s[start..]
                .iter()
                .take(10)
                .map(|&b| char::from(b))
                .collect::<String>();
            return Err(format!(
                "expected a label name ([a-zA-Z_][a-zA-Z0-9_]*) at {shown:?}"
            ));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    /// A double-quoted string with `\\`, `\"`, `\n`, `\t` escapes.
    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // the opening quote
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => return Err("unterminated \"string\"".into()),
                Some(b'"') => {
                    self.i += 1;
                    return String::from_utf8(out).map_err(|_| "a string is not UTF-8".into());
                }
                Some(b'\\') => {
                    let c = match self.s.get(self.i + 1) {
                        Some(b'\\') => b'\\',
                        Some(b'"') => b'"',
                        Some(b'n') => b'\n',
                        Some(b't') => b'\t',
                        _ => return Err("bad escape in a string (\\\\, \\\", \\n, \\t)".into()),
                    };
                    out.push(c);
                    self.i += 2;
                }
                Some(c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }
}

/// What happens to one series, decided with its labels.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Dropped {
        reason: String,
    },
    Kept {
        /// Output labels, `__name__` first, then sorted by name.
        labels: Vec<(String, String)>,
        scale: Option<(Factor, ScaleTarget)>,
    },
    /// A copy whose rule's labels the series does not carry: no copy is made.
    NotCopied,
}

/// Runs `plan` over one series the way the mapper does (`mapping::apply`).
pub fn simulate(rules: &Rules, plan: &Plan, name: &str, labels: &[(String, String)]) -> Outcome {
    let mut work: Vec<(String, String, bool)> =
        std::iter::once(("__name__".into(), name.into(), false))
            .chain(labels.iter().map(|(n, v)| (n.clone(), v.clone(), false)))
            .collect();
    let find = |work: &[(String, String, bool)], n: &str| work.iter().position(|l| l.0 == n);
    let reason = |id: u16| {
        rules
            .reasons()
            .get(id as usize)
            .cloned()
            .unwrap_or_default()
    };
    let mut scale: Option<(Factor, ScaleTarget)> = None;
    for step in &plan.steps {
        let applies = step
            .when
            .iter()
            .all(|c| c.holds(find(&work, &c.name).map(|i| work[i].1.as_bytes())));
        if !applies {
            if matches!(step.action, Action::OnlyIf) {
                return Outcome::NotCopied;
            }
            continue;
        }
        match &step.action {
            Action::OnlyIf => {}
            Action::Drop(id) => {
                return Outcome::Dropped {
                    reason: reason(*id),
                };
            }
            Action::SetName(n) => {
                if let Some(i) = find(&work, "__name__") {
                    work[i].1 = n.to_string();
                }
            }
            Action::RenameLabel { from, to } => {
                if let Some(i) = find(&work, from) {
                    work[i].0 = to.to_string();
                    work[i].2 = true;
                }
            }
            Action::MapLabelValue { label, from, to } => {
                if let Some(i) = find(&work, label)
                    && work[i].1 == **from
                {
                    work[i].1 = to.to_string();
                }
            }
            Action::SplitByLabel { label, names, .. } => {
                if let Some(i) = find(&work, label)
                    && let Some((_, n)) = names.iter().find(|(v, _)| **v == work[i].1)
                {
                    work.remove(i);
                    if let Some(j) = find(&work, "__name__") {
                        work[j].1 = n.to_string();
                    }
                }
            }
            Action::SetLabel { name, value } => match find(&work, name) {
                Some(i) => work[i].1 = value.to_string(),
                None => work.push((name.to_string(), value.to_string(), false)),
            },
            Action::DropLabel(n) => {
                if let Some(i) = find(&work, n) {
                    work.remove(i);
                }
            }
            Action::RankDedup { label, keep } => {
                if let Some(i) = find(&work, label)
                    && work[i].1 != **keep
                {
                    return Outcome::Dropped {
                        reason: reason(crate::mapping::compile::REASON_RANK_DEDUP),
                    };
                }
            }
            Action::SumOverRanks(_) => {}
            Action::TypeAndUnit { type_, unit } => {
                for (label, want) in [
                    (crate::mapping::compile::TYPE_LABEL, type_),
                    (crate::mapping::compile::UNIT_LABEL, unit),
                ] {
                    if let (Some(want), Some(i)) = (want, find(&work, label)) {
                        if want.is_empty() {
                            work.remove(i);
                        } else {
                            work[i].1 = want.to_string();
                        }
                    }
                }
            }
            Action::Scale { factor, target } => {
                scale = Some(match scale {
                    Some((f, _)) => (f.then(*factor), *target),
                    None => (*factor, *target),
                });
            }
        }
    }
    if let Some((f, ScaleTarget::Le)) = scale
        && let Some(i) = find(&work, "le")
    {
        work[i].1 = rescale_le(&work[i].1, f);
    }
    // As the mapper finishes labels: no empty values, sorted, a label renamed onto an
    // existing one loses to it.
    work.retain(|l| !l.1.is_empty());
    work.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.cmp(&b.2)));
    work.dedup_by(|later, earlier| later.0 == earlier.0);
    if let Some(i) = find(&work, "__name__") {
        let n = work.remove(i);
        work.insert(0, n);
    }
    Outcome::Kept {
        labels: work.into_iter().map(|(n, v, _)| (n, v)).collect(),
        scale,
    }
}

pub fn rescale_le(text: &str, f: Factor) -> String {
    let Some(v) = parse_float(text).filter(|v| v.is_finite()) else {
        return text.to_string();
    };
    let style = match style_of(text) {
        StyleEvidence::Known(s) => s,
        StyleEvidence::Ambiguous => FloatStyle::Go,
    };
    let mut out = Vec::new();
    write_float(&mut out, f.apply(v), style);
    String::from_utf8(out).unwrap_or_else(|_| text.to_string())
}

/// The plan the mapper runs for `name`, if any rule applies.
pub fn plan_of(rules: &Rules, name: &str) -> Option<Plan> {
    match rules.lookup(name) {
        Some(Resolution::Plan(p)) => Some((**p).clone()),
        _ => rules.plan_for(name),
    }
}

/// Writes `name{a="b",…}` (labels with `__name__` as the name).
pub fn write_selector(out: &mut String, labels: &[(String, String)]) {
    let mut first = true;
    for (n, v) in labels {
        if n == "__name__" {
            out.push_str(v);
            continue;
        }
        out.push(if first { '{' } else { ',' });
        first = false;
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(out, "{n}=\"{v}\"");
    }
    if !first {
        out.push('}');
    }
}

/// Explains one series name (with its labels when given) at `indent`; returns the names
/// it may leave under.
fn explain_series(
    rules: &Rules,
    name: &str,
    labels: Option<&[(String, String)]>,
    indent: &str,
    out: &mut String,
) -> Vec<String> {
    let mut head = vec![("__name__".to_string(), name.to_string())];
    head.extend(labels.unwrap_or_default().iter().cloned());
    out.push_str(indent);
    write_selector(out, &head);
    let Some(plan) = plan_of(rules, name) else {
        out.push_str(": no rule applies; forwarded unchanged\n");
        return vec![name.to_string()];
    };
    if plan.native_only {
        // A histogram rule's plan for the plain name: only native histogram series.
        out.push_str(" (native histogram series; a float series of this name: ");
        out.push_str(match &plan.without_native {
            Some(_) => "its own plan",
            None => "forwarded unchanged",
        });
        out.push(')');
    }
    out.push_str(":\n");
    if plan.native_keep_unit {
        let _ = writeln!(
            out,
            "{indent}  native histograms: keep_unit: a series carrying them is forwarded unrenamed, in its old unit"
        );
    }
    for t in &plan.trace {
        let _ = writeln!(out, "{indent}  {t}");
    }
    if plan.keep_original {
        let _ = writeln!(
            out,
            "{indent}  keep_original: the original series is forwarded too"
        );
    }
    if let Some(labels) = labels {
        let _ = write!(out, "{indent}  result: ");
        let mut names = write_outcome(out, simulate(rules, &plan, name, labels));
        for c in &plan.copies {
            let _ = write!(out, "{indent}  copy: ");
            names.extend(write_outcome(out, simulate(rules, &c.plan, name, labels)));
        }
        return names;
    }
    // Without labels: the name an unconditional rename gives, and those that depend on labels.
    let mut names = vec![name.to_string()];
    for s in &plan.steps {
        match &s.action {
            Action::SetName(n) if s.when.is_empty() => names[0] = n.to_string(),
            Action::SetName(n) => names.push(n.to_string()),
            Action::SplitByLabel { names: split, .. } => {
                names.extend(split.iter().map(|(_, n)| n.to_string()))
            }
            _ => {}
        }
    }
    names.dedup();
    for c in &plan.copies {
        let copy_name = c.plan.steps.iter().rev().find_map(|s| match &s.action {
            Action::SetName(n) => Some(n.to_string()),
            _ => None,
        });
        names.extend(copy_name);
    }
    names
}

/// Writes one simulated result line; returns the name it leaves under, if any.
fn write_outcome(out: &mut String, outcome: Outcome) -> Vec<String> {
    match outcome {
        Outcome::Dropped { reason } => {
            let _ = writeln!(out, "dropped ({reason})");
            Vec::new()
        }
        Outcome::NotCopied => {
            let _ = writeln!(out, "not made (the copy rule's labels do not match)");
            Vec::new()
        }
        Outcome::Kept { labels, scale } => {
            write_selector(out, &labels);
            match scale {
                Some((f, ScaleTarget::Value)) => {
                    let _ = write!(out, " (values {f})");
                }
                Some((f, ScaleTarget::Le)) => {
                    let _ = write!(out, " (le values {f})");
                }
                None => {}
            }
            out.push('\n');
            labels
                .into_iter()
                .filter(|(n, _)| n == "__name__")
                .map(|(_, v)| v)
                .collect()
        }
    }
}

/// A backend as `explain` describes it: what its native histograms with custom buckets
/// (NHCB) become.
#[derive(Clone, Debug)]
pub struct ExplainBackend {
    pub name: String,
    /// `backends[].protocol`: `v1`, `v2`, `auto`.
    pub protocol: &'static str,
    /// `backends[].native_histograms`: `auto`, `as_is`, `classic`.
    pub native_histograms: &'static str,
}

/// The text `promnorm explain QUERY` prints.
pub fn explain(
    rules: &Rules,
    deriver: Option<&Deriver>,
    query: &str,
) -> Result<String, ExplainError> {
    explain_for(rules, deriver, query, &[])
}

/// [`explain`], saying per backend what a native histogram with custom buckets (NHCB)
/// of the family becomes.
pub fn explain_for(
    rules: &Rules,
    deriver: Option<&Deriver>,
    query: &str,
    backends: &[ExplainBackend],
) -> Result<String, ExplainError> {
    let sel = parse_selector(query)?;
    let labels = sel.labels.as_deref();
    let mut out = String::new();
    let members = rules.family_members(&sel.name);
    // A histogram family name is no series of its own: only its members are shown.
    let own = members.is_empty() || plan_of(rules, &sel.name).is_some();
    let feeds = |out: &mut String, outputs: &[String], indent: &str| {
        for d in deriver.iter().flat_map(|d| d.definitions()) {
            for o in outputs {
                if let Some(slot) = d.inputs.iter().position(|i| i == o) {
                    let role = match (d.formula, slot) {
                        (Formula::Ratio | Formula::OnePlusRatio, 0) => "numerator",
                        (Formula::Ratio | Formula::OnePlusRatio, _) => "denominator",
                        _ => "input",
                    };
                    let _ = writeln!(out, "{indent}  feeds derived series {} ({role})", d.name);
                }
            }
        }
    };
    if own {
        let outputs = explain_series(rules, &sel.name, labels, "", &mut out);
        feeds(&mut out, &outputs, "");
    }
    if !members.is_empty() {
        let _ = writeln!(out, "{} as a histogram or summary family:", sel.name);
    }
    for m in &members {
        let outputs = explain_series(rules, m, labels, "  ", &mut out);
        feeds(&mut out, &outputs, "  ");
    }
    // A histogram family (or a name whose native series a rule covers): NHCB per backend.
    let native = plan_of(rules, &sel.name).filter(|p| p.native_only || !members.is_empty());
    if (native.is_some() || members.iter().any(|m| m.ends_with("_bucket"))) && !backends.is_empty()
    {
        let target = native
            .as_ref()
            .and_then(|p| {
                p.steps.iter().rev().find_map(|s| match &s.action {
                    Action::SetName(n) if s.when.is_empty() => Some(n.to_string()),
                    _ => None,
                })
            })
            .unwrap_or_else(|| sel.name.clone());
        let _ = writeln!(
            out,
            "native histograms with custom buckets (NHCB) of {target}, per backend:"
        );
        for b in backends {
            let unrolled =
                format!("unrolled into {target}_bucket{{le}}, {target}_sum, {target}_count");
            let what = match (b.native_histograms, b.protocol) {
                ("as_is", _) => "forwarded as NHCB".to_string(),
                ("classic", _) => unrolled,
                (_, "v2") => "forwarded as NHCB (2.0)".to_string(),
                (_, "auto") => format!(
                    "forwarded as NHCB while it takes 2.0; {unrolled} once it falls back to 1.0"
                ),
                _ => format!("{unrolled} (1.0)"),
            };
            let _ = writeln!(
                out,
                "  {} (protocol {}, native_histograms {}): {what}",
                b.name, b.protocol, b.native_histograms
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(q: &str) -> Selector {
        parse_selector(q).unwrap_or_else(|e| panic!("{e}"))
    }

    fn labels(l: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            l.iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn selectors_parse() {
        assert_eq!(
            sel("vllm:x"),
            Selector {
                name: "vllm:x".into(),
                labels: None
            }
        );
        assert_eq!(
            sel(" a_b:c "),
            Selector {
                name: "a_b:c".into(),
                labels: None
            }
        );
        assert_eq!(sel("x{}").labels, labels(&[]));
        assert_eq!(sel(r#"x {a="1"}"#).labels, labels(&[("a", "1")]));
        assert_eq!(
            sel(r#"x{ a = "1" , b="q\"\\\n", }"#).labels,
            labels(&[("a", "1"), ("b", "q\"\\\n")])
        );
        assert_eq!(sel(r#"{__name__="y",a="1"}"#).name, "y");
        let dotted = sel(r#"{"lmcache_mp.lookup_hit", a="1"}"#);
        assert_eq!(dotted.name, "lmcache_mp.lookup_hit");
        assert_eq!(dotted.labels, labels(&[("a", "1")]));
        assert_eq!(sel("lmcache_mp.lookup_hit").name, "lmcache_mp.lookup_hit");
    }

    #[test]
    fn bad_selectors_are_errors() {
        for (q, why) in [
            ("", "empty"),
            ("   ", "empty"),
            ("9x", "not allowed in a metric name"),
            ("a-b", "not allowed in a metric name"),
            (".x", "not allowed in a metric name"),
            ("x{", "unbalanced"),
            (r#"x{a="1""#, "unbalanced"),
            ("x}", "unbalanced"),
            (r#"x{a="1"}}"#, "after '}'"),
            (r#"x{a="1"} y"#, "after '}'"),
            ("x{a=1}", "quoted"),
            (r#"x{a!="1"}"#, "only = matchers"),
            (r#"x{a=~"1"}"#, "only = matchers"),
            (r#"x{a "1"}"#, "expected '='"),
            (r#"x{a="1" b="2"}"#, "expected ','"),
            (r#"x{a="1",a="2"}"#, "twice"),
            (r#"x{1a="1"}"#, "label name"),
            (r#"x{a="1}"#, "unterminated"),
            (r#"x{a="\q"}"#, "bad escape"),
            (r#"{a="1"}"#, "no metric name"),
            (r#"x{__name__="y"}"#, "two metric names"),
        ] {
            let e = parse_selector(q).expect_err(q).to_string();
            assert!(e.contains(why), "{q:?}: {e}");
        }
    }
}
