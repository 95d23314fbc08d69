//! Applies compiled [`Rules`] to a decoded request and encodes the result.
//!
//! Untouched series are copied out as their original bytes. Touched series are rebuilt
//! from spans of the input plus a per-request byte arena, then merged by label set so
//! that two inputs renamed onto one output never produce duplicate or out-of-order
//! samples. All buffers live in [`Mapper`] and are reused, so a warm request allocates
//! nothing per sample.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ahash::{AHashMap, AHashSet};

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
const PLAN_CACHE_LIMIT: usize = 100_000;
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

impl TapSet {
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        TapSet {
            names: names.into_iter().map(|n| n.as_bytes().into()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    #[inline]
    pub fn contains(&self, name: &[u8]) -> bool {
        self.names.contains(name)
    }
}

/// Counter families learnt from `MetricMetadata` (type COUNTER, no `_total`, unknown to
/// every pack): their series get `_total` (docs/rules.md). Shared by all workers; a mapper
/// works on a snapshot it refreshes when the version moves, so the hot path takes no lock.
#[derive(Debug, Default)]
pub struct CounterFamilies {
    set: Mutex<Arc<AHashSet<Box<str>>>>,
    version: AtomicU64,
}

impl CounterFamilies {
    /// Families remembered at most (metadata of unbounded cardinality cannot grow it).
    pub const LIMIT: usize = 100_000;

    pub fn len(&self) -> usize {
        self.set.lock().map(|s| s.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn learn(&self, names: &mut Vec<Box<str>>) {
        let Ok(mut guard) = self.set.lock() else {
            return;
        };
        let mut next = (**guard).clone();
        for n in names.drain(..) {
            if next.len() < Self::LIMIT {
                next.insert(n);
            }
        }
        *guard = Arc::new(next);
        self.version.fetch_add(1, Ordering::Release);
    }

    fn snapshot(&self) -> Option<(u64, Arc<AHashSet<Box<str>>>)> {
        let guard = self.set.lock().ok()?;
        Some((self.version.load(Ordering::Acquire), guard.clone()))
    }
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

impl<'a> TappedSeries<'a> {
    pub fn labels(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone + 'a {
        let (m, buf) = (self.mapper, self.buf);
        m.tap_labels[self.tapped.labels.usize()]
            .iter()
            .map(move |(n, v)| (m.str_bytes(*n, buf), m.str_bytes(*v, buf)))
    }

    pub fn name(&self) -> &'a [u8] {
        self.labels()
            .find(|(n, _)| *n == b"__name__")
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    pub fn samples(&self) -> &'a [SampleView] {
        &self.mapper.tap_samples[self.tapped.samples.usize()]
    }

    /// The rank label to sum this physical series over, when its pack asks for it.
    pub fn rank_label(&self) -> Option<&'a [u8]> {
        self.tapped
            .rank_label
            .map(|l| self.mapper.str_bytes(l, self.buf))
    }
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
    plan_cache: AHashMap<Box<str>, Option<Arc<Plan>>>,
    meta_cache: AHashMap<Box<str>, Option<Arc<MetadataPlan>>>,
    /// A rescaled family's restated HELP text, reused across entries.
    help_buf: Vec<u8>,
    meta_seen: AHashSet<u64>,
    le_styles: AHashMap<Box<str>, FloatStyle>,
    gather_samples: Vec<SampleView>,
    gather_hist: Vec<(i64, u32)>,
    gather_ex: Vec<ExemplarOut>,
    series_buf: Vec<u8>,
    taps: Vec<Tapped>,
    tap_labels: Vec<(Str, Str)>,
    tap_samples: Vec<SampleView>,
    counters_seen: Arc<AHashSet<Box<str>>>,
    counters_version: u64,
    total_fix_plans: AHashMap<Box<str>, Arc<Plan>>,
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
            let resolution = self.resolve(rules, name);
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

    /// The output series recorded for the derive stage by the last [`Mapper::map_request`].
    pub fn tapped<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = TappedSeries<'a>> + 'a {
        self.taps.iter().map(move |t| TappedSeries {
            mapper: self,
            buf,
            tapped: *t,
        })
    }

    fn tap_raw(&mut self, taps: &TapSet, buf: &[u8], req: &DecodedRequest, s: &SeriesView) {
        if taps.is_empty() || s.samples.is_empty() || !taps.contains(s.name.bytes(buf)) {
            return;
        }
        let l_start = self.tap_labels.len() as u32;
        for l in &req.labels[s.labels.usize()] {
            self.tap_labels.push((Str::In(l.name), Str::In(l.value)));
        }
        let s_start = self.tap_samples.len() as u32;
        self.tap_samples
            .extend_from_slice(&req.samples[s.samples.usize()]);
        self.close_tap(l_start, s_start, None);
    }

    /// Records the tap whose labels and samples were appended from these offsets on.
    fn close_tap(&mut self, l_start: u32, s_start: u32, rank_label: Option<Str>) {
        self.taps.push(Tapped {
            labels: Range32 {
                start: l_start,
                end: self.tap_labels.len() as u32,
            },
            samples: Range32 {
                start: s_start,
                end: self.tap_samples.len() as u32,
            },
            rank_label,
        });
    }

    /// Records a merged output series if the derive stage wants it, with the samples
    /// just written for it: `samples` of one chunk, or (`None`) the gathered ones.
    fn tap_merged(&mut self, taps: &TapSet, buf: &[u8], o: OutSeries, samples: Option<Range32>) {
        if o.rank_label.is_none() {
            let out_labels = &self.out_labels[o.labels.usize()];
            let Some(name) = out_labels
                .iter()
                .find(|l| self.str_bytes(l.name, buf) == b"__name__")
            else {
                return;
            };
            if !taps.contains(self.str_bytes(name.value, buf)) {
                return;
            }
        }
        let l_start = self.tap_labels.len() as u32;
        for i in o.labels.usize() {
            let l = self.out_labels[i];
            self.tap_labels.push((l.name, l.value));
        }
        let s_start = self.tap_samples.len() as u32;
        match samples {
            Some(r) => self.tap_samples.extend_from_slice(&self.samples[r.usize()]),
            None => self.tap_samples.extend_from_slice(&self.gather_samples),
        }
        self.close_tap(l_start, s_start, o.rank_label);
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
            let plan = match self.plan_cache.get(name) {
                Some(cached) => cached.clone(),
                None => {
                    if self.plan_cache.len() >= PLAN_CACHE_LIMIT {
                        self.plan_cache.clear();
                    }
                    let plan = rules.plan_for(name).map(Arc::new);
                    self.plan_cache.insert(name.into(), plan.clone());
                    plan
                }
            };
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
        if let Some(p) = self.total_fix_plans.get(name) {
            return Some(Resolved::Plan(p.clone()));
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
        if self.total_fix_plans.len() >= PLAN_CACHE_LIMIT {
            self.total_fix_plans.clear();
        }
        self.total_fix_plans.insert(name.into(), plan.clone());
        Some(Resolved::Plan(plan))
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

    fn rescale_le(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        factor: super::number::Factor,
    ) {
        let Some(i) = self.find(buf, b"le") else {
            return;
        };
        let text_bytes = self.str_bytes(self.work[i].value, buf);
        let Ok(text) = std::str::from_utf8(text_bytes) else {
            return;
        };
        let Some(v) = parse_float(text) else { return };
        if !v.is_finite() {
            return;
        }
        let style = match style_of(text) {
            StyleEvidence::Known(st) => st,
            StyleEvidence::Ambiguous => self.family_le_style(buf, req, s),
        };
        let start = self.arena.len() as u32;
        write_float(&mut self.arena, factor.apply(v), style);
        self.work[i].value = Str::Arena(start, self.arena.len() as u32);
    }

    /// The `le` style of a family whose bucket at hand is ambiguous (e.g. `0.5`):
    /// learned from the family's other buckets in this request, remembered afterwards.
    fn family_le_style(&mut self, buf: &[u8], req: &DecodedRequest, s: &SeriesView) -> FloatStyle {
        let name = s.name.str(buf);
        if let Some(st) = self.le_styles.get(name) {
            return *st;
        }
        let mut found = None;
        for other in &req.series {
            if other.name.bytes(buf) != name.as_bytes() {
                continue;
            }
            for l in &req.labels[other.labels.usize()] {
                if l.name.bytes(buf) == b"le"
                    && let StyleEvidence::Known(st) = style_of(l.value.str(buf))
                {
                    found = Some(st);
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        match found {
            Some(st) => {
                if self.le_styles.len() < PLAN_CACHE_LIMIT {
                    self.le_styles.insert(name.into(), st);
                }
                st
            }
            None => FloatStyle::Go,
        }
    }

    /// Removes empty values, sorts by name and resolves duplicate names (a label renamed
    /// onto an existing one loses to the existing one).
    fn finish_labels(&mut self, buf: &[u8]) {
        let mut work = std::mem::take(&mut self.work);
        work.retain(|l| !self.str_bytes(l.value, buf).is_empty());
        work.sort_by(|a, b| {
            self.str_bytes(a.name, buf)
                .cmp(self.str_bytes(b.name, buf))
                .then(a.renamed.cmp(&b.renamed))
        });
        work.dedup_by(|later, earlier| {
            self.str_bytes(later.name, buf) == self.str_bytes(earlier.name, buf)
        });
        self.work = work;
    }

    fn label_hash(&self, buf: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        for l in &self.work {
            h.write(self.str_bytes(l.name, buf));
            h.write_u8(0xff);
            h.write(self.str_bytes(l.value, buf));
            h.write_u8(0xfe);
        }
        h.finish()
    }

    fn same_labels(&self, buf: &[u8], o: &OutSeries) -> bool {
        let theirs = &self.out_labels[o.labels.usize()];
        theirs.len() == self.work.len()
            && theirs.iter().zip(&self.work).all(|(a, b)| {
                self.str_bytes(a.name, buf) == self.str_bytes(b.name, buf)
                    && self.str_bytes(a.value, buf) == self.str_bytes(b.value, buf)
            })
    }

    fn insert(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        factor: Option<super::number::Factor>,
        exemplar_factor: Option<super::number::Factor>,
        rank_label: Option<Str>,
    ) {
        // Samples (rescaled when a factor applies; stale markers never touched).
        let s_start = self.samples.len() as u32;
        for smp in &req.samples[s.samples.usize()] {
            let value_bits = match factor {
                Some(f) if smp.value_bits != STALE_NAN_BITS => {
                    f.apply(f64::from_bits(smp.value_bits)).to_bits()
                }
                _ => smp.value_bits,
            };
            self.samples.push(SampleView {
                value_bits,
                timestamp: smp.timestamp,
            });
        }
        let e_start = self.exemplars.len() as u32;
        for ex in &req.exemplars[s.exemplars.usize()] {
            let value_bits = match exemplar_factor {
                Some(f) if ex.value_bits != STALE_NAN_BITS => {
                    f.apply(f64::from_bits(ex.value_bits)).to_bits()
                }
                _ => ex.value_bits,
            };
            self.exemplars.push(ExemplarOut {
                labels: ex.labels,
                value_bits,
                timestamp: ex.timestamp,
            });
        }
        let h_start = self.histograms.len() as u32;
        for hi in s.histograms.usize() {
            self.histograms.push(hi as u32);
        }
        if exemplar_factor.is_some() {
            self.stats.native_unscaled += s.histograms.len() as u64;
        }
        let chunk = Chunk {
            samples: Range32 {
                start: s_start,
                end: self.samples.len() as u32,
            },
            exemplars: Range32 {
                start: e_start,
                end: self.exemplars.len() as u32,
            },
            histograms: Range32 {
                start: h_start,
                end: self.histograms.len() as u32,
            },
            next: NONE,
        };
        let chunk_id = self.chunks.len() as u32;
        self.chunks.push(chunk);

        let hash = self.label_hash(buf);
        let mut cursor = self.index.get(&hash).copied().unwrap_or(NONE);
        let head = cursor;
        while cursor != NONE {
            let o = self.out_series[cursor as usize];
            if self.same_labels(buf, &o) {
                self.chunks[o.last_chunk as usize].next = chunk_id;
                self.out_series[cursor as usize].last_chunk = chunk_id;
                self.stats.collisions += 1;
                return;
            }
            cursor = o.next_same_hash;
        }
        let l_start = self.out_labels.len() as u32;
        self.out_labels.extend_from_slice(&self.work);
        let id = self.out_series.len() as u32;
        self.out_series.push(OutSeries {
            labels: Range32 {
                start: l_start,
                end: self.out_labels.len() as u32,
            },
            first_chunk: chunk_id,
            last_chunk: chunk_id,
            next_same_hash: head,
            rank_label,
        });
        self.index.insert(hash, id);
    }

    fn encode_merged(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        out: &mut Vec<u8>,
        taps: &TapSet,
    ) {
        let mut series_buf = std::mem::take(&mut self.series_buf);
        for oi in 0..self.out_series.len() {
            let o = self.out_series[oi];
            let mut w = SeriesWriter::new(&mut series_buf);
            for l in &self.out_labels[o.labels.usize()] {
                w.label(self.str_bytes(l.name, buf), self.str_bytes(l.value, buf));
            }
            let first = self.chunks[o.first_chunk as usize];
            if first.next == NONE {
                for smp in &self.samples[first.samples.usize()] {
                    w.sample(smp.value_bits, smp.timestamp);
                }
                self.stats.samples_out += first.samples.len() as u64;
                for ex in &self.exemplars[first.exemplars.usize()] {
                    let labels = req.labels[ex.labels.usize()]
                        .iter()
                        .map(|l| (l.name.bytes(buf), l.value.bytes(buf)));
                    w.exemplar(labels, ex.value_bits, ex.timestamp);
                }
                for &hi in &self.histograms[first.histograms.usize()] {
                    w.histogram_raw(req.histograms[hi as usize].raw.bytes(buf));
                }
                self.stats.histograms_out += first.histograms.len() as u64;
                if (!taps.is_empty() || o.rank_label.is_some()) && !first.samples.is_empty() {
                    self.tap_merged(taps, buf, o, Some(first.samples));
                }
            } else {
                self.encode_chunks(&mut w, o.first_chunk, buf, req);
                if (!taps.is_empty() || o.rank_label.is_some()) && !self.gather_samples.is_empty() {
                    self.tap_merged(taps, buf, o, None);
                }
            }
            w.finish(out);
            self.stats.series_out += 1;
        }
        self.series_buf = series_buf;
    }

    /// Merges the chunks of several inputs that landed on one label set: timestamp order,
    /// first sample kept for a repeated timestamp (the rest counted as dropped).
    fn encode_chunks(
        &mut self,
        w: &mut SeriesWriter<'_>,
        first: u32,
        buf: &[u8],
        req: &DecodedRequest,
    ) {
        self.gather_samples.clear();
        self.gather_hist.clear();
        self.gather_ex.clear();
        let mut c = first;
        while c != NONE {
            let ch = self.chunks[c as usize];
            self.gather_samples
                .extend_from_slice(&self.samples[ch.samples.usize()]);
            self.gather_ex
                .extend_from_slice(&self.exemplars[ch.exemplars.usize()]);
            for &hi in &self.histograms[ch.histograms.usize()] {
                self.gather_hist
                    .push((req.histograms[hi as usize].timestamp, hi));
            }
            c = ch.next;
        }
        // Stable sorts keep the first-received sample first among equal timestamps.
        self.gather_samples.sort_by_key(|s| s.timestamp);
        let before = self.gather_samples.len();
        self.gather_samples.dedup_by_key(|s| s.timestamp);
        let mut dups = (before - self.gather_samples.len()) as u64;
        self.gather_hist.sort_by_key(|h| h.0);
        let before = self.gather_hist.len();
        self.gather_hist.dedup_by_key(|h| h.0);
        dups += (before - self.gather_hist.len()) as u64;
        self.gather_ex.sort_by_key(|e| e.timestamp);
        self.gather_ex.dedup_by_key(|e| e.timestamp);
        if let Some(d) = self
            .stats
            .dropped
            .get_mut(REASON_DUPLICATE_TIMESTAMP as usize)
        {
            *d += dups;
        }
        for smp in &self.gather_samples {
            w.sample(smp.value_bits, smp.timestamp);
        }
        self.stats.samples_out += self.gather_samples.len() as u64;
        for ex in &self.gather_ex {
            let labels = req.labels[ex.labels.usize()]
                .iter()
                .map(|l| (l.name.bytes(buf), l.value.bytes(buf)));
            w.exemplar(labels, ex.value_bits, ex.timestamp);
        }
        for &(_, hi) in &self.gather_hist {
            w.histogram_raw(req.histograms[hi as usize].raw.bytes(buf));
        }
        self.stats.histograms_out += self.gather_hist.len() as u64;
    }

    fn map_metadata(
        &mut self,
        rules: &Rules,
        buf: &[u8],
        req: &DecodedRequest,
        out: &mut Vec<u8>,
        learn_counters: bool,
    ) {
        for md in &req.metadata {
            let family = md.family.str(buf);
            let plan = if rules.exact_name_count() == 0 && !rules.needs_pattern_lookup() {
                None
            } else if let Some(t) = self.meta_cache.get(family) {
                t.clone()
            } else {
                let t = rules.metadata_plan(family).map(Arc::new);
                if self.meta_cache.len() >= PLAN_CACHE_LIMIT {
                    self.meta_cache.clear();
                }
                self.meta_cache.insert(family.into(), t.clone());
                t
            };
            // COUNTER (1) families no pack knows, written without `_total`: learn them.
            if learn_counters
                && plan.is_none()
                && md.metric_type == 1
                && !family.ends_with("_total")
                && !self.counters_seen.contains(family)
                && !self.learnt.iter().any(|n| &**n == family)
            {
                self.learnt.push(family.into());
            }
            let Some(plan) = plan else {
                if self.first_meta(family.as_bytes()) {
                    write_raw_metadata(out, md.raw.bytes(buf));
                    self.stats.metadata_out += 1;
                }
                continue;
            };
            if plan.keep_input && self.first_meta(family.as_bytes()) {
                write_raw_metadata(out, md.raw.bytes(buf));
                self.stats.metadata_out += 1;
            }
            for o in &plan.outputs {
                if !self.first_meta(o.name.as_bytes()) {
                    continue; // re-united family: one metadata entry is enough
                }
                let unit = o
                    .unit
                    .as_deref()
                    .map(str::as_bytes)
                    .unwrap_or(md.unit.bytes(buf));
                let help = match o.rescale {
                    Some(f) => {
                        meta::rewrite_help(md.help.bytes(buf), f, o.help_unit, &mut self.help_buf);
                        &self.help_buf[..]
                    }
                    None => md.help.bytes(buf),
                };
                write_metadata(out, md.metric_type, o.name.as_bytes(), help, unit);
                self.stats.metadata_out += 1;
            }
        }
    }

    /// True the first time this request writes metadata for family `name`.
    fn first_meta(&mut self, name: &[u8]) -> bool {
        let mut h = self.hasher.build_hasher();
        h.write(name);
        self.meta_seen.insert(h.finish())
    }
}

enum Resolved {
    Plan(Arc<Plan>),
    OutputName,
}
