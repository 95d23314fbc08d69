//! Compiles packs into [`Rules`]: an ordered rule list plus a hash map from every series
//! name that exact rules know to its precomputed [`Plan`]. Names that only prefix or regex
//! rules match get their plan computed once and cached by the caller.

mod metadata;
mod names;
mod plan;
mod rule;

use names::{candidates, covered_names, family_base, output_names, series_name};
use rule::{compile_otel, compile_rule};

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
}
