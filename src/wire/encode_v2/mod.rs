//! Remote-write 2.0 output, and clean 1.0 output, from the mapped request.
//!
//! The mapping stage writes one body: a 1.0 `WriteRequest` whose samples may carry 2.0's
//! `start_timestamp` (`Sample` field 3) and whose native histograms may carry theirs
//! (`Histogram` field 17). From it:
//! - [`strip_v2`] writes the 1.0 body for 1.0 backends (those two fields removed; only
//!   needed when the request had start timestamps);
//! - [`V2Encoder::encode`] writes an `io.prometheus.write.v2.Request`: the symbols table
//!   built in one pass over the series (a hash table of indices into one byte buffer, no
//!   `String` per symbol), samples and histograms copied as they are (2.0 numbers their
//!   fields like 1.0), exemplars' labels turned into references, and each series'
//!   metadata attached from the request's `MetricMetadata` or, failing that, from what
//!   earlier requests carried ([`MetadataMemory`]).
//!
//! Nothing here allocates per sample once warm: every buffer is reused.

mod fast;
mod symbols;

use ahash::AHashMap;

use self::fast::{PreviousLabels, pack_refs};
use self::symbols::Symbols;
use super::DecodeError;
use super::decode::short_eq;
use super::decode_v2::{TYPE_COUNTER, TYPE_GAUGEHISTOGRAM, TYPE_HISTOGRAM, TYPE_SUMMARY};
use super::pb::{
    Reader, WIRE_LEN, WIRE_VARINT, copy_without, put_bytes_field, put_key, put_varint,
    put_varint_at, varint_len,
};

/// Field numbers of `io.prometheus.write.v2.Request`.
const V2_SYMBOLS: u32 = 4;
const V2_TIMESERIES: u32 = 5;
/// A series' key: `timeseries`, length-delimited.
const SERIES_KEY: u8 = ((V2_TIMESERIES << 3) | WIRE_LEN as u32) as u8;

/// Metadata remembered from earlier requests, by output family name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMetadata {
    pub metric_type: i32,
    pub help: Box<[u8]>,
    pub unit: Box<[u8]>,
}

/// Families' metadata learnt from requests, to attach to 2.0 series of later requests
/// that carry none (1.0 senders send metadata in requests of their own). Bounded in
/// families and in bytes; once full, new families are not remembered (those known are
/// still updated when the update fits).
#[derive(Debug, Default)]
pub struct MetadataMemory {
    map: AHashMap<Box<[u8]>, StoredMetadata>,
    /// [`MetadataMemory::cost`] summed over the families held.
    bytes: usize,
}

impl MetadataMemory {
    /// Families remembered at most.
    pub const LIMIT: usize = 100_000;
    /// Bytes remembered at most: names, help and unit texts, plus a fixed overhead per
    /// family. Help texts may be 64 KiB each: the count alone would not bound the memory.
    pub const BYTES: usize = 32 << 20;

    /// What a family costs against [`MetadataMemory::BYTES`].
    fn cost(family: &[u8], help: &[u8], unit: &[u8]) -> usize {
        family.len() + help.len() + unit.len() + 96
    }

    /// Bytes held, as [`MetadataMemory::BYTES`] counts them.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, family: &[u8]) -> Option<&StoredMetadata> {
        self.map.get(family)
    }

    /// Whether [`MetadataMemory::store`] of this family would change what is held: the
    /// family is new and there is room for it, or it differs and its new texts fit. A
    /// full memory has no news for families it cannot take, so once it is full requests
    /// stop asking for its write lock.
    pub fn would_store(&self, family: &[u8], metric_type: i32, help: &[u8], unit: &[u8]) -> bool {
        let cost = Self::cost(family, help, unit);
        match self.map.get(family) {
            Some(s) => {
                (s.metric_type != metric_type || &*s.help != help || &*s.unit != unit)
                    && self.bytes - Self::cost(family, &s.help, &s.unit) + cost <= Self::BYTES
            }
            None => self.map.len() < Self::LIMIT && self.bytes + cost <= Self::BYTES,
        }
    }

    /// Remembers a family's metadata, when [`MetadataMemory::would_store`] says so.
    pub fn store(&mut self, family: &[u8], metric_type: i32, help: &[u8], unit: &[u8]) {
        if family.is_empty() || !self.would_store(family, metric_type, help, unit) {
            return;
        }
        let stored = StoredMetadata {
            metric_type,
            help: help.into(),
            unit: unit.into(),
        };
        let cost = Self::cost(family, help, unit);
        match self.map.get_mut(family) {
            Some(s) => {
                self.bytes = self.bytes - Self::cost(family, &s.help, &s.unit) + cost;
                *s = stored;
            }
            None => {
                self.bytes += cost;
                self.map.insert(family.into(), stored);
            }
        }
    }
}

/// What [`V2Encoder::encode`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct V2Written {
    pub series: usize,
    pub symbols: usize,
}

#[derive(Clone, Copy, Debug)]
struct RequestMetadata {
    family: (u32, u32),
    metric_type: i32,
    help: (u32, u32),
    unit: (u32, u32),
}

/// `[start, end)` of a buffer.
type ByteRange = (u32, u32);

#[inline]
fn slice(buf: &[u8], r: ByteRange) -> &[u8] {
    &buf[r.0 as usize..r.1 as usize]
}

/// Reusable state of the 2.0 encoder.
#[derive(Default)]
pub struct V2Encoder {
    symbols: Symbols,
    /// An exemplar's label references (a series' are packed straight into `ref_bytes`).
    refs: Vec<u32>,
    /// The current series' packed references, in the general encoder.
    ref_bytes: Vec<u8>,
    /// The encoded series, `series_out[..series_len]`: the one-pass encoder writes past
    /// that end in place (fixed-size copies), so the buffer is kept longer than what it
    /// holds.
    series_out: Vec<u8>,
    series_len: usize,
    series_buf: Vec<u8>,
    ex_buf: Vec<u8>,
    md: Vec<RequestMetadata>,
    md_index: AHashMap<u64, u32>,
    /// Per name symbol of this request: 0 not looked up yet, 1 no metadata, `i + 2`:
    /// `md_found[i]`. Series of one family repeat their name (histogram buckets): the
    /// suffix lookups run once per name, not once per series.
    md_by_name: Vec<u32>,
    /// (type, help symbol, unit symbol).
    md_found: Vec<(i32, u32, u32)>,
    /// The general encoder's previous series: the span of each encoded `Label` in the
    /// mapped body and its references. A label equal byte for byte at the same position
    /// reuses its symbols without hashing. Overwritten in place, label by label.
    labels_seen: Vec<LabelSeen>,
    /// The one-pass encoder's previous series.
    previous: Box<PreviousLabels>,
}

