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
mod native;
mod stats;
mod taps;
mod work;

pub use metadata::CounterFamilies;
use metadata::METADATA_FIX_PACK;
pub use stats::MapStats;
use taps::{NO_TAPS, Tapped};
pub use taps::{TapSet, TappedSeries};
use work::*;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ahash::AHashSet;

use super::cache::NameCache;
use super::compile::{
    Action, LabelCond, MetadataPlan, Plan, REASON_DUPLICATE_TIMESTAMP, REASON_RANK_DEDUP,
    Resolution, Rules, ScaleTarget, Step, TYPE_LABEL, UNIT_LABEL,
};
use super::meta;
use super::number::{FloatStyle, StyleEvidence, parse_float, style_of, write_float};
use crate::wire::decode::{
    DecodedRequest, Range32, SampleView, SeriesView, Span, is_metric_name, short_eq,
};
use crate::wire::encode::{
    SeriesWriter, label_key, write_metadata, write_raw_metadata, write_raw_series,
};
use crate::wire::held;
use crate::wire::pb::put_varint_at;

/// Prometheus' stale marker. Compared by bits, never by `is_nan()`.
pub use crate::wire::STALE_NAN_BITS;

const NONE: u32 = u32::MAX;

/// What the mapping stage needs besides the rules.
#[derive(Clone, Copy, Default)]
pub struct MapContext<'a> {
    /// Output names to record for the derive stage.
    pub taps: Option<&'a TapSet>,
    /// Counter families learnt from metadata (the metadata `_total` fix), when enabled.
    pub counters: Option<&'a CounterFamilies>,
}

/// Reusable per-worker state of the mapping stage.
#[derive(Default)]
pub struct Mapper {
    arena: Vec<u8>,
    work: Vec<WorkLabel>,
    /// Scratch of [`Mapper::finish_labels`]: the labels a step renamed or added.
    work_moved: Vec<WorkLabel>,
    out_series: Vec<OutSeries>,
    out_labels: Vec<WorkLabel>,
    /// Each output series' labels, encoded as its `TimeSeries` holds them
    /// ([`Mapper::encode_work_labels`]): hashed and compared for the merge index, and
    /// copied into the output.
    out_label_bytes: Vec<u8>,
    /// 2.0 input: the label set [`Mapper::encode_work_labels`] encoded last, in
    /// `out_label_bytes`, which the next one copies labels from.
    set_memo: crate::wire::encode::LabelMemo,
    chunks: Vec<Chunk>,
    samples: Vec<SampleView>,
    exemplars: Vec<ExemplarOut>,
    histograms: Vec<HistOut>,
    /// Rewritten (rescaled) native histograms of this request.
    hist_arena: Vec<u8>,
    native: crate::wire::histogram::NativeHistogram,
    native_scratch: Vec<(i64, f64)>,
    /// Label-set hash → first output series with it (a chain through `next_same_hash`).
    index: std::collections::HashMap<u64, u32, PreHashed>,
    /// Seeded per mapper: a sender cannot aim collisions at the merge index.
    hasher: ahash::RandomState,
    /// Every name's resolution (exact table, prefix/regex plan, learnt `_total` fix)
    /// once computed: one hash lookup per name; emptied when the learnt counter
    /// families change. A mapper lives no longer than its [`Rules`] (one pipeline).
    /// Empty while [`Mapper::map_request_unless_same`] loops over the series: the loop
    /// holds it, to lend each resolution out without cloning it.
    resolved: NameCache<Option<Resolved>>,
    meta_cache: NameCache<Option<Arc<MetadataPlan>>>,
    /// A rescaled family's restated HELP text, reused across entries.
    help_buf: Vec<u8>,
    meta_seen: AHashSet<u64>,
    le_styles: NameCache<FloatStyle>,
    /// This request's families (by name hash) whose bounds show no style: Go's.
    le_unproven: std::collections::HashMap<u64, Span, PreHashed>,
    /// Rescaled `le` texts by (factor, style, input text), see [`Mapper::rescale_le`]:
    /// a few hundred bounds in a fleet; a sender inventing bounds makes it start over.
    le_rescaled: NameCache<Box<[u8]>, 4096>,
    /// Scratch: the key of `le_rescaled`.
    le_key: Vec<u8>,
    gather_samples: Vec<SampleView>,
    gather_hist: Vec<HistOut>,
    gather_ex: Vec<ExemplarOut>,
    /// The labels of the previous series written from a 2.0 request, encoded.
    label_memo: crate::wire::encode::LabelMemo,
    taps: Vec<Tapped>,
    tap_labels: Vec<(Str, Str)>,
    tap_samples: Vec<SampleView>,
    /// The last name [`Mapper::is_tapped`] looked up in this request, and its answer.
    tap_memo: Option<(Str, bool)>,
    counters_seen: Arc<AHashSet<Box<str>>>,
    counters_version: u64,
    total_fix_plans: NameCache<Arc<Plan>>,
    learnt: Vec<Box<str>>,
    /// This request runs the metadata `_total` fix (see [`Mapper::pass_through`]).
    total_fix_on: bool,
    /// Input bytes `[start, end)` that follow `out` in the output and are not copied yet:
    /// series written as they came, one after another in the input with their framing
    /// (see [`Mapper::write_raw`]).
    pending: Option<(usize, usize)>,
    pub stats: MapStats,
}

