//! What a compiled plan is made of: the steps a series goes through, and how a name
//! resolves. Read by the mapper (`mapping::apply`), built by this module's compiler.

use super::*;

/// What a series' samples look like relative to its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Total,
    Bucket,
    Sum,
    Count,
    Created,
    /// The plain name of a histogram family: its native histogram series (applied only
    /// to series that carry native histograms).
    Native,
}

impl Kind {
    pub(super) fn suffix(self) -> &'static str {
        match self {
            Kind::Plain => "",
            Kind::Total => "_total",
            Kind::Bucket => "_bucket",
            Kind::Sum => "_sum",
            Kind::Count => "_count",
            Kind::Created => "_created",
            Kind::Native => "",
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
        /// Per entry of `names`: the split family's own type, unit and factor (metadata;
        /// the factor is applied by a `Scale` step conditional on the value, before this).
        outputs: Vec<SplitOutput>,
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
    /// Prometheus 3's type-and-unit labels follow the rule: a series that carries
    /// `__type__` or `__unit__` gets the family's type and unit as the rule leaves them
    /// (`unit: Some("")`: the rule rescales without naming a unit, the label goes). A
    /// series without them is not touched, so this step alone never copies labels.
    TypeAndUnit {
        type_: Option<Box<str>>,
        unit: Option<Box<str>>,
    },
}

/// The label Prometheus 3 writes a series' metric type in (`type-and-unit-labels`).
pub const TYPE_LABEL: &str = "__type__";
/// The label Prometheus 3 writes a series' unit in.
pub const UNIT_LABEL: &str = "__unit__";

impl Action {
    /// The step edits the series' labels (the mapper then works on a copy of them).
    pub fn changes_labels(&self) -> bool {
        matches!(
            self,
            Action::SetName(_)
                | Action::RenameLabel { .. }
                | Action::MapLabelValue { .. }
                | Action::SplitByLabel { .. }
                | Action::SetLabel { .. }
                | Action::DropLabel(_)
        )
    }
}

/// What one value of a `split_by_label` is written as, beyond its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitOutput {
    pub family_type: Option<FamilyType>,
    pub unit: Option<Box<str>>,
    pub scale: Option<Factor>,
}

/// Index of the built-in drop reason `tp_rank_dedup` in [`Rules::reasons`].
pub const REASON_RANK_DEDUP: u16 = 1;
/// Index of the built-in drop reason `duplicate_timestamp` in [`Rules::reasons`].
pub const REASON_DUPLICATE_TIMESTAMP: u16 = 2;

/// One label condition of a rule: `name="value"` (`match.labels`), or, without a value,
/// `name` present with any value (`match.has_labels`; an empty label is no label on the
/// wire, so present means non-empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelCond {
    pub name: Box<str>,
    pub value: Option<Box<str>>,
}

impl LabelCond {
    /// Whether a series whose label `name` has `value` (`None`: absent) meets it.
    pub fn holds(&self, value: Option<&[u8]>) -> bool {
        match (&self.value, value) {
            (Some(want), Some(v)) => want.as_bytes() == v,
            (None, Some(v)) => !v.is_empty(),
            (_, None) => false,
        }
    }
}

impl std::fmt::Display for LabelCond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}=\"{v}\"", self.name),
            None => write!(f, "{}!=\"\"", self.name),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Step {
    /// Label conditions, checked against the series' labels at that point.
    pub when: Vec<LabelCond>,
    pub action: Action,
    pub pack: u16,
}

/// Everything that happens to one input series name.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Emit the untouched original beside the result (migration window).
    pub keep_original: bool,
    /// The family is rescaled.
    pub rescales: bool,
    /// Every rule covering the name covers it as a histogram family's native series:
    /// the plan applies only to series that carry native histograms (a float series of
    /// that name passes as before).
    pub native_only: bool,
    /// A covering rule says `native_histograms: keep_unit`: a series carrying native
    /// histograms passes unrenamed and is counted (`promnorm_native_histograms_unscaled_total`).
    pub native_keep_unit: bool,
    /// For a `native_only` plan: the plan of a series without native histograms.
    pub without_native: Option<Arc<Plan>>,
    /// Human-readable trace of which rules applied, for `explain`.
    pub trace: Vec<String>,
    /// Copies emitted beside the series (`copy: true` rules).
    pub copies: Vec<CopyPlan>,
    /// The cut-over tracking slot of a plan that renames the series
    /// ([`crate::mapping::renames`]).
    pub rename_slot: Option<u32>,
    /// The per-family counters' slot of the plan (`Rules::families`).
    pub family_slot: Option<u32>,
    /// No step changes a label, a value or a native histogram: the steps only drop,
    /// keep or rename whole series. A series of this name that comes out unchanged can
    /// then not share its label set with another series of the name.
    pub keeps_labels: bool,
    /// Some exact rule writes this name (another name is renamed onto it).
    pub is_output: bool,
}

impl Plan {
    /// Sets [`Plan::keeps_labels`] from the steps (once they are final).
    pub(super) fn note_label_keeping(&mut self) {
        self.keeps_labels = self.steps.iter().all(|s| {
            matches!(
                s.action,
                Action::OnlyIf
                    | Action::Drop(_)
                    | Action::RankDedup { .. }
                    | Action::SumOverRanks(_)
                    | Action::SetName(_)
                    // Every series of the family gets the same values: two input series
                    // can land on one label set only if they differed in nothing but the
                    // unit or type they were labelled with.
                    | Action::TypeAndUnit { .. }
            )
        });
    }

    /// Notes that some exact rule writes this name, on the plan of the name's series
    /// without native histograms too.
    pub(super) fn mark_output(&mut self) {
        self.is_output = true;
        if let Some(w) = self.without_native.as_mut() {
            Arc::make_mut(w).is_output = true;
        }
    }

    /// A series of this name that no step changed may leave as its own bytes, outside
    /// the merge area: nothing else can land on its label set (see [`Plan::keeps_labels`]).
    pub fn unchanged_may_pass(&self) -> bool {
        self.keeps_labels && !self.is_output && !self.keep_original
    }
}

/// A copy of a series: a whole plan of its own (the series' steps, then the copy rule's).
#[derive(Clone, Debug)]
pub struct CopyPlan {
    pub plan: Plan,
    /// The copy rule's `unit:`, for the copy's metadata.
    pub unit: Option<Box<str>>,
    /// The copy rule's `help:`, for the copy's metadata.
    pub help: Option<Box<str>>,
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
    /// ([`crate::mapping::meta::rewrite_help`]) …
    pub rescale: Option<Factor>,
    /// … in this unit: the one its name states, else the rule's `unit:`.
    pub help_unit: Option<crate::mapping::meta::NameUnit>,
    /// The type to write; `None`: the input's (a split value with its own `type:`).
    pub family_type: Option<FamilyType>,
    /// The HELP to write in place of the input's (a rule's `help:`).
    pub help: Option<Box<str>>,
}

/// How a name resolves.
#[derive(Clone, Debug)]
pub enum Resolution {
    /// Rules apply.
    Plan(Arc<Plan>),
    /// No rule applies, but a rule produces this name: route through collision merging.
    OutputName,
}
