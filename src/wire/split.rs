//! Splitting a mapped 1.0 request by tenant (tenant routing, `forward::route`): one pass over the series of the mapped body into one body per
//! value of a tenant label, without re-decoding anything but each series' labels.
//! Buffers are reused across requests, so a warm split allocates nothing per sample.
//! A metadata entry goes to the tenants that have a series of its family in the request
//! (never to the others: a family's help text is one tenant's business); an entry whose
//! family has no series in the request (Prometheus 1.0 sends metadata in requests of
//! their own) goes to the tenants recently seen with series of that family
//! ([`FamilyTenants`], with [`TenantSplit::split_routed`]), else to the body of series
//! without a tenant (`default`, or the sender's), unless that body reaches no tenant:
//! then it is dropped, and counted by the caller.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;

use ahash::AHashMap;

use super::DecodeError;
use super::decode::{is_metric_name, short_eq};
use super::pb::{Reader, WIRE_LEN, put_bytes_field};

/// How to split.
#[derive(Clone, Copy, Debug)]
pub struct SplitOptions<'a> {
    /// The label whose value names the tenant (e.g. `tenant`).
    pub label: &'a [u8],
    /// The tenant of series without the label; `None`: they go to the body with
    /// `tenant: None` (the caller keeps the sender's own tenant header for it).
    pub default: Option<&'a [u8]>,
    /// Keep the tenant label on the forwarded series.
    pub keep_label: bool,
    /// More distinct tenants than this in one request is an error.
    pub max_tenants: usize,
}

/// Why a request could not be split.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error("request names more than {0} tenants")]
    TooManyTenants(usize),
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// How many tenants [`FamilyTenants`] remembers per metric name.
pub const TENANTS_PER_NAME: usize = 8;
/// How many metric names [`FamilyTenants`] remembers (the least recently seen go first).
pub const REMEMBERED_NAMES: usize = 4096;
/// Names and tenants longer than this are not remembered: with label values of up to
/// 64 KiB, 4,096 names × 8 tenants could otherwise pin gigabytes outside the budget;
/// at this size the memory stays under 10 MiB per tenancy group.
pub const REMEMBERED_BYTES: usize = 256;

/// The tenants series of each metric name were last routed to: where metadata sent
/// without series goes. Bounded: [`TENANTS_PER_NAME`] tenants for each of at most
/// [`REMEMBERED_NAMES`] names, in two generations (a full current generation becomes
/// the previous one, the old previous one is forgotten; a name found in the previous
/// one moves back to the current one), so memory stays bounded whatever senders invent.
#[derive(Debug, Default)]
pub struct FamilyTenants {
    current: AHashMap<Box<[u8]>, Recent>,
    previous: AHashMap<Box<[u8]>, Recent>,
}

/// The last tenants of one name, most recent first; `None`: series without a tenant
/// (the sender's tenant header). Vectors, so that a forgotten tenant's buffer takes the
/// new one: a name seen with more tenants than it remembers costs no allocation.
type Recent = Vec<Option<Vec<u8>>>;

impl FamilyTenants {
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes that a series named `name` went to `tenant`. Allocates only for a name not
    /// remembered yet, or a tenant longer than the one it replaces.
    pub fn note(&mut self, name: &[u8], tenant: Option<&[u8]>) {
        if name.len() > REMEMBERED_BYTES || tenant.is_some_and(|t| t.len() > REMEMBERED_BYTES) {
            return;
        }
        let recent = match self.current.get_mut(name) {
            Some(r) => r,
            None => {
                let r = self
                    .previous
                    .remove(name)
                    .unwrap_or_else(|| Vec::with_capacity(TENANTS_PER_NAME));
                if self.current.len() >= REMEMBERED_NAMES / 2 {
                    self.previous = std::mem::take(&mut self.current);
                }
                self.current.entry(Box::from(name)).or_insert(r)
            }
        };
        match recent.iter().position(|t| t.as_deref() == tenant) {
            Some(0) => {}
            Some(i) => recent[..=i].rotate_right(1),
            None => {
                let reused = if recent.len() >= TENANTS_PER_NAME {
                    recent.pop().flatten()
                } else {
                    None
                };
                let entry = tenant.map(|t| {
                    let mut buf = reused.unwrap_or_default();
                    buf.clear();
                    buf.extend_from_slice(t);
                    buf
                });
                recent.insert(0, entry);
            }
        }
    }

    /// The tenants series named `name` went to recently, most recent first.
    pub fn recent(&self, name: &[u8]) -> impl Iterator<Item = Option<&[u8]>> {
        self.current
            .get(name)
            .or_else(|| self.previous.get(name))
            .into_iter()
            .flatten()
            .map(|t| t.as_deref())
    }

    /// Names remembered.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where metadata without series of its family in the request goes
/// ([`TenantSplit::split_routed`]).
#[derive(Clone, Copy, Debug)]
pub struct Orphans<'a> {
    /// The tenants recently seen per metric name; the split also records its own.
    pub memory: &'a Mutex<FamilyTenants>,
    /// True when the body of series without a tenant reaches a tenant (a `default`, the
    /// sender's tenant header, a fixed one in the backend's headers); false: an entry
    /// that has nowhere else to go is dropped ([`TenantSplit::metadata_dropped`]).
    pub untenanted_ok: bool,
}

/// One tenant's share of a request.
#[derive(Debug, Default)]
pub struct TenantBody {
    tenant: Vec<u8>,
    has_tenant: bool,
    /// The tenant's encoded `WriteRequest`, when it is not `borrowed`.
    own: Vec<u8>,
    /// The tenant's body is this one piece of the split's input, not copied, and the
    /// input's length: a request whose series all go to one tenant as they are (they
    /// keep the tenant label, `keep_label`, or have none). `own` is empty then.
    borrowed: Option<(u32, u32, usize)>,
    pub series: usize,
    /// Float samples and histograms in the body.
    pub samples: u64,
    /// The body holds metadata entries (else the 2.0 encoder need not look for them).
    pub has_metadata: bool,
}

impl TenantBody {
    /// The tenant's name; `None` for series without the label and no default.
    pub fn tenant(&self) -> Option<&[u8]> {
        self.has_tenant.then_some(&self.tenant[..])
    }

    /// The tenant's encoded `WriteRequest`; `input` must be the body the split was
    /// given (checked by its length: another buffer would give other bytes).
    pub fn bytes<'a>(&'a self, input: &'a [u8]) -> &'a [u8] {
        match self.borrowed {
            Some((start, end, input_len)) => {
                assert_eq!(
                    input.len(),
                    input_len,
                    "a tenant body read from another input"
                );
                &input[start as usize..end as usize]
            }
            None => &self.own,
        }
    }

    /// Appends `input[start..end]`: borrowed when it is all the body holds.
    fn append_piece(&mut self, input: &[u8], start: usize, end: usize) {
        match (u32::try_from(start), u32::try_from(end)) {
            (Ok(s), Ok(e)) if self.own.is_empty() && self.borrowed.is_none() => {
                self.borrowed = Some((s, e, input.len()));
            }
            _ => self.own_bytes(input).extend_from_slice(&input[start..end]),
        }
    }

    /// The body as bytes of its own, to append to: a borrowed piece is copied first.
    fn own_bytes(&mut self, input: &[u8]) -> &mut Vec<u8> {
        if let Some((start, end, _)) = self.borrowed.take() {
            self.own
                .extend_from_slice(&input[start as usize..end as usize]);
        }
        &mut self.own
    }
}

/// Reusable state of the split.
#[derive(Default)]
pub struct TenantSplit {
    bodies: Vec<TenantBody>,
    used: usize,
    index: AHashMap<u64, u32>,
    hasher: ahash::RandomState,
    series_buf: Vec<u8>,
    /// (hash of a family a series may belong to, tenant body), sorted and deduplicated
    /// before metadata is placed; the family's bytes at `family_spans[i]`.
    families: Vec<(u64, u32, u32, u32)>,
    /// Tenant bodies a metadata entry goes to.
    targets: Vec<u32>,
    /// Metadata copies left out of the last split by [`METADATA_COPY_FLOOR`]'s bound.
    metadata_skipped: u64,
    /// (hash of a series' name, its tenant body, the name's bounds): the families metadata
    /// goes to, and what this request teaches the [`FamilyTenants`] memory.
    seen: Vec<(u64, u32, u32, u32)>,
    /// (name's bounds, tenant body) last pushed onto `seen` per slot (`RECENT_SLOTS`, by
    /// [`name_fingerprint`]): a request repeats its few hundred names (every histogram's
    /// `_bucket`, `_sum`, `_count` per label set), hashed, pushed and sorted once each then.
    recent: Vec<(u32, u32, u32)>,
    /// A family name plus a suffix, to look up in the memory.
    name_buf: Vec<u8>,
    /// Tenants the memory gave for one metadata entry.
    remembered: Vec<Option<Vec<u8>>>,
    /// Metadata entries of the last split that had no tenant to go to.
    metadata_dropped: u64,
}