/// What [`Mapper::map_request_unless_same`] left in its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapOutcome {
    /// The output is in `out`.
    Written,
    /// The output is the input, byte for byte; nothing was written to `out`.
    SameAsInput,
}

/// Where the 1.0 `WriteRequest` field holding the series `[start, end)` of `buf` starts,
/// when the bytes before it are exactly that field's key and length as
/// [`write_raw_series`] writes them (the shortest varint): the series, framing and all,
/// is then the bytes `[frame, end)` of the input.
#[inline]
fn framed_series_start(buf: &[u8], start: usize, end: usize) -> Option<usize> {
    let len = end.checked_sub(start)? as u64;
    let mut head = [0x0a; 11];
    let head_len = 1 + put_varint_at(&mut head, 1, len);
    let frame = start.checked_sub(head_len)?;
    short_eq(buf.get(frame..start)?, &head[..head_len]).then_some(frame)
}

impl Mapper {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the name caches hold (each bounded by [`super::cache::NAME_CACHE_BYTES`]
    /// of names): counted with the workspace that pools them.
    pub fn cache_bytes(&self) -> usize {
        self.resolved.held_bytes()
            + self.meta_cache.held_bytes()
            + self.le_styles.held_bytes()
            + self.le_rescaled.held_bytes()
            + self.total_fix_plans.held_bytes()
    }

    /// The mapper with its name caches (and what they depend on) but none of its
    /// per-request buffers: what a pooled workspace keeps after an outlier request.
    pub fn without_buffers(self) -> Mapper {
        Mapper {
            resolved: self.resolved,
            meta_cache: self.meta_cache,
            le_styles: self.le_styles,
            le_rescaled: self.le_rescaled,
            total_fix_plans: self.total_fix_plans,
            counters_seen: self.counters_seen,
            counters_version: self.counters_version,
            hasher: self.hasher,
            ..Mapper::default()
        }
    }

    /// Bytes the mapper's per-request buffers hold between requests (what a pooled
    /// workspace keeps), not its name caches ([`Mapper::cache_bytes`]).
    pub fn retained_bytes(&self) -> usize {
        held(&self.arena)
            + held(&self.work)
            + held(&self.work_moved)
            + held(&self.out_series)
            + held(&self.out_labels)
            + held(&self.out_label_bytes)
            + self.set_memo.retained_bytes()
            + held(&self.chunks)
            + held(&self.samples)
            + held(&self.exemplars)
            + held(&self.histograms)
            + held(&self.hist_arena)
            + held(&self.native_scratch)
            + held(&self.help_buf)
            + held(&self.gather_samples)
            + held(&self.gather_hist)
            + held(&self.gather_ex)
            + held(&self.taps)
            + held(&self.tap_labels)
            + held(&self.tap_samples)
            + self.native.retained_bytes()
            + self.stats.retained_bytes()
            + held(&self.le_key)
            + self.label_memo.retained_bytes()
            + self.learnt.iter().map(|n| n.len()).sum::<usize>()
            + held(&self.learnt)
            + self.index.capacity() * 16
            + self.meta_seen.capacity() * 8
            + self.le_unproven.capacity() * 16
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
        if self.map_request_unless_same(rules, buf, req, out, ctx) == MapOutcome::SameAsInput {
            out.extend_from_slice(buf);
        }
    }

    /// [`Mapper::map_request`], except that when the output would be `buf` itself (no
    /// rule touched a series, every one written as it came, in order, nothing else in
    /// the request) nothing is written and [`MapOutcome::SameAsInput`] says so: a request
    /// no rule touches costs no copy of its body, and no comparison with it.
    pub fn map_request_unless_same(
        &mut self,
        rules: &Rules,
        buf: &[u8],
        req: &DecodedRequest,
        out: &mut Vec<u8>,
        ctx: &MapContext<'_>,
    ) -> MapOutcome {
        self.reset(rules);
        self.pending = None;
        self.total_fix_on = ctx.counters.is_some();
        let taps = ctx.taps.unwrap_or(&NO_TAPS);
        if let Some(cf) = ctx.counters {
            self.refresh_counters(cf);
        }
        // Senders write a family's series one after another (a scrape's order): a series
        // named like the one before reuses its resolution, no hash, no lookup. It is
        // borrowed from the name cache, which is taken out of the mapper for the loop, not
        // cloned: a plan's `Arc` shared by every worker, its count raised and lowered per
        // name, would bounce one cache line between the cores (and costs two locked
        // instructions even on one).
        let mut names = self.resolved.take();
        let mut uncached: Option<Resolved>;
        let mut last: Option<(&[u8], Option<&Resolved>)> = None;
        let mut fixed: Option<Resolved>;
        for s in &req.series {
            let name_bytes = s.name.bytes(buf);
            if !matches!(&last, Some((prev, _)) if short_eq(prev, name_bytes)) {
                // One hash lookup when the name is cached (a match, not a function that
                // returns the borrow, which the borrow checker would hold over the miss).
                let r = match names.get(name_bytes) {
                    Some(r) => r.as_ref(),
                    None => {
                        let name = std::str::from_utf8(name_bytes).unwrap_or("");
                        let r = self.resolve_uncached(rules, name);
                        match names.insert_and_get(name_bytes, r) {
                            Ok(cached) => cached.as_ref(),
                            Err(not_cached) => {
                                uncached = not_cached;
                                uncached.as_ref()
                            }
                        }
                    }
                };
                last = Some((name_bytes, r));
            }
            let resolved = last.and_then(|(_, r)| r);
            let resolution = match resolved {
                None if ctx.counters.is_some() => {
                    fixed = self.series_total_fix(s, buf);
                    fixed.as_ref()
                }
                r => r,
            };
            match resolution {
                None => self.pass_through(out, buf, req, s, taps),
                Some(Resolved::OutputName) => {
                    self.apply(None, buf, req, s, false, taps);
                }
                Some(Resolved::Plan(plan)) => {
                    let Some(plan) = self.native_plan(plan, s) else {
                        self.pass_through(out, buf, req, s, taps);
                        continue;
                    };
                    if plan.keep_original {
                        self.pass_through(out, buf, req, s, taps);
                    }
                    let may_pass = plan.unchanged_may_pass() && self.can_write_as_is(s);
                    match self.apply(Some(plan), buf, req, s, may_pass, taps) {
                        Applied::Dropped => continue,
                        Applied::Merged => {}
                        Applied::Unchanged => self.write_as_is(out, buf, req, s, taps),
                    }
                    // A copy's plan repeats the series' steps: a series they drop has no
                    // copies (and its drop is counted once).
                    for c in &plan.copies {
                        self.apply(Some(&c.plan), buf, req, s, false, taps);
                    }
                }
            }
        }
        self.resolved = names;
        // Every byte of the input is in the one run of series written as they came:
        // nothing was dropped, merged or rebuilt, and the request holds nothing else.
        let same = out.is_empty()
            && self.pending == Some((0, buf.len()))
            && self.out_series.is_empty()
            && req.metadata.is_empty();
        if same {
            self.pending = None;
        } else {
            self.flush_pending(out, buf);
        }
        self.encode_merged(buf, req, out);
        self.map_metadata(rules, buf, req, out, ctx.counters.is_some());
        if let Some(cf) = ctx.counters
            && !self.learnt.is_empty()
        {
            cf.learn(&mut self.learnt);
        }
        if same {
            debug_assert!(out.is_empty(), "nothing written after the input's run");
            MapOutcome::SameAsInput
        } else {
            MapOutcome::Written
        }
    }

    /// Appends a series written as it came (`raw`, a 1.0 `TimeSeries` of `buf`). When
    /// the bytes before it in the input are the framing [`write_raw_series`] would
    /// write, it joins the run of such series not copied yet (or starts one): a run is
    /// copied in one piece, and a request that is one run is not copied at all.
    fn write_raw(&mut self, out: &mut Vec<u8>, buf: &[u8], raw: Span) {
        let (start, end) = (raw.start as usize, raw.end as usize);
        if let Some(frame) = framed_series_start(buf, start, end) {
            match &mut self.pending {
                Some((_, run_end)) if *run_end == frame => *run_end = end,
                _ => {
                    self.flush_pending(out, buf);
                    self.pending = Some((frame, end));
                }
            }
            return;
        }
        self.flush_pending(out, buf);
        write_raw_series(out, raw.bytes(buf));
    }

    /// Copies the run of series not copied yet ([`Mapper::write_raw`]) to `out`: before
    /// anything else is written there.
    #[inline]
    fn flush_pending(&mut self, out: &mut Vec<u8>, buf: &[u8]) {
        if let Some((start, end)) = self.pending.take() {
            out.extend_from_slice(&buf[start..end]);
        }
    }

    /// A series no rule changes leaves as it came: as its own bytes (1.0 with canonical
    /// labels), or encoded straight from the view (2.0 with labels in order, when no
    /// metadata `_total` fix runs). Neither enters the merge area: a name that is some
    /// rule's output goes through [`Mapper::apply`]; the `_total` fix makes output names
    /// the rules do not list, so with it on, 2.0 series are merged as before (1.0's raw
    /// copies are not: a `foo_total` sent beside a `foo` the fix renames can meet it).
    /// Anything else is rebuilt.
    fn pass_through(
        &mut self,
        out: &mut Vec<u8>,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        taps: &TapSet,
    ) {
        if self.can_write_as_is(s) {
            self.write_as_is(out, buf, req, s, taps);
        } else {
            self.apply(None, buf, req, s, false, taps);
        }
    }

    /// See [`Mapper::pass_through`].
    #[inline]
    fn can_write_as_is(&self, s: &SeriesView) -> bool {
        s.canonical || (s.labels_in_order && !self.total_fix_on)
    }

    /// Writes a series as it came (only when [`Mapper::can_write_as_is`]).
    fn write_as_is(
        &mut self,
        out: &mut Vec<u8>,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        taps: &TapSet,
    ) {
        if s.canonical {
            self.write_raw(out, buf, s.raw);
        } else {
            self.flush_pending(out, buf);
            self.write_direct(out, buf, req, s);
        }
        self.count_out(s);
        self.tap_raw(taps, buf, req, s);
    }

    /// Encodes a series as a 1.0 `TimeSeries` from the view, as it came.
    fn write_direct(
        &mut self,
        out: &mut Vec<u8>,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
    ) {
        // Straight into the output: the labels of a 2.0 request's previous series are
        // copied from there.
        let mut w = SeriesWriter::in_place(out);
        let labels = &req.labels[s.labels.usize()];
        if req.v2 {
            w.labels_memo(
                &mut self.label_memo,
                labels.len(),
                |k| label_key(labels[k].name, labels[k].value),
                |k| (labels[k].name.bytes(buf), labels[k].value.bytes(buf)),
            );
        } else {
            for l in labels {
                w.label(l.name.bytes(buf), l.value.bytes(buf));
            }
        }
        if s.samples_raw.is_empty() {
            for smp in &req.samples[s.samples.usize()] {
                w.sample_view(smp);
            }
        } else {
            // A 2.0 series' samples as they came: 1.0's bytes.
            w.raw_fields(s.samples_raw.bytes(buf));
        }
        for ex in &req.exemplars[s.exemplars.usize()] {
            let labels = req.labels[ex.labels.usize()]
                .iter()
                .map(|l| (l.name.bytes(buf), l.value.bytes(buf)));
            w.exemplar(labels, ex.value_bits, ex.timestamp);
        }
        for h in &req.histograms[s.histograms.usize()] {
            let source = self.histogram_source(buf, h);
            w.histogram_raw(self.hist_bytes(source, buf));
        }
        if req.v2 {
            w.close_memo(&mut self.label_memo);
        } else {
            w.close();
        }
    }

    /// What the rules do with series named `name`, computed (the caller memoises it per
    /// name in `resolved`, keyed by the name's bytes as they stand in the request: a warm
    /// lookup converts nothing; decoding checked them UTF-8).
    fn resolve_uncached(&mut self, rules: &Rules, name: &str) -> Option<Resolved> {
        match rules.lookup(name) {
            Some(Resolution::Plan(p)) => return Some(Resolved::Plan(p.clone())),
            Some(Resolution::OutputName) => return Some(Resolved::OutputName),
            None => {}
        }
        if rules.needs_pattern_lookup()
            && let Some(plan) = rules.plan_for(name)
        {
            return Some(Resolved::Plan(Arc::new(plan)));
        }
        self.total_fix(name)
    }

    /// Runs a plan over one series and puts the result into the merge area. With
    /// `may_pass`, a series no step changed is left to the caller to write as it came
    /// ([`Applied::Unchanged`]). The series' labels are copied into the work area only
    /// once a step is about to change them: steps that only read them (rank dedup,
    /// conditions) read the input, so a dropped series is never copied.
    fn apply(
        &mut self,
        plan: Option<&Plan>,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        may_pass: bool,
        taps: &TapSet,
    ) -> Applied {
        let mut built = false;
        let mut changed = false;
        // The input's labels are sorted and unique; see `finish_labels`.
        let mut names_changed = false;
        let mut may_have_empty = !s.labels_in_order;
        let mut scale: Option<(super::number::Factor, ScaleTarget)> = None;
        let mut scale_pack = 0u16;
        let mut renamed_by: Option<u16> = None;
        let mut name_changed = false;
        let mut rank_label: Option<Str> = None;
        if let Some(plan) = plan {
            if let Some(slot) = plan.family_slot {
                self.stats
                    .note_family(slot, (s.samples.len() + s.histograms.len()) as u64);
            }
            for step in &plan.steps {
                if !step.when.is_empty() && !self.matches(built, buf, req, s, &step.when) {
                    if matches!(step.action, Action::OnlyIf) {
                        return Applied::Dropped;
                    }
                    continue;
                }
                if step.action.changes_labels() && !built {
                    self.build_work(req, s);
                    built = true;
                }
                match &step.action {
                    Action::OnlyIf => {}
                    Action::Drop(reason) => {
                        self.drop_series(s, *reason);
                        return Applied::Dropped;
                    }
                    Action::SetName(n) => {
                        let v = self.intern(n.as_bytes());
                        if let Some(i) = self.find(buf, b"__name__") {
                            self.work[i].value = v;
                        }
                        renamed_by = Some(step.pack);
                        name_changed = true;
                        changed = true;
                    }
                    Action::RenameLabel { from, to } => {
                        if let Some(i) = self.find(buf, from.as_bytes()) {
                            let n = self.intern(to.as_bytes());
                            self.work[i].name = n;
                            self.work[i].renamed = true;
                            renamed_by = Some(step.pack);
                            changed = true;
                            names_changed = true;
                        }
                    }
                    Action::MapLabelValue { label, from, to } => {
                        if let Some(i) = self.find(buf, label.as_bytes())
                            && self.str_bytes(self.work[i].value, buf) == from.as_bytes()
                        {
                            self.work[i].value = self.intern(to.as_bytes());
                            renamed_by = Some(step.pack);
                            changed = true;
                            may_have_empty |= to.is_empty();
                        }
                    }
                    Action::SplitByLabel { label, names, .. } => {
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
                                name_changed = true;
                                changed = true;
                            }
                        }
                    }
                    Action::SetLabel { name, value } => {
                        changed = true;
                        may_have_empty |= value.is_empty();
                        let v = self.intern(value.as_bytes());
                        match self.find(buf, name.as_bytes()) {
                            Some(i) => self.work[i].value = v,
                            None => {
                                names_changed = true;
                                let n = self.intern(name.as_bytes());
                                self.work.push(WorkLabel {
                                    name: n,
                                    value: v,
                                    renamed: false,
                                    added: true,
                                });
                            }
                        }
                    }
                    Action::DropLabel(name) => {
                        if let Some(i) = self.find(buf, name.as_bytes()) {
                            self.work.remove(i);
                            changed = true;
                        }
                    }
                    Action::RankDedup { label, keep } => {
                        if self
                            .label_value(built, buf, req, s, label.as_bytes())
                            .is_some_and(|v| v != keep.as_bytes())
                        {
                            self.drop_series(s, REASON_RANK_DEDUP);
                            return Applied::Dropped;
                        }
                    }
                    Action::SumOverRanks(label) => {
                        if self
                            .label_value(built, buf, req, s, label.as_bytes())
                            .is_some()
                        {
                            rank_label = Some(self.intern(label.as_bytes()));
                        }
                    }
                    Action::TypeAndUnit { type_, unit } => {
                        for (label, want) in [(TYPE_LABEL, type_), (UNIT_LABEL, unit)] {
                            let Some(want) = want else { continue };
                            let differs = self
                                .label_value(built, buf, req, s, label.as_bytes())
                                .is_some_and(|v| v != want.as_bytes());
                            if !differs {
                                continue;
                            }
                            if !built {
                                self.build_work(req, s);
                                built = true;
                            }
                            if let Some(i) = self.find(buf, label.as_bytes()) {
                                if want.is_empty() {
                                    self.work.remove(i);
                                } else {
                                    self.work[i].value = self.intern(want.as_bytes());
                                }
                                changed = true;
                            }
                        }
                    }
                    Action::Scale { factor, target } => {
                        scale = Some(match scale {
                            Some((f, _)) => (f.then(*factor), *target),
                            None => (*factor, *target),
                        });
                        scale_pack = step.pack;
                        if let Some(c) = self.stats.rescaled.get_mut(step.pack as usize) {
                            *c += 1;
                        }
                    }
                }
            }
        }
        if name_changed && let Some(slot) = plan.and_then(|p| p.rename_slot) {
            self.stats
                .note_rename(slot, (s.samples.len() + s.histograms.len()) as u64);
        }
        if renamed_by == Some(METADATA_FIX_PACK) {
            self.stats.metadata_total_fixes += 1;
        } else if let Some(p) = renamed_by
            && let Some(c) = self.stats.renamed.get_mut(p as usize)
        {
            *c += 1;
        }
        if may_pass && !changed && scale.is_none() && rank_label.is_none() {
            return Applied::Unchanged;
        }
        if !built {
            self.build_work(req, s);
        }
        if let Some((factor, ScaleTarget::Le)) = scale {
            self.rescale_le(buf, req, s, factor);
        }
        self.finish_labels(buf, names_changed, may_have_empty);
        // Bucket counts are counts: only `le` and exemplars change for `_bucket` series.
        let value_factor = scale.and_then(|(f, t)| (t == ScaleTarget::Value).then_some(f));
        let scale = scale.map(|(f, _)| (f, scale_pack));
        // The derive stage reads it: it sums it over ranks, or its name is tapped.
        let tapped = rank_label.is_some()
            || (!taps.is_empty()
                && self
                    .work
                    .iter()
                    .find(|l| is_metric_name(self.str_bytes(l.name, buf)))
                    .map(|l| l.value)
                    .is_some_and(|n| self.is_tapped(taps, buf, n)));
        self.insert(
            buf,
            req,
            s,
            value_factor,
            scale,
            MergedTap { rank_label, tapped },
        );
        Applied::Merged
    }

    /// Copies the series' labels into the work area.
    fn build_work(&mut self, req: &DecodedRequest, s: &SeriesView) {
        self.work.clear();
        self.work
            .extend(req.labels[s.labels.usize()].iter().map(|l| WorkLabel {
                name: Str::In(l.name),
                value: Str::In(l.value),
                renamed: false,
                added: false,
            }));
    }

    /// The plan a series actually goes through: a histogram rule's plan for the plain
    /// name applies only to series with native histograms; `keep_unit` leaves those
    /// unrenamed (and counts them). `None`: no plan (the series passes as it is).
    fn native_plan<'p>(&mut self, plan: &'p Arc<Plan>, s: &SeriesView) -> Option<&'p Arc<Plan>> {
        if s.histograms.is_empty() {
            if plan.native_only {
                return plan.without_native.as_ref();
            }
            return Some(plan);
        }
        if plan.native_keep_unit {
            self.stats.native_unscaled += s.histograms.len() as u64;
            return None;
        }
        Some(plan)
    }
}

/// The merge index's keys are seeded hashes already: used as they are.
#[derive(Clone, Copy, Default)]
struct PreHashed;

impl BuildHasher for PreHashed {
    type Hasher = PreHashedKey;
    fn build_hasher(&self) -> PreHashedKey {
        PreHashedKey(0)
    }
}

struct PreHashedKey(u64);

impl Hasher for PreHashedKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); any other key still hashes.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What [`Mapper::apply`] did with a series.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Applied {
    /// Dropped by a step (or, for a copy, its labels did not match).
    Dropped,
    /// In the merge area.
    Merged,
    /// No step changed it and the caller may write it as it came.
    Unchanged,
}

#[derive(Clone)]
enum Resolved {
    Plan(Arc<Plan>),
    OutputName,
}
