//! Metadata: renamed and re-united families, and the counters learnt from it for the
//! metadata `_total` fix.

use super::*;

/// The "pack" of steps that are not from a pack (the metadata `_total` fix).
pub(super) const METADATA_FIX_PACK: u16 = u16::MAX;

/// Counter families learnt from `MetricMetadata` (type COUNTER, no `_total`, unknown to
/// every pack): their series get `_total` (docs/rules.md). Shared by all workers; a mapper
/// works on a snapshot it refreshes when the version moves, so the hot path takes no lock.
#[derive(Debug, Default)]
pub struct CounterFamilies {
    pub(super) set: Mutex<Arc<AHashSet<Box<str>>>>,
    pub(super) version: AtomicU64,
    /// The names' bytes plus a fixed overhead per name; written under `set`'s lock.
    bytes: AtomicUsize,
}

impl CounterFamilies {
    /// Families remembered at most (metadata of unbounded cardinality cannot grow it).
    pub const LIMIT: usize = 100_000;
    /// Bytes of names (plus 64 per name) remembered at most: names may be 64 KiB each.
    pub const BYTES: usize = 8 << 20;

    /// Goes up each time the set changes: a snapshot of another version is a stale copy.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Bytes held, as [`CounterFamilies::BYTES`] counts them.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.set.lock().map(|s| s.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn learn(&self, names: &mut Vec<Box<str>>) {
        let Ok(mut guard) = self.set.lock() else {
            return;
        };
        let mut next = (**guard).clone();
        let mut bytes = self.bytes.load(Ordering::Relaxed);
        for n in names.drain(..) {
            let cost = n.len() + 64;
            if next.len() < Self::LIMIT && bytes + cost <= Self::BYTES && next.insert(n) {
                bytes += cost;
            }
        }
        self.bytes.store(bytes, Ordering::Relaxed);
        *guard = Arc::new(next);
        self.version.fetch_add(1, Ordering::Release);
    }

    pub(super) fn snapshot(&self) -> Option<(u64, Arc<AHashSet<Box<str>>>)> {
        let guard = self.set.lock().ok()?;
        Some((self.version.load(Ordering::Acquire), guard.clone()))
    }
}

impl Mapper {
    /// Takes a new snapshot of the learnt counter families when they changed.
    pub(super) fn refresh_counters(&mut self, cf: &CounterFamilies) {
        if cf.version.load(Ordering::Acquire) != self.counters_version
            && let Some((v, snap)) = cf.snapshot()
        {
            self.counters_version = v;
            self.counters_seen = snap;
            // Names resolved before may now take the `_total` fix.
            self.resolved.clear();
        }
    }

    /// Takes out a snapshot of the learnt counter families that is no longer the current
    /// one, before the mapper idles in the pool: each snapshot taken after a change is a
    /// copy of up to [`CounterFamilies::BYTES`], and idle mappers holding old ones would
    /// pin one each, counted nowhere. The next request takes the current one. The
    /// caller drops what it returns (outside any lock).
    pub fn take_stale_counters(&mut self, cf: &CounterFamilies) -> Option<Arc<AHashSet<Box<str>>>> {
        if cf.version.load(Ordering::Acquire) == self.counters_version
            || self.counters_seen.is_empty()
        {
            return None;
        }
        // Never a current version: the next refresh takes a snapshot (and clears the
        // names resolved with the old one).
        self.counters_version = u64::MAX;
        Some(std::mem::take(&mut self.counters_seen))
    }

    /// The version of the learnt-counters snapshot it holds; `None`: none (empty).
    pub fn counters_snapshot(&self) -> Option<u64> {
        (!self.counters_seen.is_empty()).then_some(self.counters_version)
    }

    /// The metadata `_total` fix: a series named exactly like a learnt counter family.
    pub(super) fn total_fix(&mut self, name: &str) -> Option<Resolved> {
        if self.counters_seen.is_empty() || !self.counters_seen.contains(name) {
            return None;
        }
        Some(self.total_fix_plan(name))
    }

    /// The plan that gives `name` the suffix `_total` (cached per name).
    fn total_fix_plan(&mut self, name: &str) -> Resolved {
        if let Some(p) = self.total_fix_plans.get(name.as_bytes()) {
            return Resolved::Plan(p.clone());
        }
        let plan = Arc::new(Plan {
            rename_slot: None,
            family_slot: None,
            steps: vec![Step {
                when: Vec::new(),
                action: Action::SetName(format!("{name}_total").into()),
                pack: METADATA_FIX_PACK,
            }],
            keep_original: false,
            rescales: false,
            trace: vec![format!("metadata: {name} is a COUNTER: {name}_total")],
            copies: Vec::new(),
            ..Plan::default()
        });
        self.total_fix_plans.insert(name.as_bytes(), plan.clone());
        Resolved::Plan(plan)
    }