/// Metadata copies beyond an entry's first may add up to the mapped body's size, or
/// this much when that is less: one large help text in front of series of a thousand
/// tenants must not become a thousand copies (a few KiB would take gigabytes).
pub const METADATA_COPY_FLOOR: usize = 1 << 20;

/// Suffixes a series name can add to its family's name (`_total` of a counter, the
/// series of histograms and summaries).
const FAMILY_SUFFIXES: [&[u8]; 6] = [
    b"_total",
    b"_bucket",
    b"_count",
    b"_sum",
    b"_created",
    b"_info",
];

const NO_TENANT_KEY: u64 = u64::MAX;

/// Slots of `TenantSplit::recent` (a power of two).
const RECENT_SLOTS: usize = 256;

/// `[start, end)` of the request buffer.
type Bounds = (usize, usize);

impl TenantSplit {
    pub fn new() -> Self {
        Self::default()
    }

    fn body_for(&mut self, tenant: Option<&[u8]>, max: usize) -> Result<usize, SplitError> {
        let key = match tenant {
            Some(t) => {
                let mut h = self.hasher.build_hasher();
                h.write(t);
                h.finish() & !1 // never NO_TENANT_KEY
            }
            None => NO_TENANT_KEY,
        };
        if let Some(&i) = self.index.get(&key) {
            if self.bodies[i as usize].tenant() == tenant {
                return Ok(i as usize);
            }
            // Two tenants with one hash (rare): find it the slow way.
            if let Some(j) = self.bodies[..self.used]
                .iter()
                .position(|b| b.tenant() == tenant)
            {
                return Ok(j);
            }
        }
        // Distinct tenants (the body without one does not count).
        let named = self.bodies[..self.used]
            .iter()
            .filter(|b| b.has_tenant)
            .count();
        if tenant.is_some() && named >= max {
            return Err(SplitError::TooManyTenants(max));
        }
        if self.used == self.bodies.len() {
            self.bodies.push(TenantBody::default());
        }
        let i = self.used;
        self.used += 1;
        let b = &mut self.bodies[i];
        b.tenant.clear();
        b.own.clear();
        b.borrowed = None;
        b.series = 0;
        b.samples = 0;
        b.has_metadata = false;
        b.has_tenant = tenant.is_some();
        if let Some(t) = tenant {
            b.tenant.extend_from_slice(t);
        }
        self.index.insert(key, i as u32);
        Ok(i)
    }

    /// Bytes the split holds between requests, all together: the tenant bodies and the
    /// scratch of the families and names it saw (counted in what a pooled workspace
    /// holds).
    pub fn retained_bytes(&self) -> usize {
        use super::held;
        self.bodies
            .iter()
            .map(|b| b.own.capacity() + b.tenant.capacity())
            .sum::<usize>()
            + held(&self.bodies)
            + self.index.capacity() * 16
            + held(&self.series_buf)
            + held(&self.families)
            + held(&self.targets)
            + held(&self.seen)
            + held(&self.recent)
            + held(&self.name_buf)
            + self
                .remembered
                .iter()
                .map(|t| t.as_ref().map_or(0, Vec::capacity))
                .sum::<usize>()
            + held(&self.remembered)
    }

    /// Splits `v1` (a mapped 1.0 request) by tenant; returns one body per tenant, in the
    /// order tenants first appear. A request without series or metadata yields no body.
    /// Metadata without series of its family in the request goes to the body without a
    /// tenant.
    pub fn split(
        &mut self,
        v1: &[u8],
        opts: &SplitOptions<'_>,
    ) -> Result<&[TenantBody], SplitError> {
        self.split_inner(v1, opts, None)
    }

    /// [`TenantSplit::split`] for routing: metadata without series of its family in the
    /// request goes to the tenants `orphans.memory` remembers for the family, else to the
    /// body without a tenant when that reaches one, else nowhere (counted in
    /// [`TenantSplit::metadata_dropped`]); the request's own series are remembered.
    pub fn split_routed(
        &mut self,
        v1: &[u8],
        opts: &SplitOptions<'_>,
        orphans: &Orphans<'_>,
    ) -> Result<&[TenantBody], SplitError> {
        self.split_inner(v1, opts, Some(orphans))
    }

    /// The bodies of the last split.
    pub fn tenant_bodies(&self) -> &[TenantBody] {
        &self.bodies[..self.used]
    }

    /// Metadata entries the last split dropped: no series of their family in the request
    /// or remembered, and no tenant for the body without one.
    pub fn metadata_dropped(&self) -> u64 {
        self.metadata_dropped
    }

    fn split_inner(
        &mut self,
        v1: &[u8],
        opts: &SplitOptions<'_>,
        orphans: Option<&Orphans<'_>>,
    ) -> Result<&[TenantBody], SplitError> {
        self.reset();
        // Metadata entries are placed after the series (any order in the body), from the
        // names the series loop saw.
        let mut has_metadata = false;
        let mut r = Reader::new(v1, 0, v1.len());
        // The previous series' (name, tenant body): repeats are not looked at again.
        let mut previous: Option<(Bounds, usize)> = None;
        let mut last_tenant: Option<(Option<&[u8]>, usize)> = None;
        // Consecutive series of one tenant body that go as they are, still to copy: (body,
        // start, end) of their fields in `v1`, copied in one piece.
        let mut run: Option<(usize, usize, usize)> = None;
        // A series `extend_run` read but did not take: read once, not twice.
        let mut handed: Option<Handed> = None;
        while handed.is_some() || !r.is_done() {
            let (from, one_byte_key, s, e, fast) = match handed.take() {
                Some(h) => (h.from, true, h.start, h.end, Some(h.fields)),
                None => {
                    let from = r.pos();
                    let one_byte_key = r.eat(0x0a);
                    if !one_byte_key {
                        let (field, wire) = r.key()?;
                        if field != 1 || wire != WIRE_LEN {
                            has_metadata |= field == 3;
                            r.skip(wire)?;
                            continue;
                        }
                    }
                    let (s, e) = r.len_delimited()?;
                    // The tenant label, and where it sits in the series.
                    (
                        from,
                        one_byte_key,
                        s,
                        e,
                        series_fields_fast(v1, s, e, opts.label),
                    )
                }
            };
            let walked = fast.is_some();
            let SeriesFields {
                mut tenant,
                mut label_at,
                mut metric_name,
                mut samples,
            } = fast.unwrap_or(SeriesFields {
                tenant: None,
                label_at: None,
                metric_name: (s, s),
                samples: 0,
            });
            let mut sr = Reader::new(v1, if walked { e } else { s }, e);
            while !sr.is_done() {
                let from = sr.pos();
                let is_label = sr.eat(0x0a) || {
                    let (f, w) = sr.key()?;
                    if f == 1 && w == WIRE_LEN {
                        true
                    } else {
                        samples += u64::from(f == 2 || f == 4);
                        sr.skip(w)?;
                        false
                    }
                };
                if is_label {
                    let (ls, le) = sr.len_delimited()?;
                    let (name, value) = label(v1, ls, le)?;
                    let name = &v1[name.0..name.1];
                    if short_eq(name, opts.label) {
                        tenant = Some(value);
                        label_at = Some((from, sr.pos()));
                    } else if is_metric_name(name) {
                        metric_name = value;
                    }
                }
            }
            let name = tenant_of(v1, tenant, opts);
            // Series of one target come together: the previous tenant's body, unhashed.
            let i = match last_tenant {
                Some((t, i)) if same_tenant(t, name) => i,
                _ => self.body_for(name, opts.max_tenants)?,
            };
            last_tenant = Some((name, i));
            let repeat = previous.is_some_and(|(n, b)| {
                b == i && short_eq(&v1[n.0..n.1], &v1[metric_name.0..metric_name.1])
            });
            previous = Some((metric_name, i));
            if metric_name.1 > metric_name.0 && !repeat {
                self.note_seen(v1, metric_name, i as u32);
            }
            let body = &mut self.bodies[i];
            body.series += 1;
            body.samples += samples;
            let as_it_is = one_byte_key && (opts.keep_label || label_at.is_none());
            let run_start = match run {
                Some((b, start, end)) if as_it_is && b == i && end == from => Some(start),
                Some((b, start, end)) => {
                    self.bodies[b].append_piece(v1, start, end);
                    run = None;
                    as_it_is.then_some(from)
                }
                None => as_it_is.then_some(from),
            };
            if let Some(start) = run_start {
                // The series after it, while they join this run: the usual step.
                let (pos, last, next) = self.extend_run(v1, e, (i, name), opts, metric_name);
                run = Some((i, start, pos));
                previous = Some((last, i));
                r = Reader::new(v1, next.as_ref().map_or(pos, |h| h.end), v1.len());
                handed = next;
                continue;
            }
            let body = self.bodies[i].own_bytes(v1);
            match label_at {
                Some((a, b)) if !opts.keep_label => {
                    self.series_buf.clear();
                    self.series_buf.extend_from_slice(&v1[s..a]);
                    self.series_buf.extend_from_slice(&v1[b..e]);
                    put_bytes_field(body, 1, &self.series_buf);
                }
                _ => put_bytes_field(body, 1, &v1[s..e]),
            }
        }
        if let Some((b, start, end)) = run {
            self.bodies[b].append_piece(v1, start, end);
        }
        self.seen.sort_unstable_by_key(|s| (s.0, s.1));
        self.seen.dedup_by_key(|s| (s.0, s.1));
        if has_metadata {
            for k in 0..self.seen.len() {
                let (_, body, start, end) = self.seen[k];
                self.note_families(v1, (start as usize, end as usize), body);
            }
            self.place_metadata(v1, opts, orphans)?;
        }
        if let Some(o) = orphans {
            self.remember_seen(v1, o);
        }
        Ok(&self.bodies[..self.used])
    }

