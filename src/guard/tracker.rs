//! The active series: one table entry per series (a hash of its labels and tenant → the
//! second it was last seen and its metric), and per tenant and metric the number of
//! entries. Read-locked for the series a request already knows (their last-seen second
//! is an atomic); write-locked to admit new series and to sweep the expired ones.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::sketch::LabelSketches;

/// Metrics with label sketches at most, all tenants together (the rest show their
/// series counts only): bounds the sketches to `MAX_SKETCHED * sketch::MAX_BYTES`.
pub const MAX_SKETCHED: usize = 256;
/// Metrics (per tenant each) tracked at most, and the bytes of their and the tenants'
/// names: a metric name per series cannot grow the tables past
/// `MAX_METRICS * METRIC_BYTES + MAX_NAME_BYTES`.
pub const MAX_METRICS: usize = 16_000;
pub const MAX_NAME_BYTES: usize = 4 << 20;
/// A metric's slot and its entry in its tenant's map, names aside.
pub const METRIC_BYTES: usize = 160;
/// A series' table entry at most: 17 bytes a bucket, the table growing at 7/8 full into
/// twice the buckets (both held while it moves).
pub const SERIES_BYTES: usize = 56;

/// The most the tables hold with `max_tracked_series`.
pub fn max_bytes(max_tracked_series: usize) -> u64 {
    (max_tracked_series as u64) * SERIES_BYTES as u64
        + (MAX_METRICS * METRIC_BYTES + MAX_NAME_BYTES) as u64
        + (MAX_SKETCHED * super::sketch::MAX_BYTES) as u64
}

/// The series table's keys are hashes already.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // One multiply: sampled keys have their top bits zero, and the table's control
        // bytes come from the top bits.
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The series table, in shards by bits 32 to 37 of the key (not the top ones, which
/// sampling uses, nor the low ones, which pick a bucket): growing doubles one shard, a
/// 64th of the table, so no single allocation is large.
pub struct SeriesTable {
    shards: Vec<HashMap<u64, Entry, BuildHasherDefault<IdHasher>>>,
    len: usize,
}

const SHARDS: usize = 64;

impl Default for SeriesTable {
    fn default() -> Self {
        SeriesTable {
            shards: (0..SHARDS).map(|_| HashMap::default()).collect(),
            len: 0,
        }
    }
}

impl SeriesTable {
    #[inline]
    fn shard(key: u64) -> usize {
        ((key >> 32) as usize) & (SHARDS - 1)
    }

    #[inline]
    pub fn get(&self, key: &u64) -> Option<&Entry> {
        self.shards[Self::shard(*key)].get(key)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn insert(&mut self, key: u64, e: Entry) {
        if self.shards[Self::shard(key)].insert(key, e).is_none() {
            self.len += 1;
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&u64, &mut Entry) -> bool) {
        for shard in &mut self.shards {
            shard.retain(&mut keep);
        }
        self.len = self.shards.iter().map(|s| s.len()).sum();
    }

    fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.capacity()).sum()
    }
}

pub struct Entry {
    pub last_seen: AtomicU32,
    pub metric: u32,
}

pub struct MetricSlot {
    pub tenant: u32,
    pub name: Box<[u8]>,
    pub series: usize,
    pub labels: Option<Mutex<LabelSketches>>,
}

pub struct TenantSlot {
    pub name: Box<[u8]>,
    pub series: usize,
    pub metrics: HashMap<Box<[u8]>, u32>,
}

#[derive(Default)]
pub struct Tables {
    pub series: SeriesTable,
    pub metrics: Vec<Option<MetricSlot>>,
    free_metrics: Vec<u32>,
    pub tenants: Vec<Option<TenantSlot>>,
    free_tenants: Vec<u32>,
    tenant_index: HashMap<Box<[u8]>, u32>,
    /// Series are tracked when their key's top `shift` bits are zero (a sample of
    /// 2^-shift of them): only without limits, past `max_tracked_series`.
    pub shift: u32,
    sketched: usize,
    live_metrics: usize,
    name_bytes: usize,
}

impl Tables {
    /// Whether a series with `key` is in the sample the table tracks.
    #[inline]
    pub fn sampled(&self, key: u64) -> bool {
        self.shift == 0 || key >> (64 - self.shift) == 0
    }

    pub fn tenant(&self, name: &[u8]) -> Option<u32> {
        self.tenant_index.get(name).copied()
    }

