//! Derived series (docs/derived.md): hit ratios, speculative-decoding acceptance, MFU and MBU,
//! computed from consecutive samples of counters that may arrive in different,
//! concurrent requests.
//!
//! State lives in a fixed number of shards, each a mutex over a map from the derived
//! series' encoded label set to its [`state::SeriesState`]. A derived sample is pushed
//! onto its shard's queue while that shard is locked, so the samples of one series are
//! queued in timestamp order; the [`writer`] drains the queues and sends them as
//! requests of their own, so a backend rejecting them never touches the sender's data.
//! Sums of physical families over their rank label ([`ranks`]) use the same shards,
//! queues and writer.

pub mod defs;
pub mod gpus;
pub mod ranks;
pub mod state;
pub mod writer;

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ahash::AHashMap;

use crate::mapping::STALE_NAN_BITS;
use crate::mapping::{Mapper, TapSet, TappedSeries};
use crate::wire::encode::{SeriesWriter, write_series_label};
use defs::{DEFINITIONS, Definition};
use ranks::{MAX_RANK_BYTES, MAX_RANKS, RankSumState};
use state::SeriesState;

const SHARDS: usize = 64;
/// Recently seen series the eviction hand passes over (clearing their mark) before it
/// evicts one anyway: eviction costs O(1) with the shard locked, never a scan.
const EVICTION_SECOND_CHANCES: usize = 32;

/// A peak chosen by exact label matchers; `None` figures give no series of that kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Peak {
    pub matchers: Vec<(String, String)>,
    pub flops: Option<f64>,
    pub bandwidth: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeriveSettings {
    /// The derived series of [`defs::DEFINITIONS`] (off: only sums over ranks).
    pub derived_series: bool,
    /// Compute against the oldest point within this window instead of the previous one.
    pub window: Option<Duration>,
    pub stale_after: Duration,
    pub max_series: usize,
    /// Derived samples waiting for the writer, at most (beyond: dropped and counted).
    pub max_pending_samples: usize,
    pub peaks: Vec<Peak>,
    /// The spelling OpenTelemetry-originated inputs leave the mapping stage in
    /// (`otel_names.strategy`).
    pub otel_names: crate::mapping::OtelNames,
}

impl Default for DeriveSettings {
    fn default() -> Self {
        DeriveSettings {
            derived_series: true,
            window: None,
            stale_after: Duration::from_secs(600),
            max_series: 1_000_000,
            max_pending_samples: 1_000_000,
            peaks: Vec::new(),
            otel_names: crate::mapping::OtelNames::default(),
        }
    }
}

/// A derived sample waiting to be sent. `labels` are the encoded `Label`s of the series
/// (shared with its state, so queueing allocates nothing).
#[derive(Clone, Debug)]
pub struct Emitted {
    pub labels: Arc<[u8]>,
    pub def: u16,
    pub timestamp: i64,
    pub value_bits: u64,
}

#[derive(Default)]
struct Shard {
    series: AHashMap<Arc<[u8]>, Box<SeriesState>>,
    /// The series in insertion order: the eviction hand (CLOCK). Entries whose series
    /// was swept are pruned by the sweep; a stale entry left over is skipped.
    clock: VecDeque<Arc<[u8]>>,
    rank_sums: AHashMap<Arc<[u8]>, Box<RankSumState>>,
    queue: Vec<Emitted>,
}

/// `Emitted::def` of a sum over ranks (not one of the definitions).
pub const RANK_SUM: u16 = u16::MAX;

/// Label-set bytes a series in state may take on average: the state holds at most
/// `max_series` × this of label sets (and `max_series` series), so label values of up to
/// 64 KiB cannot take it far past the memory bound's share (`config::memory`, 400 bytes
/// a series with its state). Twice a usual Kubernetes label set of ten labels (about
/// 300 bytes), so that real fleets reach `max_series` first.
pub const LABEL_BYTES_PER_SERIES: usize = 512;