    /// [`TenantSplit::split_one_tenant`] when `one_tenant` is given and the body is as
    /// it says, else [`TenantSplit::split_routed`].
    pub fn split_routed_known(
        &mut self,
        v1: &[u8],
        one_tenant: Option<(&[u8], u64)>,
        opts: &SplitOptions<'_>,
        orphans: &Orphans<'_>,
    ) -> Result<&[TenantBody], SplitError> {
        if let Some(known) = one_tenant
            && self.split_one_tenant(v1, known, opts, orphans)?.is_some()
        {
            return Ok(&self.bodies[..self.used]);
        }
        self.split_routed(v1, opts, orphans)
    }

    /// [`TenantSplit::split_routed`] for a body known to hold only series of tenant
    /// `tenant` that keep the tenant label, and no metadata: what routing knows when
    /// every series of the request the body was mapped from gives the label that value
    /// and no rule edits it (`forward::route`). The body goes as it is, with `samples`
    /// samples; only the series' metric names are read, for the memory of the tenants
    /// seen per family. `Ok(None)`: the tenant label goes (`keep_label` off), the body is
    /// empty, holds anything but series, or a series' labels are not in the shape the
    /// mapper writes (split it with [`TenantSplit::split_routed`]).
    pub fn split_one_tenant(
        &mut self,
        v1: &[u8],
        (tenant, samples): (&[u8], u64),
        opts: &SplitOptions<'_>,
        orphans: &Orphans<'_>,
    ) -> Result<Option<&[TenantBody]>, SplitError> {
        self.reset();
        if !opts.keep_label || v1.is_empty() || tenant.is_empty() {
            return Ok(None);
        }
        let body = self.body_for(Some(tenant), opts.max_tenants)?;
        let (mut pos, mut series) = (0, 0);
        let mut previous: Option<Bounds> = None;
        while pos < v1.len() {
            let mut r = Reader::new(v1, pos, v1.len());
            let (true, Ok((start, end))) = (r.eat(0x0a), r.len_delimited()) else {
                return Ok(None);
            };
            let Some(name) = metric_name_fast(v1, start, end) else {
                return Ok(None);
            };
            let repeat = previous.is_some_and(|n| short_eq(&v1[n.0..n.1], &v1[name.0..name.1]));
            previous = Some(name);
            if name.1 > name.0 && !repeat {
                self.note_seen(v1, name, body as u32);
            }
            series += 1;
            pos = end;
        }
        let b = &mut self.bodies[body];
        b.append_piece(v1, 0, v1.len());
        b.series = series;
        b.samples = samples;
        self.seen.sort_unstable_by_key(|s| (s.0, s.1));
        self.seen.dedup_by_key(|s| (s.0, s.1));
        self.remember_seen(v1, orphans);
        Ok(Some(&self.bodies[..self.used]))
    }

    /// Forgets the last split.
    fn reset(&mut self) {
        self.used = 0;
        self.index.clear();
        self.families.clear();
        self.metadata_skipped = 0;
        self.seen.clear();
        self.recent.clear();
        self.recent.resize(RECENT_SLOTS, (0, 0, u32::MAX));
        self.metadata_dropped = 0;
    }

    /// Tells the memory the tenants this split sent each series name to (`seen`,
    /// deduplicated).
    fn remember_seen(&self, v1: &[u8], orphans: &Orphans<'_>) {
        if self.seen.is_empty() {
            return;
        }
        let mut memory = orphans
            .memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for &(_, body, start, end) in &self.seen {
            memory.note(
                &v1[start as usize..end as usize],
                self.bodies[body as usize].tenant(),
            );
        }
    }

    /// The split's usual step, series after series from `v1[pos..]` for as long as each
    /// joins the run of series of tenant body `body` (whose tenant is `tenant`) that go as
    /// they are: key 0x0a and a length of one or two bytes, read as
    /// [`series_fields_fast`] reads it, of that tenant, keeping its tenant label or without one. A
    /// function of its own so that its few values stay in registers; the series it stops
    /// at takes the loop's general step. `name`: the previous series' metric name. Returns
    /// where it stopped, the last series' metric name, and the series it stopped at when
    /// it read that one (another tenant's, or one whose tenant label goes).
    #[inline(never)]
    fn extend_run(
        &mut self,
        v1: &[u8],
        mut pos: usize,
        (body, tenant): (usize, Option<&[u8]>),
        opts: &SplitOptions<'_>,
        mut name: Bounds,
    ) -> (usize, Bounds, Option<Handed>) {
        let (mut series, mut samples) = (0usize, 0u64);
        let mut handed = None;
        while let Some(&[key, len0, len1]) = v1.get(pos..).and_then(<[u8]>::first_chunk::<3>) {
            let (len, start) = match (key, len0, len1) {
                (0x0a, 0..0x80, _) => (usize::from(len0), pos + 2),
                (0x0a, _, 0..0x80) => (usize::from(len0 & 0x7f) | usize::from(len1) << 7, pos + 3),
                _ => break,
            };
            let end = start + len;
            if end > v1.len() {
                break;
            }
            let Some(fields) = series_fields_inline(v1, start, end, opts.label) else {
                break;
            };
            let own = tenant_of(v1, fields.tenant, opts);
            if !same_tenant(own, tenant) || !(opts.keep_label || fields.label_at.is_none()) {
                handed = Some(Handed {
                    from: pos,
                    start,
                    end,
                    fields,
                });
                break;
            }
            let m = fields.metric_name;
            let repeat = short_eq(&v1[name.0..name.1], &v1[m.0..m.1]);
            name = m;
            if m.1 > m.0 && !repeat {
                self.note_seen(v1, m, body as u32);
            }
            series += 1;
            samples += fields.samples;
            pos = end;
        }
        let b = &mut self.bodies[body];
        b.series += series;
        b.samples += samples;
        (pos, name, handed)
    }

    /// Records that a series named `v1[name]` went to tenant body `body`: pushed onto
    /// `seen` unless its slot of `recent` (picked by a cheap fingerprint of the name, not
    /// a hash) holds that very name and body already; only a pushed name is hashed.
    #[inline]
    fn note_seen(&mut self, v1: &[u8], name: Bounds, body: u32) {
        let bytes = &v1[name.0..name.1];
        let slot = &mut self.recent[name_fingerprint(bytes) as usize & (RECENT_SLOTS - 1)];
        if slot.2 == body && short_eq(&v1[slot.0 as usize..slot.1 as usize], bytes) {
            return;
        }
        *slot = (name.0 as u32, name.1 as u32, body);
        let h = self.hasher.hash_one(bytes);
        self.seen.push((h, body, name.0 as u32, name.1 as u32));
    }

    /// Records the families series `name` of tenant body `tenant` may belong to.
    fn note_families(&mut self, v1: &[u8], name: Bounds, tenant: u32) {
        let full = &v1[name.0..name.1];
        if full.is_empty() {
            return;
        }
        let mut note = |family: &[u8]| {
            let h = self.hasher.hash_one(family);
            self.families
                .push((h, tenant, name.0 as u32, (name.0 + family.len()) as u32));
        };
        note(full);
        for suffix in FAMILY_SUFFIXES {
            if let Some(family) = full.strip_suffix(suffix)
                && !family.is_empty()
            {
                note(family);
            }
        }
    }

    /// Appends each metadata entry to the bodies of the tenants with a series of its
    /// family, or to the body without a tenant when no series of it is here.
    fn place_metadata(
        &mut self,
        v1: &[u8],
        opts: &SplitOptions<'_>,
        orphans: Option<&Orphans<'_>>,
    ) -> Result<(), SplitError> {
        self.families.sort_unstable_by_key(|f| (f.0, f.1));
        self.families.dedup_by_key(|f| (f.0, f.1));
        let mut copies_left = v1.len().max(METADATA_COPY_FLOOR);
        let mut r = Reader::new(v1, 0, v1.len());
        while !r.is_done() {
            let from = r.pos();
            let (field, wire) = r.key()?;
            if field != 3 || wire != WIRE_LEN {
                r.skip(wire)?;
                continue;
            }
            let (s, e) = r.len_delimited()?;
            let entry = from..r.pos();
            let family = metadata_family(v1, s, e)?;
            let family = &v1[family.0..family.1];
            let h = self.hasher.hash_one(family);
            self.targets.clear();
            let first = self.families.partition_point(|f| f.0 < h);
            for f in &self.families[first..] {
                if f.0 != h {
                    break;
                }
                if &v1[f.2 as usize..f.3 as usize] == family {
                    self.targets.push(f.1);
                }
            }
            if self.targets.is_empty()
                && let Some(o) = orphans
            {
                self.place_orphan(family, opts, o)?;
                if self.targets.is_empty() {
                    self.metadata_dropped += 1;
                    continue;
                }
            }
            if self.targets.is_empty() {
                let i = self.body_for(opts.default, opts.max_tenants)?;
                self.targets.push(i as u32);
            }
            for (k, &t) in self.targets.iter().enumerate() {
                if k > 0 {
                    if copies_left < entry.len() {
                        self.metadata_skipped += 1;
                        continue;
                    }
                    copies_left -= entry.len();
                }
                let b = &mut self.bodies[t as usize];
                b.own_bytes(v1).extend_from_slice(&v1[entry.clone()]);
                b.has_metadata = true;
            }
        }
        Ok(())
    }

