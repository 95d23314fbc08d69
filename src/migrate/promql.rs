//! PromQL rewriting with the proxy's compiled [`Rules`] (docs/migrations.md).
//!
//! The query is parsed by `promql-parser`, rewritten in place, and printed back only when
//! something changed (an untouched query keeps its text byte for byte). Every selector is
//! run through the plan the proxy applies to the series it selects; every expression node
//! carries the factor its values changed by (`new = old × f`), so products and quotients
//! combine factors, sums and comparisons see equal ones, and `histogram_quantile` returns
//! the unit of `le`. Where the algebra cannot be done, the smallest subexpression is
//! wrapped to restore the old values (never inside a range selector). What cannot be
//! rewritten faithfully is reported, never silently changed.

use std::sync::Arc;

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::token::{self, TokenType};
use promql_parser::parser::{
    AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, NumberLiteral, ParenExpr,
    VectorMatchCardinality, VectorSelector,
};

use crate::explain::rescale_le;
use crate::mapping::Rules;
use crate::mapping::compile::{
    Action, LabelCond, Plan, REASON_RANK_DEDUP, Resolution, ScaleTarget,
};
use crate::mapping::number::Factor;

/// Why a query was changed, or why it needs a human. The `snake_case` names are the
/// report's and docs/migrations.md's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// A metric name the rules rename.
    Renamed,
    /// A label the rules rename (in a matcher, a grouping or a function argument).
    LabelRenamed,
    /// A label value the rules map, in an equality matcher.
    LabelValueMapped,
    /// A `le` matcher of a rescaled histogram, rewritten to the new bound's text.
    LeRescaled,
    /// A split family, selected by the split label's value: the new name.
    SplitResolved,
    /// `--keep-values`: a factor placed so the expression returns the old values.
    ValuesRestored,
    /// A threshold (number literal) rescaled into the new unit.
    ThresholdRescaled,
    /// Without `--keep-values`: the result's values are in a new unit.
    UnitChanged,
    /// The result keeps `le` (a heatmap): its bucket bounds read in the new unit.
    LeBounds,
    /// The family is deduplicated over tensor-parallel ranks: sums over ranks change.
    RankDedup,
    /// The family is split by a label the selector does not pin to one value.
    SplitUnresolved,
    /// The family (or the selected part of it) is dropped by a rule.
    Dropped,
    /// A rule applies only to some label values the selector does not decide.
    LabelDependent,
    /// A metric name selected by a regular expression or a negative matcher.
    NameRegex,
    /// A regular-expression matcher on `le` of a rescaled histogram, or on a label whose
    /// values the rules map.
    ValueRegex,
    /// A rule sets or removes a label the selector matches on.
    LabelChanged,
    /// A construct the engine does not rewrite (`or` inside braces, native histogram
    /// functions, an unknown function over a range of a rescaled series).
    Unsupported,
    /// The text is not PromQL the parser accepts: left as it was.
    ParseError,
    /// A recording rule whose output name a pack renames (rule files).
    RecordRenamed,
    /// A name the engine no longer writes (a pack's `retired`): the query returns nothing
    /// from a current engine.
    Retired,
    /// A rule applies only to some label values the selector does not decide: the
    /// selector became the `or` of its cases, each rewritten as the rules treat it.
    CasesJoined,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Renamed => "renamed",
            Reason::LabelRenamed => "label_renamed",
            Reason::LabelValueMapped => "label_value_mapped",
            Reason::LeRescaled => "le_rescaled",
            Reason::SplitResolved => "split_resolved",
            Reason::ValuesRestored => "values_restored",
            Reason::ThresholdRescaled => "threshold_rescaled",
            Reason::UnitChanged => "unit_changed",
            Reason::LeBounds => "le_bounds",
            Reason::RankDedup => "rank_dedup",
            Reason::SplitUnresolved => "split_unresolved",
            Reason::Dropped => "dropped",
            Reason::LabelDependent => "label_dependent",
            Reason::NameRegex => "name_regex",
            Reason::ValueRegex => "value_regex",
            Reason::LabelChanged => "label_changed",
            Reason::Unsupported => "unsupported",
            Reason::ParseError => "parse_error",
            Reason::RecordRenamed => "record_renamed",
            Reason::Retired => "retired",
            Reason::CasesJoined => "cases_joined",
        }
    }

    /// True when a person must look: the query's meaning changes or could not be kept.
    pub fn needs_human(self) -> bool {
        !matches!(
            self,
            Reason::Renamed
                | Reason::LabelRenamed
                | Reason::LabelValueMapped
                | Reason::LeRescaled
                | Reason::SplitResolved
                | Reason::ValuesRestored
                | Reason::ThresholdRescaled
                | Reason::UnitChanged
                | Reason::LeBounds
                | Reason::CasesJoined
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub reason: Reason,
    pub detail: String,
}

/// The result of rewriting one query.
#[derive(Clone, Debug)]
pub struct Rewritten {
    /// The rewritten query; the input text itself when nothing changed.
    pub query: String,
    pub changed: bool,
    pub findings: Vec<Finding>,
    /// Without `--keep-values`: the factor the result's values now carry (`new = old ×
    /// f`); `None` when they are unchanged.
    pub value_factor: Option<Factor>,
    /// With `value_factor`: the unit the result's values are in now, when it is known
    /// (a rescaled family's `unit` through sums, extrema and quantiles; `rate` of bytes
    /// is `bytes_per_second`).
    pub value_unit: Option<String>,
    /// The result keeps `le` of a rescaled histogram, whose bounds are this factor of
    /// the old ones (a heatmap's buckets).
    pub le_factor: Option<Factor>,
    /// Labels renamed in the query (old → new), for legend templates.
    pub label_renames: Vec<(String, String)>,
    /// Old metric names and labels the query referenced (what `--check` lists).
    pub old_references: Vec<String>,
    /// Every selector the rules change, as the query API needs it to give a new-side
    /// answer back in the query's own terms (names, labels, values and `le` of the old
    /// series).
    pub selectors: Vec<SelectorChange>,
}

/// One selector the rules rewrite: what a series it selects was called and is called now.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectorChange {
    /// The metric name the query wrote.
    pub from: String,
    /// The name the rules give those series (`from` when only labels or units change).
    pub to: String,
    /// `new = old × factor` for the series' values.
    pub factor: Factor,
    /// `new = old × le` for the bucket bounds (`ONE` when they do not change).
    pub le: Factor,
    /// Labels the rules rename on these series (old → new).
    pub label_renames: Vec<(String, String)>,
    /// Label values the rules map on these series (label, old value, new value).
    pub value_maps: Vec<(String, String, String)>,
}

impl Rewritten {
    pub fn needs_human(&self) -> bool {
        self.findings.iter().any(|f| f.reason.needs_human())
    }
}

/// Rewrites PromQL with one rule set.
pub struct QueryRewriter<'r> {
    rules: &'r Rules,
    keep_values: bool,
}

/// What one expression's values became.
#[derive(Clone, Debug)]
struct Val {
    /// `new = old × factor`.
    factor: Factor,
    /// For bucket series (and what keeps them: rates, sums by `le`): the factor of `le`.
    le: Option<Factor>,
    /// Made of number literals only: takes the unit of what it is compared or added to.
    constant: bool,
    /// Labels renamed below this node (old → new).
    renames: Vec<(String, String)>,
    /// The unit the values are in now, when the factor is a rescaled family's and only
    /// unit-keeping operations (sums, extrema, quantiles, filters) came after it.
    unit: Option<String>,
}

impl Val {
    fn plain() -> Val {
        Val {
            factor: Factor::ONE,
            le: None,
            constant: false,
            renames: Vec::new(),
            unit: None,
        }
    }

    fn constant() -> Val {
        Val {
            constant: true,
            ..Val::plain()
        }
    }

    fn with_factor(mut self, factor: Factor) -> Val {
        if factor != self.factor {
            self.unit = None;
        }
        self.factor = factor;
        self.le = None;
        self.constant = false;
        self
    }
}

