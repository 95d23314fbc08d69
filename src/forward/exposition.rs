//! The exposition sink (`exposition`, docs/federate.md): the last sample of every series
//! promnorm forwarded, for collectors that pull (`GET /federate`). It records the same
//! mapped bodies the backends get, derived series included, and keeps, per series, the
//! newest sample within `ttl`, up to `max_series` series; past that the least recently
//! updated series are evicted.
//!
//! Memory: per series its label bytes (names and values, one separator byte each) plus
//! [`SERIES_OVERHEAD_BYTES`]; a custom-bucket native histogram adds its encoded bytes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::wire::decode::{DecodeLimits, DecodedRequest};
use crate::wire::histogram::NativeHistogram;
use crate::wire::{DecodeError, STALE_NAN_BITS};

/// What one series costs beyond its label bytes: the key's allocation header, the hash
/// map entry, the slot and up to two entries of the update order (measured by the unit
/// test `overhead_is_what_the_docs_say`).
pub const SERIES_OVERHEAD_BYTES: usize = 160;

/// Families whose metadata (type, help, unit) the sink remembers.
pub const MAX_FAMILIES: usize = 100_000;

/// Separates label names and values in a series key: never a byte of UTF-8.
pub const KEY_SEP: u8 = 0xFF;

const SHARDS: usize = 16;

/// How the sink tells a series' tenant, as the backends' tenancy does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpositionTenancy {
    /// The label whose value names the tenant.
    pub label: String,
    /// The header a scrape names its tenant in, and the sender's header for series
    /// without the label.
    pub header: http::HeaderName,
    /// The tenant of series without the label (`None`: the sender's header, if any).
    pub default: Option<String>,
    /// The tenant label stays on the series a tenant's scrape gets.
    pub keep_label: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpositionOptions {
    /// A series not refreshed for this long is gone.
    pub ttl: Duration,
    /// Series held at most; beyond, the least recently updated are evicted.
    pub max_series: usize,
    pub tenancy: Option<ExpositionTenancy>,
}

/// The newest sample of one series.
#[derive(Clone, Debug, PartialEq)]
pub enum Point {
    /// A float sample's bits.
    Float(u64),
    /// A custom-bucket native histogram, its encoded `Histogram` message.
    Histogram(Arc<[u8]>),
}

/// A family's metadata as the forwarded bodies carried it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilyMeta {
    /// `MetricMetadata.MetricType` numbering (0 unknown, 1 counter, 2 gauge, 3 histogram,
    /// 4 gauge histogram, 5 summary, 6 info, 7 stateset).
    pub metric_type: i32,
    pub help: Box<str>,
    pub unit: Box<str>,
}

/// One series as a scrape sees it.
#[derive(Clone, Debug)]
pub struct Held {
    /// Label names and values, each followed by [`KEY_SEP`], sorted by name.
    pub key: Arc<[u8]>,
    pub tenant: Option<Arc<str>>,
    pub timestamp: i64,
    pub point: Point,
}

struct Slot {
    key: Arc<[u8]>,
    tenant: Option<Arc<str>>,
    timestamp: i64,
    point: Point,
    /// The shard's update sequence number at its last update.
    seq: u64,
    /// When it was last updated.
    at: Instant,
}

#[derive(Default)]
struct Shard {
    index: HashMap<Arc<[u8]>, u32, ahash::RandomState>,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// (seq, slot) in update order; an entry whose seq is not its slot's is stale.
    order: VecDeque<(u64, u32)>,
    seq: u64,
}

impl Shard {
    fn len(&self) -> usize {
        self.index.len()
    }

    fn remove(&mut self, slot: u32) {
        if let Some(s) = self.slots[slot as usize].take() {
            self.index.remove(&s.key);
            self.free.push(slot);
        }
    }

    /// The oldest live slot, stale order entries dropped on the way.
    fn oldest(&mut self) -> Option<(u32, Instant)> {
        while let Some(&(seq, slot)) = self.order.front() {
            match &self.slots[slot as usize] {
                Some(s) if s.seq == seq => return Some((slot, s.at)),
                _ => {
                    self.order.pop_front();
                }
            }
        }
        None
    }

