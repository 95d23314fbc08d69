//! The cardinality guard (docs/limits.md): active-series limits per metric and per
//! tenant, and per-series label limits, applied to the mapped body (the names and
//! labels the backends will see) before it is encoded and routed. A series over a limit
//! is left out and counted; the rest of its request goes on. The same counts answer
//! `GET /api/v1/cardinality` ([`view`]).
//!
//! A request is one read-locked pass over its series (the ones already active only get
//! their last-seen second refreshed, an atomic store), then, when it brought new series,
//! one write-locked pass that admits them in order while the limits allow; the body is
//! copied without the series left out only when there are some.

pub mod sketch;
pub mod tracker;
pub mod view;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::telemetry;
use crate::wire::DecodeError;
use crate::wire::decode::{DecodedRequest, short_label_at};
use crate::wire::pb::{Reader, WIRE_LEN, varint_len};
use tracker::{Entry, Tables};

/// One tenant's (max_series_per_metric, max_series_per_tenant); `None` keeps the global.
pub type TenantOverride = (Option<usize>, Option<usize>);

/// A byte range in the body.
type Range = (usize, usize);

/// The guard's settings (`limits.*` and the tenancy it counts tenants by).
#[derive(Clone, Debug)]
pub struct GuardOptions {
    pub max_series_per_metric: usize,
    pub max_series_per_tenant: usize,
    pub window: Duration,
    pub series_max_labels: usize,
    pub series_max_label_value_bytes: usize,
    pub max_tracked_series: usize,
    /// Per tenant: (max_series_per_metric, max_series_per_tenant), `None` keeping the
    /// global value.
    pub overrides: HashMap<Box<[u8]>, TenantOverride>,
    /// The label naming a series' tenant (`None`: no tenancy, every series one tenant's).
    pub tenant_label: Option<Box<[u8]>>,
    /// The tenant of series without the label (`tenancy.default`).
    pub tenant_default: Option<Box<[u8]>>,
    /// The header whose value is the tenant of series without label or default.
    pub tenant_header: Option<String>,
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            max_series_per_metric: 0,
            max_series_per_tenant: 0,
            window: Duration::from_secs(600),
            series_max_labels: 0,
            series_max_label_value_bytes: 0,
            max_tracked_series: 1_000_000,
            overrides: HashMap::new(),
            tenant_label: None,
            tenant_default: None,
            tenant_header: None,
        }
    }
}

impl GuardOptions {
    /// Whether any series limit is on: then every series is tracked exactly.
    pub fn enforcing(&self) -> bool {
        self.max_series_per_metric > 0
            || self.max_series_per_tenant > 0
            || self
                .overrides
                .values()
                .any(|(m, t)| m.is_some_and(|v| v > 0) || t.is_some_and(|v| v > 0))
    }

    /// (max_series_per_metric, max_series_per_tenant) for `tenant`; 0: off.
    pub fn limits_for(&self, tenant: &[u8]) -> (usize, usize) {
        match self.overrides.get(tenant) {
            Some((m, t)) => (
                m.unwrap_or(self.max_series_per_metric),
                t.unwrap_or(self.max_series_per_tenant),
            ),
            None => (self.max_series_per_metric, self.max_series_per_tenant),
        }
    }

    fn window_secs(&self) -> u32 {
        self.window.as_secs().clamp(1, u64::from(u32::MAX / 2)) as u32
    }
}

/// Why a series was left out: the limit's key, the `reason` of its drop count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    MaxSeriesPerMetric,
    MaxSeriesPerTenant,
    SeriesMaxLabels,
    SeriesMaxLabelValueBytes,
    MaxTrackedSeries,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::MaxSeriesPerMetric,
        Reason::MaxSeriesPerTenant,
        Reason::SeriesMaxLabels,
        Reason::SeriesMaxLabelValueBytes,
        Reason::MaxTrackedSeries,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MaxSeriesPerMetric => "max_series_per_metric",
            Reason::MaxSeriesPerTenant => "max_series_per_tenant",
            Reason::SeriesMaxLabels => "series_max_labels",
            Reason::SeriesMaxLabelValueBytes => "series_max_label_value_bytes",
            Reason::MaxTrackedSeries => "max_tracked_series",
        }
    }
}

