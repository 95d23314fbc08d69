//! Compiles packs into [`Rules`]: an ordered rule list plus a hash map from every series
//! name that exact rules know to its precomputed [`Plan`]. Names that only prefix or regex
//! rules match get their plan computed once and cached by the caller.

use std::sync::Arc;

use ahash::{AHashMap, AHashSet};
use regex::Regex;

use super::number::Factor;
use super::spec::{FamilyType, PackSpec, RuleSpec};

/// What a series' samples look like relative to its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Total,
    Bucket,
    Sum,
    Count,
    Created,
}

impl Kind {
    fn suffix(self) -> &'static str {
        match self {
            Kind::Plain => "",
            Kind::Total => "_total",
            Kind::Bucket => "_bucket",
            Kind::Sum => "_sum",
            Kind::Count => "_count",
            Kind::Created => "_created",
        }
    }
}

/// What a rescale touches for one series kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleTarget {
    /// Sample values (gauges, counters, `_sum`, summary quantiles) and exemplars.
    Value,
    /// The `le` label of `_bucket` series, and exemplars.
    Le,
}

#[derive(Clone, Debug)]
pub enum Action {
    Drop(u16),
    SetName(Box<str>),
    RenameLabel {
        from: Box<str>,
        to: Box<str>,
    },
    MapLabelValue {
        label: Box<str>,
        from: Box<str>,
        to: Box<str>,
    },
    SplitByLabel {
        label: Box<str>,
        names: Vec<(Box<str>, Box<str>)>,
    },
    SetLabel {
        name: Box<str>,
        value: Box<str>,
    },
    DropLabel(Box<str>),
    RankDedup {
        label: Box<str>,
        keep: Box<str>,
    },
    /// Physical per-rank family: the derive stage also emits its sum over this label.
    SumOverRanks(Box<str>),
    Scale {
        factor: Factor,
        target: ScaleTarget,
    },
    /// The series is emitted only if the step's `when` matches (a copy rule's labels):
    /// otherwise nothing is written and nothing is counted.
    OnlyIf,
}

/// Index of the built-in drop reason `tp_rank_dedup` in [`Rules::reasons`].
pub const REASON_RANK_DEDUP: u16 = 1;
/// Index of the built-in drop reason `duplicate_timestamp` in [`Rules::reasons`].
pub const REASON_DUPLICATE_TIMESTAMP: u16 = 2;

#[derive(Clone, Debug)]
pub struct Step {
    /// Exact label matchers, checked against the series' labels at that point.
    pub when: Vec<(Box<str>, Box<str>)>,
    pub action: Action,
    pub pack: u16,
}

/// Everything that happens to one input series name.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Emit the untouched original beside the result (migration window).
    pub keep_original: bool,
    /// The family is rescaled: native histograms cannot be, and are counted.
    pub rescales: bool,
    /// Human-readable trace of which rules applied, for `explain`.
    pub trace: Vec<String>,
    /// Copies emitted beside the series (`copy: true` rules).
    pub copies: Vec<CopyPlan>,
}

/// A copy of a series: a whole plan of its own (the series' steps, then the copy rule's).
#[derive(Clone, Debug)]
pub struct CopyPlan {
    pub plan: Plan,
    /// The copy rule's `unit:`, for the copy's metadata.
    pub unit: Option<Box<str>>,
}

/// What one family's forwarded metadata becomes ([`Rules::metadata_plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataPlan {
    /// Also forward the input entry as it is (`keep_original`: the original series stay).
    pub keep_input: bool,
    /// Entries written in its place; none (and no `keep_input`): the family is dropped.
    pub outputs: Vec<MetadataOutput>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataOutput {
    pub name: Box<str>,
    /// The unit field to write; `None`: the input's.
    pub unit: Option<Box<str>>,
    /// The family's values are rescaled by this: its HELP is restated
    /// ([`super::meta::rewrite_help`]) …
    pub rescale: Option<Factor>,
    /// … in this unit: the one its name states, else the rule's `unit:`.
    pub help_unit: Option<super::meta::NameUnit>,
}

/// How a name resolves.
#[derive(Clone, Debug)]
pub enum Resolution {
    /// Rules apply.
    Plan(Arc<Plan>),
    /// No rule applies, but a rule produces this name: route through collision merging.
    OutputName,
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("pack {pack}: rule {rule}: {msg}")]
    Rule {
        pack: String,
        rule: usize,
        msg: String,
    },
    #[error("pack {pack}: {msg}")]
    Pack { pack: String, msg: String },
    #[error("conflict: {0}")]
    Conflict(String),
}

#[derive(Debug)]
enum Matcher {
    Exact(Vec<Box<str>>),
    Prefix(Box<str>),
    Regex(Regex),
}