    /// Removes the series not updated since `cutoff`; returns how many.
    fn expire(&mut self, cutoff: Instant) -> u64 {
        let mut n = 0;
        while let Some((slot, at)) = self.oldest() {
            if at >= cutoff {
                break;
            }
            self.order.pop_front();
            self.remove(slot);
            n += 1;
        }
        n
    }

    /// Rebuilds the update order when stale entries outnumber the live ones.
    fn compact(&mut self) {
        if self.order.len() <= 2 * self.len() + 1024 {
            return;
        }
        let mut live: Vec<(u64, u32)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (s.seq, i as u32)))
            .collect();
        live.sort_unstable();
        self.order = live.into();
    }

    fn upsert(
        &mut self,
        key: &[u8],
        tenant: Option<&Arc<str>>,
        timestamp: i64,
        point: Point,
        at: Instant,
        cap: usize,
    ) -> bool {
        self.seq += 1;
        let seq = self.seq;
        if let Some(&slot) = self.index.get(key) {
            if let Some(s) = self.slots[slot as usize].as_mut() {
                // An older sample arriving late does not replace a newer one.
                if timestamp >= s.timestamp {
                    s.timestamp = timestamp;
                    s.point = point;
                }
                s.seq = seq;
                s.at = at;
                self.order.push_back((seq, slot));
                self.compact();
            }
            return false;
        }
        let mut evicted = false;
        if self.len() >= cap
            && let Some((oldest, _)) = self.oldest()
        {
            self.order.pop_front();
            self.remove(oldest);
            evicted = true;
        }
        let key: Arc<[u8]> = Arc::from(key);
        let slot = Slot {
            key: key.clone(),
            tenant: tenant.cloned(),
            timestamp,
            point,
            seq,
            at,
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(key, idx);
        self.order.push_back((seq, idx));
        self.compact();
        evicted
    }

    fn forget(&mut self, key: &[u8]) {
        if let Some(&slot) = self.index.get(key) {
            self.remove(slot);
        }
    }
}

/// Counts since start (promnorm's `/metrics` reads them).
#[derive(Debug, Default)]
pub struct ExpositionCounts {
    pub evicted: AtomicU64,
    pub expired: AtomicU64,
    /// Native histograms without custom buckets: no classic form to expose.
    pub native_left_out: AtomicU64,
    /// Bodies that did not decode (never expected: they are promnorm's own output).
    pub undecodable: AtomicU64,
}

/// The last forwarded sample of every series.
pub struct ExpositionStore {
    /// Swapped whole by a reload; the held series stay.
    opts: arc_swap::ArcSwap<ExpositionOptions>,
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    families: RwLock<HashMap<Box<str>, FamilyMeta>>,
    pub counts: ExpositionCounts,
    scratch: Mutex<Vec<Scratch>>,
}

#[derive(Default)]
struct Scratch {
    decoded: DecodedRequest,
    key: Vec<u8>,
    hist: NativeHistogram,
}

impl ExpositionStore {
    pub fn new(opts: ExpositionOptions) -> ExpositionStore {
        ExpositionStore {
            opts: arc_swap::ArcSwap::from_pointee(opts),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: ahash::RandomState::new(),
            families: RwLock::new(HashMap::new()),
            counts: ExpositionCounts::default(),
            scratch: Mutex::new(Vec::new()),
        }
    }

    pub fn options(&self) -> Arc<ExpositionOptions> {
        self.opts.load_full()
    }

    /// New options for the same store (a reload): the held series stay; a lower
    /// `max_series` applies as series arrive, a shorter `ttl` at once.
    pub fn reconfigure(&self, opts: ExpositionOptions) {
        self.opts.store(Arc::new(opts));
    }

