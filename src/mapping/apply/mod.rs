//! Applies compiled [`Rules`] to a decoded request and encodes the result.
//!
//! Untouched series are copied out as their original bytes. Touched series are rebuilt
//! from spans of the input plus a per-request byte arena, then merged by label set so
//! that two inputs renamed onto one output never produce duplicate or out-of-order
//! samples. All buffers live in [`Mapper`] and are reused, so a warm request allocates
//! nothing per sample.

mod le;
mod merge;
mod metadata;
mod taps;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ahash::{AHashMap, AHashSet};

use super::cache::NameCache;
use super::compile::{
    Action, MetadataPlan, Plan, REASON_DUPLICATE_TIMESTAMP, REASON_RANK_DEDUP, Resolution, Rules,
    ScaleTarget, Step,
};
use super::meta;
use super::number::{FloatStyle, StyleEvidence, parse_float, style_of, write_float};
use crate::wire::decode::{DecodedRequest, Range32, SampleView, SeriesView, Span};
use crate::wire::encode::{SeriesWriter, write_metadata, write_raw_metadata, write_raw_series};

/// Prometheus' stale marker. Compared by bits, never by `is_nan()`.
pub use crate::wire::STALE_NAN_BITS;

const NONE: u32 = u32::MAX;
/// The tap set of a pipeline without a derive stage.
static NO_TAPS: std::sync::LazyLock<TapSet> = std::sync::LazyLock::new(TapSet::default);
/// The "pack" of steps that are not from a pack (the metadata `_total` fix).
const METADATA_FIX_PACK: u16 = u16::MAX;

#[derive(Clone, Copy, Debug)]
enum Str {
    In(Span),
    Arena(u32, u32),
}

#[derive(Clone, Copy, Debug)]
struct WorkLabel {
    name: Str,
    value: Str,
    renamed: bool,
}

#[derive(Clone, Copy, Debug)]
struct OutSeries {
    labels: Range32,
    /// Rank label to sum this physical series over (derive stage), if its plan says so.
    rank_label: Option<Str>,
    first_chunk: u32,
    last_chunk: u32,
    next_same_hash: u32,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    samples: Range32,
    exemplars: Range32,
    histograms: Range32,
    next: u32,
}

#[derive(Clone, Copy, Debug)]
struct ExemplarOut {
    labels: Range32,
    value_bits: u64,
    timestamp: i64,
}

/// Per-request counts, flushed into telemetry by the caller.
#[derive(Debug, Default, Clone)]
pub struct MapStats {
    /// Samples (float samples plus native histograms) dropped, per reason index.
    pub dropped: Vec<u64>,
    /// Series renamed / rescaled, per pack index.
    pub renamed: Vec<u64>,
    pub rescaled: Vec<u64>,
    pub collisions: u64,
    pub native_unscaled: u64,
    /// Series given `_total` because their family's metadata says COUNTER.
    pub metadata_total_fixes: u64,
    pub series_out: u64,
    pub samples_out: u64,
    pub histograms_out: u64,
    pub metadata_out: u64,
}

impl MapStats {
    fn reset(&mut self, reasons: usize, packs: usize) {
        self.dropped.clear();
        self.dropped.resize(reasons, 0);
        self.renamed.clear();
        self.renamed.resize(packs, 0);
        self.rescaled.clear();
        self.rescaled.resize(packs, 0);
        self.collisions = 0;
        self.native_unscaled = 0;
        self.metadata_total_fixes = 0;
        self.series_out = 0;
        self.samples_out = 0;
        self.histograms_out = 0;
        self.metadata_out = 0;
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }
}

/// Output metric names the derive stage reads (inputs of derived series). The mapper
/// records the output series with these names, after every rule has applied.
#[derive(Debug, Default, Clone)]
pub struct TapSet {
    names: AHashSet<Box<[u8]>>,
}

/// Counter families learnt from `MetricMetadata` (type COUNTER, no `_total`, unknown to
/// every pack): their series get `_total` (docs/rules.md). Shared by all workers; a mapper
/// works on a snapshot it refreshes when the version moves, so the hot path takes no lock.
#[derive(Debug, Default)]
pub struct CounterFamilies {
    set: Mutex<Arc<AHashSet<Box<str>>>>,
    version: AtomicU64,
}