#[derive(Debug)]
struct CompiledRule {
    pack: u16,
    index: usize,
    phase: u8,
    matcher: Matcher,
    family_type: FamilyType,
    when: Vec<(Box<str>, Box<str>)>,
    drop: Option<u16>,
    rename: Option<String>,
    scale: Option<Factor>,
    unit: Option<String>,
    rename_labels: Vec<(Box<str>, Box<str>)>,
    label_values: Vec<(Box<str>, Box<str>, Box<str>)>,
    split: Option<Split>,
    set_labels: Vec<(Box<str>, Box<str>)>,
    drop_labels: Vec<Box<str>>,
    /// `copy: true`: the rule's result is a copy beside the series (phase `PHASE_COPY`).
    copy: bool,
    describe: String,
}

/// Label to split on, and value → new family base.
type Split = (Box<str>, Vec<(Box<str>, String)>);

#[derive(Debug)]
struct RankDedup {
    pack: u16,
    label: Box<str>,
    keep: Box<str>,
    prefixes: Vec<String>,
    physical_names: AHashSet<String>,
    physical_prefixes: Vec<String>,
    physical_suffixes: Vec<String>,
    sum_over_ranks: bool,
}

/// Options that apply across packs.
#[derive(Clone, Debug)]
pub struct PackOptions {
    pub name: String,
    pub keep_original: bool,
    /// Overrides the pack's own `rank_dedup.sum_over_ranks`.
    pub sum_over_ranks: Option<bool>,
}

#[derive(Clone, Debug)]
pub struct GlobalOptions {
    pub drop_created_series: bool,
}

/// Phases, in the order they apply (documented in docs/rules.md, "Phase order").
const PHASE_DROP: u8 = 0;
const PHASE_MIGRATE: u8 = 1;
const PHASE_DEDUP: u8 = 2;
const PHASE_UNIT: u8 = 3;
const PHASE_TOTAL: u8 = 4;
const PHASE_COPY: u8 = 5;

/// Compiled, immutable rule set shared by all workers.
#[derive(Debug)]
pub struct Rules {
    rules: Vec<CompiledRule>,
    dedups: Vec<RankDedup>,
    packs: Vec<PackOptions>,
    reasons: Vec<String>,
    names: AHashMap<Box<str>, Resolution>,
    has_pattern_rules: bool,
    drop_created: bool,
    created_reason: u16,
}

impl Rules {
    /// An empty rule set: everything passes unchanged.
    pub fn empty() -> Rules {
        Rules::compile(
            &[],
            &GlobalOptions {
                drop_created_series: false,
            },
        )
        .expect("empty rule set compiles")
    }

    pub fn compile(
        packs: &[(PackSpec, PackOptions)],
        global: &GlobalOptions,
    ) -> Result<Rules, CompileError> {
        let mut rules = Vec::new();
        let mut dedups = Vec::new();
        let mut pack_opts = Vec::new();
        let mut reasons: Vec<String> = Vec::new();
        let reason_id = |r: &str, reasons: &mut Vec<String>| -> u16 {
            if let Some(i) = reasons.iter().position(|x| x == r) {
                i as u16
            } else {
                reasons.push(r.to_string());
                (reasons.len() - 1) as u16
            }
        };
        // Built-in reasons first, at the indices the mapper uses directly.
        let created_reason = reason_id("created_series", &mut reasons);
        let rank_reason = reason_id("tp_rank_dedup", &mut reasons);
        let duplicate_reason = reason_id("duplicate_timestamp", &mut reasons);
        debug_assert_eq!(
            (rank_reason, duplicate_reason),
            (REASON_RANK_DEDUP, REASON_DUPLICATE_TIMESTAMP)
        );

        for (pi, (pack, opts)) in packs.iter().enumerate() {
            let pid = pi as u16;
            pack_opts.push(opts.clone());
            for (ri, spec) in pack.rules.iter().enumerate() {
                let r = compile_rule(pid, ri, &pack.pack, spec, &mut |s| {
                    reason_id(s, &mut reasons)
                })?;
                rules.push(r);
            }
            for (oi, o) in pack.otel.iter().enumerate() {
                rules.extend(compile_otel(pid, pack.rules.len() + oi, o));
            }
            if let Some(d) = &pack.rank_dedup {
                if d.prefixes.is_empty() {
                    return Err(CompileError::Pack {
                        pack: pack.pack.clone(),
                        msg: "rank_dedup needs at least one prefix".into(),
                    });
                }
                dedups.push(RankDedup {
                    pack: pid,
                    label: d.label.as_str().into(),
                    keep: d.keep.as_str().into(),
                    prefixes: d.prefixes.clone(),
                    physical_names: d.physical.names.iter().cloned().collect(),
                    physical_prefixes: d.physical.prefixes.clone(),
                    physical_suffixes: d.physical.suffixes.clone(),
                    sum_over_ranks: opts.sum_over_ranks.unwrap_or(d.sum_over_ranks),
                });
            }
        }
        // Stable: phase first, then pack order, then rule order.
        rules.sort_by_key(|r| (r.phase, r.pack, r.index));
        let has_pattern_rules = rules
            .iter()
            .any(|r| !matches!(r.matcher, Matcher::Exact(_)))
            || !dedups.is_empty();

        let mut compiled = Rules {
            rules,
            dedups,
            packs: pack_opts,
            reasons,
            names: AHashMap::new(),
            has_pattern_rules,
            drop_created: global.drop_created_series,
            created_reason,
        };
        compiled.precompute()?;
        Ok(compiled)
    }