/// Where a series' tenant is read: its tenant label's value, or the request's fallback.
#[derive(Clone, Copy, Debug)]
enum TenantAt {
    Label(usize, usize),
    Fallback,
}

fn tenant_at(label: Option<Range>) -> TenantAt {
    match label {
        Some((a, b)) => TenantAt::Label(a, b),
        None => TenantAt::Fallback,
    }
}

/// A series of the request and its key.
struct Seen {
    key: u64,
    from: usize,
    to: usize,
    start: usize,
    end: usize,
}

/// A series met in the read pass that the table does not hold yet.
struct Pending {
    from: usize,
    to: usize,
    key: u64,
    name: (usize, usize),
    tenant: TenantAt,
    start: usize,
    end: usize,
    samples: u64,
    histograms: u64,
}

/// A series left out.
struct Drop {
    from: usize,
    to: usize,
    reason: Reason,
    tenant: TenantAt,
    name: (usize, usize),
    samples: u64,
    histograms: u64,
}

/// Per-request buffers, reused.
#[derive(Default)]
pub struct GuardScratch {
    seen: Vec<Seen>,
    pending: Vec<Pending>,
    drops: Vec<Drop>,
    counted: Vec<(Reason, TenantAt, u64)>,
    /// A hash of (reason, tenant) → its place in `counted`.
    counted_at: HashMap<u64, usize>,
    /// The body without the series left out, when the last [`Guard::filter`] left some.
    pub out: Vec<u8>,
}

impl GuardScratch {
    pub fn retained_bytes(&self) -> usize {
        self.out.capacity()
            + self.seen.capacity() * std::mem::size_of::<Seen>()
            + self.pending.capacity() * std::mem::size_of::<Pending>()
            + self.drops.capacity() * std::mem::size_of::<Drop>()
    }
}

/// What one [`Guard::filter`] left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    pub series: usize,
    pub samples: u64,
    pub histograms: u64,
}

/// One series' labels as the walk reads them.
#[derive(Default)]
struct Scan {
    labels: usize,
    longest_value: usize,
    name: (usize, usize),
    tenant: Option<(usize, usize)>,
    hash: u64,
    samples: u64,
    histograms: u64,
}

pub struct Guard {
    opts: ArcSwap<GuardOptions>,
    tables: RwLock<Tables>,
    epoch: Instant,
    next_sweep: AtomicU32,
    /// A hash of (reason, tenant, metric) → the second its last log line was written
    /// (a hash: a dropped series allocates nothing; a collision only skips a line).
    logged: Mutex<HashMap<u64, u32>>,
    /// The second `logged` was last pruned.
    log_pruned: AtomicU32,
    /// The drop counters by a hash of (reason, tenant): registered once each, so that
    /// counting allocates nothing once warm.
    counters: Mutex<HashMap<u64, metrics::Counter>>,
    hasher: ahash::RandomState,
}

/// Drop counter handles kept at most (tenants × reasons); past it they are registered
/// again as needed.
const MAX_COUNTERS: usize = 4096;

/// Log lines remembered at most (one a minute per limit, tenant and metric).
const MAX_LOGGED: usize = 4096;

impl Guard {
    pub fn new(opts: GuardOptions) -> Guard {
        Guard {
            opts: ArcSwap::from_pointee(opts),
            tables: RwLock::new(Tables::default()),
            epoch: Instant::now(),
            next_sweep: AtomicU32::new(0),
            logged: Mutex::new(HashMap::new()),
            log_pruned: AtomicU32::new(0),
            counters: Mutex::new(HashMap::new()),
            hasher: ahash::RandomState::with_seeds(
                0x9e37_79b9_7f4a_7c15,
                0xbf58_476d_1ce4_e5b9,
                0x94d0_49bb_1331_11eb,
                0x2545_f491_4f6c_dd1d,
            ),
        }
    }