    pub fn tenant_series(&self, tenant: Option<u32>) -> usize {
        tenant
            .and_then(|t| self.tenants[t as usize].as_ref())
            .map_or(0, |t| t.series)
    }

    pub fn metric(&self, tenant: Option<u32>, name: &[u8]) -> Option<u32> {
        let t = self.tenants[tenant? as usize].as_ref()?;
        t.metrics.get(name).copied()
    }

    pub fn metric_series(&self, metric: Option<u32>) -> usize {
        metric
            .and_then(|m| self.metrics[m as usize].as_ref())
            .map_or(0, |m| m.series)
    }

    fn tenant_or_insert(&mut self, name: &[u8]) -> Option<u32> {
        if let Some(t) = self.tenant(name) {
            return Some(t);
        }
        if self.name_bytes + 2 * name.len() > MAX_NAME_BYTES {
            return None;
        }
        self.name_bytes += 2 * name.len();
        let slot = TenantSlot {
            name: name.into(),
            series: 0,
            metrics: HashMap::new(),
        };
        let id = match self.free_tenants.pop() {
            Some(id) => {
                self.tenants[id as usize] = Some(slot);
                id
            }
            None => {
                self.tenants.push(Some(slot));
                (self.tenants.len() - 1) as u32
            }
        };
        self.tenant_index.insert(name.into(), id);
        Some(id)
    }

    fn metric_or_insert(&mut self, tenant: u32, name: &[u8]) -> Option<u32> {
        if let Some(m) = self.metric(Some(tenant), name) {
            return Some(m);
        }
        if self.live_metrics >= MAX_METRICS || self.name_bytes + 2 * name.len() > MAX_NAME_BYTES {
            return None;
        }
        self.live_metrics += 1;
        self.name_bytes += 2 * name.len();
        let labels = (self.sketched < MAX_SKETCHED).then(|| {
            self.sketched += 1;
            Mutex::new(LabelSketches::default())
        });
        let slot = MetricSlot {
            tenant,
            name: name.into(),
            series: 0,
            labels,
        };
        let id = match self.free_metrics.pop() {
            Some(id) => {
                self.metrics[id as usize] = Some(slot);
                id
            }
            None => {
                self.metrics.push(Some(slot));
                (self.metrics.len() - 1) as u32
            }
        };
        if let Some(t) = self.tenants[tenant as usize].as_mut() {
            t.metrics.insert(name.into(), id);
        }
        Some(id)
    }

    /// Adds the series `key` of metric `name` of `tenant`, seen at `now`; returns its
    /// metric, or `None` when the tables hold as many metrics or name bytes as they may
    /// ([`MAX_METRICS`], [`MAX_NAME_BYTES`]).
    pub fn insert(&mut self, key: u64, tenant: &[u8], name: &[u8], now: u32) -> Option<u32> {
        // No tenant slot for a series whose metric would not fit.
        if self.metric(self.tenant(tenant), name).is_none()
            && (self.live_metrics >= MAX_METRICS
                || self.name_bytes + 2 * (name.len() + tenant.len()) > MAX_NAME_BYTES)
        {
            return None;
        }
        let t = self.tenant_or_insert(tenant)?;
        let m = self.metric_or_insert(t, name)?;
        self.series.insert(
            key,
            Entry {
                last_seen: AtomicU32::new(now),
                metric: m,
            },
        );
        if let Some(slot) = self.metrics[m as usize].as_mut() {
            slot.series += 1;
        }
        if let Some(slot) = self.tenants[t as usize].as_mut() {
            slot.series += 1;
        }
        Some(m)
    }

    /// Removes the series `keep` refuses, and the metrics and tenants left without
    /// series.
    fn remove_where(&mut self, mut keep: impl FnMut(u64, &Entry) -> bool) {
        let metrics = &mut self.metrics;
        let tenants = &mut self.tenants;
        self.series.retain(|&k, e| {
            if keep(k, e) {
                return true;
            }
            if let Some(m) = metrics[e.metric as usize].as_mut() {
                m.series -= 1;
                if let Some(t) = tenants[m.tenant as usize].as_mut() {
                    t.series -= 1;
                }
            }
            false
        });
        for id in 0..self.metrics.len() {
            let empty = self.metrics[id].as_ref().is_some_and(|m| m.series == 0);
            if !empty {
                continue;
            }
            if let Some(m) = self.metrics[id].take() {
                if m.labels.is_some() {
                    self.sketched -= 1;
                }
                self.live_metrics -= 1;
                self.name_bytes = self.name_bytes.saturating_sub(2 * m.name.len());
                if let Some(t) = self.tenants[m.tenant as usize].as_mut() {
                    t.metrics.remove(&m.name);
                }
                self.free_metrics.push(id as u32);
            }
        }
        for id in 0..self.tenants.len() {
            let empty = self.tenants[id]
                .as_ref()
                .is_some_and(|t| t.series == 0 && t.metrics.is_empty());
            if empty && let Some(t) = self.tenants[id].take() {
                self.tenant_index.remove(&t.name);
                self.name_bytes = self.name_bytes.saturating_sub(2 * t.name.len());
                self.free_tenants.push(id as u32);
            }
        }
    }