/// A label of the previous series (see `V2Encoder::labels_seen`).
#[derive(Clone, Copy, Debug)]
struct LabelSeen {
    /// The encoded `Label` in the mapped body.
    span: ByteRange,
    /// The name in the mapped body, and its symbol.
    name: ByteRange,
    name_ref: u32,
    value_ref: u32,
    /// The value in the mapped body.
    value: ByteRange,
    is_name: bool,
    /// `name_ref` and `value_ref` as packed varints: `refs_packed[..refs_len]`.
    refs_packed: [u8; 16],
    refs_len: u8,
}

impl LabelSeen {
    fn new(
        span: ByteRange,
        (name, name_ref): (ByteRange, u32),
        (value, value_ref): (ByteRange, u32),
        is_name: bool,
    ) -> Self {
        let (refs_packed, refs_len) = pack_refs(name_ref, value_ref);
        LabelSeen {
            span,
            name,
            name_ref,
            value_ref,
            value,
            is_name,
            refs_packed,
            refs_len,
        }
    }
}

impl V2Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the encoder's buffers hold between requests (the symbols table, the
    /// encoded series, the request's metadata).
    pub fn retained_bytes(&self) -> usize {
        use crate::wire::held;
        self.symbols.retained_bytes()
            + held(&self.refs)
            + held(&self.ref_bytes)
            + held(&self.series_out)
            + held(&self.series_buf)
            + held(&self.ex_buf)
            + held(&self.md)
            + self.md_index.capacity() * 16
            + held(&self.md_by_name)
            + held(&self.md_found)
            + held(&self.labels_seen)
    }

    /// Encodes `v1` (the mapped request, see the module docs) as a 2.0 `Request` into
    /// `out`, replacing its contents. `memory` supplies metadata for series whose family
    /// the request carries none for.
    pub fn encode(
        &mut self,
        v1: &[u8],
        memory: Option<&MetadataMemory>,
        out: &mut Vec<u8>,
    ) -> Result<V2Written, DecodeError> {
        self.encode_inner(v1, memory, out, true)
    }

    /// [`V2Encoder::encode`] of a body its producer knows to hold no metadata entries
    /// (the mapper wrote none): the pass that looks for them before the series, a
    /// tenth of the encoder's time, is skipped. Series still get metadata from `memory`.
    pub fn encode_metadata_free(
        &mut self,
        v1: &[u8],
        memory: Option<&MetadataMemory>,
        out: &mut Vec<u8>,
    ) -> Result<V2Written, DecodeError> {
        self.encode_inner(v1, memory, out, false)
    }

    fn encode_inner(
        &mut self,
        v1: &[u8],
        memory: Option<&MetadataMemory>,
        out: &mut Vec<u8>,
        metadata_in_body: bool,
    ) -> Result<V2Written, DecodeError> {
        out.clear();
        self.symbols.reset();
        self.series_len = 0;
        self.md.clear();
        self.md_index.clear();
        self.md_by_name.clear();
        self.md_found.clear();
        self.labels_seen.clear();
        self.previous.len = 0;
        // The request's metadata first: series look their family up in it.
        let mut r = Reader::new(v1, 0, if metadata_in_body { v1.len() } else { 0 });
        while !r.is_done() {
            // A series (key 0x0a) is read in the second pass: stepped over here without
            // the field dispatch.
            if r.eat(0x0a) {
                r.len_delimited()?;
                continue;
            }
            let (field, wire) = r.key()?;
            if field == 3 && wire == WIRE_LEN {
                let (s, e) = r.len_delimited()?;
                self.read_metadata(v1, s, e)?;
            } else {
                r.skip(wire)?;
            }
        }
        let mut written = V2Written::default();
        let mut r = Reader::new(v1, 0, v1.len());
        while !r.is_done() {
            let series = r.eat(0x0a) || {
                let (field, wire) = r.key()?;
                if field == 1 && wire == WIRE_LEN {
                    true
                } else {
                    r.skip(wire)?;
                    false
                }
            };
            if series {
                let (s, e) = r.len_delimited()?;
                if self.encode_series_fast(v1, s, e, memory).is_none() {
                    self.encode_series(v1, s, e, memory)?;
                }
                written.series += 1;
            }
        }
        self.symbols.put_fields(out, V2_SYMBOLS);
        out.extend_from_slice(&self.series_out[..self.series_len]);
        written.symbols = self.symbols.len();
        Ok(written)
    }

    fn read_metadata(&mut self, buf: &[u8], start: usize, end: usize) -> Result<(), DecodeError> {
        let mut md = RequestMetadata {
            family: (0, 0),
            metric_type: 0,
            help: (0, 0),
            unit: (0, 0),
        };
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match (field, wire) {
                (1, WIRE_VARINT) => md.metric_type = r.varint()? as i32,
                (2 | 4 | 5, WIRE_LEN) => {
                    let (s, e) = r.len_delimited()?;
                    let span = (s as u32, e as u32);
                    match field {
                        2 => md.family = span,
                        4 => md.help = span,
                        _ => md.unit = span,
                    }
                }
                _ => r.skip(wire)?,
            }
        }
        let key = self.symbols.hash(slice(buf, md.family));
        // The first entry of a family wins (the mapper writes one per family anyway).
        if let std::collections::hash_map::Entry::Vacant(v) = self.md_index.entry(key) {
            v.insert(self.md.len() as u32);
            self.md.push(md);
        }
        Ok(())
    }

    /// Metadata for the series named `name`: its family is `name`, or `name` without the
    /// suffix its type gives its series.
    fn find_metadata<'m>(
        &self,
        buf: &'m [u8],
        name: &[u8],
        memory: Option<&'m MetadataMemory>,
    ) -> Option<(i32, &'m [u8], &'m [u8])> {
        const CANDIDATES: &[(&[u8], &[u8])] = &[
            (b"", &[]),
            (b"_total", &[TYPE_COUNTER]),
            (b"_bucket", &[TYPE_HISTOGRAM, TYPE_GAUGEHISTOGRAM]),
            (
                b"_count",
                &[TYPE_HISTOGRAM, TYPE_GAUGEHISTOGRAM, TYPE_SUMMARY],
            ),
            (
                b"_sum",
                &[TYPE_HISTOGRAM, TYPE_GAUGEHISTOGRAM, TYPE_SUMMARY],
            ),
            (
                b"_created",
                &[
                    TYPE_COUNTER,
                    TYPE_HISTOGRAM,
                    TYPE_GAUGEHISTOGRAM,
                    TYPE_SUMMARY,
                ],
            ),
        ];
        // Nowhere to look (a request without metadata, nothing remembered yet): the
        // candidates' suffix checks alone took a hundredth of 2.0 out's time.
        let memory = memory.filter(|mem| !mem.is_empty());
        if self.md.is_empty() && memory.is_none() {
            return None;
        }
        for (suffix, types) in CANDIDATES {
            // `strip_suffix` compares through `memcmp`, a call per candidate.
            let Some(family) = name
                .len()
                .checked_sub(suffix.len())
                .filter(|&at| short_eq(&name[at..], suffix))
                .map(|at| &name[..at])
            else {
                continue;
            };
            if family.is_empty() {
                continue;
            }
            let type_ok = |t: i32| types.is_empty() || types.iter().any(|&x| i32::from(x) == t);
            // Most requests carry no metadata (1.0 senders send it apart): no hashing then.
            if !self.md.is_empty()
                && let Some(&i) = self.md_index.get(&self.symbols.hash(family))
                && let Some(m) = self.md.get(i as usize)
                && short_eq(slice(buf, m.family), family)
            {
                if type_ok(m.metric_type) {
                    return Some((m.metric_type, slice(buf, m.help), slice(buf, m.unit)));
                }
                continue;
            }
            if let Some(m) = memory.and_then(|mem| mem.get(family))
                && type_ok(m.metric_type)
            {
                return Some((m.metric_type, &m.help, &m.unit));
            }
        }
        None
    }

    /// The metadata of the series named `name` (symbol `name_ref`) as (type, help
    /// symbol, unit symbol), looked up once per name and request: a name already looked
    /// up is answered here, inline; the look itself is out of line.
    #[inline(always)]
    fn series_metadata(
        &mut self,
        buf: &[u8],
        name: ByteRange,
        name_ref: Option<u32>,
        memory: Option<&MetadataMemory>,
    ) -> Option<(i32, u32, u32)> {
        if let Some(i) = name_ref {
            match self.md_by_name.get(i as usize) {
                None | Some(0) => {}
                Some(1) => return None,
                Some(&k) => return self.md_found.get(k as usize - 2).copied(),
            }
        }
        self.look_up_series_metadata(buf, (name, name_ref), memory)
    }

    /// [`V2Encoder::series_metadata`] of a name not looked up yet in this request (or
    /// of a series without a name): found, and remembered for the name's other series.
    #[inline(never)]
    fn look_up_series_metadata(
        &mut self,
        buf: &[u8],
        (name, name_ref): (ByteRange, Option<u32>),
        memory: Option<&MetadataMemory>,
    ) -> Option<(i32, u32, u32)> {
        let slot = name_ref.map(|r| r as usize);
        if let Some(i) = slot
            && self.md_by_name.len() <= i
        {
            self.md_by_name.resize(i + 1, 0);
        }
        let found = self
            .find_metadata(buf, slice(buf, name), memory)
            .map(|(t, help, unit)| {
                let help_ref = if help.is_empty() {
                    0
                } else {
                    self.symbols.intern(help)
                };
                let unit_ref = if unit.is_empty() {
                    0
                } else {
                    self.symbols.intern(unit)
                };
                (t, help_ref, unit_ref)
            });
        if let Some(i) = slot {
            self.md_by_name[i] = match found {
                None => 1,
                Some(f) => {
                    self.md_found.push(f);
                    self.md_found.len() as u32 + 1
                }
            };
        }
        found
    }

    /// Label `k` of the current series, the encoded `Label` at `span` (its name and value
    /// when already read): its references appended to `ref_bytes`, reused from label `k`
    /// of the previous series when the bytes are the same. Returns the value's span when
    /// the label is `__name__`.
    #[inline(always)]
    fn take_label(
        &mut self,
        buf: &[u8],
        k: usize,
        span: ByteRange,
        parsed: Option<(ByteRange, ByteRange)>,
    ) -> Result<Option<ByteRange>, DecodeError> {
        let same = match self.labels_seen.get_mut(k) {
            Some(before) if short_eq(slice(buf, before.span), slice(buf, span)) => {
                before.span = span;
                true
            }
            _ => false,
        };
        if !same {
            let (n, v) = match parsed {
                Some(nv) => nv,
                None => read_label(buf, span.0 as usize, span.1 as usize)?,
            };
            // Mostly only the value changed (`le`, a family's other series' names): the
            // name's symbol is the previous label's then.
            let name_ref = match self.labels_seen.get(k) {
                Some(before) if short_eq(slice(buf, before.name), slice(buf, n)) => before.name_ref,
                _ => self.symbols.intern(slice(buf, n)),
            };
            let value_ref = self.symbols.intern(slice(buf, v));
            let is_name = super::decode::is_metric_name(slice(buf, n));
            let seen = LabelSeen::new(span, (n, name_ref), (v, value_ref), is_name);
            match self.labels_seen.get_mut(k) {
                Some(slot) => *slot = seen,
                None => self.labels_seen.push(seen),
            }
        }
        let Some(seen) = self.labels_seen.get(k) else {
            return Ok(None);
        };
        // All ten bytes, then back to the references' length: a fixed-size copy.
        let at = self.ref_bytes.len();
        self.ref_bytes.extend_from_slice(&seen.refs_packed);
        self.ref_bytes.truncate(at + usize::from(seen.refs_len));
        Ok(seen.is_name.then_some(seen.value))
    }

    fn encode_series(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        memory: Option<&MetadataMemory>,
    ) -> Result<(), DecodeError> {
        // The one-pass encoder's previous series is another one now (and may be half
        // overwritten by its try at this one).
        self.previous.len = 0;
        self.ref_bytes.clear();
        let mut k = 0;
        let mut name: (u32, u32) = (0, 0);
        let mut name_ref: Option<u32> = None;
        // The labels come first (key 0x0a) in every series the mapper writes, nearly
        // always in the short shape (`wire::decode::short_label_at`), read here without
        // the field loop; the second loop below reads any other (and steps over labels).
        let msg = &buf[..end];
        let mut p = start;
        while let Some(label) = super::decode::short_label_at(msg, p) {
            let next = label.value.end;
            let span = ((p + 2) as u32, next as u32);
            let parsed = (
                (label.name.start as u32, label.name.end as u32),
                (label.value.start as u32, label.value.end as u32),
            );
            if let Some(value) = self.take_label(buf, k, span, Some(parsed))? {
                name = value;
                name_ref = self.labels_seen.get(k).map(|l| l.value_ref);
            }
            k += 1;
            p = next;
        }
        let mut r = Reader::new(buf, p, end);
        // `rest_at`: the end of the leading run of labels, where the copy of the rest
        // starts (it steps over labels anyway, so any label position stays correct).
        let (mut rest_at, mut leading) = (p, true);
        while !r.is_done() {
            if !r.eat(0x0a) {
                // Not a one-byte label key: a label in a longer key form is still one;
                // anything else is stepped over (a label after it is still read).
                leading = false;
                let (field, wire) = r.key()?;
                if field != 1 || wire != WIRE_LEN {
                    r.skip(wire)?;
                    continue;
                }
            }
            let (s, e) = r.len_delimited()?;
            if leading {
                rest_at = e;
            }
            if let Some(value) = self.take_label(buf, k, (s as u32, e as u32), None)? {
                name = value;
                name_ref = self.labels_seen.get(k).map(|l| l.value_ref);
            }
            k += 1;
        }
        self.labels_seen.truncate(k);
        let metadata = self.series_metadata(buf, name, name_ref, memory);
        let mut md = [0u8; 32];
        let md_len = put_series_metadata(&mut md, metadata);
        let mut body = std::mem::take(&mut self.series_buf);
        body.clear();
        put_ref_bytes(&mut body, &self.ref_bytes);
        let mut r = Reader::new(buf, rest_at, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match (field, wire) {
                (2, WIRE_LEN) => {
                    let (s, e) = r.len_delimited()?;
                    put_bytes_field(&mut body, 2, &buf[s..e]);
                }
                (4, WIRE_LEN) => {
                    let (s, e) = r.len_delimited()?;
                    put_bytes_field(&mut body, 3, &buf[s..e]);
                }
                (3, WIRE_LEN) => {
                    let (s, e) = r.len_delimited()?;
                    self.encode_exemplar(buf, s, e, &mut body)?;
                }
                _ => r.skip(wire)?,
            }
        }
        body.extend_from_slice(&md[..md_len]);
        let mut key_len = [0u8; 11];
        key_len[0] = SERIES_KEY;
        let n = 1 + put_varint_at(&mut key_len, 1, body.len() as u64);
        self.append_series_bytes(&key_len[..n]);
        self.append_series_bytes(&body);
        self.series_buf = body;
        Ok(())
    }

    /// Appends `bytes` to `series_out[..series_len]`. The buffer is never cut back (the
    /// one-pass encoder writes past `series_len`): it grows by doubling, so each byte of
    /// it is zeroed once, however the two encoders alternate.
    fn append_series_bytes(&mut self, bytes: &[u8]) {
        let end = self.series_len + bytes.len();
        if self.series_out.len() < end {
            let want = end.max(self.series_out.len() * 2);
            self.series_out.resize(want, 0);
        }
        self.series_out[self.series_len..end].copy_from_slice(bytes);
        self.series_len = end;
    }

    fn encode_exemplar(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        body: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        let refs_from = self.refs.len();
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            if field == 1 && wire == WIRE_LEN {
                let (s, e) = r.len_delimited()?;
                let (n, v) = read_label(buf, s, e)?;
                let nr = self.symbols.intern(slice(buf, n));
                let vr = self.symbols.intern(slice(buf, v));
                self.refs.push(nr);
                self.refs.push(vr);
            } else {
                r.skip(wire)?;
            }
        }
        let mut ex = std::mem::take(&mut self.ex_buf);
        ex.clear();
        put_packed(&mut ex, 1, &self.refs[refs_from..]);
        self.refs.truncate(refs_from);
        // value (2) and timestamp (3) are numbered alike in both versions.
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let from = r.pos();
            let (field, wire) = r.key()?;
            r.skip(wire)?;
            if field != 1 {
                ex.extend_from_slice(&buf[from..r.pos()]);
            }
        }
        put_bytes_field(body, 4, &ex);
        self.ex_buf = ex;
        Ok(())
    }

    /// [`V2Encoder::encode`] with metadata shared across requests: what `memory` holds
    /// fills in families the request carries no metadata for, and what the request says
    /// that `memory` does not know yet is stored (under the write lock, only then).
    /// `metadata_in_body`: false when `v1`'s producer knows it holds no metadata
    /// entries (see [`V2Encoder::encode_metadata_free`]).
    pub fn encode_remembering(
        &mut self,
        v1: &[u8],
        memory: &std::sync::RwLock<MetadataMemory>,
        out: &mut Vec<u8>,
        metadata_in_body: bool,
    ) -> Result<V2Written, DecodeError> {
        let known = memory.read().ok();
        let written = self.encode_inner(v1, known.as_deref(), out, metadata_in_body)?;
        let news = known.as_deref().is_some_and(|m| self.metadata_news(v1, m));
        drop(known);
        if news && let Ok(mut m) = memory.write() {
            self.remember_metadata(v1, &mut m);
        }
        Ok(written)
    }

    /// Whether the request's metadata (from the last [`V2Encoder::encode`] of `v1`)
    /// holds something `memory` would store. Asked under the read lock, so a request
    /// whose metadata is known already, or cannot be taken, needs no write lock and
    /// allocates nothing.
    pub fn metadata_news(&self, v1: &[u8], memory: &MetadataMemory) -> bool {
        self.md.iter().any(|m| {
            let family = slice(v1, m.family);
            !family.is_empty()
                && memory.would_store(family, m.metric_type, slice(v1, m.help), slice(v1, m.unit))
        })
    }

    /// Stores the request's metadata in `memory` (see [`V2Encoder::metadata_news`]).
    pub fn remember_metadata(&self, v1: &[u8], memory: &mut MetadataMemory) {
        for m in &self.md {
            memory.store(
                slice(v1, m.family),
                m.metric_type,
                slice(v1, m.help),
                slice(v1, m.unit),
            );
        }
    }
}