/// What the mapping stage needs besides the rules.
#[derive(Clone, Copy, Default)]
pub struct MapContext<'a> {
    /// Output names to record for the derive stage.
    pub taps: Option<&'a TapSet>,
    /// Counter families learnt from metadata (the metadata `_total` fix), when enabled.
    pub counters: Option<&'a CounterFamilies>,
}

#[derive(Clone, Copy, Debug)]
struct Tapped {
    labels: Range32,
    samples: Range32,
    rank_label: Option<Str>,
}

/// One recorded output series: its final labels (with `__name__`) and float samples.
pub struct TappedSeries<'a> {
    mapper: &'a Mapper,
    buf: &'a [u8],
    tapped: Tapped,
}

/// Reusable per-worker state of the mapping stage.
#[derive(Default)]
pub struct Mapper {
    arena: Vec<u8>,
    work: Vec<WorkLabel>,
    out_series: Vec<OutSeries>,
    out_labels: Vec<WorkLabel>,
    chunks: Vec<Chunk>,
    samples: Vec<SampleView>,
    exemplars: Vec<ExemplarOut>,
    histograms: Vec<u32>,
    index: AHashMap<u64, u32>,
    hasher: ahash::RandomState,
    plan_cache: NameCache<Option<Arc<Plan>>>,
    meta_cache: NameCache<Option<Arc<MetadataPlan>>>,
    /// A rescaled family's restated HELP text, reused across entries.
    help_buf: Vec<u8>,
    meta_seen: AHashSet<u64>,
    le_styles: NameCache<FloatStyle>,
    gather_samples: Vec<SampleView>,
    gather_hist: Vec<(i64, u32)>,
    gather_ex: Vec<ExemplarOut>,
    series_buf: Vec<u8>,
    taps: Vec<Tapped>,
    tap_labels: Vec<(Str, Str)>,
    tap_samples: Vec<SampleView>,
    counters_seen: Arc<AHashSet<Box<str>>>,
    counters_version: u64,
    total_fix_plans: NameCache<Arc<Plan>>,
    learnt: Vec<Box<str>>,
    pub stats: MapStats,
}

impl Mapper {
    pub fn new() -> Self {
        Self::default()
    }

    fn reset(&mut self, rules: &Rules) {
        self.arena.clear();
        self.work.clear();
        self.out_series.clear();
        self.out_labels.clear();
        self.chunks.clear();
        self.samples.clear();
        self.exemplars.clear();
        self.histograms.clear();
        self.index.clear();
        self.meta_seen.clear();
        self.taps.clear();
        self.tap_labels.clear();
        self.tap_samples.clear();
        self.stats.reset(rules.reasons().len(), rules.packs().len());
    }

    /// Maps `req` (decoded from `buf`) and appends the encoded `WriteRequest` to `out`.
    /// Output series named in `taps` are recorded for [`Mapper::tapped`].
    pub fn map_request(
        &mut self,
        rules: &Rules,
        buf: &[u8],
        req: &DecodedRequest,
        out: &mut Vec<u8>,
        ctx: &MapContext<'_>,
    ) {
        self.reset(rules);
        let taps = ctx.taps.unwrap_or(&NO_TAPS);
        if let Some(cf) = ctx.counters
            && cf.version.load(Ordering::Acquire) != self.counters_version
            && let Some((v, snap)) = cf.snapshot()
        {
            self.counters_version = v;
            self.counters_seen = snap;
        }
        for s in &req.series {
            let name = s.name.str(buf);
            let resolution = match self.resolve(rules, name) {
                None if ctx.counters.is_some() => self.series_total_fix(s, name),
                r => r,
            };
            match resolution {
                None if s.canonical => {
                    write_raw_series(out, s.raw.bytes(buf));
                    self.count_out(s);
                    self.tap_raw(taps, buf, req, s);
                }
                None | Some(Resolved::OutputName) => {
                    self.apply(None, buf, req, s);
                }
                Some(Resolved::Plan(plan)) => {
                    if plan.keep_original {
                        if s.canonical {
                            write_raw_series(out, s.raw.bytes(buf));
                            self.count_out(s);
                            self.tap_raw(taps, buf, req, s);
                        } else {
                            self.apply(None, buf, req, s);
                        }
                    }
                    // A copy's plan repeats the series' steps: a series they drop has no
                    // copies (and its drop is counted once).
                    if self.apply(Some(&plan), buf, req, s) {
                        for c in &plan.copies {
                            self.apply(Some(&c.plan), buf, req, s);
                        }
                    }
                }
            }
        }
        self.encode_merged(buf, req, out, taps);
        self.map_metadata(rules, buf, req, out, ctx.counters.is_some());
        if let Some(cf) = ctx.counters
            && !self.learnt.is_empty()
        {
            cf.learn(&mut self.learnt);
        }
    }