fn inverse(f: Factor) -> Factor {
    Factor {
        num: f.den,
        den: f.num,
    }
}

/// Functions whose result is the argument's values times the same factor (positive
/// factors: order, signs and extrema are kept).
const LINEAR: &[&str] = &[
    "abs",
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "last_over_time",
    "stddev_over_time",
    "mad_over_time",
    "quantile_over_time",
    "predict_linear",
    "holt_winters",
    "double_exponential_smoothing",
    "sort",
    "sort_desc",
    "sort_by_label",
    "sort_by_label_desc",
    "label_replace",
    "label_join",
    "scalar",
    "vector",
    "first_over_time",
];

/// Functions whose result does not depend on the scale of a positive factor.
const UNITLESS: &[&str] = &[
    "changes",
    "resets",
    "count_over_time",
    "present_over_time",
    "absent",
    "absent_over_time",
    "timestamp",
    "sgn",
    "time",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "hour",
    "minute",
    "month",
    "year",
    "pi",
];

/// Native histogram functions: their argument is a native histogram series.
const NATIVE: &[&str] = &[
    "histogram_count",
    "histogram_sum",
    "histogram_avg",
    "histogram_stddev",
    "histogram_stdvar",
];

impl<'r> QueryRewriter<'r> {
    pub fn new(rules: &'r Rules, keep_values: bool) -> Self {
        QueryRewriter { rules, keep_values }
    }

    pub fn keep_values(&self) -> bool {
        self.keep_values
    }

    /// The same rules, returning the old values (a panel whose unit cannot follow).
    pub fn keeping_values(&self) -> QueryRewriter<'r> {
        QueryRewriter::new(self.rules, true)
    }

    /// Rewrites one query. Grafana variables (`$var`, `${var}`, `[[var]]`,
    /// `$__rate_interval`) are kept as they are.
    pub fn rewrite(&self, query: &str) -> Rewritten {
        let unchanged = |findings| Rewritten {
            query: query.to_string(),
            changed: false,
            findings,
            value_factor: None,
            value_unit: None,
            le_factor: None,
            label_renames: Vec::new(),
            old_references: Vec::new(),
            selectors: Vec::new(),
        };
        let templ = super::template::Template::mask(query);
        let mut expr = match promql_parser::parser::parse(templ.masked()) {
            Ok(e) => e,
            Err(e) => {
                return unchanged(vec![Finding {
                    reason: Reason::ParseError,
                    detail: format!("not rewritten: {}", e.trim()),
                }]);
            }
        };
        let mut walk = Walk {
            union_depth: 0,
            rules: self.rules,
            keep_values: self.keep_values,
            findings: Vec::new(),
            changed: false,
            old: Vec::new(),
            renames: Vec::new(),
            selectors: Vec::new(),
        };
        let val = walk.expr(&mut expr);
        let mut value_factor = None;
        let mut value_unit = None;
        if !val.factor.is_one() && !val.constant {
            if self.keep_values {
                walk.restore(&mut expr, val.factor, "the query's result");
            } else {
                value_factor = Some(val.factor);
                value_unit = val.unit.clone();
                walk.note(
                    Reason::UnitChanged,
                    format!("the result's values are now {} the old ones", val.factor),
                );
            }
        }
        let le_factor = val.le.filter(|f| !f.is_one());
        if let Some(f) = le_factor {
            walk.note(
                Reason::LeBounds,
                format!(
                    "the result keeps le, whose bounds are now {f} the old ones (le=\"100\" \
                     reads le=\"{}\")",
                    rescale_le("100", f)
                ),
            );
        }
        // The labels renamed in the text, and those the result's series carry renamed
        // (a legend `{{Hostname}}` over a selector that does not name it).
        let mut label_renames = walk.renames;
        for r in val.renames {
            if !label_renames.iter().any(|(f, _)| *f == r.0) {
                label_renames.push(r);
            }
        }
        if !walk.changed {
            return Rewritten {
                le_factor,
                label_renames,
                old_references: walk.old,
                selectors: walk.selectors,
                ..unchanged(walk.findings)
            };
        }
        let printed = expr.to_string();
        Rewritten {
            query: templ.unmask(&printed),
            changed: true,
            findings: walk.findings,
            value_factor,
            value_unit,
            le_factor,
            label_renames,
            old_references: walk.old,
            selectors: walk.selectors,
        }
    }
}

/// How many conditions one selector may be split over (2^n cases).
const MAX_CASE_SPLITS: u8 = 3;

struct Walk<'r> {
    /// Case splits above the node being rewritten ([`Walk::join_cases`]).
    union_depth: u8,
    rules: &'r Rules,
    keep_values: bool,
    findings: Vec<Finding>,
    changed: bool,
    old: Vec<String>,
    renames: Vec<(String, String)>,
    selectors: Vec<SelectorChange>,
}