    fn shard_of(&self, key: &[u8]) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Records a mapped 1.0 body (uncompressed) as the backends get it. `sender` is
    /// the request's headers, whose tenant header goes with series without the tenant
    /// label when no default is configured.
    pub fn record(&self, body: &[u8], sender: Option<&http::HeaderMap>) {
        let mut sc = self
            .scratch
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_default();
        if let Err(e) = self.record_with(&mut sc, body, sender) {
            self.counts.undecodable.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "exposition: a forwarded body did not decode");
        }
        if let Ok(mut p) = self.scratch.lock()
            && p.len() < 8
        {
            p.push(sc);
        }
    }

    fn record_with(
        &self,
        sc: &mut Scratch,
        body: &[u8],
        sender: Option<&http::HeaderMap>,
    ) -> Result<(), DecodeError> {
        let limits = DecodeLimits {
            max_series: usize::MAX,
            max_labels_per_series: usize::MAX,
            max_label_value_bytes: usize::MAX,
            max_expanded_bytes: usize::MAX,
        };
        sc.decoded.decode(body, limits)?;
        let d = &sc.decoded;
        let opts = self.opts.load();
        self.record_metadata(d, body);
        let sender_tenant: Option<Arc<str>> = opts.tenancy.as_ref().and_then(|t| {
            t.default.as_deref().map(Arc::from).or_else(|| {
                sender
                    .and_then(|h| h.get(&t.header))
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
                    .map(Arc::from)
            })
        });
        let now = Instant::now();
        let cutoff = now.checked_sub(opts.ttl);
        let cap = opts.max_series.div_ceil(SHARDS).max(1);
        let mut evicted = 0u64;
        let mut expired = 0u64;
        for series in &d.series {
            sc.key.clear();
            let mut has_tenant_label = false;
            for l in &d.labels[series.labels.usize()] {
                let name = l.name.bytes(body);
                if let Some(t) = &opts.tenancy
                    && name == t.label.as_bytes()
                {
                    has_tenant_label = true;
                }
                sc.key.extend_from_slice(name);
                sc.key.push(KEY_SEP);
                sc.key.extend_from_slice(l.value.bytes(body));
                sc.key.push(KEY_SEP);
            }
            let tenant = if has_tenant_label {
                None
            } else {
                sender_tenant.as_ref()
            };
            // One lock at a time: two bodies recorded at once never wait on each other
            // in a circle.
            let mut g = match self.shards[self.shard_of(&sc.key)].lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            if let Some(cutoff) = cutoff {
                expired += g.expire(cutoff);
            }
            // The newest sample of the series in this body (samples arrive in order).
            let last_float = d.samples[series.samples.usize()].last();
            let last_hist = d.histograms[series.histograms.usize()].last();
            let float_is_newest = match (last_float, last_hist) {
                (Some(s), Some(h)) => s.timestamp >= h.timestamp,
                (f, _) => f.is_some(),
            };
            match (last_float.filter(|_| float_is_newest), last_hist) {
                (Some(s), _) => {
                    if s.value_bits == STALE_NAN_BITS {
                        g.forget(&sc.key);
                    } else {
                        evicted += g.upsert(
                            &sc.key,
                            tenant,
                            s.timestamp,
                            Point::Float(s.value_bits),
                            now,
                            cap,
                        ) as u64;
                    }
                }
                (_, Some(h)) => {
                    let raw = h.raw.bytes(body);
                    sc.hist
                        .parse(body, h.raw.start as usize, h.raw.end as usize)?;
                    if sc.hist.schema != -53 {
                        self.counts.native_left_out.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if sc.hist.sum_bits == STALE_NAN_BITS {
                        g.forget(&sc.key);
                        continue;
                    }
                    evicted += g.upsert(
                        &sc.key,
                        tenant,
                        h.timestamp,
                        Point::Histogram(Arc::from(raw)),
                        now,
                        cap,
                    ) as u64;
                }
                (None, None) => {}
            }
        }
        self.counts.evicted.fetch_add(evicted, Ordering::Relaxed);
        self.counts.expired.fetch_add(expired, Ordering::Relaxed);
        Ok(())
    }

    fn record_metadata(&self, d: &DecodedRequest, body: &[u8]) {
        if d.metadata.is_empty() {
            return;
        }
        let fresh = |m: &crate::wire::decode::MetadataView, known: Option<&FamilyMeta>| {
            known.is_none_or(|k| {
                k.metric_type != m.metric_type
                    || *k.help != *m.help.str(body)
                    || *k.unit != *m.unit.str(body)
            })
        };
        let any_new = match self.families.read() {
            Ok(f) => d
                .metadata
                .iter()
                .any(|m| fresh(m, f.get(m.family.str(body)))),
            Err(_) => return,
        };
        if !any_new {
            return;
        }
        let Ok(mut f) = self.families.write() else {
            return;
        };
        for m in &d.metadata {
            let family = m.family.str(body);
            if !fresh(m, f.get(family)) || (f.len() >= MAX_FAMILIES && !f.contains_key(family)) {
                continue;
            }
            f.insert(
                family.into(),
                FamilyMeta {
                    metric_type: m.metric_type,
                    help: m.help.str(body).into(),
                    unit: m.unit.str(body).into(),
                },
            );
        }
    }

    /// The metadata of every family seen.
    pub fn families(&self) -> HashMap<Box<str>, FamilyMeta> {
        self.families.read().map(|f| f.clone()).unwrap_or_default()
    }

    /// The held series that pass `keep` (given the key and tenant), not older than
    /// `ttl`; expired ones are removed on the way.
    pub fn collect(&self, mut keep: impl FnMut(&[u8], Option<&str>) -> bool) -> Vec<Held> {
        let now = Instant::now();
        let cutoff = now.checked_sub(self.opts.load().ttl);
        let mut out = Vec::new();
        let mut expired = 0;
        for shard in self.shards.iter() {
            let mut g = match shard.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            if let Some(cutoff) = cutoff {
                expired += g.expire(cutoff);
            }
            for s in g.slots.iter().flatten() {
                if keep(&s.key, s.tenant.as_deref()) {
                    out.push(Held {
                        key: s.key.clone(),
                        tenant: s.tenant.clone(),
                        timestamp: s.timestamp,
                        point: s.point.clone(),
                    });
                }
            }
        }
        self.counts.expired.fetch_add(expired, Ordering::Relaxed);
        out
    }

    /// Series held now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map(|g| g.len()).unwrap_or(0))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The labels of a series key: (name, value) pairs in key order.
pub fn key_labels(key: &[u8]) -> impl Iterator<Item = (&str, &str)> {
    let mut parts = key.split(|b| *b == KEY_SEP);
    std::iter::from_fn(move || {
        let name = parts.next()?;
        let value = parts.next()?;
        Some((
            std::str::from_utf8(name).unwrap_or(""),
            std::str::from_utf8(value).unwrap_or(""),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus as proto;
    use prost::Message;

    fn opts(max_series: usize) -> ExpositionOptions {
        ExpositionOptions {
            ttl: Duration::from_secs(300),
            max_series,
            tenancy: None,
        }
    }

    fn body(series: &[(&str, &str, f64, i64)]) -> Vec<u8> {
        proto::WriteRequest {
            timeseries: series
                .iter()
                .map(|(name, inst, v, ts)| proto::TimeSeries {
                    labels: vec![
                        proto::Label {
                            name: "__name__".into(),
                            value: (*name).into(),
                        },
                        proto::Label {
                            name: "instance".into(),
                            value: (*inst).into(),
                        },
                    ],
                    samples: vec![proto::Sample {
                        value: *v,
                        timestamp: *ts,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn values(store: &ExpositionStore) -> Vec<(String, i64, u64)> {
        let mut v: Vec<_> = store
            .collect(|_, _| true)
            .into_iter()
            .map(|h| {
                let labels: Vec<String> = key_labels(&h.key)
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                let Point::Float(bits) = h.point else {
                    panic!("float")
                };
                (labels.join(","), h.timestamp, bits)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn keeps_the_newest_sample_and_forgets_on_a_stale_marker() {
        let s = ExpositionStore::new(opts(100));
        s.record(&body(&[("a", "x", 1.0, 10), ("b", "x", 2.0, 10)]), None);
        s.record(&body(&[("a", "x", 3.0, 20)]), None);
        // A late, older sample does not replace the newer one.
        s.record(&body(&[("a", "x", 9.0, 15)]), None);
        assert_eq!(
            values(&s),
            vec![
                ("__name__=a,instance=x".into(), 20, 3f64.to_bits()),
                ("__name__=b,instance=x".into(), 10, 2f64.to_bits()),
            ]
        );
        s.record(
            &body(&[("b", "x", f64::from_bits(STALE_NAN_BITS), 30)]),
            None,
        );
        assert_eq!(values(&s).len(), 1);
    }

    #[test]
    fn evicts_the_least_recently_updated_past_max_series() {
        let s = ExpositionStore::new(opts(SHARDS));
        // One series per shard at most: the store holds 16.
        for i in 0..200 {
            let inst = format!("i{i}");
            s.record(&body(&[("m", &inst, i as f64, i)]), None);
        }
        assert!(s.len() <= SHARDS, "{}", s.len());
        assert!(s.counts.evicted.load(Ordering::Relaxed) >= 200 - SHARDS as u64);
        // Least recently updated per shard: the survivors are the newest series of each
        // shard the 200 fell into.
        let key = |i: i64| {
            let mut k = Vec::new();
            for part in ["__name__", "m", "instance", &format!("i{i}")] {
                k.extend_from_slice(part.as_bytes());
                k.push(KEY_SEP);
            }
            k
        };
        let mut newest = [None::<i64>; SHARDS];
        for i in 0..200 {
            newest[s.shard_of(&key(i))] = Some(i);
        }
        let mut want: Vec<i64> = newest.iter().flatten().copied().collect();
        want.sort();
        let mut got: Vec<i64> = values(&s).into_iter().map(|(_, ts, _)| ts).collect();
        got.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn series_expire_after_ttl() {
        let mut o = opts(100);
        o.ttl = Duration::from_millis(50);
        let s = ExpositionStore::new(o);
        s.record(&body(&[("a", "x", 1.0, 10)]), None);
        assert_eq!(s.collect(|_, _| true).len(), 1);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(s.collect(|_, _| true).len(), 0);
        assert_eq!(s.counts.expired.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_update_order_stays_bounded_under_repeated_updates() {
        let s = ExpositionStore::new(opts(1000));
        for round in 0..200 {
            let b = body(&[("a", "x", 1.0, round), ("b", "y", 2.0, round)]);
            s.record(&b, None);
        }
        for shard in s.shards.iter() {
            let g = shard.lock().unwrap();
            assert!(g.order.len() <= 2 * g.len() + 1025);
        }
    }

    #[test]
    fn series_without_the_tenant_label_take_the_senders_tenant() {
        let mut o = opts(100);
        o.tenancy = Some(ExpositionTenancy {
            label: "tenant".into(),
            header: http::HeaderName::from_static("x-scope-orgid"),
            default: None,
            keep_label: false,
        });
        let s = ExpositionStore::new(o);
        let mut h = http::HeaderMap::new();
        h.insert("x-scope-orgid", http::HeaderValue::from_static("team-a"));
        s.record(&body(&[("a", "x", 1.0, 10)]), Some(&h));
        let held = s.collect(|_, _| true);
        assert_eq!(held[0].tenant.as_deref(), Some("team-a"));
    }

    #[test]
    fn overhead_is_what_the_docs_say() {
        // Slot + index entry (key pointer, value, control byte at 7/8 load) + two order
        // entries + the Arc header.
        let slot = std::mem::size_of::<Option<Slot>>();
        let index = (std::mem::size_of::<(Arc<[u8]>, u32)>() + 1) * 8 / 7;
        let order = 2 * std::mem::size_of::<(u64, u32)>();
        let arc_header = 16;
        let total = slot + index + order + arc_header;
        assert!(total <= SERIES_OVERHEAD_BYTES, "{total}");
        assert!(
            total * 3 >= SERIES_OVERHEAD_BYTES * 2,
            "{total} is far below the docs"
        );
    }
}
