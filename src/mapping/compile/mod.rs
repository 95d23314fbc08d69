//! Compiles packs into [`Rules`]: an ordered rule list plus a hash map from every series
//! name that exact rules know to its precomputed [`Plan`]. Names that only prefix or regex
//! rules match get their plan computed once and cached by the caller.

mod metadata;
mod names;
mod plan;
mod rule;
mod steps;

pub use steps::*;

use names::{candidates, covered_names, family_base, series_name};
use rule::{compile_otel, compile_rule};

use std::sync::Arc;

use ahash::{AHashMap, AHashSet};
use regex::Regex;

use super::number::Factor;
use super::spec::{FamilyType, PackSpec, RuleSpec};

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
    when: Vec<LabelCond>,
    drop: Option<u16>,
    rename: Option<String>,
    scale: Option<Factor>,
    unit: Option<String>,
    help: Option<String>,
    rename_labels: Vec<(Box<str>, Box<str>)>,
    label_values: Vec<(Box<str>, Box<str>, Box<str>)>,
    split: Option<Split>,
    set_labels: Vec<(Box<str>, Box<str>)>,
    drop_labels: Vec<Box<str>>,
    /// `copy: true`: the rule's result is a copy beside the series (phase `PHASE_COPY`).
    copy: bool,
    /// `native_histograms: keep_unit`.
    native_keep_unit: bool,
    describe: String,
}

/// Label to split on, and value → new family base (with that value's own type, factor
/// and unit, if the rule gives them).
type Split = (Box<str>, Vec<(Box<str>, String, SplitOutput)>);

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

/// One compiled rule as the web UI lists it ([`Rules::rule_list`]).
#[derive(Clone, Debug)]
pub struct RuleInfo {
    pub pack: String,
    pub phase: &'static str,
    pub phase_order: u8,
    /// The names it matches: families, `prefix …` or `regex …`.
    pub matches: String,
    /// `pack NAME rule N (description)`, as `explain` prints it.
    pub describe: String,
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
    /// The spelling every `otel:` instrument is written in.
    pub otel_names: OtelNames,
}

/// How an OpenTelemetry instrument's name and attribute keys are spelt on the way out:
/// escaped (`_` for every character outside `[a-zA-Z0-9_:]`) or as registered (UTF-8),
/// with or without the unit suffix and a counter's `_total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OtelNames {
    #[default]
    UnderscoreWithSuffixes,
    UnderscoreWithoutSuffixes,
    Utf8WithSuffixes,
    Utf8WithoutSuffixes,
}

impl OtelNames {
    pub fn utf8(self) -> bool {
        matches!(
            self,
            OtelNames::Utf8WithSuffixes | OtelNames::Utf8WithoutSuffixes
        )
    }

    /// An instrument's family name in this spelling (`unit`: its Prometheus word).
    pub fn spell(self, name: &str, unit: Option<&str>) -> String {
        let base = if self.utf8() {
            name.to_string()
        } else {
            rule::otel_escape(name)
        };
        match unit.filter(|u| !u.is_empty() && self.suffixes()) {
            Some(u) if !base.ends_with(&format!("_{u}")) => format!("{base}_{u}"),
            _ => base,
        }
    }

    /// An attribute key's label name in this spelling.
    pub fn label(self, key: &str) -> String {
        if self.utf8() {
            key.to_string()
        } else {
            rule::otel_escape(key)
        }
    }

    /// The `otel_names.strategy` value.
    pub fn name(self) -> &'static str {
        match self {
            OtelNames::UnderscoreWithSuffixes => "underscore_with_suffixes",
            OtelNames::UnderscoreWithoutSuffixes => "underscore_without_suffixes",
            OtelNames::Utf8WithSuffixes => "utf8_with_suffixes",
            OtelNames::Utf8WithoutSuffixes => "utf8_without_suffixes",
        }
    }

    pub fn suffixes(self) -> bool {
        matches!(
            self,
            OtelNames::UnderscoreWithSuffixes | OtelNames::Utf8WithSuffixes
        )
    }
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
    renames: super::renames::RenameTracker,
    /// Per plan (family): series, samples, last seen (`/rules`).
    families: super::renames::RenameTracker,
    /// [`Rules::edited_labels`].
    edited_labels: Vec<Box<str>>,
    /// Retired family names → what the pack says became of them ([`Rules::retired`]).
    retired: AHashMap<Box<str>, Box<str>>,
}