    /// Fills the exact-name map: every series name an exact rule covers, plus every name
    /// some rule writes.
    fn precompute(&mut self) -> Result<(), CompileError> {
        let mut inputs: Vec<String> = Vec::new();
        for r in &self.rules {
            if let Matcher::Exact(fams) = &r.matcher {
                for f in fams {
                    for (name, _) in covered_names(f, r.family_type) {
                        inputs.push(name);
                    }
                }
            }
        }
        inputs.sort();
        inputs.dedup();
        let mut outputs: AHashMap<String, String> = AHashMap::new();
        for name in &inputs {
            let plan = self.plan_for(name);
            if let Some(plan) = plan {
                for out in output_names(&plan) {
                    if let Some(prev) = outputs.get(&out)
                        && prev != name
                        && !self.collision_allowed(prev, name)
                    {
                        return Err(CompileError::Conflict(format!(
                            "{prev:?} and {name:?} are both written as {out:?} by different rules \
                             without label matchers to tell them apart"
                        )));
                    }
                    outputs.insert(out, name.clone());
                }
                self.names
                    .insert(name.as_str().into(), Resolution::Plan(Arc::new(plan)));
            }
        }
        for (out, _) in outputs {
            self.names
                .entry(out.into_boxed_str())
                .or_insert(Resolution::OutputName);
        }
        Ok(())
    }

    /// Renames of several old names onto one new name are the point of migrations; they
    /// are allowed when they are declared in the same pack (merged at run time).
    fn collision_allowed(&self, a: &str, b: &str) -> bool {
        let packs = |p: Plan| -> Vec<u16> {
            let copies = p.copies.iter().flat_map(|c| c.plan.steps.iter());
            p.steps.iter().chain(copies).map(|s| s.pack).collect()
        };
        let pa = self.plan_for(a).map(packs);
        let pb = self.plan_for(b).map(packs);
        match (pa, pb) {
            (Some(pa), Some(pb)) => pa.iter().any(|p| pb.contains(p)),
            _ => true,
        }
    }

    /// Looks a series name up in the precomputed map. `None` means: not an exact name;
    /// call [`Rules::plan_for`] when [`Rules::needs_pattern_lookup`].
    #[inline]
    pub fn lookup(&self, name: &str) -> Option<&Resolution> {
        self.names.get(name)
    }

    /// True when prefix/regex rules or rank dedup exist, so unknown names need a check.
    #[inline]
    pub fn needs_pattern_lookup(&self) -> bool {
        self.has_pattern_rules || self.drop_created
    }

    pub fn reasons(&self) -> &[String] {
        &self.reasons
    }

    pub fn packs(&self) -> &[PackOptions] {
        &self.packs
    }

    /// True when some pack sums physical families over ranks (needs the derive stage).
    pub fn sums_over_ranks(&self) -> bool {
        self.dedups.iter().any(|d| d.sum_over_ranks)
    }

    pub fn exact_name_count(&self) -> usize {
        self.names.len()
    }