    /// Forgets series not seen since `oldest` (a second).
    pub fn expire(&mut self, oldest: u32) {
        self.remove_where(|_, e| e.last_seen.load(Ordering::Relaxed) >= oldest);
    }

    /// Halves the sample: keeps the series whose key's next bit is zero too.
    pub fn halve_sample(&mut self) {
        self.shift = (self.shift + 1).min(63);
        let shift = self.shift;
        self.remove_where(|k, _| k >> (64 - shift) == 0);
    }

    /// Doubles the sample again (undoes one [`Tables::halve_sample`]); the series of
    /// the half let in are counted as they are next seen.
    pub fn double_sample(&mut self) {
        self.shift = self.shift.saturating_sub(1);
    }

    /// Forgets everything (a switch between sampled and exact tracking).
    pub fn clear(&mut self) {
        *self = Tables::default();
    }

    /// Bytes the tables hold, estimated from their capacities.
    pub fn bytes(&self) -> usize {
        let series = self.series.capacity() * (std::mem::size_of::<(u64, Entry)>() + 1);
        let metrics = self.metrics.capacity() * std::mem::size_of::<Option<MetricSlot>>()
            + self
                .metrics
                .iter()
                .flatten()
                .map(|m| 2 * m.name.len() + 48)
                .sum::<usize>()
            + self.sketched * super::sketch::MAX_BYTES;
        let tenants = self.tenants.capacity() * std::mem::size_of::<Option<TenantSlot>>()
            + self
                .tenants
                .iter()
                .flatten()
                .map(|t| 2 * t.name.len() + 48)
                .sum::<usize>();
        series + metrics + tenants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_frees_series_metrics_and_tenants() {
        let mut t = Tables::default();
        t.insert(1, b"a", b"m", 10);
        t.insert(2, b"a", b"m", 20);
        t.insert(3, b"b", b"n", 10);
        let a = t.tenant(b"a");
        assert_eq!(t.tenant_series(a), 2);
        assert_eq!(t.metric_series(t.metric(a, b"m")), 2);
        t.expire(15);
        assert_eq!(t.series.len(), 1);
        assert_eq!(t.metric_series(t.metric(a, b"m")), 1);
        assert_eq!(t.tenant(b"b"), None);
        assert_eq!(t.live_metrics, 1);
        // A freed slot is reused.
        t.insert(4, b"c", b"o", 30);
        assert_eq!(t.tenants.len(), 2);
    }

    #[test]
    fn metrics_past_the_cap_are_not_tracked() {
        let mut t = Tables::default();
        for i in 0..MAX_METRICS {
            assert!(
                t.insert(i as u64, b"", format!("m{i}").as_bytes(), 1)
                    .is_some()
            );
        }
        assert_eq!(t.insert(u64::MAX, b"", b"one_more", 1), None);
        // A series of a metric already tracked still is.
        assert!(t.insert(u64::MAX, b"", b"m0", 1).is_some());
        let long = vec![b'x'; MAX_NAME_BYTES];
        assert_eq!(t.insert(7 << 40, b"", &long, 1), None);
    }

    #[test]
    fn halving_the_sample_keeps_the_keys_with_a_zero_top_bit() {
        let mut t = Tables::default();
        for k in [1u64, u64::MAX, 1 << 62, 1 << 63] {
            t.insert(k, b"", b"m", 1);
        }
        t.halve_sample();
        assert_eq!(t.series.len(), 2);
        assert!(t.sampled(1) && !t.sampled(1 << 63));
        assert_eq!(t.metric_series(t.metric(t.tenant(b""), b"m")), 2);
    }
}