fn read_label(buf: &[u8], start: usize, end: usize) -> Result<(ByteRange, ByteRange), DecodeError> {
    let mut name = (start as u32, start as u32);
    let mut value = (start as u32, start as u32);
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1 | 2, WIRE_LEN) => {
                let (s, e) = r.len_delimited()?;
                if field == 1 {
                    name = (s as u32, e as u32);
                } else {
                    value = (s as u32, e as u32);
                }
            }
            _ => r.skip(wire)?,
        }
    }
    Ok((name, value))
}

/// Writes a 2.0 series' `metadata` field (5) for (type, help symbol, unit symbol) into
/// `out`; returns its length (0 when there is none). Three varints under 2^32 and their
/// keys fit in 32 bytes.
fn put_series_metadata(out: &mut [u8; 32], metadata: Option<(i32, u32, u32)>) -> usize {
    let Some((metric_type, help_ref, unit_ref)) = metadata else {
        return 0;
    };
    let fields = [
        // int32: a negative one takes ten bytes, as protobuf writes it.
        (metric_type as u64, 1),
        (u64::from(help_ref), 3),
        (u64::from(unit_ref), 4),
    ];
    let mut len = 0;
    for (v, _) in fields {
        if v != 0 {
            len += 1 + varint_len(v);
        }
    }
    out[0] = ((5 << 3) | WIRE_LEN as u32) as u8;
    out[1] = len as u8;
    let mut at = 2;
    for (v, f) in fields {
        if v != 0 {
            out[at] = ((f << 3) | u32::from(WIRE_VARINT)) as u8;
            at += 1 + put_varint_at(out, at + 1, v);
        }
    }
    at
}