impl Walk<'_> {
    fn note(&mut self, reason: Reason, detail: String) {
        let f = Finding { reason, detail };
        if !self.findings.contains(&f) {
            self.findings.push(f);
        }
    }

    fn old_ref(&mut self, what: String) {
        if !self.old.contains(&what) {
            self.old.push(what);
        }
    }

    fn expr(&mut self, e: &mut Expr) -> Val {
        match e {
            Expr::NumberLiteral(_) => Val::constant(),
            Expr::StringLiteral(_) => Val::plain(),
            Expr::Paren(p) => self.expr(&mut p.expr),
            Expr::Unary(u) => self.expr(&mut u.expr),
            Expr::VectorSelector(vs) => match self.cases(vs) {
                Some(split) => self.join_cases(e, split, None),
                None => self.selector(vs),
            },
            Expr::Call(c) if self.union_depth < MAX_CASE_SPLITS => {
                // A range of a label-dependent family: the call of each case, joined.
                let arg = c
                    .args
                    .args
                    .iter()
                    .enumerate()
                    .find_map(|(i, a)| match &**a {
                        Expr::MatrixSelector(ms) => self.cases(&ms.vs).map(|s| (i, s)),
                        _ => None,
                    });
                match arg {
                    Some((i, split)) => self.join_cases(e, split, Some(i)),
                    None => match e {
                        Expr::Call(c) => self.call(c),
                        _ => Val::plain(),
                    },
                }
            }
            Expr::MatrixSelector(ms) => self.selector(&mut ms.vs),
            Expr::Subquery(sq) => self.expr(&mut sq.expr),
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Binary(b) if chain_step(b).is_some() => self.literal_chain(e),
            Expr::Binary(b) => self.binary(b),
            Expr::Call(c) => self.call(c),
            Expr::Extension(_) => {
                self.note(Reason::Unsupported, "an extension expression".into());
                Val::plain()
            }
        }
    }

    /// The two cases a rule's condition splits a selector into (`priority!=""` and
    /// `priority=""`; `kind="a"` and `kind!="a"`), when a rule of its family applies only
    /// to label values the selector does not decide.
    fn cases(&self, vs: &VectorSelector) -> Option<(Matcher, Matcher, String)> {
        if self.union_depth >= MAX_CASE_SPLITS || !vs.matchers.or_matchers.is_empty() {
            return None;
        }
        let name = vs.name.clone().or_else(|| {
            vs.matchers
                .matchers
                .iter()
                .find(|m| m.name == "__name__" && matches!(m.op, MatchOp::Equal))
                .map(|m| m.value.clone())
        })?;
        let plan = self.plan(&name)?;
        let sel = Selected::from(vs);
        for step in &plan.steps {
            if !matches!(sel.decides(&step.when), Decided::Unknown)
                || matches!(step.action, Action::OnlyIf | Action::SumOverRanks(_))
            {
                continue;
            }
            let c = step
                .when
                .iter()
                .find(|c| matches!(sel.decides(std::slice::from_ref(*c)), Decided::Unknown))?;
            let (yes, no) = match &c.value {
                Some(v) => (
                    Matcher::new(MatchOp::Equal, &c.name, v),
                    Matcher::new(MatchOp::NotEqual, &c.name, v),
                ),
                None => (
                    Matcher::new(MatchOp::NotEqual, &c.name, ""),
                    Matcher::new(MatchOp::Equal, &c.name, ""),
                ),
            };
            return Some((
                yes,
                no,
                format!("{name}: a rule applies only to series with {c}"),
            ));
        }
        None
    }

    /// Replaces `e` (a selector, or the call over the range selector at `arg`) by the
    /// `or` of its two cases, then rewrites that: each case is a selector the rules
    /// decide. The cases are disjoint by the condition's label, so `or` keeps them all.
    fn join_cases(
        &mut self,
        e: &mut Expr,
        (yes, no, why): (Matcher, Matcher, String),
        arg: Option<usize>,
    ) -> Val {
        let with = |m: &Matcher| -> Expr {
            let mut x = e.clone();
            let vs = match (&mut x, arg) {
                (Expr::VectorSelector(vs), None) => Some(vs),
                (Expr::Call(c), Some(i)) => match c.args.args.get_mut(i).map(|a| &mut **a) {
                    Some(Expr::MatrixSelector(ms)) => Some(&mut ms.vs),
                    _ => None,
                },
                _ => None,
            };
            if let Some(vs) = vs {
                vs.matchers.matchers.push(m.clone());
            }
            x
        };
        let joined = Expr::Paren(ParenExpr {
            expr: Box::new(Expr::Binary(BinaryExpr {
                op: TokenType::new(token::T_LOR),
                lhs: Box::new(with(&yes)),
                rhs: Box::new(with(&no)),
                modifier: None,
            })),
        });
        *e = joined;
        self.changed = true;
        self.note(
            Reason::CasesJoined,
            format!(
                "{why}: the query reads both cases ({yes} or {no}), each as the rules write it"
            ),
        );
        self.union_depth += 1;
        let v = self.expr(e);
        self.union_depth -= 1;
        v
    }

    /// Wraps `e` so that it returns the old values: `(e) * den / num`.
    fn restore(&mut self, e: &mut Expr, f: Factor, what: &str) {
        if f.is_one() {
            return;
        }
        let inner = std::mem::replace(e, Expr::from(0.0));
        let inner = match inner {
            Expr::Binary(_) | Expr::Unary(_) => Expr::Paren(ParenExpr {
                expr: Box::new(inner),
            }),
            other => other,
        };
        let num = |v: u64| Expr::NumberLiteral(NumberLiteral { val: v as f64 });
        let bin = |lhs: Expr, op, rhs: Expr| {
            Expr::Binary(BinaryExpr {
                op: TokenType::new(op),
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                modifier: None,
            })
        };
        *e = if f.num == 1 {
            bin(inner, token::T_MUL, num(f.den))
        } else if f.den == 1 {
            bin(inner, token::T_DIV, num(f.num))
        } else {
            bin(
                bin(inner, token::T_MUL, num(f.den)),
                token::T_DIV,
                num(f.num),
            )
        };
        self.changed = true;
        self.note(
            Reason::ValuesRestored,
            format!("{what} restored to the old unit ({})", inverse(f)),
        );
    }

    /// Scales a constant expression into the unit of the other side (`x > 500` in ms →
    /// `x > 0.5` in s). False when it is not a plain literal.
    fn scale_constant(&mut self, e: &mut Expr, f: Factor) -> bool {
        if f.is_one() {
            return true;
        }
        match e {
            Expr::NumberLiteral(n) => {
                let old = n.val;
                n.val = f.apply(old);
                self.changed = true;
                self.note(
                    Reason::ThresholdRescaled,
                    format!("{old} → {} (values {f})", n.val),
                );
                true
            }
            Expr::Paren(p) => self.scale_constant(&mut p.expr, f),
            Expr::Unary(u) => self.scale_constant(&mut u.expr, f),
            _ => false,
        }
    }

    fn plan(&self, name: &str) -> Option<Arc<Plan>> {
        match self.rules.lookup(name) {
            Some(Resolution::Plan(p)) => Some(p.clone()),
            Some(Resolution::OutputName) => None,
            None if self.rules.needs_pattern_lookup() => self.rules.plan_for(name).map(Arc::new),
            None => None,
        }
    }

    fn selector(&mut self, vs: &mut VectorSelector) -> Val {
        let mut val = Val::plain();
        if !vs.matchers.or_matchers.is_empty() {
            self.note(
                Reason::Unsupported,
                "`or` inside a selector's braces: not rewritten".into(),
            );
            return val;
        }
        // The name: the selector's own, else an equality `__name__` matcher.
        let name_matcher = vs
            .matchers
            .matchers
            .iter()
            .position(|m| m.name == "__name__");
        let name = match (&vs.name, name_matcher) {
            (Some(n), _) => n.clone(),
            (None, Some(i)) => {
                let m = &vs.matchers.matchers[i];
                if !matches!(m.op, MatchOp::Equal) {
                    self.name_regex(m);
                    return val;
                }
                m.value.clone()
            }
            (None, None) => return val,
        };
        if let Some(why) = self.rules.retired(&name) {
            self.old_ref(name.clone());
            self.note(Reason::Retired, format!("{name}: {why}"));
        }
        let Some(plan) = self.plan(&name) else {
            return val;
        };
        let sel = Selected::from(vs);
        let mut sim = Symbolic {
            name: name.clone(),
            matchers: vs
                .matchers
                .matchers
                .iter()
                .filter(|m| m.name != "__name__")
                .cloned()
                .collect(),
            factor: Factor::ONE,
            le: Factor::ONE,
        };
        for step in &plan.steps {
            match sel.decides(&step.when) {
                Decided::No => continue,
                Decided::Yes => {}
                Decided::Unknown => {
                    if matches!(step.action, Action::OnlyIf | Action::SumOverRanks(_)) {
                        continue;
                    }
                    let cond: Vec<String> = step.when.iter().map(|c| c.to_string()).collect();
                    self.old_ref(name.clone());
                    self.note(
                        Reason::LabelDependent,
                        format!(
                            "{name}: a rule applies only to series with {}; add that matcher \
                             (or its negation) to the selector: not rewritten",
                            cond.join(", ")
                        ),
                    );
                    return val;
                }
            }
            if !self.step(&name, &step.action, &mut sim) {
                return val;
            }
        }
        // Apply what the simulation decided.
        if sim.name != name {
            self.changed = true;
            self.old_ref(name.clone());
            self.note(Reason::Renamed, format!("{name} → {}", sim.name));
            match (&mut vs.name, name_matcher) {
                (Some(n), _) => *n = sim.name.clone(),
                (None, Some(i)) => vs.matchers.matchers[i].value = sim.name.clone(),
                (None, None) => {}
            }
        }
        let name_m = vs
            .matchers
            .matchers
            .iter()
            .filter(|m| m.name == "__name__")
            .cloned();
        let rebuilt: Vec<Matcher> = name_m.chain(sim.matchers.iter().cloned()).collect();
        if rebuilt != vs.matchers.matchers {
            vs.matchers.matchers = rebuilt;
            self.changed = true;
        }
        val.factor = sim.factor;
        if !sim.factor.is_one() {
            // The unit the last applying rule gives the family.
            val.unit = plan
                .steps
                .iter()
                .filter(|s| !matches!(sel.decides(&s.when), Decided::No))
                .filter_map(|s| match &s.action {
                    Action::TypeAndUnit { unit: Some(u), .. } if !u.is_empty() => {
                        Some(u.to_string())
                    }
                    _ => None,
                })
                .next_back();
        }
        if !sim.le.is_one() {
            val.le = Some(sim.le);
        }
        let mut value_maps = Vec::new();
        for step in &plan.steps {
            if matches!(sel.decides(&step.when), Decided::No) {
                continue;
            }
            match &step.action {
                Action::RenameLabel { from, to } => {
                    let r = (from.to_string(), to.to_string());
                    if !val.renames.contains(&r) {
                        val.renames.push(r);
                    }
                }
                Action::MapLabelValue { label, from, to } => {
                    value_maps.push((label.to_string(), from.to_string(), to.to_string()));
                }
                _ => {}
            }
        }
        let change = SelectorChange {
            from: name.clone(),
            to: sim.name.clone(),
            factor: sim.factor,
            le: sim.le,
            label_renames: val.renames.clone(),
            value_maps,
        };
        let touches = change.from != change.to
            || !change.factor.is_one()
            || !change.le.is_one()
            || !change.label_renames.is_empty()
            || !change.value_maps.is_empty();
        if touches && !self.selectors.contains(&change) {
            self.selectors.push(change);
        }
        if plan.native_only && sim.name != name {
            self.note(
                Reason::Renamed,
                format!(
                    "{name} is a histogram family's own name: the rules rename its native \
                     histogram series (a float series of this name keeps it)"
                ),
            );
        }
        if plan.keep_original && sim.name != name {
            self.note(
                Reason::Renamed,
                format!(
                    "{name}: keep_original is on, so the old series still arrive during the \
                     migration window"
                ),
            );
        }
        val
    }

    fn name_regex(&mut self, m: &Matcher) {
        let re = match &m.op {
            MatchOp::Re(re) | MatchOp::NotRe(re) => Some(re),
            _ => None,
        };
        let touched: Vec<&str> = self
            .rules
            .known_names()
            .filter(|n| {
                let hit = re.is_some_and(|re| re.is_match(n));
                let hit = if matches!(m.op, MatchOp::NotRe(_) | MatchOp::NotEqual) {
                    true
                } else {
                    hit
                };
                hit && self.plan(n).is_some()
            })
            .take(3)
            .collect();
        if !touched.is_empty() {
            self.note(
                Reason::NameRegex,
                format!(
                    "{{__name__{}\"{}\"}} may select names the rules rename (e.g. {}): \
                     not rewritten",
                    m.op,
                    m.value,
                    touched.join(", ")
                ),
            );
        }
    }

    /// Applies one step to the symbolic selector; false when the selector cannot be
    /// rewritten (the finding is recorded).
    fn step(&mut self, name: &str, action: &Action, sim: &mut Symbolic) -> bool {
        match action {
            Action::OnlyIf | Action::SumOverRanks(_) => true,
            Action::TypeAndUnit { type_, unit } => {
                // `{__unit__="milliseconds"}` selects what is now labelled seconds.
                for (label, want) in [
                    (crate::mapping::compile::TYPE_LABEL, type_),
                    (crate::mapping::compile::UNIT_LABEL, unit),
                ] {
                    let Some(want) = want else { continue };
                    for m in sim.matchers.iter_mut().filter(|m| m.name == label) {
                        match m.op {
                            MatchOp::Equal if m.value != **want && !m.value.is_empty() => {
                                self.note(
                                    Reason::LabelValueMapped,
                                    format!("{label}=\"{}\" → {label}=\"{want}\"", m.value),
                                );
                                m.value = want.to_string();
                            }
                            MatchOp::Re(_) | MatchOp::NotRe(_) | MatchOp::NotEqual => {
                                self.note(
                                    Reason::ValueRegex,
                                    format!(
                                        "{name}: {m} on a family whose {label} becomes \"{want}\": \
                                         check the expression"
                                    ),
                                );
                            }
                            _ => {}
                        }
                    }
                }
                true
            }
            Action::Drop(reason) => {
                let why = self
                    .rules
                    .reasons()
                    .get(*reason as usize)
                    .cloned()
                    .unwrap_or_default();
                self.note(
                    Reason::Dropped,
                    format!("{name}: dropped by a rule ({why}): the query returns nothing"),
                );
                self.old_ref(name.to_string());
                false
            }
            Action::SetName(n) => {
                sim.name = n.to_string();
                true
            }
            Action::RenameLabel { from, to } => {
                for m in sim.matchers.iter_mut().filter(|m| *m.name == **from) {
                    m.name = to.to_string();
                    self.note(Reason::LabelRenamed, format!("label {from} → {to}"));
                    self.old_ref(format!("label {from}"));
                }
                true
            }
            Action::MapLabelValue { label, from, to } => {
                for m in sim.matchers.iter_mut().filter(|m| *m.name == **label) {
                    match &m.op {
                        MatchOp::Equal | MatchOp::NotEqual if *m.value == **from => {
                            m.value = to.to_string();
                            self.note(
                                Reason::LabelValueMapped,
                                format!("{label}=\"{from}\" → {label}=\"{to}\""),
                            );
                            self.old_ref(format!("{label}=\"{from}\""));
                        }
                        MatchOp::Re(re) | MatchOp::NotRe(re) if re.is_match(from) => {
                            self.note(
                                Reason::ValueRegex,
                                format!(
                                    "{name}: {label}{}\"{}\" matches {from:?}, which the rules \
                                     map to {to:?}: check the expression",
                                    m.op, m.value
                                ),
                            );
                        }
                        _ => {}
                    }
                }
                true
            }
            Action::SplitByLabel { label, names, .. } => {
                let pinned = sim
                    .matchers
                    .iter()
                    .position(|m| *m.name == **label && matches!(m.op, MatchOp::Equal));
                match pinned {
                    Some(i) => {
                        if let Some((_, n)) =
                            names.iter().find(|(v, _)| **v == sim.matchers[i].value)
                        {
                            self.note(
                                Reason::SplitResolved,
                                format!("{name}{{{label}=\"{}\"}} → {n}", sim.matchers[i].value),
                            );
                            sim.matchers.remove(i);
                            sim.name = n.to_string();
                        }
                        true
                    }
                    None => {
                        let to: Vec<&str> = names.iter().map(|(_, n)| &**n).collect();
                        self.old_ref(name.to_string());
                        self.note(
                            Reason::SplitUnresolved,
                            format!(
                                "{name} is split by {label} into {}: select one {label} value, \
                                 or add the new families: not rewritten",
                                to.join(", ")
                            ),
                        );
                        false
                    }
                }
            }
            Action::SetLabel { name: l, value } => {
                if let Some(m) = sim.matchers.iter().find(|m| *m.name == **l)
                    && !(matches!(m.op, MatchOp::Equal) && *m.value == **value)
                {
                    self.note(
                        Reason::LabelChanged,
                        format!("{name}: a rule sets {l}=\"{value}\", which {m} tests"),
                    );
                }
                true
            }
            Action::DropLabel(l) => {
                if let Some(m) = sim.matchers.iter().find(|m| *m.name == **l) {
                    self.note(
                        Reason::LabelChanged,
                        format!("{name}: a rule removes label {l}, which {m} tests"),
                    );
                }
                true
            }
            Action::RankDedup { label, keep } => {
                let pinned = sim
                    .matchers
                    .iter()
                    .find(|m| *m.name == **label && matches!(m.op, MatchOp::Equal));
                match pinned {
                    Some(m) if *m.value == **keep => {}
                    Some(m) => {
                        let reason = self
                            .rules
                            .reasons()
                            .get(REASON_RANK_DEDUP as usize)
                            .cloned()
                            .unwrap_or_default();
                        self.note(
                            Reason::Dropped,
                            format!(
                                "{name}{{{m}}}: only {label}=\"{keep}\" is kept ({reason}): the \
                                 query returns nothing"
                            ),
                        );
                    }
                    None => self.note(
                        Reason::RankDedup,
                        format!(
                            "{name}: only {label}=\"{keep}\" is kept (the value repeats on every \
                             rank): a sum over {label} no longer multiplies it by the rank count"
                        ),
                    ),
                }
                true
            }
            Action::Scale { factor, target } => {
                match target {
                    ScaleTarget::Value => sim.factor = sim.factor.then(*factor),
                    ScaleTarget::Le => {
                        sim.le = sim.le.then(*factor);
                        for m in sim.matchers.iter_mut().filter(|m| m.name == "le") {
                            match m.op {
                                MatchOp::Equal | MatchOp::NotEqual => {
                                    let new = rescale_le(&m.value, *factor);
                                    if new != m.value {
                                        self.note(
                                            Reason::LeRescaled,
                                            format!("le=\"{}\" → le=\"{new}\"", m.value),
                                        );
                                        m.value = new;
                                    }
                                }
                                _ => self.note(
                                    Reason::ValueRegex,
                                    format!(
                                        "{name}: le{}\"{}\" on a histogram whose bounds are \
                                         {factor}: rewrite the bounds by hand",
                                        m.op, m.value
                                    ),
                                ),
                            }
                        }
                    }
                }
                true
            }
        }
    }

    fn aggregate(&mut self, a: &mut AggregateExpr) -> Val {
        if let Some(p) = a.param.as_deref_mut() {
            self.expr(p);
        }
        let mut v = self.expr(&mut a.expr);
        if let Some(m) = &mut a.modifier {
            let labels = match m {
                LabelModifier::Include(l) | LabelModifier::Exclude(l) => l,
            };
            self.rename_labels(&mut labels.labels, &v.renames);
        }
        let op = a.op.id();
        let keeps_le = a.modifier.as_ref().is_some_and(|m| match m {
            LabelModifier::Include(l) => l.labels.iter().any(|l| l == "le"),
            LabelModifier::Exclude(l) => !l.labels.iter().any(|l| l == "le"),
        });
        let le = if keeps_le { v.le } else { None };
        if op == token::T_COUNT || op == token::T_GROUP {
            return Val {
                le: None,
                ..v.with_factor(Factor::ONE)
            };
        }
        if op == token::T_COUNT_VALUES {
            // Values become label values: they must be the old ones.
            let f = v.factor;
            self.restore(&mut a.expr, f, "the input of count_values");
            return v.with_factor(Factor::ONE);
        }
        if op == token::T_STDVAR {
            let f = v.factor.then(v.factor);
            return v.with_factor(f);
        }
        v.le = le;
        v
    }

    fn rename_labels(&mut self, labels: &mut [String], renames: &[(String, String)]) {
        for l in labels.iter_mut() {
            if let Some((from, to)) = renames.iter().find(|(f, _)| f == l) {
                self.note(Reason::LabelRenamed, format!("label {from} → {to}"));
                self.old_ref(format!("label {from}"));
                if !self.renames.iter().any(|(f, _)| f == from) {
                    self.renames.push((from.clone(), to.clone()));
                }
                *l = to.clone();
                self.changed = true;
            }
        }
    }

    /// `v * c1 / c2 …`, a series scaled by number literals (a user's own unit
    /// conversion): when `v`'s values change by `f`, the literals absorb it, so the
    /// expression keeps its values and reads simpler (`FB_USED * 1024 * 1024` →
    /// `FB_USED_bytes`; `lat_ms / 1000` → `lat_seconds`). When no literal can say the
    /// new factor exactly, the product carries `f` as any product does.
    fn literal_chain(&mut self, e: &mut Expr) -> Val {
        let (depth, product) = chain_of(e);
        let v = self.expr(chain_inner(e, depth));
        let plain = Val {
            factor: v.factor,
            le: None,
            constant: false,
            renames: v.renames.clone(),
            unit: v.unit.clone(),
        };
        if v.factor.is_one() || v.constant {
            return plain;
        }
        // new = old × f: the literals' product becomes product / f.
        let f = v.factor;
        let want = product * f.den as f64 / f.num as f64;
        // Without --keep-values only an exact cancellation is absorbed (the values are
        // then in the new unit and the old one alike); otherwise the factor is carried.
        let Some(literal) =
            Literal::of(want).filter(|l| self.keep_values || matches!(l, Literal::One))
        else {
            return plain;
        };
        let inner = std::mem::replace(chain_inner(e, depth), Expr::from(0.0));
        let paren = |x: Expr| match x {
            Expr::Binary(_) | Expr::Unary(_) => Expr::Paren(ParenExpr { expr: Box::new(x) }),
            other => other,
        };
        let num = |v: f64| Expr::NumberLiteral(NumberLiteral { val: v });
        let bin = |lhs: Expr, op, rhs: Expr| {
            Expr::Binary(BinaryExpr {
                op: TokenType::new(op),
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                modifier: None,
            })
        };
        *e = match literal {
            Literal::One => inner,
            Literal::Times(n) => bin(paren(inner), token::T_MUL, num(n)),
            Literal::Over(n) => bin(paren(inner), token::T_DIV, num(n)),
        };
        self.changed = true;
        self.note(
            Reason::ThresholdRescaled,
            format!(
                "the expression's own factor ({}) now says the unit change too: its values \
                 are the old ones",
                fmt_number(product)
            ),
        );
        Val {
            factor: Factor::ONE,
            unit: None,
            ..plain
        }
    }

    fn binary(&mut self, b: &mut BinaryExpr) -> Val {
        let lv = self.expr(&mut b.lhs);
        let rv = self.expr(&mut b.rhs);
        let mut renames = lv.renames.clone();
        for r in &rv.renames {
            if !renames.contains(r) {
                renames.push(r.clone());
            }
        }
        if let Some(m) = &mut b.modifier {
            if let Some(LabelModifier::Include(l) | LabelModifier::Exclude(l)) = &mut m.matching {
                self.rename_labels(&mut l.labels, &renames);
            }
            if let VectorMatchCardinality::ManyToOne(l) | VectorMatchCardinality::OneToMany(l) =
                &mut m.card
            {
                self.rename_labels(&mut l.labels, &renames);
            }
        }
        let op = b.op.id();
        // A filter or a sum of one unit keeps it.
        let unit = match (&lv.unit, &rv.unit) {
            (Some(l), Some(r)) if l == r => Some(l.clone()),
            (Some(l), None) if rv.constant => Some(l.clone()),
            (None, Some(r)) if lv.constant && op != token::T_DIV => Some(r.clone()),
            _ => None,
        };
        let with = |f: Factor, constant: bool| Val {
            factor: f,
            le: None,
            constant,
            renames: renames.clone(),
            unit: if op == token::T_MUL || op == token::T_DIV || op == token::T_POW {
                None
            } else {
                unit.clone()
            },
        };
        if op == token::T_LAND || op == token::T_LUNLESS {
            let mut v = lv.clone();
            v.renames = renames.clone();
            return v;
        }
        if lv.constant && rv.constant {
            return with(Factor::ONE, true);
        }
        if op == token::T_MUL {
            return with(lv.factor.then(rv.factor), false);
        }
        if op == token::T_DIV {
            return with(lv.factor.then(inverse(rv.factor)), false);
        }
        if op == token::T_POW {
            let (lf, rf) = (lv.factor, rv.factor);
            self.restore(&mut b.lhs, lf, "the base of ^");
            self.restore(&mut b.rhs, rf, "the exponent of ^");
            return with(Factor::ONE, false);
        }
        let comparison = b.op.is_comparison_operator();
        let returns_bool = b.modifier.as_ref().is_some_and(|m| m.return_bool);
        // `+ - % atan2 or` and comparisons need both sides in one unit.
        let f = if lv.constant || rv.constant {
            let (vf, vec_side_is_lhs) = if lv.constant {
                (rv.factor, false)
            } else {
                (lv.factor, true)
            };
            if vf.is_one() {
                vf
            } else if self.keep_values {
                let side = if vec_side_is_lhs {
                    &mut b.lhs
                } else {
                    &mut b.rhs
                };
                self.restore(side, vf, "the expression compared or added to a number");
                Factor::ONE
            } else {
                let c = if vec_side_is_lhs {
                    &mut b.rhs
                } else {
                    &mut b.lhs
                };
                if self.scale_constant(c, vf) {
                    vf
                } else {
                    let side = if vec_side_is_lhs {
                        &mut b.lhs
                    } else {
                        &mut b.rhs
                    };
                    self.restore(side, vf, "the expression compared or added to a number");
                    Factor::ONE
                }
            }
        } else if lv.factor == rv.factor {
            lv.factor
        } else {
            let (lf, rf) = (lv.factor, rv.factor);
            self.restore(&mut b.lhs, lf, "the left side");
            self.restore(&mut b.rhs, rf, "the right side");
            Factor::ONE
        };
        if comparison && returns_bool {
            return with(Factor::ONE, false);
        }
        if comparison && !lv.constant {
            // A filter: the left side's values, now in unit `f`.
            let mut v = with(f, false);
            v.le = lv.le;
            return v;
        }
        with(f, false)
    }

    fn call(&mut self, c: &mut Call) -> Val {
        let name = c.func.name;
        let mut vals: Vec<Val> = c.args.args.iter_mut().map(|a| self.expr(a)).collect();
        let mut renames = Vec::new();
        for v in &vals {
            for r in &v.renames {
                if !renames.contains(r) {
                    renames.push(r.clone());
                }
            }
        }
        if matches!(name, "label_replace" | "label_join") {
            self.rename_string_args(c, &renames);
        }
        let first_vector = vals
            .iter()
            .position(|v| !v.constant)
            .filter(|&i| !matches!(*c.args.args[i], Expr::StringLiteral(_)));
        // The unit of the value argument, when the function keeps it.
        let keeps_unit = LINEAR.contains(&name)
            && !matches!(name, "rate" | "irate" | "deriv" | "predict_linear")
            || name == "histogram_quantile"
            || (NATIVE.contains(&name) && name != "histogram_count" && name != "histogram_stdvar");
        let unit = if keeps_unit {
            let arg = if name == "histogram_quantile" {
                1
            } else {
                first_vector.unwrap_or(0)
            };
            vals.get(arg).and_then(|v| v.unit.clone())
        } else if matches!(name, "rate" | "irate") {
            // Bytes per second is a unit of its own; others have none here.
            first_vector
                .and_then(|i| vals.get(i))
                .and_then(|v| v.unit.as_deref())
                .filter(|u| *u == "bytes")
                .map(|_| "bytes_per_second".to_string())
        } else {
            None
        };
        let mut out = |f: Factor, le: Option<Factor>| Val {
            factor: f,
            le,
            constant: false,
            renames: std::mem::take(&mut renames),
            unit: unit.clone(),
        };
        // Classic buckets carry the factor of `le`; a native histogram (named as its
        // family) carries the factor of its values and bounds alike.
        let hist = |i: usize| {
            vals.get(i)
                .map(|v| v.le.unwrap_or(v.factor))
                .unwrap_or(Factor::ONE)
        };
        if name == "histogram_quantile" {
            let f = hist(1);
            return out(f, None);
        }
        if name == "histogram_fraction" {
            let f = hist(2);
            for i in 0..2 {
                if let Some(arg) = c.args.args.get_mut(i)
                    && !self.scale_constant(arg, f)
                {
                    self.note(
                        Reason::Unsupported,
                        "histogram_fraction with computed bounds over a rescaled histogram".into(),
                    );
                }
            }
            return out(Factor::ONE, None);
        }
        if NATIVE.contains(&name) {
            let f = hist(0);
            return match name {
                "histogram_count" => out(Factor::ONE, None),
                "histogram_stdvar" => out(f.then(f), None),
                _ => out(f, None),
            };
        }
        if UNITLESS.contains(&name) {
            return out(Factor::ONE, None);
        }
        if LINEAR.contains(&name) {
            // The value argument: the first that is not a number or string parameter.
            let (f, le) = first_vector
                .and_then(|i| vals.get(i))
                .map(|v| (v.factor, v.le))
                .unwrap_or((Factor::ONE, None));
            let keeps_le = !matches!(name, "scalar" | "vector");
            return out(f, if keeps_le { le } else { None });
        }
        if name == "stdvar_over_time" {
            let f = vals.first().map(|v| v.factor).unwrap_or(Factor::ONE);
            return out(f.then(f), None);
        }
        // Anything else (clamp*, ln, exp, sqrt, round, …): its vector arguments restored
        // to the old unit first, the result unchanged; impossible inside a range.
        for (i, v) in vals.iter_mut().enumerate() {
            if v.factor.is_one() || v.constant {
                continue;
            }
            let Some(arg) = c.args.args.get_mut(i) else {
                continue;
            };
            if matches!(**arg, Expr::MatrixSelector(_)) {
                self.note(
                    Reason::Unsupported,
                    format!(
                        "{name} over a range of a series whose values are now {}: a factor \
                         cannot be placed inside a range; rewrite by hand",
                        v.factor
                    ),
                );
                continue;
            }
            let f = v.factor;
            self.restore(arg, f, &format!("the argument of {name}"));
        }
        out(Factor::ONE, None)
    }

    /// `label_replace(v, dst, repl, src, re)`, `label_join(v, dst, sep, src…)`: the label
    /// names follow the renames of `v`.
    fn rename_string_args(&mut self, c: &mut Call, renames: &[(String, String)]) {
        let name = c.func.name;
        for (i, arg) in c.args.args.iter_mut().enumerate() {
            let is_label = match name {
                "label_replace" => i == 1 || i == 3,
                _ => i == 1 || i >= 3,
            };
            if !is_label {
                continue;
            }
            if let Expr::StringLiteral(s) = &mut **arg
                && let Some((from, to)) = renames.iter().find(|(f, _)| *f == s.val)
            {
                self.note(Reason::LabelRenamed, format!("label {from} → {to}"));
                self.old_ref(format!("label {from}"));
                if !self.renames.iter().any(|(f, _)| f == from) {
                    self.renames.push((from.clone(), to.clone()));
                }
                s.val = to.clone();
                self.changed = true;
            }
        }
    }
}