    /// Every series name the exact rules know: the names they match and the names they
    /// write (unordered).
    pub fn known_names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(|k| &**k)
    }

    /// The physical families summed over ranks, in words, per pack that sums: which
    /// names are physical and the rank label (for `promnorm rules`).
    pub fn sum_over_ranks_patterns(&self) -> Vec<String> {
        let quoted = |v: &[String]| {
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.dedups
            .iter()
            .filter(|d| d.sum_over_ranks)
            .map(|d| {
                let mut what = Vec::new();
                let mut names: Vec<String> = d.physical_names.iter().cloned().collect();
                names.sort();
                if !names.is_empty() {
                    what.push(format!("named {}", quoted(&names)));
                }
                if !d.physical_prefixes.is_empty() {
                    what.push(format!("starting with {}", quoted(&d.physical_prefixes)));
                }
                if !d.physical_suffixes.is_empty() {
                    what.push(format!("ending with {}", quoted(&d.physical_suffixes)));
                }
                format!(
                    "pack {}: families under {} {}, over {}",
                    self.packs[d.pack as usize].name,
                    quoted(&d.prefixes),
                    what.join(" or "),
                    d.label
                )
            })
            .collect()
    }

    /// Builds the plan for a series name by walking the phases; a rename in one phase
    /// makes later phases match the new name.
    pub fn plan_for(&self, name: &str) -> Option<Plan> {
        let mut plan = Plan::default();
        let mut cur = name.to_string();
        if self.drop_created && name.ends_with("_created") {
            plan.steps.push(Step {
                when: Vec::new(),
                action: Action::Drop(self.created_reason),
                pack: u16::MAX,
            });
            plan.trace
                .push("drop_created_series: dropped (holds a timestamp, not a value)".into());
            return Some(plan);
        }
        let mut phase_done_dedup = false;
        for r in &self.rules {
            if r.phase > PHASE_DEDUP && !phase_done_dedup {
                self.add_dedup(&cur, &mut plan);
                phase_done_dedup = true;
            }
            let Some((kind, target_base)) = self.cover(r, &cur) else {
                continue;
            };
            if r.copy {
                let copy = self.copy_plan(r, kind, &target_base, &cur, &plan);
                plan.trace.extend(copy.trace.last().cloned());
                plan.copies.push(CopyPlan {
                    plan: copy,
                    unit: r.unit.as_deref().map(Into::into),
                });
                continue;
            }
            if let Some(reason) = r.drop {
                plan.steps.push(Step {
                    when: r.when.clone(),
                    action: Action::Drop(reason),
                    pack: r.pack,
                });
                plan.trace.push(format!(
                    "{}: drop ({})",
                    r.describe, self.reasons[reason as usize]
                ));
                continue;
            }
            let when = r.when.clone();
            self.rule_steps(r, kind, &target_base, &when, &mut cur, &mut plan);
        }
        if !phase_done_dedup {
            self.add_dedup(&cur, &mut plan);
        }
        if plan.steps.is_empty() && plan.copies.is_empty() {
            None
        } else {
            Some(plan)
        }
    }

    /// Appends the steps of rule `r` (already known to cover the series, of `kind`, new
    /// family base `target_base`) under the condition `when`, and its `explain` line.
    fn rule_steps(
        &self,
        r: &CompiledRule,
        kind: Kind,
        target_base: &str,
        when: &[(Box<str>, Box<str>)],
        cur: &mut String,
        plan: &mut Plan,
    ) {
        let steps_before = plan.steps.len();
        // What this rule does, in words, for `explain`.
        let mut details: Vec<String> = Vec::new();
        if !r.when.is_empty() {
            let cond: Vec<String> = r.when.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            details.push(format!("only series with {}", cond.join(", ")));
        }
        let pack = r.pack;
        let push = |plan: &mut Plan, action: Action| {
            plan.steps.push(Step {
                when: when.to_vec(),
                action,
                pack,
            })
        };
        for (from, to) in &r.rename_labels {
            details.push(format!("label {from} → {to}"));
            push(
                plan,
                Action::RenameLabel {
                    from: from.clone(),
                    to: to.clone(),
                },
            );
        }
        for (label, from, to) in &r.label_values {
            details.push(format!("{label}=\"{from}\" → {label}=\"{to}\""));
            push(
                plan,
                Action::MapLabelValue {
                    label: label.clone(),
                    from: from.clone(),
                    to: to.clone(),
                },
            );
        }
        if let Some((label, names)) = &r.split {
            let names = names
                .iter()
                .map(|(v, base)| {
                    (
                        v.clone(),
                        series_name(base, r.family_type, kind).into_boxed_str(),
                    )
                })
                .collect::<Vec<(Box<str>, Box<str>)>>();
            let to: Vec<String> = names.iter().map(|(v, n)| format!("{v} → {n}")).collect();
            details.push(format!(
                "split by {label}: {}; other values keep the name",
                to.join(", ")
            ));
            push(
                plan,
                Action::SplitByLabel {
                    label: label.clone(),
                    names,
                },
            );
        }
        for (n, v) in &r.set_labels {
            details.push(format!("sets {n}=\"{v}\""));
            push(
                plan,
                Action::SetLabel {
                    name: n.clone(),
                    value: v.clone(),
                },
            );
        }
        for n in &r.drop_labels {
            details.push(format!("drops label {n}"));
            push(plan, Action::DropLabel(n.clone()));
        }
        if let Some(factor) = r.scale {
            let target = match kind {
                Kind::Plain | Kind::Total | Kind::Sum => Some(ScaleTarget::Value),
                Kind::Bucket => Some(ScaleTarget::Le),
                Kind::Count | Kind::Created => None,
            };
            details.push(match target {
                Some(ScaleTarget::Value) => format!("values {factor}"),
                Some(ScaleTarget::Le) => {
                    format!("le values {factor} (bucket counts unchanged)")
                }
                None if kind == Kind::Count => "a count: not rescaled".into(),
                None => "a timestamp: not rescaled".into(),
            });
            if let Some(target) = target {
                push(plan, Action::Scale { factor, target });
            }
            plan.rescales = true;
        }
        let new_name = series_name(target_base, r.family_type, kind);
        let renamed = new_name != *cur;
        if renamed {
            push(plan, Action::SetName(new_name.as_str().into()));
            if self.packs[pack as usize].keep_original && !r.copy {
                plan.keep_original = true;
            }
            *cur = new_name;
        }
        if plan.steps.len() > steps_before {
            let mut line = r.describe.clone();
            if !details.is_empty() {
                line.push_str(": ");
                line.push_str(&details.join("; "));
            }
            if renamed {
                line.push_str(" → ");
                line.push_str(cur);
            }
            plan.trace.push(line);
        }
    }

    /// The plan of the copy that copy rule `r` makes of a series whose own plan so far is
    /// `main` (its name now `cur`): `main`'s steps, then the rule's, gated by its labels.
    fn copy_plan(
        &self,
        r: &CompiledRule,
        kind: Kind,
        target_base: &str,
        cur: &str,
        main: &Plan,
    ) -> Plan {
        let mut copy = Plan {
            steps: main.steps.clone(),
            rescales: main.rescales,
            ..Plan::default()
        };
        if !r.when.is_empty() {
            copy.steps.push(Step {
                when: r.when.clone(),
                action: Action::OnlyIf,
                pack: r.pack,
            });
        }
        let mut name = cur.to_string();
        self.rule_steps(r, kind, target_base, &[], &mut name, &mut copy);
        let mut line = copy.trace.pop().unwrap_or_else(|| r.describe.clone());
        line.push_str(" (a copy, beside the series)");
        copy.trace = vec![line];
        copy
    }

    fn add_dedup(&self, cur: &str, plan: &mut Plan) {
        for d in &self.dedups {
            if !d.prefixes.iter().any(|p| cur.starts_with(p.as_str())) {
                continue;
            }
            let physical = d.physical_names.contains(cur)
                || d.physical_prefixes
                    .iter()
                    .any(|p| cur.starts_with(p.as_str()))
                || d.physical_suffixes
                    .iter()
                    .any(|s| cur.ends_with(s.as_str()));
            if physical {
                plan.trace.push(format!(
                    "pack {}: physical per-rank family, every {} kept",
                    self.packs[d.pack as usize].name, d.label
                ));
                if d.sum_over_ranks {
                    plan.steps.push(Step {
                        when: Vec::new(),
                        action: Action::SumOverRanks(d.label.clone()),
                        pack: d.pack,
                    });
                    plan.trace.push(format!(
                        "pack {}: also summed over {} (a series without it)",
                        self.packs[d.pack as usize].name, d.label
                    ));
                }
                continue;
            }
            plan.steps.push(Step {
                when: Vec::new(),
                action: Action::RankDedup {
                    label: d.label.clone(),
                    keep: d.keep.clone(),
                },
                pack: d.pack,
            });
            plan.trace.push(format!(
                "pack {}: logical family, only {}=\"{}\" kept",
                self.packs[d.pack as usize].name, d.label, d.keep
            ));
        }
    }

    /// Does rule `r` cover series `name`? Returns its kind and the new family base.
    fn cover(&self, r: &CompiledRule, name: &str) -> Option<(Kind, String)> {
        match &r.matcher {
            Matcher::Exact(fams) => {
                for f in fams {
                    for (n, kind) in covered_names(f, r.family_type) {
                        if n == name {
                            let base = r
                                .rename
                                .clone()
                                .unwrap_or_else(|| family_base(f, r.family_type).to_string());
                            return Some((kind, base));
                        }
                    }
                }
                None
            }
            Matcher::Prefix(p) => {
                let rest = name.strip_prefix(&**p)?;
                match &r.rename {
                    // A prefix rename replaces the prefix; the series keeps its suffix.
                    Some(to) => Some((Kind::Plain, format!("{to}{rest}"))),
                    None => Some((Kind::Plain, name.to_string())),
                }
            }
            Matcher::Regex(re) => {
                for (kind, base) in candidates(name, r.family_type) {
                    if let Some(caps) = re.captures(base) {
                        let target = match &r.rename {
                            Some(t) => {
                                let mut out = String::new();
                                caps.expand(t, &mut out);
                                out
                            }
                            None => family_base(base, r.family_type).to_string(),
                        };
                        return Some((kind, target));
                    }
                }
                None
            }
        }
    }

    /// What forwarded metadata of `family` becomes, or `None` when no rule changes it.
    /// Tries the family as a series name, then as a histogram/counter base. Only
    /// unconditional steps count: metadata carries no labels to match.
    pub fn metadata_plan(&self, family: &str) -> Option<MetadataPlan> {
        for (suffix, strip) in [("", ""), ("_bucket", "_bucket"), ("_total", "")] {
            let probe = format!("{family}{suffix}");
            let plan = match self.lookup(&probe) {
                Some(Resolution::Plan(p)) => Some(p.clone()),
                Some(Resolution::OutputName) => None,
                None if self.needs_pattern_lookup() => self.plan_for(&probe).map(Arc::new),
                None => None,
            };
            let Some(plan) = plan else { continue };
            let unit = self.unit_for(&probe);
            let Some(main) = metadata_outputs(&plan.steps, family, strip, unit.as_deref()) else {
                return Some(MetadataPlan::default());
            };
            // The series' own metadata is unchanged: forwarded as it is, beside the copies'.
            let unchanged = main.len() == 1
                && main[0].unit.is_none()
                && main[0].rescale.is_none()
                && &*main[0].name == family;
            if unchanged && plan.copies.is_empty() {
                continue;
            }
            let mut outputs = if unchanged { Vec::new() } else { main };
            for c in &plan.copies {
                let unit = c.unit.as_deref().or(unit.as_deref());
                outputs.extend(
                    metadata_outputs(&c.plan.steps, family, strip, unit).unwrap_or_default(),
                );
            }
            return Some(MetadataPlan {
                keep_input: plan.keep_original || unchanged,
                outputs,
            });
        }
        None
    }

    /// The `_bucket`, `_sum` and `_count` series that rules match as members of the
    /// histogram or summary family `family` (the name `# TYPE` lines and dashboards use).
    pub fn family_members(&self, family: &str) -> Vec<String> {
        [Kind::Bucket, Kind::Sum, Kind::Count]
            .into_iter()
            .map(|kind| (kind, format!("{family}{}", kind.suffix())))
            .filter(|(kind, name)| {
                self.rules.iter().any(|r| {
                    !matches!(r.matcher, Matcher::Prefix(_))
                        && self.cover(r, name).is_some_and(|(k, _)| k == *kind)
                })
            })
            .map(|(_, name)| name)
            .collect()
    }

    fn unit_for(&self, name: &str) -> Option<String> {
        self.rules
            .iter()
            .find(|r| r.unit.is_some() && !r.copy && self.cover(r, name).is_some())
            .and_then(|r| r.unit.clone())
    }
}