/// Writes a series' `labels_refs` field (1) from its packed bytes (nothing when empty).
fn put_ref_bytes(out: &mut Vec<u8>, packed: &[u8]) {
    if !packed.is_empty() {
        put_bytes_field(out, 1, packed);
    }
}

/// Writes a packed `repeated uint32` field (nothing when empty).
fn put_packed(out: &mut Vec<u8>, field: u32, values: &[u32]) {
    if values.is_empty() {
        return;
    }
    put_key(out, field, WIRE_LEN);
    // One byte for the length, patched once the values are written (a longer length,
    // past 127 bytes of references, moves them along).
    let at = out.len();
    out.push(0);
    out.reserve(2 * values.len());
    for &v in values {
        // Symbol references: one or two bytes nearly always.
        if v < 0x80 {
            out.push(v as u8);
        } else if v < 0x4000 {
            out.extend_from_slice(&[(v as u8) | 0x80, (v >> 7) as u8]);
        } else {
            put_varint(out, u64::from(v));
        }
    }
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut prefix = [0u8; 10];
        let mut n = 0;
        let mut rest = len as u64;
        while rest >= 0x80 {
            prefix[n] = (rest as u8) | 0x80;
            rest >>= 7;
            n += 1;
        }
        prefix[n] = rest as u8;
        out[at] = prefix[0];
        out.splice(at + 1..at + 1, prefix[1..=n].iter().copied());
    }
}