    /// New settings for a reload; the counts stay. A switch from sampled to exact
    /// tracking (a limit turned on while the view sampled) starts the counts afresh.
    pub fn reconfigure(&self, opts: GuardOptions) {
        if opts.enforcing()
            && let Ok(mut t) = self.tables.write()
            && t.shift > 0
        {
            t.clear();
        }
        self.opts.store(std::sync::Arc::new(opts));
        self.next_sweep.store(0, Ordering::Relaxed);
    }

    pub fn options(&self) -> std::sync::Arc<GuardOptions> {
        self.opts.load_full()
    }

    /// The second now, counted from start-up (from 1).
    fn now(&self) -> u32 {
        (self.epoch.elapsed().as_secs() + 1).min(u64::from(u32::MAX)) as u32
    }

    /// The sender's tenant for series without a tenant label or default: the value of
    /// the tenancy header in `headers`.
    pub fn sender_tenant<'h>(&self, headers: &'h http::HeaderMap) -> Option<&'h [u8]> {
        let opts = self.opts.load();
        let name = opts.tenant_header.as_deref()?;
        headers
            .get(name)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty())
    }

    /// Checks every series of the mapped 1.0 `body` against the limits; when some are
    /// left out, `scratch.out` holds the body without them. `sender_tenant`: the
    /// request's tenant header ([`Guard::sender_tenant`]).
    pub fn filter(
        &self,
        body: &[u8],
        sender_tenant: Option<&[u8]>,
        scratch: &mut GuardScratch,
    ) -> Result<Filtered, DecodeError> {
        self.filter_at(body, None, sender_tenant, scratch, self.now())
    }

    /// [`Guard::filter`] for a 1.0 request no rule touched (`body` is the input that
    /// `decoded` was decoded from): each series' labels are where the decoder found them,
    /// so the series are not walked again.
    pub fn filter_input(
        &self,
        body: &[u8],
        decoded: &DecodedRequest,
        sender_tenant: Option<&[u8]>,
        scratch: &mut GuardScratch,
    ) -> Result<Filtered, DecodeError> {
        self.filter_at(body, Some(decoded), sender_tenant, scratch, self.now())
    }

    fn filter_at(
        &self,
        body: &[u8],
        decoded: Option<&DecodedRequest>,
        sender_tenant: Option<&[u8]>,
        s: &mut GuardScratch,
        now: u32,
    ) -> Result<Filtered, DecodeError> {
        let opts = self.opts.load();
        self.maybe_sweep(&opts, now);
        s.pending.clear();
        s.drops.clear();
        let tenant_label = opts.tenant_label.as_deref();
        let fallback: &[u8] = match tenant_label {
            None => b"",
            Some(_) => opts
                .tenant_default
                .as_deref()
                .or(sender_tenant)
                .unwrap_or(b""),
        };
        // Series that take the fallback tenant do not name it in their labels.
        let salt = if fallback.is_empty() {
            0
        } else {
            self.hasher.hash_one(fallback) | 1
        };
        let window = opts.window_secs();
        let generation = now / window;
        // Pass one, no lock held: each series' key (and the label limits). Pass two,
        // read-locked: the lookups, one after another, so that their cache misses
        // overlap.
        s.seen.clear();
        let from_view =
            decoded.is_some_and(|d| self.seen_from_view(body, d, &opts, tenant_label, salt, s));
        if !from_view {
            s.seen.clear();
            s.drops.clear();
            let mut r = Reader::new(body, 0, body.len());
            while !r.is_done() {
                let from = r.pos();
                let (field, wire) = r.key()?;
                if field != 1 || wire != WIRE_LEN {
                    r.skip(wire)?;
                    continue;
                }
                let (start, end) = r.len_delimited()?;
                let to = r.pos();
                let sc = self.scan(body, start, end, tenant_label)?;
                self.pass_one(&opts, s, sc, salt, (from, to), (start, end));
            }
        }
        {
            let Ok(t) = self.tables.read() else {
                return Ok(Filtered::default());
            };
            for x in &s.seen {
                if !t.sampled(x.key) {
                    continue;
                }
                match t.series.get(&x.key) {
                    Some(e) => self.refresh(&t, e, body, x.start, x.end, now, window),
                    None => {
                        let sc = self.scan(body, x.start, x.end, tenant_label)?;
                        s.pending.push(Pending {
                            from: x.from,
                            to: x.to,
                            key: x.key,
                            name: sc.name,
                            tenant: tenant_at(sc.tenant),
                            start: x.start,
                            end: x.end,
                            samples: sc.samples,
                            histograms: sc.histograms,
                        });
                    }
                }
            }
        }
        if !s.pending.is_empty() {
            self.admit(&opts, body, fallback, s, now, generation);
        }
        if s.drops.is_empty() {
            return Ok(Filtered::default());
        }
        s.drops.sort_unstable_by_key(|d| d.from);
        let mut done = Filtered::default();
        s.out.clear();
        let mut at = 0;
        for d in &s.drops {
            s.out.extend_from_slice(&body[at..d.from]);
            at = d.to;
            done.series += 1;
            done.samples += d.samples;
            done.histograms += d.histograms;
        }
        s.out.extend_from_slice(&body[at..]);
        self.account(&opts, body, fallback, s, now);
        Ok(done)
    }

    /// Pass one from the decoder's view of `body`: each series' key and label limits;
    /// false (and pass one is walked instead) where a series is not where the walk
    /// would find it, as a top-level field 1 with a short length.
    fn seen_from_view(
        &self,
        body: &[u8],
        decoded: &DecodedRequest,
        opts: &GuardOptions,
        tenant_label: Option<&[u8]>,
        salt: u64,
        s: &mut GuardScratch,
    ) -> bool {
        for v in &decoded.series {
            let (start, end) = (v.raw.start as usize, v.raw.end as usize);
            let Some(from) = start.checked_sub(1 + varint_len((end - start) as u64)) else {
                return false;
            };
            if body.get(from) != Some(&0x0a)
                || short_varint(body, from + 1) != Some((end - start, start - from - 1))
            {
                return false;
            }
            let labels = &decoded.labels[v.labels.usize()];
            let sc = match labels.last() {
                Some(last) if v.labels_encoded => {
                    let mut sc = Scan {
                        labels: labels.len(),
                        name: (v.name.start as usize, v.name.end as usize),
                        hash: label_hash(&body[start..last.value.end as usize]),
                        samples: v.samples.len() as u64,
                        histograms: v.histograms.len() as u64,
                        ..Scan::default()
                    };
                    if opts.series_max_label_value_bytes > 0 {
                        sc.longest_value = labels.iter().map(|l| l.value.len()).max().unwrap_or(0);
                    }
                    if let Some(t) = tenant_label {
                        sc.tenant = labels
                            .iter()
                            .find(|l| l.name.bytes(body) == t && !l.value.is_empty())
                            .map(|l| (l.value.start as usize, l.value.end as usize));
                    }
                    sc
                }
                _ => match self.scan(body, start, end, tenant_label) {
                    Ok(sc) => sc,
                    Err(_) => return false,
                },
            };
            self.pass_one(opts, s, sc, salt, (from, end), (start, end));
        }
        true
    }

    /// Pass one's verdict on one series: left out by a label limit, or seen.
    #[inline]
    fn pass_one(
        &self,
        opts: &GuardOptions,
        s: &mut GuardScratch,
        sc: Scan,
        salt: u64,
        (from, to): Range,
        (start, end): Range,
    ) {
        let over = if opts.series_max_labels > 0 && sc.labels > opts.series_max_labels {
            Some(Reason::SeriesMaxLabels)
        } else if opts.series_max_label_value_bytes > 0
            && sc.longest_value > opts.series_max_label_value_bytes
        {
            Some(Reason::SeriesMaxLabelValueBytes)
        } else {
            None
        };
        if let Some(reason) = over {
            s.drops.push(Drop {
                from,
                to,
                reason,
                tenant: tenant_at(sc.tenant),
                name: sc.name,
                samples: sc.samples,
                histograms: sc.histograms,
            });
            return;
        }
        let key = if sc.tenant.is_some() {
            sc.hash
        } else {
            sc.hash ^ salt
        };
        s.seen.push(Seen {
            key,
            from,
            to,
            start,
            end,
        });
    }

    /// A known series seen again: its last-seen second, and its labels into the
    /// metric's sketches when it is the series' first sample of this window.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn refresh(
        &self,
        t: &Tables,
        e: &Entry,
        body: &[u8],
        start: usize,
        end: usize,
        now: u32,
        window: u32,
    ) {
        let last = e.last_seen.load(Ordering::Relaxed);
        if last == now {
            return;
        }
        e.last_seen.store(now, Ordering::Relaxed);
        if last / window != now / window {
            self.sketch(t, e.metric, body, start, end, now / window);
        }
    }

    fn sketch(
        &self,
        t: &Tables,
        metric: u32,
        body: &[u8],
        start: usize,
        end: usize,
        generation: u32,
    ) {
        let Some(Some(m)) = t.metrics.get(metric as usize) else {
            return;
        };
        let Some(labels) = &m.labels else {
            return;
        };
        let Ok(mut sk) = labels.lock() else {
            return;
        };
        let _ = each_label(body, start, end, |name, value| {
            if &body[name.0..name.1] != b"__name__" {
                sk.add(generation, &body[name.0..name.1], &body[value.0..value.1]);
            }
        });
    }

    /// The write pass: admits the pending series in order while the limits allow.
    fn admit(
        &self,
        opts: &GuardOptions,
        body: &[u8],
        fallback: &[u8],
        s: &mut GuardScratch,
        now: u32,
        generation: u32,
    ) {
        let Ok(mut t) = self.tables.write() else {
            return;
        };
        let enforcing = opts.enforcing();
        if enforcing && t.shift > 0 {
            // The view sampled under earlier settings (a reload raced this request):
            // limits need every series, so the counts start afresh, exact.
            t.clear();
        }
        let window = opts.window_secs();
        for p in &s.pending {
            if !t.sampled(p.key) {
                continue;
            }
            if let Some(e) = t.series.get(&p.key) {
                // Admitted by a request that took the lock first.
                self.refresh(&t, e, body, p.start, p.end, now, window);
                continue;
            }
            let tenant = match p.tenant {
                TenantAt::Label(a, b) => &body[a..b],
                TenantAt::Fallback => fallback,
            };
            let name = &body[p.name.0..p.name.1];
            let (metric_limit, tenant_limit) = opts.limits_for(tenant);
            let tid = t.tenant(tenant);
            let reason = if tenant_limit > 0 && t.tenant_series(tid) >= tenant_limit {
                Some(Reason::MaxSeriesPerTenant)
            } else if metric_limit > 0 && t.metric_series(t.metric(tid, name)) >= metric_limit {
                Some(Reason::MaxSeriesPerMetric)
            } else if enforcing && t.series.len() >= opts.max_tracked_series {
                Some(Reason::MaxTrackedSeries)
            } else {
                None
            };
            if let Some(reason) = reason {
                s.drops.push(Drop {
                    from: p.from,
                    to: p.to,
                    reason,
                    tenant: p.tenant,
                    name: p.name,
                    samples: p.samples,
                    histograms: p.histograms,
                });
                continue;
            }
            if t.series.len() >= opts.max_tracked_series {
                // The view alone: track half as many series, and scale the counts.
                t.halve_sample();
                if !t.sampled(p.key) {
                    continue;
                }
            }
            match t.insert(p.key, tenant, name, now) {
                Some(m) => self.sketch(&t, m, body, p.start, p.end, generation),
                // As many metrics (or name bytes) as the tables may hold.
                None if enforcing => s.drops.push(Drop {
                    from: p.from,
                    to: p.to,
                    reason: Reason::MaxTrackedSeries,
                    tenant: p.tenant,
                    name: p.name,
                    samples: p.samples,
                    histograms: p.histograms,
                }),
                None => {}
            }
        }
    }

    /// Counts what was left out, by reason and tenant, and logs each (reason, tenant,
    /// metric) at most once a minute.
    fn account(
        &self,
        opts: &GuardOptions,
        body: &[u8],
        fallback: &[u8],
        s: &mut GuardScratch,
        now: u32,
    ) {
        let tenant_of = |at: TenantAt| match at {
            TenantAt::Label(a, b) => &body[a..b],
            TenantAt::Fallback => fallback,
        };
        s.counted.clear();
        s.counted_at.clear();
        for d in &s.drops {
            let n = d.samples + d.histograms;
            let tenant = tenant_of(d.tenant);
            // By a hash of (reason, tenant), then the tenant compared: one lookup a
            // drop however many tenants the request has.
            let key = {
                let mut h = self.hasher.build_hasher();
                h.write_u8(d.reason as u8);
                h.write(tenant);
                h.finish()
            };
            let at = s.counted_at.entry(key).or_insert(usize::MAX);
            match s.counted.get_mut(*at) {
                Some(c) if c.0 == d.reason && tenant_of(c.1) == tenant => c.2 += n,
                Some(_) => match s
                    .counted
                    .iter_mut()
                    .find(|(r, t, _)| *r == d.reason && tenant_of(*t) == tenant)
                {
                    Some(c) => c.2 += n,
                    None => s.counted.push((d.reason, d.tenant, n)),
                },
                None => {
                    *at = s.counted.len();
                    s.counted.push((d.reason, d.tenant, n));
                }
            }
        }
        let tenancy = opts.tenant_label.is_some();
        if let Ok(mut counters) = self.counters.lock() {
            for &(reason, at, n) in &s.counted {
                let tenant = tenant_of(at);
                let key = {
                    let mut h = self.hasher.build_hasher();
                    h.write_u8(reason as u8);
                    h.write_u8(u8::from(tenancy));
                    h.write(tenant);
                    h.finish()
                };
                if counters.len() >= MAX_COUNTERS && !counters.contains_key(&key) {
                    counters.clear();
                }
                counters
                    .entry(key)
                    .or_insert_with(|| {
                        let tenant = tenancy.then(|| String::from_utf8_lossy(tenant));
                        telemetry::series_limited(reason.as_str(), tenant.as_deref())
                    })
                    .increment(n);
            }
        }
        let Ok(mut logged) = self.logged.lock() else {
            return;
        };
        for d in &s.drops {
            let tenant = tenant_of(d.tenant);
            let name = &body[d.name.0..d.name.1];
            let key = {
                let mut h = self.hasher.build_hasher();
                h.write_u8(d.reason as u8);
                h.write(tenant);
                h.write_u8(0xff);
                h.write(name);
                h.finish()
            };
            if logged
                .get(&key)
                .is_some_and(|&at| now.saturating_sub(at) < 60)
            {
                continue;
            }
            if logged.len() >= MAX_LOGGED {
                // Pruned at most once a second: a flood of new names costs no rescans.
                if self.log_pruned.swap(now, Ordering::Relaxed) != now {
                    logged.retain(|_, at| now.saturating_sub(*at) < 60);
                }
                if logged.len() >= MAX_LOGGED {
                    continue;
                }
            }
            logged.insert(key, now);
            let (metric_limit, tenant_limit) = opts.limits_for(tenant);
            let limit = match d.reason {
                Reason::MaxSeriesPerMetric => metric_limit,
                Reason::MaxSeriesPerTenant => tenant_limit,
                Reason::SeriesMaxLabels => opts.series_max_labels,
                Reason::SeriesMaxLabelValueBytes => opts.series_max_label_value_bytes,
                Reason::MaxTrackedSeries => opts.max_tracked_series,
            };
            tracing::warn!(
                metric = %String::from_utf8_lossy(name),
                tenant = %String::from_utf8_lossy(tenant),
                limit = d.reason.as_str(),
                value = limit,
                "series left out: limit reached (further ones of this metric are counted in promnorm_samples_dropped_total, logged again in a minute)"
            );
        }
    }

    /// Forgets the series that left the window, at most every tenth of it.
    fn maybe_sweep(&self, opts: &GuardOptions, now: u32) {
        let next = self.next_sweep.load(Ordering::Relaxed);
        if now < next {
            return;
        }
        let window = opts.window_secs();
        let period = (window / 10).max(1);
        if self
            .next_sweep
            .compare_exchange(next, now + period, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        if let Ok(mut t) = self.tables.write() {
            t.expire(now.saturating_sub(window));
            // The view sampled past its capacity and the series have since gone: twice
            // the sample still leaves half the capacity free, so the rate goes back up
            // (a quarter: no back and forth at the bound).
            if t.shift > 0 && !opts.enforcing() && t.series.len() < opts.max_tracked_series / 4 {
                t.double_sample();
            }
        }
    }

    /// One series' label count, longest value, name and tenant label, the hash of its
    /// labels, and its samples and histograms.
    #[inline]
    fn scan(
        &self,
        body: &[u8],
        start: usize,
        end: usize,
        tenant_label: Option<&[u8]>,
    ) -> Result<Scan, DecodeError> {
        if let Some(sc) = self.quick_scan(body, start, end, tenant_label) {
            return Ok(sc);
        }
        self.general_scan(body, start, end, tenant_label)
    }

    /// [`Guard::scan`] for the shape the mapper writes and senders send: short labels
    /// first, then samples, histograms and exemplars only, in one tight pass; `None`
    /// for anything else (the general walk's, which hashes the same bytes).
    #[inline(always)]
    fn quick_scan(
        &self,
        body: &[u8],
        start: usize,
        end: usize,
        tenant_label: Option<&[u8]>,
    ) -> Option<Scan> {
        let b = body.get(..end)?;
        let mut sc = Scan::default();
        let mut p = start;
        while p < end && b[p] == 0x0a {
            let l = short_label_at(b, p)?;
            let (vs, ve) = (l.value.start, l.value.end);
            let name = &b[l.name.start..l.name.end];
            sc.labels += 1;
            sc.longest_value = sc.longest_value.max(ve - vs);
            if name == b"__name__" {
                sc.name = (vs, ve);
            } else if tenant_label == Some(name) && ve > vs {
                sc.tenant = Some((vs, ve));
            }
            p = ve;
        }
        let labels_end = p;
        while p < end {
            let k = b[p];
            // Length-delimited fields 2 (sample), 3 (exemplar), 4 (histogram) only.
            if !matches!(k, 0x12 | 0x1a | 0x22) {
                return None;
            }
            let (len, n) = short_varint(b, p + 1)?;
            p = (p + 1 + n).checked_add(len)?;
            match k {
                0x12 => sc.samples += 1,
                0x22 => sc.histograms += 1,
                _ => {}
            }
        }
        if p != end {
            return None;
        }
        sc.hash = label_hash(&b[start..labels_end]);
        Some(sc)
    }

    fn general_scan(
        &self,
        body: &[u8],
        start: usize,
        end: usize,
        tenant_label: Option<&[u8]>,
    ) -> Result<Scan, DecodeError> {
        let mut sc = Scan::default();
        // Labels first, one after another (the mapper's shape): hashed as one slice.
        let mut first = None;
        let mut last = start;
        let mut contiguous = true;
        let mut r = Reader::new(body, start, end);
        while !r.is_done() {
            let p = r.pos();
            let (field, wire) = r.key()?;
            match (field, wire) {
                (1, WIRE_LEN) => {
                    let (ls, le) = r.len_delimited()?;
                    let (name, value) = label_at(body, p, ls, le)?;
                    if first.is_none() {
                        first = Some(p);
                    } else if last != p {
                        contiguous = false;
                    }
                    last = le;
                    sc.labels += 1;
                    sc.longest_value = sc.longest_value.max(value.1 - value.0);
                    let n = &body[name.0..name.1];
                    if n == b"__name__" {
                        sc.name = value;
                    } else if tenant_label == Some(n) && value.1 > value.0 {
                        sc.tenant = Some(value);
                    }
                }
                (2, WIRE_LEN) => {
                    r.len_delimited()?;
                    sc.samples += 1;
                }
                (4, WIRE_LEN) => {
                    r.len_delimited()?;
                    sc.histograms += 1;
                }
                _ => r.skip(wire)?,
            }
        }
        let first = first.unwrap_or(start);
        sc.hash = if contiguous {
            label_hash(&body[first..last])
        } else {
            // The label fields one after another, as a contiguous series holds them.
            let mut fields = Vec::with_capacity(end - start);
            let mut r = Reader::new(body, start, end);
            while !r.is_done() {
                let p = r.pos();
                let (field, wire) = r.key()?;
                r.skip(wire)?;
                if field == 1 && wire == WIRE_LEN {
                    fields.extend_from_slice(&body[p..r.pos()]);
                }
            }
            label_hash(&fields)
        };
        Ok(sc)
    }

    /// The tables' size: series tracked, and the bytes they hold.
    pub fn tracked(&self) -> (usize, usize) {
        self.tables
            .read()
            .map(|t| (t.series.len(), t.bytes()))
            .unwrap_or((0, 0))
    }
}