/// What one linear plan (a series' own, or a copy's) makes of its family's metadata:
/// `None` when it drops the family. Only unconditional steps count: metadata carries no
/// labels to match. `strip` is the series suffix the family was probed with; `unit` the
/// rule's `unit:`, if any.
fn metadata_outputs(
    steps: &[Step],
    family: &str,
    strip: &str,
    unit: Option<&str>,
) -> Option<Vec<MetadataOutput>> {
    let mut name: Option<&str> = None;
    let mut split: Option<&[(Box<str>, Box<str>)]> = None;
    let mut factor = Factor::ONE;
    for s in steps.iter().filter(|s| s.when.is_empty()) {
        match &s.action {
            Action::Drop(_) => return None,
            // A later rename renames split series too.
            Action::SetName(n) => (name, split) = (Some(&**n), None),
            Action::SplitByLabel { names, .. } => split = Some(names),
            Action::Scale { factor: f, .. } => factor = factor.then(*f),
            _ => {}
        }
    }
    let strip = |n: &str| -> Box<str> { n.strip_suffix(strip).unwrap_or(n).into() };
    let names: Vec<Box<str>> = match (split, name) {
        // Each family a split produces; a series with a value the split does not
        // name keeps the old name, but carries no metadata of its own.
        (Some(split), _) => split.iter().map(|(_, n)| strip(n)).collect(),
        (None, Some(n)) => vec![strip(n)],
        (None, None) => vec![family.into()],
    };
    let rescale = (!factor.is_one()).then_some(factor);
    let outputs = names
        .into_iter()
        .map(|name| {
            let help_unit = rescale.and_then(|_| {
                super::meta::unit_of_name(&name).or_else(|| unit.and_then(super::meta::unit_named))
            });
            // A rescaled family's old unit is wrong: the rule's, else the name's, else none.
            let unit = match (unit, rescale) {
                (Some(u), _) => Some(u.into()),
                (None, Some(_)) => Some(help_unit.map_or("", |u| u.unit).into()),
                (None, None) => None,
            };
            MetadataOutput {
                name,
                unit,
                rescale,
                help_unit,
            }
        })
        .collect();
    Some(outputs)
}