    /// Metadata copies the last split left out: more than the bound on copies allows
    /// ([`METADATA_COPY_FLOOR`]); each tenant still gets its series.
    pub fn metadata_skipped(&self) -> u64 {
        self.metadata_skipped
    }
}

impl TenantSplit {
    /// The bodies a metadata entry of `family` goes to when no series of it is in the
    /// request: the tenants remembered for the family's names, else the body without a
    /// tenant when it reaches one (`default`, `untenanted_ok`); none: it is dropped.
    fn place_orphan(
        &mut self,
        family: &[u8],
        opts: &SplitOptions<'_>,
        o: &Orphans<'_>,
    ) -> Result<(), SplitError> {
        self.remembered.clear();
        {
            let memory = o
                .memory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for suffix in std::iter::once(&b""[..]).chain(FAMILY_SUFFIXES) {
                self.name_buf.clear();
                self.name_buf.extend_from_slice(family);
                self.name_buf.extend_from_slice(suffix);
                for t in memory.recent(&self.name_buf) {
                    if !self.remembered.iter().any(|r| r.as_deref() == t) {
                        self.remembered.push(t.map(<[u8]>::to_vec));
                    }
                }
            }
        }
        let untenanted_ok = o.untenanted_ok || opts.default.is_some();
        let remembered = std::mem::take(&mut self.remembered);
        for t in &remembered {
            // Series without a tenant went to `default` when there is one (and were
            // remembered under it), so `None` here is the sender's tenant.
            if t.is_none() && !untenanted_ok {
                continue;
            }
            // The tenants come from the memory, bounded: not the request's own count.
            let i = self.body_for(t.as_deref(), usize::MAX)? as u32;
            if !self.targets.contains(&i) {
                self.targets.push(i);
            }
        }
        self.remembered = remembered;
        if self.targets.is_empty() && untenanted_ok {
            let i = self.body_for(opts.default, opts.max_tenants)?;
            self.targets.push(i as u32);
        }
        Ok(())
    }
}

/// The family name (field 2) of a `MetricMetadata` entry.
fn metadata_family(buf: &[u8], start: usize, end: usize) -> Result<Bounds, DecodeError> {
    let mut family = (start, start);
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (f, w) = r.key()?;
        if f == 2 && w == WIRE_LEN {
            family = r.len_delimited()?;
        } else {
            r.skip(w)?;
        }
    }
    Ok(family)
}

/// A cheap fingerprint of a metric name (its length and last eight bytes, mixed): names
/// of one request differ in their suffix or length nearly always; a collision costs only
/// a push onto `TenantSplit::seen`, deduplicated later.
#[inline]
fn name_fingerprint(name: &[u8]) -> u32 {
    let n = name.len();
    let tail = match name.get(n.saturating_sub(8)..) {
        Some(t) if t.len() == 8 => {
            let mut w = [0u8; 8];
            w.copy_from_slice(t);
            u64::from_le_bytes(w)
        }
        _ => name.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
    };
    ((tail ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u32
}

/// The tenant a series goes to: its tenant label's value `v1[tenant]`, or the default
/// when it has none or an empty one.
#[inline(always)]
fn tenant_of<'a>(
    v1: &'a [u8],
    tenant: Option<Bounds>,
    opts: &SplitOptions<'a>,
) -> Option<&'a [u8]> {
    tenant
        .map(|(a, b)| &v1[a..b])
        .filter(|t| !t.is_empty())
        .or(opts.default)
}

/// Whether two series' tenants ([`tenant_of`]) are the same one.
#[inline(always)]
fn same_tenant(a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => short_eq(a, b),
        (a, b) => a.is_none() && b.is_none(),
    }
}

/// A series [`TenantSplit::extend_run`] read and left to the loop's general step: where
/// its field starts (key), where its message starts and ends, and what it read of it.
struct Handed {
    from: usize,
    start: usize,
    end: usize,
    fields: SeriesFields,
}

/// What the split needs of one series.
struct SeriesFields {
    /// The tenant label's value.
    tenant: Option<Bounds>,
    /// The whole tenant label field (key to end).
    label_at: Option<Bounds>,
    metric_name: Bounds,
    /// Float samples and histograms.
    samples: u64,
}

/// [`SeriesFields`] of the series `buf[start..end]` in the shape the mapper writes
/// (every label `0x0a LEN 0x0a NL name 0x12 VL value`, then samples, exemplars and
/// histograms, every length one byte), read by byte position with no field dispatch;
/// `None` for anything else (the general walk takes the series, with its errors).
#[inline(never)]
fn series_fields_fast(
    buf: &[u8],
    start: usize,
    end: usize,
    tenant_label: &[u8],
) -> Option<SeriesFields> {
    series_fields_inline(buf, start, end, tenant_label)
}

/// [`series_fields_fast`], inlined where it is called (`TenantSplit::extend_run`, whose
/// loop it is most of).
#[inline(always)]
fn series_fields_inline(
    buf: &[u8],
    start: usize,
    end: usize,
    tenant_label: &[u8],
) -> Option<SeriesFields> {
    let msg = buf.get(start..end)?;
    let mut out = SeriesFields {
        tenant: None,
        label_at: None,
        metric_name: (start, start),
        samples: 0,
    };
    // The labels, each `0x0a LEN 0x0a NL name 0x12 VL value` with the value filling the
    // rest exactly, read by position; every read is `get(at..)` then a fixed-size chunk,
    // not `get(at..at + N)`: no check in the loop that `at + N` overflows.
    let tenant_len = tenant_label.len();
    let mut p = 0;
    while let Some(label) = short_label(msg, p) {
        let ShortLabel { name, value, next } = label?;
        if name.len() == tenant_len && short_eq(name, tenant_label) {
            out.tenant = Some((start + value, start + next));
            out.label_at = Some((start + p, start + next));
        } else if is_metric_name(name) {
            out.metric_name = (start + value, start + next);
        }
        p = next;
    }
    while p < msg.len() {
        let head = msg.get(p..p + 2)?;
        let len = head[1] as usize;
        if !matches!(head[0], 0x12 | 0x1a | 0x22) || len >= 0x80 || p + 2 + len > msg.len() {
            return None;
        }
        out.samples += u64::from(head[0] != 0x1a);
        p += 2 + len;
    }
    Some(out)
}

/// A label in the shape `0x0a LEN 0x0a NL name 0x12 VL value`, one-byte lengths, the
/// value filling the rest exactly: its name, and where its value starts and it ends.
/// The shape `wire::decode::short_label_at` reads, read here its own way: the split's
/// loop over that function took 20 % more instructions (cachegrind, requests split by
/// `instance`: `extend_run` 143.6 M → 172.6 M), and the decoder's loop over this one 8 %
/// more (`short_labels` 280.3 M → 303.5 M).
struct ShortLabel<'a> {
    name: &'a [u8],
    value: usize,
    next: usize,
}

/// The label at `msg[p..]`: `None` when no label starts there (a field of another
/// number, or fewer than four bytes left: the labels ended), `Some(None)` for a label in
/// another shape. Every read is `get(at..)` then a fixed-size chunk, not
/// `get(at..at + N)`: no check that `at + N` overflows.
#[inline(always)]
fn short_label(msg: &[u8], p: usize) -> Option<Option<ShortLabel<'_>>> {
    let head = u32::from_le_bytes(*msg.get(p..)?.first_chunk::<4>()?);
    // Key 0x0a, length < 128, name key 0x0a, name length < 128.
    if head & 0x80ff_80ff != 0x000a_000a {
        return (head & 0xff == 0x0a).then_some(None);
    }
    let (len, name_len) = (((head >> 8) & 0x7f) as usize, (head >> 24) as usize);
    let next = p + 2 + len;
    let value_key = p + 4 + name_len;
    // The value's key (0x12) and length fill the rest of the label exactly: the two
    // bytes compared at once with what they must be (a length that does not leave room
    // for them wraps around to a value no two bytes hold).
    let value_len = len.wrapping_sub(4 + name_len);
    let field = msg.get(value_key..next).and_then(<[u8]>::first_chunk::<2>);
    if field.is_none_or(|f| usize::from(u16::from_le_bytes(*f)) != 0x12 | value_len << 8) {
        return Some(None);
    }
    let Some(name) = msg.get(p + 4..value_key) else {
        return Some(None);
    };
    Some(Some(ShortLabel {
        name,
        value: value_key + 2,
        next,
    }))
}