/// A derived series or group whose label set is longer than this is not kept (counted
/// as `promnorm_derived_evictions_total{reason="label_bytes"}`).
pub const MAX_LABEL_SET_BYTES: usize = 16 << 10;

/// Series evicted at most to make room for one new label set.
const MAX_EVICTIONS_PER_SERIES: usize = 64;

/// Counts kept by the deriver; exported as promnorm metrics by the caller.
#[derive(Default)]
pub struct DeriveCounters {
    pub evicted_stale: AtomicU64,
    pub evicted_limit: AtomicU64,
    /// Points given up because one input never reported that timestamp.
    pub incomplete: AtomicU64,
    /// Derived samples dropped because the writer's queue was full.
    pub backlog_dropped: AtomicU64,
    /// Input series with no configured peak (no MFU/MBU for them).
    pub no_peak: AtomicU64,
    /// Ranks forgotten by a sum over ranks because they stopped reporting.
    pub ranks_gone: AtomicU64,
    /// Series and groups not kept (a label set over [`MAX_LABEL_SET_BYTES`], or no
    /// room left for its bytes), and groups of a sum over ranks ended by a rank they
    /// could not keep.
    pub label_bytes: AtomicU64,
}

/// Reusable per-worker scratch of the derive stage.
#[derive(Default)]
pub struct DeriveScratch {
    key: Vec<u8>,
}

impl DeriveScratch {
    /// Bytes its buffer holds between requests.
    pub fn retained_bytes(&self) -> usize {
        self.key.capacity()
    }
}

pub struct Deriver {
    defs: Vec<Definition>,
    /// Input name → (definition index, input slot).
    inputs: AHashMap<Box<[u8]>, Vec<(u16, u8)>>,
    taps: TapSet,
    peaks: Vec<Peak>,
    window_ms: i64,
    stale_after_s: u32,
    max_series: usize,
    shard_queue_limit: usize,
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    series_count: AtomicUsize,
    /// The label sets' bytes of the series and groups held, and their ranks' (see
    /// [`LABEL_BYTES_PER_SERIES`]).
    label_bytes: AtomicUsize,
    max_label_bytes: usize,
    start: Instant,
    pub counters: DeriveCounters,
}

impl Deriver {
    pub fn new(settings: &DeriveSettings) -> Self {
        let has_flops = settings.peaks.iter().any(|p| p.flops.is_some());
        let has_bandwidth = settings.peaks.iter().any(|p| p.bandwidth.is_some());
        // Utilisation series exist only where a peak is configured.
        let defs: Vec<Definition> = DEFINITIONS
            .iter()
            .filter(|_| settings.derived_series)
            .filter(|d| (!d.needs_flops() || has_flops) && (!d.needs_bandwidth() || has_bandwidth))
            .copied()
            .collect();
        let mut inputs: AHashMap<Box<[u8]>, Vec<(u16, u8)>> = AHashMap::new();
        let mut tapped = Vec::new();
        for (di, d) in defs.iter().enumerate() {
            for (slot, name) in d.inputs.iter().enumerate() {
                // Read under the name the mapping stage writes it (otel_names.strategy).
                let name = defs::input_spelling(name, settings.otel_names);
                inputs
                    .entry(name.as_bytes().into())
                    .or_default()
                    .push((di as u16, slot as u8));
                tapped.push(name);
            }
        }
        let taps = TapSet::new(tapped.iter().map(|n| n.as_ref()));
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Deriver {
            defs,
            inputs,
            taps,
            peaks: settings.peaks.clone(),
            window_ms: settings.window.map_or(0, |w| w.as_millis() as i64),
            stale_after_s: settings.stale_after.as_secs().clamp(1, u32::MAX as u64) as u32,
            max_series: settings.max_series.max(1),
            shard_queue_limit: settings.max_pending_samples.div_ceil(SHARDS).max(1),
            shards,
            hasher: ahash::RandomState::with_seeds(0x5eed, 0xdead, 0xbeef, 0xf00d),
            series_count: AtomicUsize::new(0),
            label_bytes: AtomicUsize::new(0),
            max_label_bytes: settings
                .max_series
                .max(1)
                .saturating_mul(LABEL_BYTES_PER_SERIES),
            start: Instant::now(),
            counters: DeriveCounters::default(),
        }
    }