/// The output name of the series (its first unconditional rename) and of each
/// unconditional copy (its last rename: the copy rule's).
fn output_names(plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for s in &plan.steps {
        match &s.action {
            Action::SetName(n) if s.when.is_empty() => out.push(n.to_string()),
            _ => {}
        }
    }
    out.truncate(1);
    for c in plan.copies.iter().map(|c| &c.plan) {
        if c.steps.iter().any(|s| matches!(s.action, Action::OnlyIf)) {
            continue;
        }
        let name = c.steps.iter().rev().find_map(|s| match &s.action {
            Action::SetName(n) if s.when.is_empty() => Some(n.to_string()),
            _ => None,
        });
        out.extend(name);
    }
    out
}

/// The family name without the `_total` a counter may carry.
fn family_base(f: &str, t: FamilyType) -> &str {
    match t {
        FamilyType::Counter => f.strip_suffix("_total").unwrap_or(f),
        _ => f,
    }
}

/// The series name of kind `kind` in family `base` of type `t`.
fn series_name(base: &str, t: FamilyType, kind: Kind) -> String {
    match (t, kind) {
        (FamilyType::Counter, Kind::Plain | Kind::Total) => {
            format!("{}_total", base.strip_suffix("_total").unwrap_or(base))
        }
        (FamilyType::Info, Kind::Plain) => base.to_string(),
        _ => format!("{base}{}", kind.suffix()),
    }
}