/// The selector as the rules see it while its plan runs.
struct Symbolic {
    name: String,
    matchers: Vec<Matcher>,
    factor: Factor,
    le: Factor,
}

/// Whether a rule's `when` holds for every series a selector selects.
enum Decided {
    Yes,
    No,
    Unknown,
}

/// The selector's original matchers, for deciding `when` conditions.
struct Selected {
    matchers: Vec<Matcher>,
}

impl Selected {
    fn from(vs: &VectorSelector) -> Selected {
        Selected {
            matchers: vs.matchers.matchers.clone(),
        }
    }

    fn decides(&self, when: &[LabelCond]) -> Decided {
        let mut all = true;
        for c in when {
            let k = &c.name;
            let on: Vec<&Matcher> = self.matchers.iter().filter(|m| *m.name == **k).collect();
            let mut yes = false;
            for m in &on {
                match (&c.value, &m.op) {
                    (Some(v), MatchOp::Equal) if *m.value == **v => yes = true,
                    (Some(_), MatchOp::Equal) => return Decided::No,
                    (Some(v), MatchOp::NotEqual) if *m.value == **v => return Decided::No,
                    (Some(v), MatchOp::Re(re)) if !re.is_match(v) => return Decided::No,
                    (Some(v), MatchOp::NotRe(re)) if re.is_match(v) => return Decided::No,
                    // Presence (`has_labels`): the selector asks for the label empty
                    // (absent) or for some non-empty value.
                    (None, MatchOp::Equal) if m.value.is_empty() => return Decided::No,
                    (None, MatchOp::Equal) => yes = true,
                    (None, MatchOp::NotEqual) if m.value.is_empty() => yes = true,
                    (None, MatchOp::Re(re)) if !re.is_match("") => yes = true,
                    (None, MatchOp::NotRe(re)) if re.is_match("") => yes = true,
                    _ => {}
                }
            }
            if !yes {
                all = false;
            }
        }
        if all { Decided::Yes } else { Decided::Unknown }
    }
}