/// The key of a series: a hash of its label fields' bytes (rapidhash: about twice as
/// fast as ahash's portable path on a series' 100 to 200 bytes).
#[inline(always)]
fn label_hash(fields: &[u8]) -> u64 {
    rapidhash::v3::rapidhash_v3(fields)
}

/// A varint of at most 3 bytes at `b[p..]` (a field under 2 MiB) and its length.
#[inline(always)]
fn short_varint(b: &[u8], p: usize) -> Option<(usize, usize)> {
    let b0 = *b.get(p)? as usize;
    if b0 < 0x80 {
        return Some((b0, 1));
    }
    let b1 = *b.get(p + 1)? as usize;
    if b1 < 0x80 {
        return Some(((b0 & 0x7f) | (b1 << 7), 2));
    }
    let b2 = *b.get(p + 2)? as usize;
    (b2 < 0x80).then_some(((b0 & 0x7f) | ((b1 & 0x7f) << 7) | (b2 << 14), 3))
}

/// The name and value ranges of the label whose field starts at `p` (its message is
/// `body[ls..le]`).
#[inline]
fn label_at(body: &[u8], p: usize, ls: usize, le: usize) -> Result<(Range, Range), DecodeError> {
    if let Some(l) = short_label_at(&body[..le], p) {
        return Ok(((l.name.start, l.name.end), (l.value.start, l.value.end)));
    }
    let mut name = (ls, ls);
    let mut value = (ls, ls);
    let mut r = Reader::new(body, ls, le);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, WIRE_LEN) => name = r.len_delimited()?,
            (2, WIRE_LEN) => value = r.len_delimited()?,
            _ => r.skip(wire)?,
        }
    }
    Ok((name, value))
}

/// Calls `f` with each label's name and value ranges of the series `body[start..end]`.
fn each_label(
    body: &[u8],
    start: usize,
    end: usize,
    mut f: impl FnMut(Range, Range),
) -> Result<(), DecodeError> {
    let mut r = Reader::new(body, start, end);
    while !r.is_done() {
        let p = r.pos();
        let (field, wire) = r.key()?;
        if field == 1 && wire == WIRE_LEN {
            let (ls, le) = r.len_delimited()?;
            let (n, v) = label_at(body, p, ls, le)?;
            f(n, v);
        } else {
            r.skip(wire)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