    fn count_out(&mut self, s: &SeriesView) {
        self.stats.series_out += 1;
        self.stats.samples_out += s.samples.len() as u64;
        self.stats.histograms_out += s.histograms.len() as u64;
    }

    fn resolve(&mut self, rules: &Rules, name: &str) -> Option<Resolved> {
        match rules.lookup(name) {
            Some(Resolution::Plan(p)) => return Some(Resolved::Plan(p.clone())),
            Some(Resolution::OutputName) => return Some(Resolved::OutputName),
            None => {}
        }
        if rules.needs_pattern_lookup() {
            let plan = self
                .plan_cache
                .get_or_insert_with(name, || rules.plan_for(name).map(Arc::new));
            if plan.is_some() {
                return plan.map(Resolved::Plan);
            }
        }
        self.total_fix(name)
    }

    /// The metadata `_total` fix: a series named exactly like a learnt counter family.
    fn total_fix(&mut self, name: &str) -> Option<Resolved> {
        if self.counters_seen.is_empty() || !self.counters_seen.contains(name) {
            return None;
        }
        Some(self.total_fix_plan(name))
    }

    /// The plan that gives `name` the suffix `_total` (cached per name).
    fn total_fix_plan(&mut self, name: &str) -> Resolved {
        if let Some(p) = self.total_fix_plans.get(name) {
            return Resolved::Plan(p.clone());
        }
        let plan = Arc::new(Plan {
            steps: vec![Step {
                when: Vec::new(),
                action: Action::SetName(format!("{name}_total").into()),
                pack: METADATA_FIX_PACK,
            }],
            keep_original: false,
            rescales: false,
            trace: vec![format!("metadata: {name} is a COUNTER: {name}_total")],
            copies: Vec::new(),
        });
        self.total_fix_plans.insert(name, plan.clone());
        Resolved::Plan(plan)
    }

    #[inline]
    fn str_bytes<'a>(&'a self, s: Str, buf: &'a [u8]) -> &'a [u8] {
        match s {
            Str::In(span) => span.bytes(buf),
            Str::Arena(a, b) => &self.arena[a as usize..b as usize],
        }
    }

    fn intern(&mut self, bytes: &[u8]) -> Str {
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        Str::Arena(start, self.arena.len() as u32)
    }

    fn find(&self, buf: &[u8], name: &[u8]) -> Option<usize> {
        self.work
            .iter()
            .position(|l| self.str_bytes(l.name, buf) == name)
    }

    fn matches(&self, buf: &[u8], when: &[(Box<str>, Box<str>)]) -> bool {
        when.iter().all(|(n, v)| {
            self.find(buf, n.as_bytes())
                .is_some_and(|i| self.str_bytes(self.work[i].value, buf) == v.as_bytes())
        })
    }

    fn drop_series(&mut self, s: &SeriesView, reason: u16) {
        if let Some(c) = self.stats.dropped.get_mut(reason as usize) {
            *c += (s.samples.len() + s.histograms.len()) as u64;
        }
    }