/// One step of a literal chain: `b` multiplies or divides its vector side by a number
/// literal (no `bool`, no matching). The vector side: `true` for the left.
fn chain_step(b: &BinaryExpr) -> Option<bool> {
    if b.modifier.is_some() {
        return None;
    }
    let op = b.op.id();
    let lit = |e: &Expr| literal_value(e).is_some();
    if op == token::T_MUL && lit(&b.rhs) && !lit(&b.lhs) {
        Some(true)
    } else if op == token::T_MUL && lit(&b.lhs) && !lit(&b.rhs) {
        Some(false)
    } else if op == token::T_DIV && lit(&b.rhs) && !lit(&b.lhs) {
        Some(true)
    } else {
        None
    }
}

fn literal_value(e: &Expr) -> Option<f64> {
    match e {
        Expr::NumberLiteral(n) => Some(n.val),
        Expr::Paren(p) => literal_value(&p.expr),
        _ => None,
    }
}

/// How many chain steps `e` is made of, and the product of their literals.
fn chain_of(e: &Expr) -> (usize, f64) {
    let mut depth = 0;
    let mut product = 1.0;
    let mut cur = e;
    loop {
        match cur {
            Expr::Paren(p) if matches!(&*p.expr, Expr::Binary(b) if chain_step(b).is_some()) => {
                cur = &p.expr;
            }
            Expr::Binary(b) => {
                let Some(left) = chain_step(b) else { break };
                let (v, c) = if left {
                    (&b.lhs, &b.rhs)
                } else {
                    (&b.rhs, &b.lhs)
                };
                let c = literal_value(c).unwrap_or(1.0);
                product = if b.op.id() == token::T_DIV {
                    product / c
                } else {
                    product * c
                };
                depth += 1;
                cur = v;
            }
            _ => break,
        }
    }
    (depth, product)
}