/// Every series name a family of type `t` consists of.
fn covered_names(f: &str, t: FamilyType) -> Vec<(String, Kind)> {
    let base = family_base(f, t);
    let with = |k: Kind| (format!("{base}{}", k.suffix()), k);
    match t {
        FamilyType::Counter => vec![
            (base.to_string(), Kind::Total),
            with(Kind::Total),
            with(Kind::Created),
        ],
        FamilyType::Gauge => vec![(base.to_string(), Kind::Plain)],
        FamilyType::Info => vec![
            (base.to_string(), Kind::Plain),
            (format!("{base}_info"), Kind::Plain),
        ],
        FamilyType::Histogram => vec![
            with(Kind::Bucket),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
        ],
        FamilyType::Summary => vec![
            (base.to_string(), Kind::Plain),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
        ],
        FamilyType::Any => vec![
            (base.to_string(), Kind::Plain),
            with(Kind::Total),
            with(Kind::Bucket),
            with(Kind::Sum),
            with(Kind::Count),
            with(Kind::Created),
        ],
    }
}

/// For pattern rules: the (kind, family base) readings of a series name.
fn candidates(name: &str, t: FamilyType) -> Vec<(Kind, &str)> {
    let mut out = Vec::with_capacity(6);
    let strip = |k: Kind| name.strip_suffix(k.suffix()).map(|b| (k, b));
    match t {
        FamilyType::Counter => {
            out.extend(strip(Kind::Total));
            out.extend(strip(Kind::Created));
            out.push((Kind::Total, name));
        }
        FamilyType::Histogram => {
            out.extend(
                [Kind::Bucket, Kind::Sum, Kind::Count, Kind::Created]
                    .into_iter()
                    .filter_map(strip),
            );
        }
        FamilyType::Summary => {
            out.extend(
                [Kind::Sum, Kind::Count, Kind::Created]
                    .into_iter()
                    .filter_map(strip),
            );
            out.push((Kind::Plain, name));
        }
        FamilyType::Gauge | FamilyType::Info => out.push((Kind::Plain, name)),
        FamilyType::Any => {
            out.extend(
                [
                    Kind::Bucket,
                    Kind::Sum,
                    Kind::Count,
                    Kind::Created,
                    Kind::Total,
                ]
                .into_iter()
                .filter_map(strip),
            );
            out.push((Kind::Plain, name));
        }
    }
    out
}