    pub(super) fn map_metadata(
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
            } else {
                self.meta_cache.get_or_insert_with(family.as_bytes(), || {
                    rules.metadata_plan(family).map(Arc::new)
                })
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
                    write_input_metadata(out, md, buf);
                    self.stats.metadata_out += 1;
                }
                continue;
            };
            if plan.keep_input && self.first_meta(family.as_bytes()) {
                write_input_metadata(out, md, buf);
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
                let help = match (o.help.as_deref(), o.rescale) {
                    (Some(h), _) => h.as_bytes(),
                    (None, Some(f)) => {
                        meta::rewrite_help(md.help.bytes(buf), f, o.help_unit, &mut self.help_buf);
                        &self.help_buf[..]
                    }
                    (None, None) => md.help.bytes(buf),
                };
                let metric_type = o.family_type.and_then(wire_type).unwrap_or(md.metric_type);
                write_metadata(out, metric_type, o.name.as_bytes(), help, unit);
                self.stats.metadata_out += 1;
            }
        }
    }

    /// True the first time this request writes metadata for family `name`.
    pub(super) fn first_meta(&mut self, name: &[u8]) -> bool {
        let mut h = self.hasher.build_hasher();
        h.write(name);
        self.meta_seen.insert(h.finish())
    }
}

/// The remote-write `MetricType` of a split value written with its own `type:`.
fn wire_type(t: crate::mapping::spec::FamilyType) -> Option<i32> {
    use crate::mapping::spec::FamilyType;
    match t {
        FamilyType::Any => None,
        FamilyType::Counter => Some(1),
        FamilyType::Gauge => Some(2),
        FamilyType::Histogram => Some(3),
        FamilyType::Summary => Some(5),
        FamilyType::Info => Some(6),
    }
}

/// Writes an input's metadata as received: its own bytes for 1.0, rebuilt from its fields
/// for metadata that came with 2.0 series (it has no 1.0 bytes).
fn write_input_metadata(out: &mut Vec<u8>, md: &crate::wire::decode::MetadataView, buf: &[u8]) {
    if md.raw.is_empty() {
        write_metadata(
            out,
            md.metric_type,
            md.family.bytes(buf),
            md.help.bytes(buf),
            md.unit.bytes(buf),
        );
    } else {
        write_raw_metadata(out, md.raw.bytes(buf));
    }
}

impl Mapper {
    /// The metadata `_total` fix for a 2.0 series whose own metadata says COUNTER: no
    /// learning across requests needed. Same conditions as for learnt families.
    pub(super) fn series_total_fix(&mut self, s: &SeriesView, buf: &[u8]) -> Option<Resolved> {
        if s.metric_type != crate::wire::decode_v2::TYPE_COUNTER {
            return None;
        }
        let name = s.name.str(buf);
        if name.ends_with("_total") {
            return None;
        }
        Some(self.total_fix_plan(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_families_are_bounded_in_bytes() {
        let cf = CounterFamilies::default();
        let long = 60 << 10;
        let rounds = CounterFamilies::BYTES / (8 * long) + 4;
        for r in 0..rounds {
            let mut names: Vec<Box<str>> = (0..8)
                .map(|i| format!("{r}_{i}_{}", "c".repeat(long)).into())
                .collect();
            cf.learn(&mut names);
            assert!(cf.bytes() <= CounterFamilies::BYTES);
        }
        assert!(cf.len() < rounds * 8, "refused past the bound");
        let held = cf.bytes();
        // A name learnt twice counts once; a short new one still fits.
        cf.learn(&mut vec!["0_0_x".into(), "0_0_x".into()]);
        assert_eq!(cf.bytes(), held + "0_0_x".len() + 64);
    }

    #[test]
    fn an_idle_mapper_lets_go_of_an_old_snapshot_and_takes_the_new_one_when_used() {
        let cf = CounterFamilies::default();
        cf.learn(&mut vec!["vllm:old_requests".into()]);
        let mut m = Mapper::new();
        m.refresh_counters(&cf);
        assert!(m.total_fix("vllm:old_requests").is_some());
        // Current: kept (no copy to take again).
        assert!(m.take_stale_counters(&cf).is_none());
        assert_eq!(Arc::strong_count(&m.counters_seen), 2);
        cf.learn(&mut vec!["vllm:new_requests".into()]);
        let old = Arc::downgrade(&m.counters_seen);
        drop(m.take_stale_counters(&cf));
        assert!(old.upgrade().is_none(), "the old copy is freed");
        assert!(
            m.total_fix("vllm:new_requests").is_none(),
            "nothing held now"
        );
        m.refresh_counters(&cf);
        assert!(m.total_fix("vllm:old_requests").is_some());
        assert!(m.total_fix("vllm:new_requests").is_some());
    }
}