/// The vector side under `depth` chain steps of `e`.
fn chain_inner(e: &mut Expr, depth: usize) -> &mut Expr {
    let mut cur = e;
    let mut left = depth;
    // `chain_of` counted these steps (and looked through the parentheses between them).
    while left > 0 {
        let side = match &*cur {
            Expr::Paren(_) => 0,
            Expr::Binary(b) if chain_step(b) == Some(true) => 1,
            Expr::Binary(_) => 2,
            _ => 3,
        };
        cur = match (side, cur) {
            (0, Expr::Paren(p)) => &mut p.expr,
            (1, Expr::Binary(b)) => {
                left -= 1;
                &mut b.lhs
            }
            (2, Expr::Binary(b)) => {
                left -= 1;
                &mut b.rhs
            }
            (_, other) => return other,
        };
    }
    cur
}

/// A factor as the literal that writes it exactly: nothing, `* n` or `/ n`.
enum Literal {
    One,
    Times(f64),
    Over(f64),
}

impl Literal {
    fn of(x: f64) -> Option<Literal> {
        let integral = |v: f64| (1.0..9.0e15).contains(&v) && ((v - v.round()).abs() <= v * 1e-12);
        if !x.is_finite() || x <= 0.0 {
            return None;
        }
        if (x - 1.0).abs() < 1e-12 {
            return Some(Literal::One);
        }
        if integral(x) {
            return Some(Literal::Times(x.round()));
        }
        let inv = 1.0 / x;
        integral(inv).then(|| Literal::Over(inv.round()))
    }
}