impl Rules {
    /// An empty rule set: everything passes unchanged.
    pub fn empty() -> Rules {
        Rules::compile(
            &[],
            &GlobalOptions {
                drop_created_series: false,
                otel_names: OtelNames::default(),
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

        let mut retired: AHashMap<Box<str>, Box<str>> = AHashMap::new();
        for (pi, (pack, opts)) in packs.iter().enumerate() {
            let pid = pi as u16;
            pack_opts.push(opts.clone());
            for r in &pack.retired {
                for n in &r.names {
                    retired
                        .entry(n.as_str().into())
                        .or_insert_with(|| format!("{} ({} pack)", r.removed, pack.pack).into());
                }
            }
            for (ri, spec) in pack.rules.iter().enumerate() {
                let r = compile_rule(pid, ri, &pack.pack, spec, &mut |s| {
                    reason_id(s, &mut reasons)
                })?;
                rules.push(r);
            }
            for (oi, o) in pack.otel.iter().enumerate() {
                rules.extend(compile_otel(
                    pid,
                    pack.rules.len() + oi,
                    o,
                    global.otel_names,
                ));
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

        // The labels a rule may give another value, add or remove (`__name__` always:
        // renames, splits and the metadata `_total` fix; `le` when a rule rescales).
        let mut edited_labels: Vec<Box<str>> = vec!["__name__".into()];
        for r in &rules {
            for (from, to) in &r.rename_labels {
                edited_labels.extend([from.clone(), to.clone()]);
            }
            edited_labels.extend(r.label_values.iter().map(|(label, _, _)| label.clone()));
            edited_labels.extend(r.split.iter().map(|(label, _)| label.clone()));
            edited_labels.extend(r.set_labels.iter().map(|(name, _)| name.clone()));
            edited_labels.extend(r.drop_labels.iter().cloned());
            let split_scales = r
                .split
                .as_ref()
                .is_some_and(|(_, values)| values.iter().any(|(_, _, o)| o.scale.is_some()));
            if r.scale.is_some() || split_scales {
                edited_labels.push("le".into());
            }
            // Prometheus 3's type-and-unit labels, where a series carries them.
            if r.scale.is_some() || r.unit.is_some() {
                edited_labels.push(UNIT_LABEL.into());
            }
            if r.family_type != crate::mapping::spec::FamilyType::Any {
                edited_labels.push(TYPE_LABEL.into());
            }
        }
        edited_labels.sort_unstable();
        edited_labels.dedup();

        let mut compiled = Rules {
            retired,
            edited_labels,
            rules,
            dedups,
            packs: pack_opts,
            reasons,
            names: AHashMap::new(),
            has_pattern_rules,
            drop_created: global.drop_created_series,
            created_reason,
            renames: Default::default(),
            families: Default::default(),
        };
        compiled.precompute()?;
        Ok(compiled)
    }

    /// What a pack says became of a retired name: the family's own, or that of the
    /// family a series name (`_total`, `_bucket`, …) belongs to.
    pub fn retired(&self, name: &str) -> Option<&str> {
        if self.retired.is_empty() {
            return None;
        }
        if let Some(r) = self.retired.get(name) {
            return Some(r);
        }
        ["_total", "_bucket", "_sum", "_count", "_created"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .and_then(|base| self.retired.get(base))
            .map(|r| &**r)
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

    /// Cut-over tracking: the old names the rules rename, with samples and last seen.
    pub fn renames(&self) -> &super::renames::RenameTracker {
        &self.renames
    }

    /// The per-family counters: one slot per plan (its input name, its trace as `rule`).
    pub fn families(&self) -> &super::renames::RenameTracker {
        &self.families
    }

    /// A reload's new rules take over the running rules' cut-over counts (by pack name
    /// and old name), so that "last seen" survives a reload.
    pub fn inherit_renames(&self, old: &Rules) {
        for seen in old.renames.snapshot() {
            if seen.samples == 0 {
                continue;
            }
            let Some(name) = old.packs.get(seen.pack as usize).map(|p| &p.name) else {
                continue;
            };
            let Some(pack) = self.packs.iter().position(|p| &p.name == name) else {
                continue;
            };
            let slot = if seen.from == super::renames::OTHER {
                self.renames.other(pack as u16)
            } else {
                self.renames
                    .slot(pack as u16, &seen.from, &seen.to, &seen.rule)
            };
            let last_ms = seen.last_seen.map(|s| (s * 1000.0) as i64).unwrap_or(0);
            self.renames.record(&[(slot, seen.samples)], last_ms);
        }
        // The per-family counts too, under the new rules' slot of the same name (a
        // plan whose rules changed starts from the old counts of its name).
        for seen in old.families.snapshot() {
            if seen.samples == 0 && seen.series == 0 || seen.from == super::renames::OTHER {
                continue;
            }
            let slot = match self.lookup(&seen.from) {
                Some(Resolution::Plan(p)) => p.family_slot,
                _ => None,
            };
            if let Some(slot) = slot {
                let last_ms = seen.last_seen.map(|s| (s * 1000.0) as i64).unwrap_or(0);
                self.families
                    .record_families(&[(slot, seen.series, seen.samples)], last_ms);
            }
        }
    }

    pub fn reasons(&self) -> &[String] {
        &self.reasons
    }

    /// Labels some rule may give another value, add or remove, sorted: every other
    /// label of a mapped series has the value its input series gave it (or is absent
    /// as there). Routing reads a tenant off the input when its label is not here.
    pub fn edited_labels(&self) -> &[Box<str>] {
        &self.edited_labels
    }

    pub fn packs(&self) -> &[PackOptions] {
        &self.packs
    }

    /// Every rule in phase order, for the web UI's `/rules` page.
    pub fn rule_list(&self) -> Vec<RuleInfo> {
        let mut out: Vec<RuleInfo> = self
            .rules
            .iter()
            .map(|r| RuleInfo {
                pack: self
                    .packs
                    .get(r.pack as usize)
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                phase: match r.phase {
                    PHASE_DROP => "drop",
                    PHASE_MIGRATE => "migrate",
                    PHASE_DEDUP => "dedup",
                    PHASE_UNIT => "unit",
                    PHASE_TOTAL => "total",
                    _ => "copy",
                },
                phase_order: r.phase,
                matches: match &r.matcher {
                    Matcher::Exact(f) => f.join(", "),
                    Matcher::Prefix(p) => format!("prefix {p}"),
                    Matcher::Regex(re) => format!("regex {}", re.as_str()),
                },
                describe: r.describe.clone(),
            })
            .collect();
        out.sort_by_key(|r| r.phase_order);
        out
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

    /// Every label rename of every rule (old → new), deduplicated: what a series' label
    /// names may become (for comparing query results across a migration).
    pub fn label_renames(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for r in &self.rules {
            for (from, to) in &r.rename_labels {
                let pair = (from.to_string(), to.to_string());
                if !out.contains(&pair) {
                    out.push(pair);
                }
            }
        }
        out
    }

    /// Every label-value map of every rule: (label, old value, new value).
    pub fn label_value_maps(&self) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = Vec::new();
        for r in &self.rules {
            for (l, from, to) in &r.label_values {
                let t = (l.to_string(), from.to_string(), to.to_string());
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        out
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
