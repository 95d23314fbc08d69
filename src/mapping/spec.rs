//! The rule language as it is written in mapping files (`mappings/*.yaml` and users'
//! own files). Pure data; [`super::compile`] turns it into lookup structures.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One mapping file: a pack of rules with a name that configuration switches on or off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackSpec {
    pub pack: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// OpenTelemetry instruments whose every exported shape lands on one canonical name.
    #[serde(default)]
    pub otel: Vec<OtelSpec>,
    /// Tensor-parallel rank deduplication of logical families.
    #[serde(default)]
    pub rank_dedup: Option<RankDedupSpec>,
    /// Names the engine no longer writes and nothing replaces under a new name: their
    /// series pass as they come; `migrate` reports every query of them.
    #[serde(default)]
    pub retired: Vec<RetiredSpec>,
    /// Whether a built-in pack is on when configuration does not name it (`packs.builtin:
    /// all`, or a map without it). Files listed in `packs.files` are applied regardless.
    #[serde(default)]
    pub default: PackDefault,
}

/// Retired metric names, and what became of them, in words.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredSpec {
    /// Exact family names (a histogram's or counter's series are covered by its name).
    pub names: Vec<String>,
    /// When and how they went, and what to query instead if anything: "removed in vLLM
    /// 0.9 with the V0 engine's CPU swap space; no successor".
    pub removed: String,
}

/// `default: on` (the default) or `default: off`; `true`/`false` are accepted too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PackDefault {
    #[default]
    On,
    Off,
}

impl PackDefault {
    pub fn is_on(self) -> bool {
        self == PackDefault::On
    }
}

impl<'de> Deserialize<'de> for PackDefault {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(PackDefault::On),
            Raw::Bool(false) => Ok(PackDefault::Off),
            Raw::Word(w) if w == "on" => Ok(PackDefault::On),
            Raw::Word(w) if w == "off" => Ok(PackDefault::Off),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "default must be on or off, not {w:?}"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FamilyType {
    /// Covers `F`, `F_total`, `F_bucket`, `F_sum`, `F_count`, `F_created`.
    #[default]
    Any,
    /// Covers `F` and `F_total` (both written as `G_total`) and `F_created`.
    Counter,
    Gauge,
    /// Classic histogram: `F_bucket`, `F_sum`, `F_count`, `F_created`.
    Histogram,
    /// `F{quantile}`, `F_sum`, `F_count`, `F_created`.
    Summary,
    Info,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(rename = "match")]
    pub matcher: MatchSpec,
    #[serde(default, rename = "type")]
    pub family_type: FamilyType,
    /// Drop every series of the family; the value is the reason counted in
    /// `promnorm_samples_dropped_total{reason}`.
    #[serde(default)]
    pub drop: Option<String>,
    /// New family name (`$1`… refer to regex groups; for a prefix match, the prefix is replaced).
    #[serde(default)]
    pub rename: Option<String>,
    /// Exact rational factor: `"1/1000"`, `"1048576"`, `"2^30"`.
    #[serde(default)]
    pub scale: Option<String>,
    /// Unit written into forwarded metadata for the family.
    #[serde(default)]
    pub unit: Option<String>,
    /// HELP written into forwarded metadata for the family, in place of the input's
    /// (names defined by a standard carry the standard's description).
    #[serde(default)]
    pub help: Option<String>,
    #[serde(default)]
    pub rename_labels: BTreeMap<String, String>,
    /// label → (old value → new value)
    #[serde(default)]
    pub label_values: BTreeMap<String, BTreeMap<String, String>>,
    #[serde(default)]
    pub split_by_label: Option<SplitSpec>,
    #[serde(default)]
    pub set_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub drop_labels: Vec<String>,
    /// Emit the rewritten series as a copy, beside the series, which goes on unchanged.
    /// Copy rules apply after every other phase, to the series as the other rules leave it.
    #[serde(default)]
    pub copy: bool,
    /// What the rule does to the family's native histogram series: `follow` (default: the
    /// same rename and rescale as the classic series) or `keep_unit` (forwarded unrenamed
    /// in the old unit, counted in `promnorm_native_histograms_unscaled_total`).
    #[serde(default)]
    pub native_histograms: NativeHistograms,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NativeHistograms {
    #[default]
    Follow,
    KeepUnit,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    #[serde(default)]
    pub family: Option<String>,
    #[serde(default)]
    pub families: Vec<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    /// Anchored: `^(?:…)$` is implied.
    #[serde(default)]
    pub regex: Option<String>,
    /// Exact label matchers; the rule applies only to series that carry all of them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Label names the rule requires with any (non-empty) value.
    #[serde(default)]
    pub has_labels: Vec<String>,
}

/// A family whose label value chooses the new name; the label is removed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    pub label: String,
    pub names: BTreeMap<String, SplitTarget>,
}

/// What one value of a split becomes: a family name, or a family name with its own
/// type, factor and unit (exporters that pack sub-metrics *and their units* into a label
/// value, such as the TensorRT-LLM Triton backend).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SplitTarget {
    Name(String),
    Full(SplitTargetSpec),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitTargetSpec {
    pub name: String,
    /// The type the split family is written as (default: the rule's).
    #[serde(default, rename = "type")]
    pub family_type: Option<FamilyType>,
    /// Factor for this value's series only, after the rule's own `scale`.
    #[serde(default)]
    pub scale: Option<String>,
    /// Unit of this family's forwarded metadata (default: the rule's).
    #[serde(default)]
    pub unit: Option<String>,
}

impl SplitTarget {
    pub fn name(&self) -> &str {
        match self {
            SplitTarget::Name(n) => n,
            SplitTarget::Full(f) => &f.name,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtelSpec {
    /// The instrument name as the application registers it, e.g. `lmcache_mp.lookup_hit`.
    pub name: String,
    /// The instrument unit's Prometheus suffix (`tokens`, `requests`, `seconds`…), if any.
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default, rename = "type")]
    pub family_type: FamilyType,
    /// Attribute keys (`gen_ai.operation.name`) whose label names follow the spelling of
    /// the instrument's name (escaped `gen_ai_operation_name`, or as registered).
    #[serde(default)]
    pub attributes: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankDedupSpec {
    #[serde(default = "default_rank_label")]
    pub label: String,
    #[serde(default = "default_rank_keep")]
    pub keep: String,
    /// Families (by name prefix) whose series are logical unless listed as physical.
    pub prefixes: Vec<String>,
    #[serde(default)]
    pub physical: PhysicalSpec,
    /// Also emit physical families summed over ranks, as series without the rank label.
    #[serde(default)]
    pub sum_over_ranks: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhysicalSpec {
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(default)]
    pub prefixes: Vec<String>,
    #[serde(default)]
    pub suffixes: Vec<String>,
}

fn default_rank_label() -> String {
    "tp_rank".into()
}
fn default_rank_keep() -> String {
    "0".into()
}