    /// Runs a plan over one series and puts the result into the merge area; false when
    /// the plan drops it (or, for a copy, its labels do not match).
    fn apply(
        &mut self,
        plan: Option<&Plan>,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
    ) -> bool {
        self.work.clear();
        for l in &req.labels[s.labels.usize()] {
            self.work.push(WorkLabel {
                name: Str::In(l.name),
                value: Str::In(l.value),
                renamed: false,
            });
        }
        let mut scale: Option<(super::number::Factor, ScaleTarget)> = None;
        let mut renamed_by: Option<u16> = None;
        let mut rank_label: Option<Str> = None;
        if let Some(plan) = plan {
            for step in &plan.steps {
                if !step.when.is_empty() && !self.matches(buf, &step.when) {
                    if matches!(step.action, Action::OnlyIf) {
                        return false;
                    }
                    continue;
                }
                match &step.action {
                    Action::OnlyIf => {}
                    Action::Drop(reason) => {
                        self.drop_series(s, *reason);
                        return false;
                    }
                    Action::SetName(n) => {
                        let v = self.intern(n.as_bytes());
                        if let Some(i) = self.find(buf, b"__name__") {
                            self.work[i].value = v;
                        }
                        renamed_by = Some(step.pack);
                    }
                    Action::RenameLabel { from, to } => {
                        if let Some(i) = self.find(buf, from.as_bytes()) {
                            let n = self.intern(to.as_bytes());
                            self.work[i].name = n;
                            self.work[i].renamed = true;
                            renamed_by = Some(step.pack);
                        }
                    }
                    Action::MapLabelValue { label, from, to } => {
                        if let Some(i) = self.find(buf, label.as_bytes())
                            && self.str_bytes(self.work[i].value, buf) == from.as_bytes()
                        {
                            self.work[i].value = self.intern(to.as_bytes());
                            renamed_by = Some(step.pack);
                        }
                    }
                    Action::SplitByLabel { label, names } => {
                        if let Some(i) = self.find(buf, label.as_bytes()) {
                            let v = self.str_bytes(self.work[i].value, buf);
                            if let Some((_, n)) = names.iter().find(|(val, _)| val.as_bytes() == v)
                            {
                                let nv = self.intern(n.as_bytes());
                                self.work.remove(i);
                                if let Some(j) = self.find(buf, b"__name__") {
                                    self.work[j].value = nv;
                                }
                                renamed_by = Some(step.pack);
                            }
                        }
                    }
                    Action::SetLabel { name, value } => {
                        let v = self.intern(value.as_bytes());
                        match self.find(buf, name.as_bytes()) {
                            Some(i) => self.work[i].value = v,
                            None => {
                                let n = self.intern(name.as_bytes());
                                self.work.push(WorkLabel {
                                    name: n,
                                    value: v,
                                    renamed: false,
                                });
                            }
                        }
                    }
                    Action::DropLabel(name) => {
                        if let Some(i) = self.find(buf, name.as_bytes()) {
                            self.work.remove(i);
                        }
                    }
                    Action::RankDedup { label, keep } => {
                        if let Some(i) = self.find(buf, label.as_bytes())
                            && self.str_bytes(self.work[i].value, buf) != keep.as_bytes()
                        {
                            self.drop_series(s, REASON_RANK_DEDUP);
                            return false;
                        }
                    }
                    Action::SumOverRanks(label) => {
                        if self.find(buf, label.as_bytes()).is_some() {
                            rank_label = Some(self.intern(label.as_bytes()));
                        }
                    }
                    Action::Scale { factor, target } => {
                        scale = Some(match scale {
                            Some((f, _)) => (f.then(*factor), *target),
                            None => (*factor, *target),
                        });
                        if let Some(c) = self.stats.rescaled.get_mut(step.pack as usize) {
                            *c += 1;
                        }
                    }
                }
            }
        }
        if renamed_by == Some(METADATA_FIX_PACK) {
            self.stats.metadata_total_fixes += 1;
        } else if let Some(p) = renamed_by
            && let Some(c) = self.stats.renamed.get_mut(p as usize)
        {
            *c += 1;
        }
        if let Some((factor, ScaleTarget::Le)) = scale {
            self.rescale_le(buf, req, s, factor);
        }
        self.finish_labels(buf);
        // Bucket counts are counts: only `le` and exemplars change for `_bucket` series.
        let value_factor = scale.and_then(|(f, t)| (t == ScaleTarget::Value).then_some(f));
        self.insert(buf, req, s, value_factor, scale.map(|(f, _)| f), rank_label);
        true
    }
}

enum Resolved {
    Plan(Arc<Plan>),
    OutputName,
}