/// Reusable buffers of [`strip_v2`].
#[derive(Default)]
pub struct StripScratch {
    series: Vec<u8>,
    inner: Vec<u8>,
}

impl StripScratch {
    /// Bytes its buffers hold between requests.
    pub fn retained_bytes(&self) -> usize {
        self.series.capacity() + self.inner.capacity()
    }
}

/// Writes `v1` (the mapped request) into `out` as plain 1.0: without the samples' and
/// native histograms' start timestamps, which 1.0 has no field for.
pub fn strip_v2(
    v1: &[u8],
    out: &mut Vec<u8>,
    scratch: &mut StripScratch,
) -> Result<(), DecodeError> {
    out.clear();
    let mut r = Reader::new(v1, 0, v1.len());
    while !r.is_done() {
        let from = r.pos();
        let (field, wire) = r.key()?;
        if field != 1 || wire != WIRE_LEN {
            r.skip(wire)?;
            out.extend_from_slice(&v1[from..r.pos()]);
            continue;
        }
        let (s, e) = r.len_delimited()?;
        scratch.series.clear();
        let mut sr = Reader::new(v1, s, e);
        while !sr.is_done() {
            let f_from = sr.pos();
            let (f, w) = sr.key()?;
            let drop = match (f, w) {
                (2, WIRE_LEN) => 3,
                (4, WIRE_LEN) => super::histogram::START_TIMESTAMP_FIELD,
                _ => 0,
            };
            if drop == 0 {
                sr.skip(w)?;
                scratch.series.extend_from_slice(&v1[f_from..sr.pos()]);
                continue;
            }
            let (is, ie) = sr.len_delimited()?;
            scratch.inner.clear();
            copy_without(v1, is, ie, drop, &mut scratch.inner)?;
            put_bytes_field(&mut scratch.series, f, &scratch.inner);
        }
        put_bytes_field(out, 1, &scratch.series);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::encode::{SeriesWriter, write_metadata};
    use crate::wire::proto::prometheus as pb;
    use crate::wire::proto::write_v2 as v2;
    use prost::Message;

    #[test]
    fn labels_with_a_two_byte_key_reach_the_2_0_body() {
        // Field 1, wire type 2, written as the (valid) two-byte varint 0x8a 0x00: the
        // decoder reads such a series as canonical and forwards its bytes as they are.
        let label = |n: &str, v: &str| {
            let mut l = Vec::new();
            crate::wire::pb::put_bytes_field(&mut l, 1, n.as_bytes());
            crate::wire::pb::put_bytes_field(&mut l, 2, v.as_bytes());
            let mut out = vec![0x8a, 0x00, l.len() as u8];
            out.extend_from_slice(&l);
            out
        };
        let mut series = label("__name__", "up");
        series.extend(label("job", "j"));
        let sample = pb::Sample {
            value: 1.0,
            timestamp: 5,
        };
        crate::wire::pb::put_bytes_field(&mut series, 2, &sample.encode_to_vec());
        let mut v1 = Vec::new();
        crate::wire::pb::put_bytes_field(&mut v1, 1, &series);
        let mut out = Vec::new();
        V2Encoder::new().encode(&v1, None, &mut out).unwrap();
        let req = v2::Request::decode(&out[..]).unwrap();
        let names: Vec<(&str, &str)> = req.timeseries[0]
            .labels_refs
            .chunks(2)
            .map(|p| {
                (
                    req.symbols[p[0] as usize].as_str(),
                    req.symbols[p[1] as usize].as_str(),
                )
            })
            .collect();
        assert_eq!(names, [("__name__", "up"), ("job", "j")]);
        assert_eq!(req.timeseries[0].samples.len(), 1);
    }

    #[test]
    fn packed_references_encode_as_prost_does_at_every_length() {
        // Lengths of 0, 1 and 2+ bytes; references of 1, 2 and 3+ bytes.
        for values in [
            vec![],
            vec![1u32, 2, 3],
            (0..200).collect::<Vec<u32>>(),
            vec![0x3fff, 0x4000, u32::MAX, 127, 128],
            (0..5000).map(|i| i * 37).collect(),
        ] {
            let mut ours = Vec::new();
            put_packed(&mut ours, 1, &values);
            let theirs = v2::TimeSeries {
                labels_refs: values.clone(),
                ..Default::default()
            }
            .encode_to_vec();
            assert_eq!(ours, theirs, "{} values", values.len());
        }
    }

    #[test]
    fn a_label_s_packed_references_are_the_two_varints() {
        let edges = [
            0u32,
            1,
            127,
            128,
            300,
            0x3fff,
            0x4000,
            (1 << 21) - 1,
            1 << 21,
            (1 << 28) - 1,
            1 << 28,
            u32::MAX,
        ];
        for &a in &edges {
            for &b in &edges {
                let mut want = Vec::new();
                crate::wire::pb::put_varint(&mut want, a.into());
                crate::wire::pb::put_varint(&mut want, b.into());
                let (packed, len) = fast::pack_refs(a, b);
                assert_eq!(&packed[..usize::from(len)], &want[..], "{a} {b}");
                assert!(packed[usize::from(len)..].iter().all(|&x| x == 0));
            }
        }
    }

    /// A mapped body: `n` series, each with its own label value, one sample with a start
    /// timestamp, and one metadata entry.
    fn mapped(n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        for i in 0..n {
            let mut w = SeriesWriter::new(&mut scratch);
            w.label(b"__name__", b"requests_total");
            w.label(b"id", i.to_string().as_bytes());
            w.sample_view(&crate::wire::decode::SampleView {
                value_bits: (i as f64).to_bits(),
                timestamp: 1000 + i as i64,
                start_timestamp: 7,
            });
            w.finish(&mut out);
        }
        write_metadata(&mut out, 1, b"requests", b"Requests.", b"");
        out
    }

    /// A body without metadata entries encodes the same with the look for them
    /// skipped; series still get their family's metadata from the memory.
    #[test]
    fn a_metadata_free_body_encodes_the_same_without_the_look_for_metadata() {
        let series_only = crate::wire::pb::series_fields_of(&mapped(300));
        let mut memory = MetadataMemory::default();
        memory.store(b"requests", 1, b"Requests.", b"");
        let (mut scanned, mut skipped) = (Vec::new(), Vec::new());
        let mut enc = V2Encoder::new();
        enc.encode(&series_only, Some(&memory), &mut scanned)
            .unwrap();
        enc.encode_metadata_free(&series_only, Some(&memory), &mut skipped)
            .unwrap();
        assert_eq!(scanned, skipped);
        let request = v2::Request::decode(&skipped[..]).unwrap();
        assert_eq!(request.timeseries.len(), 300);
        let help = request.timeseries[0].metadata.as_ref().unwrap().help_ref;
        assert_eq!(request.symbols[help as usize], "Requests.");
    }

    #[test]
    fn symbols_table_grows_and_deduplicates() {
        let body = mapped(3000);
        let mut enc = V2Encoder::new();
        let mut out = Vec::new();
        let w = enc.encode(&body, None, &mut out).unwrap();
        assert_eq!(w.series, 3000);
        let req = v2::Request::decode(out.as_slice()).unwrap();
        // "", "__name__", "requests_total", "id", 3000 ids, "Requests.".
        assert_eq!(req.symbols.len(), 3000 + 5);
        assert_eq!(req.symbols[0], "");
        for (i, ts) in req.timeseries.iter().enumerate() {
            let labels: Vec<&str> = ts
                .labels_refs
                .iter()
                .map(|&r| req.symbols[r as usize].as_str())
                .collect();
            assert_eq!(labels, ["__name__", "requests_total", "id", &i.to_string()]);
            assert_eq!(ts.samples[0].start_timestamp, 7);
            // `requests_total` is the COUNTER family `requests`.
            let md = ts.metadata.unwrap();
            assert_eq!(md.r#type, 1);
            assert_eq!(req.symbols[md.help_ref as usize], "Requests.");
        }
        // Warm: the same again gives the same bytes.
        let first = out.clone();
        enc.encode(&body, None, &mut out).unwrap();
        assert_eq!(out, first);
    }

    /// The one-pass encoder's rare shapes: a series over 127 bytes (its length takes two
    /// bytes, the body moved along), references over 127 bytes (32 labels of two-byte
    /// symbols), a 33rd label (the general encoder), each between ordinary series that
    /// share labels with it, read back through prost.
    #[test]
    fn long_series_long_references_and_many_labels_read_back_the_same() {
        let mut request = pb::WriteRequest::default();
        let series = |labels: Vec<(String, String)>, samples: usize| pb::TimeSeries {
            labels: labels
                .into_iter()
                .map(|(name, value)| pb::Label { name, value })
                .collect(),
            samples: (0..samples)
                .map(|i| pb::Sample {
                    value: i as f64 + 0.5,
                    timestamp: 1_700_000_000_000 + i as i64,
                })
                .collect(),
            ..Default::default()
        };
        // 16,400 symbols first, so that later ones take three bytes: 32 labels' references
        // take more than 127 bytes then.
        for i in 0..8200 {
            let labels = vec![
                ("__name__".into(), format!("m{i}")),
                ("v".into(), format!("x{i}")),
            ];
            request.timeseries.push(series(labels, 1));
        }
        let wide = |n: usize, tag: &str| -> Vec<(String, String)> {
            let mut l = vec![("__name__".to_string(), "wide".to_string())];
            l.extend((1..n).map(|i| (format!("l{i:02}"), format!("{tag}{i}"))));
            l
        };
        for (n, samples) in [
            (32, 1),
            (32, 1),
            (33, 1),
            (33, 1),
            (32, 1),
            (3, 12),
            (3, 12),
            (32, 9),
        ] {
            request.timeseries.push(series(wide(n, "a"), samples));
            request.timeseries.push(series(wide(n, "b"), samples));
        }
        let body = request.encode_to_vec();
        let mut encoder = V2Encoder::new();
        let mut out = Vec::new();
        for _ in 0..2 {
            encoder.encode(&body, None, &mut out).unwrap();
            let got = v2::Request::decode(out.as_slice()).unwrap();
            assert_eq!(got.timeseries.len(), request.timeseries.len());
            for (want, have) in request.timeseries.iter().zip(&got.timeseries) {
                let labels: Vec<(&str, &str)> = have
                    .labels_refs
                    .chunks(2)
                    .map(|p| {
                        (
                            got.symbols[p[0] as usize].as_str(),
                            got.symbols[p[1] as usize].as_str(),
                        )
                    })
                    .collect();
                let wanted: Vec<(&str, &str)> = want
                    .labels
                    .iter()
                    .map(|l| (l.name.as_str(), l.value.as_str()))
                    .collect();
                assert_eq!(labels, wanted);
                let samples: Vec<(f64, i64)> = have
                    .samples
                    .iter()
                    .map(|s| (s.value, s.timestamp))
                    .collect();
                let wanted: Vec<(f64, i64)> = want
                    .samples
                    .iter()
                    .map(|s| (s.value, s.timestamp))
                    .collect();
                assert_eq!(samples, wanted);
            }
        }
        // The shapes this test is for did occur: a one-pass series of 32 labels whose
        // references take 128 bytes or more, and one whose length takes two bytes.
        let got = v2::Request::decode(out.as_slice()).unwrap();
        let refs_len = |t: &v2::TimeSeries| -> usize {
            t.labels_refs.iter().map(|&r| varint_len(r.into())).sum()
        };
        assert!(
            got.timeseries
                .iter()
                .any(|t| t.labels_refs.len() == 64 && refs_len(t) >= 128)
        );
        assert!(
            got.timeseries
                .iter()
                .any(|t| t.encoded_len() >= 128 && t.labels_refs.len() == 6)
        );
    }

    #[test]
    fn strip_removes_start_timestamps_only() {
        let body = mapped(2);
        let mut out = Vec::new();
        strip_v2(&body, &mut out, &mut StripScratch::default()).unwrap();
        let req = pb::WriteRequest::decode(out.as_slice()).unwrap();
        assert_eq!(req.encode_to_vec(), out, "nothing unknown to 1.0 is left");
        assert_eq!(req.timeseries.len(), 2);
        assert_eq!(req.timeseries[1].samples[0].timestamp, 1001);
        assert_eq!(req.metadata.len(), 1);
    }

    #[test]
    fn metadata_is_remembered_only_when_new() {
        let body = mapped(1);
        let mut enc = V2Encoder::new();
        let mut out = Vec::new();
        let mut memory = MetadataMemory::default();
        enc.encode(&body, Some(&memory), &mut out).unwrap();
        assert!(enc.metadata_news(&body, &memory));
        enc.remember_metadata(&body, &mut memory);
        assert_eq!(memory.len(), 1);
        assert!(!enc.metadata_news(&body, &memory));
        // A later request without metadata gets it from memory.
        let mut scratch = Vec::new();
        let mut plain = Vec::new();
        let mut w = SeriesWriter::new(&mut scratch);
        w.label(b"__name__", b"requests_total");
        w.sample(0, 1);
        w.finish(&mut plain);
        enc.encode(&plain, Some(&memory), &mut out).unwrap();
        let req = v2::Request::decode(out.as_slice()).unwrap();
        let md = req.timeseries[0].metadata.unwrap();
        assert_eq!(req.symbols[md.help_ref as usize], "Requests.");
    }

    #[test]
    fn metadata_memory_is_bounded_in_bytes() {
        // Families with 60 KiB help texts: the byte bound, not the count, stops them.
        let help = "h".repeat(60 << 10);
        let mut memory = MetadataMemory::default();
        let mut enc = V2Encoder::new();
        let mut out = Vec::new();
        let per_request = 16;
        let requests = MetadataMemory::BYTES / (per_request * help.len()) + 4;
        for r in 0..requests {
            let body = pb::WriteRequest {
                metadata: (0..per_request)
                    .map(|i| pb::MetricMetadata {
                        r#type: 2,
                        metric_family_name: format!("family_{r}_{i}"),
                        help: help.clone(),
                        unit: String::new(),
                    })
                    .collect(),
                ..Default::default()
            }
            .encode_to_vec();
            enc.encode(&body, Some(&memory), &mut out).unwrap();
            enc.remember_metadata(&body, &mut memory);
            assert!(memory.bytes() <= MetadataMemory::BYTES);
        }
        assert!(
            memory.len() < requests * per_request,
            "refused past the bound"
        );
        assert!(memory.bytes() > MetadataMemory::BYTES - per_request * (help.len() + 200));
        // Full: a family it cannot take is no news (no write lock on every request).
        let refused = pb::WriteRequest {
            metadata: vec![pb::MetricMetadata {
                r#type: 2,
                metric_family_name: "family_refused".into(),
                help: help.clone(),
                unit: String::new(),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        enc.encode(&refused, Some(&memory), &mut out).unwrap();
        assert!(!enc.metadata_news(&refused, &memory));
        // A known family is still updated when the update fits (a shorter help).
        let known = pb::WriteRequest {
            metadata: vec![pb::MetricMetadata {
                r#type: 2,
                metric_family_name: "family_0_0".into(),
                help: "Short.".into(),
                unit: String::new(),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let before = memory.bytes();
        enc.encode(&known, Some(&memory), &mut out).unwrap();
        assert!(
            enc.metadata_news(&known, &memory),
            "an update that fits is news"
        );
        enc.remember_metadata(&known, &mut memory);
        assert_eq!(&*memory.get(b"family_0_0").unwrap().help, b"Short.");
        assert_eq!(memory.bytes(), before - help.len() + "Short.".len());
    }

    /// The metadata of the counter `requests` (its series are `requests_total`).
    fn requests_counter_metadata() -> pb::MetricMetadata {
        pb::MetricMetadata {
            r#type: 1,
            metric_family_name: "requests".into(),
            help: "Requests.".into(),
            unit: String::new(),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Series built by small edits of the one before (so that runs of labels equal to
        /// the previous series' are found at every position), some with an exemplar (the
        /// general loop's), read back the same through prost.
        #[test]
        fn series_edited_one_after_another_read_back_the_same(
            ops in proptest::collection::vec((0u8..8, 0usize..8, 0usize..6, 0usize..7), 1..48),
            with_metadata in proptest::bool::ANY,
        ) {
            const NAMES: [&str; 6] = ["__name__", "instance", "job", "le", "pod", "a_label_name_of_forty_bytes_or_so_xxxxxxx"];
            let long_value = "v".repeat(130);
            let values: [&str; 7] = ["requests_total", "x_bucket", "0.5", "+Inf", "10.0.0.1:9000", &long_value, "pod-abcdefghijklmnop-1"];
            let mut labels: Vec<(usize, usize)> = vec![(0, 0), (1, 4), (2, 6)];
            let mut request = pb::WriteRequest::default();
            for (i, &(op, at, name, value)) in ops.iter().enumerate() {
                let at = if labels.is_empty() { 0 } else { at % labels.len() };
                match op {
                    0..=2 if !labels.is_empty() => labels[at].1 = value,
                    3 => labels.insert(at, (name, value)),
                    4 if !labels.is_empty() => {
                        labels.remove(at);
                    }
                    _ => {}
                }
                let mut ts = pb::TimeSeries::default();
                for &(n, v) in &labels {
                    ts.labels.push(pb::Label { name: NAMES[n].into(), value: values[v].into() });
                }
                ts.samples.push(pb::Sample { value: i as f64, timestamp: 1000 + i as i64 });
                if op == 7 {
                    ts.exemplars.push(pb::Exemplar {
                        labels: vec![pb::Label { name: "trace_id".into(), value: "t".into() }],
                        value: 1.0,
                        timestamp: 3,
                    });
                }
                request.timeseries.push(ts);
            }
            if with_metadata {
                request.metadata.push(requests_counter_metadata());
            }
            let body = request.encode_to_vec();
            let mut encoder = V2Encoder::new();
            for _ in 0..2 {
                let mut out = Vec::new();
                encoder.encode(&body, None, &mut out).unwrap();
                let got = v2::Request::decode(out.as_slice()).unwrap();
                proptest::prop_assert_eq!(got.timeseries.len(), request.timeseries.len());
                let sym = |r: u32| got.symbols[r as usize].clone();
                for (want, have) in request.timeseries.iter().zip(&got.timeseries) {
                    let labels: Vec<(String, String)> =
                        have.labels_refs.chunks(2).map(|p| (sym(p[0]), sym(p[1]))).collect();
                    let wanted: Vec<(String, String)> =
                        want.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
                    proptest::prop_assert_eq!(labels, wanted);
                    proptest::prop_assert_eq!(have.samples.len(), 1);
                    proptest::prop_assert_eq!(have.samples[0].timestamp, want.samples[0].timestamp);
                    proptest::prop_assert_eq!(have.exemplars.len(), want.exemplars.len());
                    let is_counter = want.labels.iter().rev().find(|l| l.name == "__name__")
                        .is_some_and(|l| l.value == "requests_total");
                    proptest::prop_assert_eq!(have.metadata.is_some(), with_metadata && is_counter);
                }
            }
        }

        /// Any mapped body (labels of every length, shared or not with the previous
        /// series, samples, exemplars, metadata) comes out of the 2.0 encoder as the same
        /// series, read back by prost.
        #[test]
        fn every_series_reads_back_the_same_through_prost(
            series in proptest::collection::vec(
                (
                    proptest::collection::vec((0usize..6, 0usize..7), 0..8),
                    proptest::collection::vec((proptest::num::f64::ANY, proptest::num::i64::ANY), 0..3),
                    proptest::collection::vec((0usize..6, proptest::num::f64::ANY), 0..2),
                ),
                0..40,
            ),
            with_metadata in proptest::bool::ANY,
        ) {
            const NAMES: [&str; 6] = ["__name__", "job", "le", "a", "instance", "long_label_name_that_runs_past_one_hundred_and_twenty_eight_bytes_so_its_length_takes_two_varint_bytes_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"];
            let long_value = "v".repeat(300);
            let values: [&str; 7] = ["requests_total", "x_bucket", "0.5", "", "10.0.0.1:9000", &long_value, "x"];
            let mut request = pb::WriteRequest::default();
            for (labels, samples, exemplars) in &series {
                let mut ts = pb::TimeSeries::default();
                for &(n, v) in labels {
                    ts.labels.push(pb::Label { name: NAMES[n].into(), value: values[v].into() });
                }
                for &(value, timestamp) in samples {
                    ts.samples.push(pb::Sample { value, timestamp });
                }
                for &(n, value) in exemplars {
                    ts.exemplars.push(pb::Exemplar {
                        labels: vec![pb::Label { name: NAMES[n].into(), value: "trace".into() }],
                        value,
                        timestamp: 3,
                    });
                }
                request.timeseries.push(ts);
            }
            if with_metadata {
                request.metadata.push(requests_counter_metadata());
            }
            let body = request.encode_to_vec();
            // What prost reads back (it writes no -0.0, as proto3 leaves defaults out).
            let request = pb::WriteRequest::decode(body.as_slice()).unwrap();
            let mut out = Vec::new();
            let written = V2Encoder::new().encode(&body, None, &mut out).unwrap();
            proptest::prop_assert_eq!(written.series, series.len());
            let got = v2::Request::decode(out.as_slice()).unwrap();
            proptest::prop_assert_eq!(got.timeseries.len(), request.timeseries.len());
            let sym = |r: u32| got.symbols[r as usize].clone();
            for (want, have) in request.timeseries.iter().zip(&got.timeseries) {
                let labels: Vec<(String, String)> =
                    have.labels_refs.chunks(2).map(|p| (sym(p[0]), sym(p[1]))).collect();
                let wanted: Vec<(String, String)> =
                    want.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
                proptest::prop_assert_eq!(labels, wanted);
                let samples: Vec<(u64, i64)> =
                    have.samples.iter().map(|s| (s.value.to_bits(), s.timestamp)).collect();
                let wanted: Vec<(u64, i64)> =
                    want.samples.iter().map(|s| (s.value.to_bits(), s.timestamp)).collect();
                proptest::prop_assert_eq!(samples, wanted);
                proptest::prop_assert_eq!(have.exemplars.len(), want.exemplars.len());
                for (e, w) in have.exemplars.iter().zip(&want.exemplars) {
                    proptest::prop_assert_eq!(sym(e.labels_refs[0]), w.labels[0].name.clone());
                    proptest::prop_assert_eq!(e.value.to_bits(), w.value.to_bits());
                }
                // The series' name is its last `__name__` (the mapper writes one).
                let is_counter = want.labels.iter().rev().find(|l| l.name == "__name__")
                    .is_some_and(|l| l.value == "requests_total");
                match &have.metadata {
                    Some(md) => {
                        proptest::prop_assert!(with_metadata && is_counter);
                        proptest::prop_assert_eq!(md.r#type, 1);
                        proptest::prop_assert_eq!(sym(md.help_ref), "Requests.");
                    }
                    None => proptest::prop_assert!(!(with_metadata && is_counter)),
                }
            }
        }
    }
}