    /// The output names the mapping stage must record for this deriver.
    pub fn taps(&self) -> &TapSet {
        &self.taps
    }

    pub fn definitions(&self) -> &[Definition] {
        &self.defs
    }

    /// Series currently held in state.
    pub fn series_count(&self) -> usize {
        self.series_count.load(Ordering::Relaxed)
    }

    /// Bytes of the label sets held in state, and of the ranks of sums over ranks.
    pub fn label_bytes(&self) -> usize {
        self.label_bytes.load(Ordering::Relaxed)
    }

    /// Makes room in `shard` for a new series or group with a label set of `len` bytes:
    /// evicts series of the shard while the state is full (in series or in label
    /// bytes), and takes the bytes. False (counted) when there is no room: the label set
    /// is too long, or nothing of this shard can be evicted.
    fn make_room(&self, shard: &mut Shard, len: usize) -> bool {
        if len > MAX_LABEL_SET_BYTES {
            self.counters.label_bytes.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        for _ in 0..MAX_EVICTIONS_PER_SERIES {
            let full = self.series_count.load(Ordering::Relaxed) >= self.max_series;
            if !full && self.take_label_bytes(len) {
                return true;
            }
            // An eviction, or (nothing of this shard to evict) a refusal rather than
            // exceeding the limit, is counted under the limit that forced it.
            let counter = if full {
                &self.counters.evicted_limit
            } else {
                &self.counters.label_bytes
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if !self.evict_one(shard) {
                return false;
            }
        }
        self.counters.label_bytes.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Takes `len` bytes of the label-byte budget when they fit, in one atomic step:
    /// workers of different shards checking and adding apart could each see room for
    /// their label set and together go past the bound.
    fn take_label_bytes(&self, len: usize) -> bool {
        self.label_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(len).filter(|&n| n <= self.max_label_bytes)
            })
            .is_ok()
    }

    /// Adds `grown - shrunk` to the bytes held.
    fn adjust_label_bytes(&self, grown: usize, shrunk: usize) {
        if grown > shrunk {
            self.label_bytes
                .fetch_add(grown - shrunk, Ordering::Relaxed);
        } else {
            self.label_bytes
                .fetch_sub(shrunk - grown, Ordering::Relaxed);
        }
    }

    fn now_s(&self) -> u32 {
        self.start.elapsed().as_secs().min(u32::MAX as u64) as u32
    }

    /// Feeds the series the mapper recorded in its last request.
    pub fn observe(&self, mapper: &Mapper, buf: &[u8], scratch: &mut DeriveScratch) {
        let now_s = self.now_s();
        for t in mapper.tapped(buf) {
            if let Some(rank_label) = t.rank_label() {
                self.observe_rank_sum(&t, rank_label, now_s, scratch);
            }
            let Some(targets) = self.inputs.get(t.name()) else {
                continue;
            };
            for &(di, slot) in targets {
                self.observe_one(&t, di, slot as usize, now_s, scratch);
            }
        }
    }

    fn observe_one(
        &self,
        t: &TappedSeries<'_>,
        di: u16,
        slot: usize,
        now_s: u32,
        scratch: &mut DeriveScratch,
    ) {
        let def = &self.defs[di as usize];
        derived_key(def.name, t.labels(), &mut scratch.key);
        let key = scratch.key.as_slice();
        let Ok(mut guard) = self.shard_of(key).lock() else {
            return;
        };
        let shard = &mut *guard;
        if !shard.series.contains_key(key) {
            let peak = if def.needs_flops() || def.needs_bandwidth() {
                match self.peak_for(def, t.labels()) {
                    Some(p) => p,
                    None => {
                        self.counters.no_peak.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            } else {
                0.0
            };
            if !self.make_room(shard, key.len()) {
                return;
            }
            let labels: Arc<[u8]> = Arc::from(key);
            shard.clock.push_back(labels.clone());
            shard
                .series
                .insert(labels, Box::new(SeriesState::new(di, peak, now_s)));
            self.series_count.fetch_add(1, Ordering::Relaxed);
        }
        let Some(labels) = shard.series.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(state) = shard.series.get_mut(key) else {
            return;
        };
        state.last_seen_s = now_s;
        state.referenced = true;
        let mut incomplete = 0;
        for smp in t.samples() {
            if let Some((ts, bits)) = state.observe(
                def,
                slot,
                smp.timestamp,
                smp.value_bits,
                self.window_ms,
                &mut incomplete,
            ) {
                self.enqueue(&mut shard.queue, &labels, di, ts, bits);
            }
        }
        if incomplete > 0 {
            self.counters
                .incomplete
                .fetch_add(incomplete as u64, Ordering::Relaxed);
        }
    }

    fn observe_rank_sum(
        &self,
        t: &TappedSeries<'_>,
        rank_label: &[u8],
        now_s: u32,
        scratch: &mut DeriveScratch,
    ) {
        let Some(rank) = t.labels().find(|(n, _)| *n == rank_label).map(|(_, v)| v) else {
            return;
        };
        scratch.key.clear();
        for (n, v) in t.labels() {
            if n != rank_label {
                write_series_label(&mut scratch.key, n, v);
            }
        }
        let key = scratch.key.as_slice();
        let Ok(mut guard) = self.shard_of(key).lock() else {
            return;
        };
        let shard = &mut *guard;
        let group = shard.rank_sums.get(key);
        let new_group = group.is_none();
        // Bytes taken below for a rank not kept yet; what the group holds after the
        // samples is set against them.
        let mut rank_taken = 0;
        if !group.is_some_and(|g| g.has_rank(rank)) {
            // A rank that brings no value keeps nothing (its stale marker may still end
            // the sum of the ranks kept).
            let brings_value = t
                .samples()
                .iter()
                .any(|s| s.value_bits != STALE_NAN_BITS && !f64::from_bits(s.value_bits).is_nan());
            if !brings_value && new_group {
                return;
            }
            // Groups are refused when full, never evicted to make room.
            if brings_value
                && new_group
                && self.series_count.load(Ordering::Relaxed) >= self.max_series
            {
                self.counters.evicted_limit.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // A rank's value and history count against the label-byte budget like a
            // label set. A rank that cannot be kept ends its group's sum: a sum without
            // it would be wrong. The group learns its ranks again, and sums again once
            // every rank fits or the refused one has stopped ([`RankSumState::end`]).
            let need = RankSumState::cost(rank) + if new_group { key.len() } else { 0 };
            if brings_value
                && (key.len() > MAX_LABEL_SET_BYTES
                    || rank.len() > MAX_RANK_BYTES
                    || group.is_some_and(|g| g.rank_count() >= MAX_RANKS)
                    || !self.take_label_bytes(need))
            {
                self.counters.label_bytes.fetch_add(1, Ordering::Relaxed);
                let last = t
                    .samples()
                    .iter()
                    .map(|s| s.timestamp)
                    .max()
                    .unwrap_or(i64::MIN);
                self.end_rank_sum(shard, key, last);
                return;
            }
            // A new group returned above unless it brings a value: its label set's
            // bytes are in `need`.
            rank_taken = if brings_value {
                RankSumState::cost(rank)
            } else {
                0
            };
        }
        if new_group {
            shard
                .rank_sums
                .insert(Arc::from(key), Box::new(RankSumState::new(now_s)));
            self.series_count.fetch_add(1, Ordering::Relaxed);
        }
        let Some(labels) = shard.rank_sums.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(state) = shard.rank_sums.get_mut(key) else {
            return;
        };
        state.last_seen_s = now_s;
        let before = state.bytes();
        let mut gone = 0;
        for smp in t.samples() {
            if let Some((ts, bits)) = state.observe(rank, smp.timestamp, smp.value_bits, &mut gone)
            {
                self.enqueue(&mut shard.queue, &labels, RANK_SUM, ts, bits);
            }
        }
        self.adjust_label_bytes(state.bytes(), before + rank_taken);
        if gone > 0 {
            self.counters
                .ranks_gone
                .fetch_add(u64::from(gone), Ordering::Relaxed);
        }
    }

    /// Ends the sum of the group `key`, if held ([`RankSumState::end`]): its ranks'
    /// bytes given back, a stale marker queued when a sum was open. The group keeps its
    /// label set (one `Arc` per derived series, so its samples stay in order).
    fn end_rank_sum(&self, shard: &mut Shard, key: &[u8], timestamp: i64) {
        let Some(labels) = shard.rank_sums.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(state) = shard.rank_sums.get_mut(key) else {
            return;
        };
        self.label_bytes.fetch_sub(state.bytes(), Ordering::Relaxed);
        if let Some(at) = state.end(timestamp) {
            self.enqueue(&mut shard.queue, &labels, RANK_SUM, at, STALE_NAN_BITS);
        }
    }

    /// Queues a derived sample (the shard is locked: per-series order is kept).
    fn enqueue(&self, queue: &mut Vec<Emitted>, labels: &Arc<[u8]>, def: u16, ts: i64, bits: u64) {
        if queue.len() >= self.shard_queue_limit {
            self.counters
                .backlog_dropped
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        queue.push(Emitted {
            labels: labels.clone(),
            def,
            timestamp: ts,
            value_bits: bits,
        });
    }

    fn shard_of(&self, key: &[u8]) -> &Mutex<Shard> {
        let mut h = self.hasher.build_hasher();
        h.write(key);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    fn peak_for<'a>(
        &self,
        def: &Definition,
        labels: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
    ) -> Option<f64> {
        self.peaks
            .iter()
            .filter(|p| {
                p.matchers.iter().all(|(n, v)| {
                    labels
                        .clone()
                        .any(|(ln, lv)| ln == n.as_bytes() && lv == v.as_bytes())
                })
            })
            .find_map(|p| {
                if def.needs_flops() {
                    p.flops
                } else {
                    p.bandwidth
                }
            })
    }

    /// Evicts one series of the shard, approximately the least recently seen one
    /// (CLOCK): the hand gives up to [`EVICTION_SECOND_CHANCES`] series seen since it
    /// last passed another round, then evicts.
    fn evict_one(&self, shard: &mut Shard) -> bool {
        let mut chances = EVICTION_SECOND_CHANCES;
        while let Some(key) = shard.clock.pop_front() {
            let live = shard
                .series
                .get_key_value(&*key)
                .is_some_and(|(k, _)| Arc::ptr_eq(k, &key));
            let Some(state) = shard.series.get_mut(&*key).filter(|_| live) else {
                continue; // swept already
            };
            if state.referenced && chances > 0 {
                state.referenced = false;
                chances -= 1;
                shard.clock.push_back(key);
                continue;
            }
            shard.series.remove(&*key);
            self.series_count.fetch_sub(1, Ordering::Relaxed);
            self.label_bytes.fetch_sub(key.len(), Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Moves every queued derived sample into `out` (per series in timestamp order).
    pub fn drain(&self, out: &mut Vec<Emitted>) {
        for shard in self.shards.iter() {
            if let Ok(mut s) = shard.lock() {
                out.append(&mut s.queue);
            }
        }
    }

    /// Forgets series whose inputs have not been seen for `stale_after`.
    pub fn sweep(&self) {
        let now = self.now_s();
        let limit = self.stale_after_s;
        for shard in self.shards.iter() {
            if let Ok(mut s) = shard.lock() {
                let before = s.series.len() + s.rank_sums.len();
                let Shard {
                    series,
                    rank_sums,
                    clock,
                    ..
                } = &mut *s;
                let mut freed = 0;
                // A group's bytes are its label set's and its ranks'.
                let mut keep = |last_seen_s: u32, bytes: usize| {
                    let kept = now.saturating_sub(last_seen_s) < limit;
                    if !kept {
                        freed += bytes;
                    }
                    kept
                };
                series.retain(|k, st| keep(st.last_seen_s, k.len()));
                rank_sums.retain(|k, st| keep(st.last_seen_s, k.len() + st.bytes()));
                self.label_bytes.fetch_sub(freed, Ordering::Relaxed);
                clock.retain(|k| {
                    series
                        .get_key_value(k)
                        .is_some_and(|(m, _)| Arc::ptr_eq(m, k))
                });
                let gone = before - s.series.len() - s.rank_sums.len();
                if gone > 0 {
                    self.series_count.fetch_sub(gone, Ordering::Relaxed);
                    self.counters
                        .evicted_stale
                        .fetch_add(gone as u64, Ordering::Relaxed);
                }
            }
        }
    }

    /// Encodes `batch` as one `WriteRequest`: one `TimeSeries` per derived series, its
    /// samples in queue (timestamp) order.
    pub fn encode(&self, batch: &mut [Emitted], out: &mut Vec<u8>, scratch: &mut Vec<u8>) {
        // Stable: keeps each series' samples in the order they were queued.
        batch.sort_by_key(|e| Arc::as_ptr(&e.labels) as *const u8 as usize);
        let mut i = 0;
        while i < batch.len() {
            let mut j = i;
            let mut w = SeriesWriter::new(scratch);
            w.raw_fields(&batch[i].labels);
            while j < batch.len() && Arc::ptr_eq(&batch[j].labels, &batch[i].labels) {
                w.sample(batch[j].value_bits, batch[j].timestamp);
                j += 1;
            }
            w.finish(out);
            i = j;
        }
    }
}

/// Encodes the derived series' labels: `__name__` = `name` plus the input's labels minus
/// its own name (and `le`/`quantile`, and Prometheus 3's `__type__`/`__unit__`: a ratio
/// of two counters is neither of their type nor of their unit), in label-name order.
fn derived_key<'a>(
    name: &str,
    labels: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    out: &mut Vec<u8>,
) {
    out.clear();
    let mut name_written = false;
    for (n, v) in labels {
        if n == b"__name__"
            || n == b"le"
            || n == b"quantile"
            || n == b"__type__"
            || n == b"__unit__"
        {
            continue;
        }
        if !name_written && n > b"__name__".as_slice() {
            write_series_label(out, b"__name__", name.as_bytes());
            name_written = true;
        }
        write_series_label(out, n, v);
    }
    if !name_written {
        write_series_label(out, b"__name__", name.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers taking label bytes at once never take more than the budget together, and
    /// take all of it that fits.
    #[test]
    fn label_bytes_taken_at_once_stay_within_the_budget() {
        let d = Deriver::new(&DeriveSettings {
            max_series: 64,
            ..DeriveSettings::default()
        });
        const LEN: usize = 100;
        let taken: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let mut n = 0;
                        while d.take_label_bytes(LEN) {
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(taken * LEN, d.label_bytes());
        assert_eq!(taken, d.max_label_bytes / LEN, "as many as fit, no more");
        d.adjust_label_bytes(10, 10 + LEN);
        assert_eq!(d.label_bytes(), (taken - 1) * LEN);
        d.adjust_label_bytes(LEN + 1, 1);
        assert_eq!(d.label_bytes(), taken * LEN);
    }
}