fn compile_rule(
    pack: u16,
    index: usize,
    pack_name: &str,
    spec: &RuleSpec,
    reason_id: &mut dyn FnMut(&str) -> u16,
) -> Result<CompiledRule, CompileError> {
    let err = |msg: String| CompileError::Rule {
        pack: pack_name.to_string(),
        rule: index + 1,
        msg,
    };
    let m = &spec.matcher;
    let mut fams: Vec<Box<str>> = m.families.iter().map(|s| s.as_str().into()).collect();
    if let Some(f) = &m.family {
        fams.insert(0, f.as_str().into());
    }
    let kinds = usize::from(!fams.is_empty())
        + usize::from(m.prefix.is_some())
        + usize::from(m.regex.is_some());
    if kinds != 1 {
        return Err(err(
            "match needs exactly one of family/families, prefix, regex".into(),
        ));
    }
    let matcher = if !fams.is_empty() {
        if fams.iter().any(|f| f.is_empty()) {
            return Err(err("empty family name".into()));
        }
        Matcher::Exact(fams)
    } else if let Some(p) = &m.prefix {
        if p.is_empty() {
            return Err(err("empty prefix".into()));
        }
        Matcher::Prefix(p.as_str().into())
    } else {
        let src = m.regex.as_deref().unwrap_or_default();
        let re = Regex::new(&format!("^(?:{src})$")).map_err(|e| err(format!("bad regex: {e}")))?;
        Matcher::Regex(re)
    };
    if matches!(matcher, Matcher::Exact(ref f) if f.len() > 1) && spec.rename.is_some() {
        return Err(err(
            "a rename needs a single family (use one rule per family)".into(),
        ));
    }
    let scale = spec
        .scale
        .as_deref()
        .map(Factor::parse)
        .transpose()
        .map_err(err)?
        .filter(|f| !f.is_one());
    let mut split = None;
    if let Some(s) = &spec.split_by_label {
        if s.names.is_empty() {
            return Err(err("split_by_label needs names".into()));
        }
        split = Some((
            s.label.as_str().into(),
            s.names
                .iter()
                .map(|(v, n)| (v.as_str().into(), n.clone()))
                .collect(),
        ));
    }
    for (k, v) in spec.rename_labels.iter().chain(spec.set_labels.iter()) {
        if k.is_empty() || (v.is_empty() && !spec.set_labels.contains_key(k)) {
            return Err(err("empty label name".into()));
        }
        if k == "__name__" {
            return Err(err("use rename to change __name__".into()));
        }
    }
    let has_label_actions = !spec.rename_labels.is_empty()
        || !spec.label_values.is_empty()
        || split.is_some()
        || !spec.set_labels.is_empty()
        || !spec.drop_labels.is_empty();
    if spec.copy {
        if spec.drop.is_some() || split.is_some() {
            return Err(err(
                "a copy rule cannot drop or split_by_label (it adds a series beside the original)"
                    .into(),
            ));
        }
        if spec.rename.is_none() {
            return Err(err(
                "a copy rule needs rename (a copy under the series' own name would collide with it)"
                    .into(),
            ));
        }
    }
    let phase = if spec.copy {
        PHASE_COPY
    } else if spec.drop.is_some() {
        PHASE_DROP
    } else if scale.is_some() {
        PHASE_UNIT
    } else if spec.rename.is_some() || has_label_actions {
        PHASE_MIGRATE
    } else if spec.family_type == FamilyType::Counter {
        PHASE_TOTAL
    } else {
        PHASE_MIGRATE
    };
    let describe = format!(
        "pack {pack_name} rule {}{}",
        index + 1,
        spec.description
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default()
    );
    Ok(CompiledRule {
        pack,
        index,
        phase,
        matcher,
        family_type: spec.family_type,
        when: m
            .labels
            .iter()
            .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
            .collect(),
        drop: spec.drop.as_deref().map(reason_id),
        rename: spec.rename.clone(),
        scale,
        unit: spec.unit.clone(),
        rename_labels: spec
            .rename_labels
            .iter()
            .map(|(a, b)| (a.as_str().into(), b.as_str().into()))
            .collect(),
        label_values: spec
            .label_values
            .iter()
            .flat_map(|(l, m)| {
                m.iter()
                    .map(move |(a, b)| (l.as_str().into(), a.as_str().into(), b.as_str().into()))
            })
            .collect(),
        split,
        set_labels: spec
            .set_labels
            .iter()
            .map(|(a, b)| (a.as_str().into(), b.as_str().into()))
            .collect(),
        drop_labels: spec.drop_labels.iter().map(|s| s.as_str().into()).collect(),
        copy: spec.copy,
        describe,
    })
}

/// Expands one OpenTelemetry instrument into exact rules for each shape the exporters
/// and collectors produce, all landing on the OpenTelemetry Prometheus exporter's name.
fn compile_otel(pack: u16, index: usize, o: &super::spec::OtelSpec) -> Vec<CompiledRule> {
    let underscored: String = o
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let unit_suffix = o
        .unit
        .as_deref()
        .filter(|u| !u.is_empty())
        .map(|u| format!("_{u}"));
    let with_unit = match &unit_suffix {
        Some(u) if !underscored.ends_with(u.as_str()) => format!("{underscored}{u}"),
        _ => underscored.clone(),
    };
    let mut shapes = vec![o.name.clone(), underscored.clone(), with_unit.clone()];
    if let Some(u) = &unit_suffix {
        // Dotted name with the unit suffix (Prometheus 3 with UTF-8 names and suffixes).
        shapes.push(format!("{}{u}", o.name));
    }
    shapes.sort();
    shapes.dedup();
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, shape)| CompiledRule {
            pack,
            index: index * 16 + i,
            phase: PHASE_MIGRATE,
            matcher: Matcher::Exact(vec![shape.into_boxed_str()]),
            family_type: o.family_type,
            when: Vec::new(),
            drop: None,
            rename: Some(with_unit.clone()),
            scale: None,
            unit: o.unit.clone(),
            rename_labels: Vec::new(),
            label_values: Vec::new(),
            split: None,
            set_labels: Vec::new(),
            drop_labels: Vec::new(),
            copy: false,
            describe: format!("otel instrument {}", o.name),
        })
        .collect()
}