fn fmt_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        format!("×{}", x as i64)
    } else if x < 1.0 && (1.0 / x).fract() == 0.0 {
        format!("÷{}", (1.0 / x) as i64)
    } else {
        format!("×{x}")
    }
}

impl QueryRewriter<'_> {
    /// The name a query of `name` is rewritten to, when the rules rename it whatever its
    /// labels.
    pub fn renamed_to(&self, name: &str) -> Option<String> {
        let r = QueryRewriter::new(self.rules, false).rewrite(name);
        (r.changed && !r.needs_human())
            .then(|| {
                promql_parser::parser::parse(&r.query)
                    .ok()
                    .and_then(|e| match e {
                        Expr::VectorSelector(vs) => vs.name,
                        _ => None,
                    })
            })
            .flatten()
            .filter(|n| n != name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PACK: &str = r#"
pack: t
rules:
  - match: {family: lat_ms}
    type: histogram
    rename: lat_seconds
    scale: 1/1000
    unit: seconds
  - match: {family: mem_mib}
    type: gauge
    rename: mem_bytes
    scale: "1048576"
  - match: {family: util_percent}
    type: gauge
    rename: util_ratio
    scale: 1/100
  - match: {family: gone}
    type: gauge
    drop: unwanted
  - match: {family: cond, labels: {kind: a}}
    type: gauge
    rename: cond_a
  - match: {family: xfer_total}
    type: counter
    split_by_label: {label: dir, names: {in: xfer_in, out: xfer_out}}
  - match: {family: staged}
    type: gauge
    label_values: {stage: {old: new}}
  - match: {family: tagged}
    type: gauge
    set_labels: {env: prod}
  - match: {prefix: "dev_"}
    rename_labels: {Host: host}
  - match: {family: dev_old}
    type: gauge
    rename: dev_new
rank_dedup:
  label: tp_rank
  keep: "0"
  prefixes: ["rk_"]
"#;

    fn rules() -> Rules {
        crate::migrate::test_rules(PACK)
    }

    fn rw(q: &str, keep: bool) -> Rewritten {
        let rules = rules();
        QueryRewriter::new(&rules, keep).rewrite(q)
    }

    fn reasons(r: &Rewritten) -> Vec<Reason> {
        r.findings.iter().map(|f| f.reason).collect()
    }

    #[test]
    fn names_le_and_thresholds() {
        let q = r#"histogram_quantile(0.9, sum by (le) (rate(lat_ms_bucket{le="100"}[5m]))) > 500"#;
        let keep = rw(q, true);
        assert_eq!(
            keep.query,
            r#"histogram_quantile(0.9, sum by (le) (rate(lat_seconds_bucket{le="0.1"}[5m]))) * 1000 > 500"#
        );
        let r = reasons(&keep);
        for want in [Reason::Renamed, Reason::LeRescaled, Reason::ValuesRestored] {
            assert!(r.contains(&want), "{want:?} in {r:?}");
        }
        assert!(!keep.needs_human());
        assert_eq!(keep.old_references, vec!["lat_ms_bucket".to_string()]);
        let new = rw(q, false);
        assert!(new.query.ends_with("> 0.5"), "{}", new.query);
        assert!(reasons(&new).contains(&Reason::ThresholdRescaled));
        assert_eq!(new.value_factor.map(|f| (f.num, f.den)), Some((1, 1000)));
    }

    #[test]
    fn factors_combine_through_the_expression() {
        // A ratio of two series rescaled alike needs no factor.
        let r = rw("rate(lat_ms_sum[5m]) / rate(lat_ms_count[5m])", true);
        assert_eq!(
            r.query,
            "(rate(lat_seconds_sum[5m]) / rate(lat_seconds_count[5m])) * 1000"
        );
        let r = rw("mem_mib / (mem_mib + mem_mib)", true);
        assert_eq!(r.query, "mem_bytes / (mem_bytes + mem_bytes)");
        // Unequal factors in a sum: each side restored.
        let r = rw("mem_mib + util_percent", false);
        assert_eq!(r.query, "mem_bytes / 1048576 + util_ratio * 100");
        assert_eq!(r.value_factor, None);
        // Non-linear functions see old values; never a factor inside a range.
        let r = rw("sqrt(mem_mib)", false);
        assert_eq!(r.query, "sqrt(mem_bytes / 1048576)");
        let r = rw("stdvar_over_time(mem_mib[5m])", false);
        assert_eq!(r.value_factor.map(|f| f.num), Some(1 << 40));
        let r = rw("ln(max_over_time(mem_mib[5m]))", true);
        assert_eq!(r.query, "ln(max_over_time(mem_bytes[5m]) / 1048576)");
        let r = rw("resets(mem_mib[5m])", true);
        assert_eq!(r.query, "resets(mem_bytes[5m])");
        let r = rw("count_values(\"v\", mem_mib)", true);
        assert_eq!(r.query, "count_values(\"v\", mem_bytes / 1048576)");
        let r = rw("mem_mib > bool 45", false);
        assert_eq!(r.query, "mem_bytes > bool 47185920");
        assert_eq!(r.value_factor, None, "bool comparisons return 0 or 1");
    }

    #[test]
    fn a_users_own_conversion_absorbs_the_new_unit() {
        for keep in [true, false] {
            let r = rw("mem_mib * 1024 * 1024", keep);
            assert_eq!(r.query, "mem_bytes", "keep_values {keep}");
            assert_eq!(r.value_factor, None);
            let r = rw(
                "sum(rate(lat_ms_sum[5m])) / sum(rate(lat_ms_count[5m])) / 1000",
                keep,
            );
            assert_eq!(
                r.query,
                "sum(rate(lat_seconds_sum[5m])) / sum(rate(lat_seconds_count[5m]))"
            );
        }
        // Keeping values, the literal says the whole factor; else the factor is carried.
        let r = rw("(mem_mib / 1024) > 2", true);
        assert_eq!(r.query, "(mem_bytes / 1073741824) > 2");
        let r = rw("mem_mib / 1024", false);
        assert_eq!(r.query, "mem_bytes / 1024");
        assert_eq!(r.value_factor.map(|f| f.num), Some(1 << 20));
        // Not a literal chain: a vector on both sides.
        let r = rw("mem_mib * on () group_left () scalar(mem_mib)", true);
        assert!(r.query.ends_with(") / 1099511627776"), "{}", r.query);
    }

    #[test]
    fn prometheus_3_type_and_unit_matchers_follow_the_family() {
        let r = rw(r#"rate(lat_ms_sum{__unit__="milliseconds"}[5m])"#, true);
        assert_eq!(
            r.query,
            r#"rate(lat_seconds_sum{__unit__="seconds"}[5m]) * 1000"#
        );
        assert!(reasons(&r).contains(&Reason::LabelValueMapped));
        let r = rw(r#"mem_mib{__type__="unknown"}"#, true);
        assert_eq!(r.query, r#"mem_bytes{__type__="gauge"} / 1048576"#);
    }

    #[test]
    fn labels_follow_their_renames() {
        let r = rw(
            r#"sum by (Host) (dev_old{Host="h"}) * on (Host) group_left () label_replace(dev_x, "Host", "$1", "Host", "(.*)")"#,
            true,
        );
        assert_eq!(
            r.query,
            r#"sum by (host) (dev_new{host="h"}) * on (host) group_left () label_replace(dev_x, "host", "$1", "host", "(.*)")"#
        );
        assert!(reasons(&r).contains(&Reason::LabelRenamed));
        assert_eq!(r.label_renames, vec![("Host".into(), "host".into())]);
        // A label of a series the rules do not touch stays.
        let r = rw("sum by (Host) (node_x)", true);
        assert!(!r.changed);
        assert_eq!(r.query, "sum by (Host) (node_x)");
    }

    #[test]
    fn values_and_splits() {
        let r = rw(r#"staged{stage="old"}"#, true);
        assert_eq!(r.query, r#"staged{stage="new"}"#);
        assert!(reasons(&r).contains(&Reason::LabelValueMapped));
        let r = rw(r#"staged{stage=~"o.*"}"#, true);
        assert!(reasons(&r).contains(&Reason::ValueRegex) && r.needs_human());
        let r = rw(r#"rate(xfer_total{dir="in"}[1m])"#, true);
        assert_eq!(r.query, "rate(xfer_in_total[1m])");
        assert!(reasons(&r).contains(&Reason::SplitResolved));
        let r = rw("rate(xfer_total[1m])", true);
        assert!(!r.changed && reasons(&r).contains(&Reason::SplitUnresolved));
    }

    #[test]
    fn what_cannot_be_kept_is_reported_not_changed() {
        for (q, reason) in [
            ("gone", Reason::Dropped),
            (r#"{__name__=~"lat_.*"}"#, Reason::NameRegex),
            (r#"lat_ms_bucket{le=~"1.*"}"#, Reason::ValueRegex),
            (r#"tagged{env="dev"}"#, Reason::LabelChanged),
            ("sum(rk_x)", Reason::RankDedup),
            (r#"rk_x{tp_rank="1"}"#, Reason::Dropped),
            ("sum(", Reason::ParseError),
        ] {
            let r = rw(q, true);
            assert!(
                reasons(&r).contains(&reason),
                "{q}: {reason:?} in {:?}",
                r.findings
            );
            assert!(r.needs_human(), "{q}");
        }
        // A label-dependent rule decided by the selector is rewritten.
        assert_eq!(rw(r#"cond{kind="a"}"#, true).query, r#"cond_a{kind="a"}"#);
        assert!(!rw(r#"cond{kind="b"}"#, true).changed);
    }

    #[test]
    fn a_label_dependent_rule_is_rewritten_as_the_union_of_its_cases() {
        let r = rw("sum by (kind) (cond)", true);
        assert_eq!(
            r.query,
            r#"sum by (kind) ((cond_a{kind="a"} or cond{kind!="a"}))"#
        );
        assert!(reasons(&r).contains(&Reason::CasesJoined));
        assert!(!r.needs_human(), "{:?}", r.findings);
        // Over a range: the call of each case.
        let r = rw("rate(cond[5m]) > 1", true);
        assert_eq!(
            r.query,
            r#"(rate(cond_a{kind="a"}[5m]) or rate(cond{kind!="a"}[5m])) > 1"#
        );
        // A migrated query is left alone.
        let again = rw(&r.query, true);
        assert!(!again.changed, "{}", again.query);
    }

    #[test]
    fn heatmaps_report_their_bounds_and_grafana_variables_survive() {
        let r = rw(
            "sum by (le) (increase(lat_ms_bucket[$__rate_interval]))",
            true,
        );
        assert_eq!(
            r.query,
            "sum by (le) (increase(lat_seconds_bucket[$__rate_interval]))"
        );
        assert!(reasons(&r).contains(&Reason::LeBounds));
        assert_eq!(r.le_factor.map(|f| f.den), Some(1000));
        let r = rw(
            r#"sum by ($group) (mem_mib{model=~"$model"}) / [[scale]]"#,
            true,
        );
        assert!(
            r.query.contains("$group")
                && r.query.contains("$model")
                && r.query.contains("[[scale]]"),
            "{}",
            r.query
        );
    }

    #[test]
    fn native_histograms_carry_their_factor() {
        let r = rw("histogram_quantile(0.9, sum(rate(lat_ms[5m]))) > 250", true);
        assert_eq!(
            r.query,
            "histogram_quantile(0.9, sum(rate(lat_seconds[5m]))) * 1000 > 250"
        );
        let r = rw(
            "histogram_sum(rate(lat_ms[5m])) / histogram_count(rate(lat_ms[5m]))",
            false,
        );
        assert_eq!(r.value_factor.map(|f| f.den), Some(1000));
        let r = rw("histogram_fraction(0, 100, rate(lat_ms[5m]))", false);
        assert_eq!(r.query, "histogram_fraction(0, 0.1, rate(lat_seconds[5m]))");
        assert_eq!(r.value_factor, None);
    }

    #[test]
    fn a_reload_keeps_the_cut_over_counts() {
        let old = rules();
        let slot = old
            .plan_for("dev_old")
            .and_then(|p| p.rename_slot)
            .expect("tracked");
        old.renames().record(&[(slot, 7)], 1_700_000_000_000);
        let new = rules();
        new.inherit_renames(&old);
        let seen = new.renames().snapshot();
        let e = seen
            .iter()
            .find(|s| s.from == "dev_old")
            .expect("inherited");
        assert_eq!((e.samples, e.last_seen), (7, Some(1_700_000_000.0)));
        assert_eq!(e.to, "dev_new");
    }

    #[test]
    fn a_migrated_query_is_left_alone() {
        for q in [
            "histogram_quantile(0.9, sum by (le) (rate(lat_seconds_bucket[5m])))",
            "sum by (host) (dev_new)",
            "mem_bytes > 1e9",
        ] {
            let r = rw(q, true);
            assert!(
                !r.changed && r.findings.is_empty() && r.old_references.is_empty(),
                "{q}: {r:?}"
            );
            assert_eq!(r.query, q);
        }
    }
}