/// The metric name of series `buf[start..end]`, its labels in the shape the mapper
/// writes ([`short_label`]): the value of its first `__name__` label (the only one in a
/// body the mapper wrote: it writes each label name once). `None` for a label in another
/// shape, or none named `__name__` before the first field that is not a label (a series
/// whose labels do not all come first, which a sender may write and the mapper copy as
/// it came: the full split reads those).
fn metric_name_fast(buf: &[u8], start: usize, end: usize) -> Option<Bounds> {
    let msg = buf.get(start..end)?;
    let mut p = 0;
    while let Some(label) = short_label(msg, p) {
        let ShortLabel { name, value, next } = label?;
        if is_metric_name(name) {
            return Some((start + value, start + next));
        }
        p = next;
    }
    None
}

fn label(buf: &[u8], start: usize, end: usize) -> Result<(Bounds, Bounds), DecodeError> {
    let mut name = (start, start);
    let mut value = (start, start);
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (f, w) = r.key()?;
        match (f, w) {
            (1 | 2, WIRE_LEN) => {
                let span = r.len_delimited()?;
                if f == 1 {
                    name = span;
                } else {
                    value = span;
                }
            }
            _ => r.skip(w)?,
        }
    }
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::encode::{SeriesWriter, write_metadata};
    use crate::wire::proto::prometheus as pb;
    use prost::Message;

    /// A series' tenant and its labels (name, value), as a test expects them.
    type TenantSeries = (Option<String>, Vec<(String, String)>);

    proptest::proptest! {
        /// Series built by small edits of the one before, in the shapes the fast walk reads
        /// and the ones it leaves to the general walk, reach the tenant the labels name,
        /// protobuf's way (the last `tenant` label wins, a value before its name counts),
        /// with that label dropped, in request order.
        #[test]
        fn series_in_every_shape_split_as_decoded(
            ops in proptest::collection::vec((0u8..7, 0usize..8, 0usize..6, 0usize..5), 1..48),
            keep_label in proptest::bool::ANY,
        ) {
            const NAMES: [&str; 5] = ["__name__", "tenant", "a", "le", "pod"];
            let long = "v".repeat(150);
            let values = ["x", "y", "up", "", long.as_str(), "zz"];
            // (name, value, value written first)
            let mut labels: Vec<(usize, usize, bool)> = vec![(0, 2, false), (1, 0, false)];
            let mut body = Vec::new();
            let mut expected: Vec<TenantSeries> = Vec::new();
            // Each series' metric name (the last `__name__`), when it has one.
            let mut names: Vec<&str> = Vec::new();
            let mut sample = vec![0x09];
            sample.extend_from_slice(&1f64.to_bits().to_le_bytes());
            sample.extend_from_slice(&[0x10, 0x01]);
            for (op, at, value, name) in ops {
                let at = if labels.is_empty() { 0 } else { at % labels.len() };
                match op {
                    0 | 1 if !labels.is_empty() => labels[at].1 = value,
                    2 => labels.insert(at, (name, value, false)),
                    3 if !labels.is_empty() => {
                        labels.remove(at);
                    }
                    4 if !labels.is_empty() => labels[at].2 = !labels[at].2,
                    _ => {}
                }
                let mut series = Vec::new();
                for &(n, v, value_first) in &labels {
                    let mut l = Vec::new();
                    let fields = [(1, NAMES[n]), (2, values[v])];
                    let order = if value_first { [1, 0] } else { [0, 1] };
                    for i in order {
                        crate::wire::pb::put_bytes_field(&mut l, fields[i].0, fields[i].1.as_bytes());
                    }
                    crate::wire::pb::put_bytes_field(&mut series, 1, &l);
                }
                crate::wire::pb::put_bytes_field(&mut series, 2, &sample);
                crate::wire::pb::put_bytes_field(&mut body, 1, &series);
                if let Some(name) = labels.iter().rev().find(|l| l.0 == 0)
                    && !values[name.1].is_empty()
                {
                    names.push(values[name.1]);
                }
                let last_tenant = labels.iter().rposition(|l| l.0 == 1);
                let tenant = last_tenant
                    .map(|i| values[labels[i].1])
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .or_else(|| keep_label.then(|| "anon".to_string()));
                let kept: Vec<(String, String)> = labels
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| keep_label || Some(*i) != last_tenant)
                    .map(|(_, l)| (NAMES[l.0].to_string(), values[l.1].to_string()))
                    .collect();
                expected.push((tenant, kept));
            }
            // The metadata of every family a series has: it goes to the tenants of the
            // series named so, read from the names the split noted.
            let mut families: Vec<&str> = names.clone();
            families.sort_unstable();
            families.dedup();
            for f in &families {
                write_metadata(&mut body, 1, f.as_bytes(), b"", b"");
            }
            let default: Option<&'static [u8]> = if keep_label { Some(b"anon") } else { None };
            let mut split = TenantSplit::new();
            for round in 0..2 {
                let bodies = split.split(&body, &opts(default, keep_label, 100)).unwrap();
                let mut want_families: Vec<(Option<String>, Vec<String>)> = Vec::new();
                for b in bodies {
                    let (t, req) = decoded(b, &body);
                    proptest::prop_assert_eq!(b.series, req.timeseries.len(), "round {}", round);
                    let mut f: Vec<String> = req
                        .timeseries
                        .iter()
                        .filter_map(|ts| ts.labels.iter().rev().find(|l| l.name == "__name__"))
                        .map(|l| l.value.clone())
                        .filter(|v| !v.is_empty())
                        .collect();
                    f.sort();
                    f.dedup();
                    want_families.push((t, f));
                }
                proptest::prop_assert_eq!(
                    families_by_tenant(bodies, &body),
                    want_families,
                    "round {}",
                    round
                );
                let mut got: Vec<TenantSeries> = Vec::new();
                let (tenants, want) = grouped_by_tenant(&expected);
                proptest::prop_assert_eq!(bodies.len(), tenants, "round {}", round);
                for b in bodies {
                    let (t, req) = decoded(b, &body);
                    proptest::prop_assert_eq!(b.samples, req.timeseries.len() as u64);
                    for ts in req.timeseries {
                        let l = ts.labels.into_iter().map(|l| (l.name, l.value)).collect();
                        got.push((t.clone(), l));
                    }
                }
                proptest::prop_assert_eq!(got, want, "round {}", round);
            }
        }
    }

    /// `items` grouped by tenant, tenants in the order they first come and each one's
    /// items in theirs (how the split lays its bodies out), and the number of tenants.
    fn grouped_by_tenant<T: Clone>(
        items: &[(Option<String>, T)],
    ) -> (usize, Vec<(Option<String>, T)>) {
        let mut order: Vec<&Option<String>> = Vec::new();
        for (t, _) in items {
            if !order.contains(&t) {
                order.push(t);
            }
        }
        let mut grouped = Vec::new();
        for t in &order {
            grouped.extend(items.iter().filter(|(u, _)| u == *t).cloned());
        }
        (order.len(), grouped)
    }

    fn request(tenants: &[Option<&str>]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        for (i, t) in tenants.iter().enumerate() {
            let mut w = SeriesWriter::new(&mut scratch);
            w.label(b"__name__", b"up");
            w.label(b"i", i.to_string().as_bytes());
            if let Some(t) = t {
                w.label(b"tenant", t.as_bytes());
            }
            w.sample(1f64.to_bits(), 1000 + i as i64);
            w.finish(&mut out);
        }
        write_metadata(&mut out, 2, b"up", b"Up.", b"");
        out
    }

    fn opts(default: Option<&'static [u8]>, keep_label: bool, max: usize) -> SplitOptions<'static> {
        SplitOptions {
            label: b"tenant",
            default,
            keep_label,
            max_tenants: max,
        }
    }

    fn decoded(b: &TenantBody, input: &[u8]) -> (Option<String>, pb::WriteRequest) {
        (
            b.tenant().map(|t| String::from_utf8(t.to_vec()).unwrap()),
            pb::WriteRequest::decode(b.bytes(input)).unwrap(),
        )
    }

    /// Splits `bytes` and, when prost reads them too, checks that every series reached
    /// the tenant prost's reading of its last `tenant` label names (`anon` without one),
    /// with its samples, in the order it came. `Some(true)`: compared; `Some(false)`:
    /// prost does not read the body; `None`: the split refused it.
    fn split_as_prost_reads(
        split: &mut TenantSplit,
        bytes: &[u8],
        keep_label: bool,
    ) -> Option<bool> {
        let opts = opts(Some(b"anon"), keep_label, 100);
        let bodies = split.split(bytes, &opts).ok()?;
        let Ok(req) = pb::WriteRequest::decode(bytes) else {
            return Some(false);
        };
        let want: Vec<(Option<String>, usize)> = req
            .timeseries
            .iter()
            .map(|ts| {
                let t = ts.labels.iter().rev().find(|l| l.name == "tenant");
                let t = t.map(|l| l.value.clone()).filter(|v| !v.is_empty());
                (t.or(Some("anon".into())), ts.samples.len())
            })
            .collect();
        let got: Vec<(Option<String>, usize)> = bodies
            .iter()
            .flat_map(|b| {
                let (t, r) = decoded(b, bytes);
                r.timeseries
                    .into_iter()
                    .map(move |ts| (t.clone(), ts.samples.len()))
            })
            .collect();
        assert_eq!(got, grouped_by_tenant(&want).1, "{bytes:02x?}");
        let series: usize = bodies.iter().map(|b| b.series).sum();
        assert_eq!(series, req.timeseries.len());
        Some(true)
    }

    /// A body with every byte changed (to up to eight values each) and cut at every
    /// length: the split never panics, and whenever prost reads the body, every series
    /// reaches the tenant its last `tenant` label names as prost reads that label (a
    /// `Label` with two name fields is named by the last), in the order it came.
    #[test]
    fn changed_bytes_split_as_prost_reads_them_or_fail() {
        let mut body = request(&[Some("a"), Some("a"), None, Some("b"), Some("a")]);
        // A value of 200 bytes: a label and a series with two-byte lengths (the general
        // step's).
        let mut scratch = Vec::new();
        let mut w = SeriesWriter::new(&mut scratch);
        w.label(b"__name__", b"up");
        w.label(b"tenant", "c".repeat(200).as_bytes());
        w.sample(1f64.to_bits(), 1000);
        w.finish(&mut body);
        let mut split = TenantSplit::new();
        let mut checked = 0;
        let mut check = |bytes: &[u8], keep_label: bool| {
            if split_as_prost_reads(&mut split, bytes, keep_label) == Some(true) {
                checked += 1;
            }
        };
        for at in 0..body.len() {
            for value in [0x00, 0x01, 0x0a, 0x12, 0x7f, 0x80, 0xff, body[at] ^ 0x01] {
                let mut changed = body.clone();
                changed[at] = value;
                check(&changed, at % 2 == 0);
            }
        }
        for len in 0..body.len() {
            check(&body[..len], len % 2 == 0);
        }
        // Most changes leave a body prost reads: the comparison ran, not only the split.
        assert!(checked > body.len() * 4, "{checked} of {}", body.len() * 9);
    }

    /// Series whose labels are all short but whose own length takes two bytes (128 to
    /// 16,383: `extend_run` reads them) or three (the general step's), and empty series
    /// (`0x0a 0x00`) among them and last, in runs of one tenant and across tenants.
    #[test]
    fn long_series_of_short_labels_and_empty_series_split_as_prost_reads_them() {
        let mut scratch = Vec::new();
        let series = |body: &mut Vec<u8>, scratch: &mut Vec<u8>, tenant: &str, labels: usize| {
            let mut w = SeriesWriter::new(scratch);
            w.label(b"__name__", b"up");
            for i in 0..labels {
                w.label(format!("l{i:04}").as_bytes(), "v".repeat(100).as_bytes());
            }
            w.label(b"tenant", tenant.as_bytes());
            w.sample(1f64.to_bits(), 1000);
            w.finish(body);
        };
        let mut body = Vec::new();
        series(&mut body, &mut scratch, "a", 0);
        series(&mut body, &mut scratch, "a", 2); // 2-byte length
        series(&mut body, &mut scratch, "a", 100); // 2-byte length, 11,000 bytes
        body.extend_from_slice(&[0x0a, 0x00]);
        series(&mut body, &mut scratch, "a", 3);
        series(&mut body, &mut scratch, "a", 160); // 3-byte length
        series(&mut body, &mut scratch, "a", 1);
        series(&mut body, &mut scratch, "b", 4);
        series(&mut body, &mut scratch, "b", 0);
        series(&mut body, &mut scratch, "a", 2);
        body.extend_from_slice(&[0x0a, 0x00]);
        let mut split = TenantSplit::new();
        for keep_label in [true, false] {
            assert_eq!(
                split_as_prost_reads(&mut split, &body, keep_label),
                Some(true)
            );
            // The same series, every cut at a series' end.
            let mut r = Reader::new(&body, 0, body.len());
            while !r.is_done() {
                r.key().unwrap();
                r.len_delimited().unwrap();
                let cut = &body[..r.pos()];
                assert_eq!(
                    split_as_prost_reads(&mut split, cut, keep_label),
                    Some(true)
                );
            }
        }
        // Three tenants: `a`, the empty series' default, `b`.
        let bodies = split.split(&body, &opts(Some(b"anon"), true, 100)).unwrap();
        let series: Vec<usize> = bodies.iter().map(|b| b.series).collect();
        assert_eq!(series, [7, 2, 2]);
        // `extend_run` itself takes the series of two-byte lengths (a wrong start would
        // only leave them to the general step, with the same result, slower): from the
        // second series on, it stops at the empty one and hands it over.
        let mut ends = Vec::new();
        let mut r = Reader::new(&body, 0, body.len());
        while !r.is_done() {
            r.key().unwrap();
            r.len_delimited().unwrap();
            ends.push(r.pos());
        }
        let opts = opts(Some(b"anon"), true, 100);
        let (pos, _, handed) = split.extend_run(&body, ends[0], (0, Some(b"a")), &opts, (0, 0));
        assert_eq!(pos, ends[2]);
        let handed = handed.expect("the empty series, read and handed over");
        assert_eq!((handed.from, handed.end), (ends[2], ends[3]));
        assert_eq!(handed.fields.tenant, None);
    }

    /// Each body's tenant and the metadata families it holds, sorted.
    fn families_by_tenant(
        bodies: &[TenantBody],
        input: &[u8],
    ) -> Vec<(Option<String>, Vec<String>)> {
        bodies
            .iter()
            .map(|b| decoded(b, input))
            .map(|(t, r)| {
                let mut f: Vec<String> = r
                    .metadata
                    .into_iter()
                    .map(|m| m.metric_family_name)
                    .collect();
                f.sort();
                (t, f)
            })
            .collect()
    }

    /// The byte-position read of the usual shape and the general walk agree: series in
    /// other shapes (a label with a two-byte length, a label written value first, a label
    /// after the samples) are split by the general walk, with the same result.
    #[test]
    fn series_in_any_shape_reach_their_tenant_with_the_label_dropped() {
        let label = |name: &[u8], value: &[u8], value_first: bool| {
            let mut l = Vec::new();
            let fields = [(1, name), (2, value)];
            let order = if value_first { [1, 0] } else { [0, 1] };
            for i in order {
                crate::wire::pb::put_bytes_field(&mut l, fields[i].0, fields[i].1);
            }
            l
        };
        let long = "t".repeat(200);
        let mut sample = Vec::new();
        sample.push(0x09);
        sample.extend_from_slice(&1f64.to_bits().to_le_bytes());
        sample.extend_from_slice(&[0x10, 0x01]);
        let shapes: Vec<(Vec<Vec<u8>>, bool, &str)> = vec![
            (
                vec![
                    label(b"__name__", b"up", false),
                    label(b"tenant", b"a", false),
                ],
                false,
                "a",
            ),
            (
                vec![
                    label(b"__name__", b"up", false),
                    label(b"tenant", long.as_bytes(), false),
                ],
                false,
                &long,
            ),
            (
                vec![
                    label(b"__name__", b"up", false),
                    label(b"tenant", b"b", true),
                ],
                false,
                "b",
            ),
            (
                vec![
                    label(b"__name__", b"up", false),
                    label(b"tenant", b"c", false),
                ],
                true,
                "c",
            ),
        ];
        for (labels, label_last, tenant) in shapes {
            let mut series = Vec::new();
            let (first, last) = labels.split_at(if label_last { 1 } else { labels.len() });
            for l in first {
                crate::wire::pb::put_bytes_field(&mut series, 1, l);
            }
            crate::wire::pb::put_bytes_field(&mut series, 2, &sample);
            for l in last {
                crate::wire::pb::put_bytes_field(&mut series, 1, l);
            }
            let mut body = Vec::new();
            crate::wire::pb::put_bytes_field(&mut body, 1, &series);
            let mut split = TenantSplit::new();
            let bodies = split.split(&body, &opts(None, false, 10)).unwrap();
            assert_eq!(bodies.len(), 1, "{tenant}");
            let (t, req) = decoded(&bodies[0], &body);
            assert_eq!(t.as_deref(), Some(tenant));
            assert_eq!(bodies[0].samples, 1);
            let names: Vec<_> = req.timeseries[0]
                .labels
                .iter()
                .map(|l| l.name.as_str())
                .collect();
            assert_eq!(names, ["__name__"], "{tenant}: the tenant label dropped");
        }
    }

    #[test]
    fn three_tenants_and_a_default() {
        let body = request(&[Some("a"), Some("b"), None, Some("a"), Some("c")]);
        let mut split = TenantSplit::new();
        for round in 0..2 {
            let bodies = split
                .split(&body, &opts(Some(b"anonymous"), false, 10))
                .unwrap();
            let got: Vec<(Option<String>, pb::WriteRequest)> =
                bodies.iter().map(|b| decoded(b, &body)).collect();
            let names: Vec<Option<&str>> = got.iter().map(|(t, _)| t.as_deref()).collect();
            assert_eq!(
                names,
                [Some("a"), Some("b"), Some("anonymous"), Some("c")],
                "round {round}"
            );
            let counts: Vec<usize> = got.iter().map(|(_, r)| r.timeseries.len()).collect();
            assert_eq!(counts, [2, 1, 1, 1]);
            let samples: Vec<u64> = bodies.iter().map(|b| b.samples).collect();
            assert_eq!(samples, [2, 1, 1, 1]);
            for (_, r) in &got {
                assert!(
                    r.timeseries
                        .iter()
                        .all(|ts| ts.labels.iter().all(|l| l.name != "tenant"))
                );
                assert_eq!(r.metadata.len(), 1, "metadata to every tenant");
            }
        }
    }

    #[test]
    fn metadata_goes_to_the_tenants_of_its_family_only() {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        for (name, tenant) in [("a_total", "x"), ("b_bucket", "y"), ("a_total", "z")] {
            let mut w = SeriesWriter::new(&mut scratch);
            w.label(b"__name__", name.as_bytes());
            w.label(b"tenant", tenant.as_bytes());
            w.sample(1f64.to_bits(), 1000);
            w.finish(&mut out);
        }
        let series_end = out.len();
        write_metadata(&mut out, 1, b"a", b"A.", b"");
        write_metadata(&mut out, 4, b"b", b"B.", b"");
        write_metadata(&mut out, 2, b"elsewhere", b"E.", b"");
        let mut split = TenantSplit::new();
        for round in 0..2 {
            let bodies = split.split(&out, &opts(Some(b"anon"), false, 10)).unwrap();
            let got = families_by_tenant(bodies, &out);
            assert_eq!(
                got,
                [
                    (Some("x".into()), vec!["a".to_string()]),
                    (Some("y".into()), vec!["b".to_string()]),
                    (Some("z".into()), vec!["a".to_string()]),
                    (Some("anon".into()), vec!["elsewhere".to_string()]),
                ],
                "round {round}"
            );
            assert!(bodies.iter().all(|b| b.has_metadata));
            // Without metadata in the request, no body says it has some.
            let bodies = split
                .split(&out[..series_end], &opts(Some(b"anon"), false, 10))
                .unwrap();
            assert_eq!(bodies.len(), 3);
            assert!(bodies.iter().all(|b| !b.has_metadata));
            assert!(
                families_by_tenant(bodies, &out[..series_end])
                    .iter()
                    .all(|(_, f)| f.is_empty())
            );
        }
        // Metadata in front of the series it describes goes to the same tenants.
        let mut first = Vec::new();
        write_metadata(&mut first, 1, b"a", b"A.", b"");
        write_metadata(&mut first, 4, b"b", b"B.", b"");
        write_metadata(&mut first, 2, b"elsewhere", b"E.", b"");
        let metadata_len = first.len();
        first.extend_from_slice(&out[..out.len() - metadata_len]);
        let bodies = split
            .split(&first, &opts(Some(b"anon"), false, 10))
            .unwrap();
        assert_eq!(
            families_by_tenant(bodies, &first),
            [
                (Some("x".into()), vec!["a".to_string()]),
                (Some("y".into()), vec!["b".to_string()]),
                (Some("z".into()), vec!["a".to_string()]),
                (Some("anon".into()), vec!["elsewhere".to_string()]),
            ],
            "metadata first"
        );
        // Metadata alone (as Prometheus 1.0 sends it): to the body without a tenant.
        let mut only = Vec::new();
        write_metadata(&mut only, 1, b"a", b"A.", b"");
        let bodies = split.split(&only, &opts(None, false, 10)).unwrap();
        assert_eq!(bodies.len(), 1);
        let (t, r) = decoded(&bodies[0], &only);
        assert_eq!((t, r.metadata.len(), r.timeseries.len()), (None, 1, 0));
    }

    /// One 256 KiB help text and one series in each of 1,000 tenants: 1,000 copies
    /// would be 256 MB from a 300 KB request. Copies stop at the bound; every tenant
    /// keeps its series, and the skipped copies are counted.
    #[test]
    fn metadata_copies_across_tenants_are_bounded() {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        for i in 0..1000 {
            let mut w = SeriesWriter::new(&mut scratch);
            w.label(b"__name__", b"a_total");
            w.label(b"tenant", format!("t{i}").as_bytes());
            w.sample(1f64.to_bits(), 1000);
            w.finish(&mut out);
        }
        let help = vec![b'h'; 256 << 10];
        write_metadata(&mut out, 1, b"a", &help, b"");
        let mut split = TenantSplit::new();
        let bodies = split.split(&out, &opts(None, false, 1000)).unwrap();
        assert_eq!(bodies.len(), 1000);
        let total: usize = bodies.iter().map(|b| b.bytes(&out).len()).sum();
        let with_metadata = bodies
            .iter()
            .filter(|b| decoded(b, &out).1.metadata.len() == 1)
            .count();
        assert!(
            total <= out.len() * 2 + METADATA_COPY_FLOOR,
            "{total} bytes out of {}",
            out.len()
        );
        assert!(bodies.iter().all(|b| b.series == 1));
        assert_eq!(with_metadata as u64 + split.metadata_skipped(), 1000);
        assert!(with_metadata >= 2, "copies up to the bound still go out");
    }

    /// A request whose series all go to one tenant as they are is that tenant's body,
    /// not a copy of it; a second piece or metadata for that tenant makes it a copy
    /// with the piece appended.
    #[test]
    fn one_tenant_s_series_as_they_are_are_borrowed_not_copied() {
        let series_only =
            |tenants: &[Option<&str>]| crate::wire::pb::series_fields_of(&request(tenants));
        let mut split = TenantSplit::new();
        let one = series_only(&[Some("a"), Some("a"), Some("a")]);
        let bodies = split.split(&one, &opts(None, true, 10)).unwrap();
        assert_eq!(bodies.len(), 1);
        let bytes = bodies[0].bytes(&one);
        assert_eq!(bytes, &one[..]);
        assert_eq!(bytes.as_ptr(), one.as_ptr(), "the input itself");
        assert_eq!(decoded(&bodies[0], &one).1.timeseries.len(), 3);
        let held = split.retained_bytes();
        // a, b, a: tenant a's two pieces are copied into one body.
        let two = series_only(&[Some("a"), Some("b"), Some("a")]);
        let bodies = split.split(&two, &opts(None, true, 10)).unwrap();
        let got: Vec<_> = bodies.iter().map(|b| decoded(b, &two)).collect();
        let labels = |r: &pb::WriteRequest| -> Vec<String> {
            r.timeseries
                .iter()
                .map(|ts| ts.labels[1].value.clone())
                .collect()
        };
        assert_eq!(got[0].0.as_deref(), Some("a"));
        assert_eq!(labels(&got[0].1), ["0", "2"]);
        assert_eq!(labels(&got[1].1), ["1"]);
        let in_input = |b: &TenantBody| two.as_ptr_range().contains(&b.bytes(&two).as_ptr());
        assert!(in_input(&bodies[1]), "b's one piece borrowed");
        assert!(!in_input(&bodies[0]), "a's two pieces copied");
        assert!(
            split.retained_bytes() > held,
            "a's body has bytes of its own"
        );
        // One tenant with metadata: its series, then the metadata.
        let with_metadata = request(&[Some("a"), Some("a")]);
        let bodies = split.split(&with_metadata, &opts(None, true, 10)).unwrap();
        assert_eq!(bodies.len(), 1);
        let (_, r) = decoded(&bodies[0], &with_metadata);
        assert_eq!((r.timeseries.len(), r.metadata.len()), (2, 1));
        assert!(bodies[0].has_metadata);
        // A body of the same split again starts empty, whatever it held before.
        let bodies = split.split(&one, &opts(None, true, 10)).unwrap();
        assert_eq!(bodies[0].bytes(&one).as_ptr(), one.as_ptr());
    }

    /// A body known to be all one tenant's goes as the full split sends it: one body,
    /// the input itself, its series and samples counted, each name remembered for the
    /// tenant; anything but series in the mapper's shape is left to the full split.
    #[test]
    fn one_known_tenant_goes_as_the_full_split_sends_it() {
        let mut body = Vec::new();
        let mut scratch = Vec::new();
        // Names first, after labels sorted before them, or absent; two samples some.
        for (i, (before, name)) in [
            (None, Some("up")),
            (None, Some("up")),
            (Some("DCGM_VERSION"), Some("gpu_util")),
            (Some("Hostname"), Some("gpu_util")),
            (None, Some("up")),
        ]
        .into_iter()
        .enumerate()
        {
            let mut w = SeriesWriter::new(&mut scratch);
            if let Some(b) = before {
                w.label(b.as_bytes(), b"x");
            }
            if let Some(n) = name {
                w.label(b"__name__", n.as_bytes());
            }
            w.label(b"i", i.to_string().as_bytes());
            w.label(b"tenant", b"a");
            w.sample(1f64.to_bits(), 1000);
            if i % 2 == 0 {
                w.sample(2f64.to_bits(), 2000);
            }
            w.finish(&mut body);
        }
        let (full_memory, known_memory) = (
            Mutex::new(FamilyTenants::new()),
            Mutex::new(FamilyTenants::new()),
        );
        let orphans = |memory| Orphans {
            memory,
            untenanted_ok: false,
        };
        let opts = opts(Some(b"anon"), true, 10);
        let mut full = TenantSplit::new();
        let want = full
            .split_routed(&body, &opts, &orphans(&full_memory))
            .unwrap();
        let mut known = TenantSplit::new();
        let got = known
            .split_one_tenant(&body, (b"a", 8), &opts, &orphans(&known_memory))
            .unwrap()
            .expect("series in the mapper's shape");
        let view = |b: &[TenantBody]| -> Vec<_> {
            b.iter()
                .map(|t| {
                    let bytes = t.bytes(&body);
                    (
                        t.tenant().map(<[u8]>::to_vec),
                        bytes.as_ptr(),
                        bytes.len(),
                        t.series,
                        t.samples,
                        t.has_metadata,
                    )
                })
                .collect()
        };
        assert_eq!(view(got), view(want));
        assert_eq!(view(got)[0].1, body.as_ptr(), "the input itself");
        for name in ["up", "gpu_util", "Hostname", "i"] {
            let recent = |m: &Mutex<FamilyTenants>| -> Vec<Option<Vec<u8>>> {
                m.lock()
                    .unwrap()
                    .recent(name.as_bytes())
                    .map(|t| t.map(<[u8]>::to_vec))
                    .collect()
            };
            assert_eq!(recent(&known_memory), recent(&full_memory), "{name}");
        }
        assert_eq!(known_memory.lock().unwrap().len(), 2, "up and gpu_util");

        // Metadata, an empty body, a label in another shape, a series with no name
        // among its labels before its samples: the full split's.
        let with_metadata = request(&[Some("a"), Some("a")]);
        let samples_first = {
            use crate::wire::pb::put_bytes_field;
            let mut sample = vec![0x09];
            sample.extend_from_slice(&1f64.to_bits().to_le_bytes());
            let mut ts = Vec::new();
            put_bytes_field(&mut ts, 2, &sample);
            for (n, v) in [("__name__", "up"), ("tenant", "a")] {
                let mut l = Vec::new();
                put_bytes_field(&mut l, 1, n.as_bytes());
                put_bytes_field(&mut l, 2, v.as_bytes());
                put_bytes_field(&mut ts, 1, &l);
            }
            let mut b = Vec::new();
            put_bytes_field(&mut b, 1, &ts);
            b
        };
        let long = {
            let mut b = Vec::new();
            let mut w = SeriesWriter::new(&mut scratch);
            w.label(b"A", "v".repeat(200).as_bytes());
            w.label(b"__name__", b"up");
            w.label(b"tenant", b"a");
            w.sample(1f64.to_bits(), 1000);
            w.finish(&mut b);
            b
        };
        assert_eq!(
            decoded(
                &full.split(&samples_first, &opts).unwrap()[0],
                &samples_first
            )
            .1
            .timeseries[0]
                .labels[0]
                .value,
            "up",
            "a body prost reads"
        );
        for other in [&with_metadata[..], &[], &long, &samples_first] {
            let r = known.split_one_tenant(other, (b"a", 2), &opts, &orphans(&known_memory));
            assert!(r.unwrap().is_none(), "{other:02x?}");
        }
        // The tenant limit holds.
        let none = SplitOptions {
            max_tenants: 0,
            ..opts
        };
        assert!(matches!(
            known.split_one_tenant(&body, (b"a", 8), &none, &orphans(&known_memory)),
            Err(SplitError::TooManyTenants(0))
        ));
    }

    #[test]
    fn no_default_keeps_label_and_limits_tenants() {
        let body = request(&[Some("a"), None]);
        let mut split = TenantSplit::new();
        let bodies = split.split(&body, &opts(None, true, 10)).unwrap();
        let (t0, r0) = decoded(&bodies[0], &body);
        assert_eq!(t0.as_deref(), Some("a"));
        assert!(r0.timeseries[0].labels.iter().any(|l| l.name == "tenant"));
        assert_eq!(
            decoded(&bodies[1], &body).0,
            None,
            "unlabelled series keep the sender's tenant"
        );
        let body = request(&[Some("a"), Some("b"), Some("c")]);
        assert!(matches!(
            split.split(&body, &opts(None, false, 2)),
            Err(SplitError::TooManyTenants(2))
        ));
    }

    #[test]
    fn family_tenants_are_bounded_and_keep_the_recent_ones() {
        let mut m = FamilyTenants::new();
        let recent = |m: &FamilyTenants, name: &[u8]| -> Vec<Option<Vec<u8>>> {
            m.recent(name).map(|t| t.map(<[u8]>::to_vec)).collect()
        };
        for t in 0..20u8 {
            m.note(b"x_total", Some(&[b'a' + t]));
        }
        m.note(b"x_total", None);
        m.note(b"x_total", Some(b"t"));
        let got = recent(&m, b"x_total");
        assert_eq!(got.len(), TENANTS_PER_NAME);
        assert_eq!(got[0].as_deref(), Some(&b"t"[..]), "the most recent first");
        assert_eq!(got[1], None);
        // Many names: at most REMEMBERED_NAMES, the recently noted ones kept.
        for n in 0..10 * REMEMBERED_NAMES {
            m.note(format!("n{n}").as_bytes(), Some(b"a"));
            // One name noted all along stays.
            m.note(b"kept", Some(b"k"));
        }
        assert!(m.len() <= REMEMBERED_NAMES, "{}", m.len());
        assert_eq!(recent(&m, b"kept"), [Some(b"k".to_vec())]);
        assert!(recent(&m, b"x_total").is_empty(), "forgotten");
        let last = format!("n{}", 10 * REMEMBERED_NAMES - 1);
        assert_eq!(recent(&m, last.as_bytes()).len(), 1);
        // Long names and tenants (label values go up to 64 KiB) are not remembered.
        let long = vec![b'x'; REMEMBERED_BYTES + 1];
        m.note(&long, Some(b"a"));
        m.note(b"short", Some(&long));
        assert!(recent(&m, &long).is_empty());
        assert!(recent(&m, b"short").is_empty());
    }

    #[test]
    fn metadata_alone_goes_to_the_tenants_remembered_or_is_dropped() {
        let memory = Mutex::new(FamilyTenants::new());
        let mut split = TenantSplit::new();
        let meta = |families: &[&str]| {
            let mut out = Vec::new();
            for f in families {
                write_metadata(&mut out, 1, f.as_bytes(), b"H.", b"");
            }
            out
        };
        let families = families_by_tenant;
        let strict = Orphans {
            memory: &memory,
            untenanted_ok: false,
        };
        // Nothing seen, no tenant for the body without one: dropped.
        let bodies = split
            .split_routed(&meta(&["up", "x"]), &opts(None, false, 10), &strict)
            .unwrap();
        assert!(bodies.is_empty());
        assert_eq!(split.metadata_dropped(), 2);
        // With a sender's tenant: to the body without one, as before.
        let lenient = Orphans {
            untenanted_ok: true,
            ..strict
        };
        let input = meta(&["up"]);
        let bodies = split
            .split_routed(&input, &opts(None, false, 10), &lenient)
            .unwrap();
        assert_eq!(families(bodies, &input), [(None, vec!["up".to_string()])]);
        assert_eq!(split.metadata_dropped(), 0);
        // Series teach the memory (`up` at a, b and without a tenant).
        let no_meta = crate::wire::pb::series_fields_of(&request(&[Some("a"), Some("b"), None]));
        split
            .split_routed(&no_meta, &opts(None, false, 10), &strict)
            .unwrap();
        let input = meta(&["up", "x"]);
        let bodies = split
            .split_routed(&input, &opts(None, false, 10), &strict)
            .unwrap();
        let mut got = families(bodies, &input);
        got.sort();
        assert_eq!(
            got,
            [
                (Some("a".into()), vec!["up".to_string()]),
                (Some("b".into()), vec!["up".to_string()]),
            ],
            "not to the sender's tenant: it has none"
        );
        assert_eq!(split.metadata_dropped(), 1, "x");
        let bodies = split
            .split_routed(&meta(&["up"]), &opts(None, false, 10), &lenient)
            .unwrap();
        assert_eq!(bodies.len(), 3, "a, b and the sender's tenant");
        // A default takes what nothing else does.
        let input = meta(&["x"]);
        let bodies = split
            .split_routed(&input, &opts(Some(b"anon"), false, 10), &strict)
            .unwrap();
        assert_eq!(
            families(bodies, &input),
            [(Some("anon".into()), vec!["x".to_string()])]
        );
    }
}
