//! Decodes an `io.prometheus.write.v2.Request` (remote-write 2.0) into the same borrowed
//! [`DecodedRequest`] view that 1.0 produces, so that mapping, derive and encoding run
//! unchanged: the symbols table is a list of spans into the decompressed buffer and
//! every label reference resolves to one of them, without a `String` per label.
//!
//! What differs from 1.0 in the view: series are never `canonical` (their bytes are 2.0,
//! not a 1.0 `TimeSeries`: one no rule touches is encoded from the view when its labels
//! are `labels_in_order`, else rebuilt); per-series metadata becomes one
//! [`MetadataView`] per family and request (with an empty `raw`), and its type is kept
//! on the series for the metadata `_total` fix; samples carry their start timestamp
//! (rc.4's `Sample.start_timestamp`, or the earlier drafts' per-series
//! `TimeSeries.created_timestamp` for samples without one).

use std::hash::{BuildHasher, Hasher};

use super::DecodeError;
use super::decode::{
    DecodeLimits, DecodedRequest, ExemplarView, HistogramView, LabelSpan, MetadataView, Range32,
    SampleView, Span, check_labels, ensure_room, utf8,
};
use super::pb::{Reader, WIRE_I64, WIRE_LEN, WIRE_VARINT};

/// `MetricMetadata.MetricType` values (1.0 and 2.0 number them alike).
pub const TYPE_COUNTER: u8 = 1;
pub const TYPE_HISTOGRAM: u8 = 3;
pub const TYPE_GAUGEHISTOGRAM: u8 = 4;
pub const TYPE_SUMMARY: u8 = 5;

/// The family a series of `metric_type` belongs to: `name` without the suffix its type
/// gives its series (`_bucket`, `_sum`, `_count` for histograms and summaries).
pub fn family_of(name: &[u8], metric_type: u8) -> &[u8] {
    let suffixes: &[&[u8]] = match metric_type {
        TYPE_HISTOGRAM | TYPE_GAUGEHISTOGRAM => &[b"_bucket", b"_sum", b"_count"],
        TYPE_SUMMARY => &[b"_sum", b"_count"],
        _ => &[],
    };
    for s in suffixes {
        if let Some(f) = name.strip_suffix(*s)
            && !f.is_empty()
        {
            return f;
        }
    }
    name
}

/// Bytes a resolved label takes in a 1.0 body beyond its two strings, at most (field
/// keys and length varints of the label and its two fields).
const LABEL_OVERHEAD: usize = 16;
/// The same for a 1.0 `MetricMetadata` entry beyond its three strings.
const METADATA_OVERHEAD: usize = 24;

/// Metadata fields of one 2.0 series, as read.
#[derive(Clone, Copy, Default)]
struct SeriesMetadata {
    present: bool,
    metric_type: u8,
    help: Span,
    unit: Span,
}

impl DecodedRequest {
    /// Decodes `buf` (a complete 2.0 `Request`) into `self`, replacing its contents.
    pub fn decode_v2(&mut self, buf: &[u8], limits: DecodeLimits) -> Result<(), DecodeError> {
        self.clear();
        self.v2 = true;
        if buf.len() > u32::MAX as usize {
            return Err(DecodeError::TooLarge);
        }
        self.expanded_bytes = buf.len();
        self.view_base = buf.len();
        // Symbols first: fields may come in any order, and series refer to them.
        let mut r = Reader::new(buf, 0, buf.len());
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                4 => {
                    r.expect(wire, WIRE_LEN, "Request.symbols")?;
                    let (s, e) = r.len_delimited()?;
                    utf8(buf, s, e)?;
                    ensure_room!(self.symbols);
                    self.symbols.push(Span::new(s, e));
                }
                // Reserved in 2.0 so that a 1.0 `WriteRequest` is never read as an empty
                // 2.0 request: its series (1) and metadata (3) would be lost silently.
                1..=3 => return Err(DecodeError::ReservedV2Field(field)),
                // The series, read in the second pass: stepped over without `skip`'s
                // dispatch.
                5 if wire == WIRE_LEN => {
                    r.len_delimited()?;
                }
                _ => r.skip(wire)?,
            }
        }
        if let Some(first) = self.symbols.first()
            && !first.is_empty()
        {
            return Err(DecodeError::FirstSymbolNotEmpty);
        }
        self.check_view()?;
        let mut r = Reader::new(buf, 0, buf.len());
        while !r.is_done() {
            let (field, wire) = r.key()?;
            if field == 5 {
                r.expect(wire, WIRE_LEN, "Request.timeseries")?;
                if self.series.len() >= limits.max_series {
                    return Err(DecodeError::TooManySeries(limits.max_series));
                }
                let (s, e) = r.len_delimited()?;
                self.decode_series_v2(buf, s, e, &limits)?;
                self.check_view()?;
            } else {
                r.skip(wire)?;
            }
        }
        Ok(())
    }

    #[inline]
    fn symbol(&self, r: u32) -> Result<Span, DecodeError> {
        self.symbols
            .get(r as usize)
            .copied()
            .ok_or(DecodeError::SymbolRef {
                index: r.into(),
                symbols: self.symbols.len(),
            })
    }

    /// Reads a `repeated uint32 *_refs` field (packed or not) onto `self.refs`.
    fn read_refs(&mut self, buf: &[u8], r: &mut Reader<'_>, wire: u8) -> Result<(), DecodeError> {
        let push = |refs: &mut Vec<u32>, v: u64, n: usize| {
            refs.push(symbol_ref(v, n)?);
            Ok::<(), DecodeError>(())
        };
        let n = self.symbols.len();
        match wire {
            WIRE_LEN => {
                let (s, e) = r.len_delimited()?;
                let mut p = Reader::new(buf, s, e);
                while !p.is_done() {
                    push(&mut self.refs, p.varint()?, n)?;
                }
                Ok(())
            }
            WIRE_VARINT => push(&mut self.refs, r.varint()?, n),
            w => Err(DecodeError::UnexpectedWireType("labels_refs", w)),
        }
    }

    /// Resolves `self.refs` (name, value pairs) onto `self.labels`.
    fn push_ref_labels(
        &mut self,
        buf: &[u8],
        limits: Option<&DecodeLimits>,
    ) -> Result<(), DecodeError> {
        if self.refs.len() % 2 != 0 {
            return Err(DecodeError::OddLabelRefs(self.refs.len()));
        }
        if let Some(l) = limits
            && self.refs.len() / 2 > l.max_labels_per_series
        {
            return Err(DecodeError::TooManyLabels(l.max_labels_per_series));
        }
        for i in (0..self.refs.len()).step_by(2) {
            self.push_label_ref(buf, self.refs[i], self.refs[i + 1], limits)?;
        }
        Ok(())
    }

    /// Resolves one (name, value) pair of references onto `self.labels`.
    #[inline(always)]
    fn push_label_ref(
        &mut self,
        buf: &[u8],
        name_ref: u32,
        value_ref: u32,
        limits: Option<&DecodeLimits>,
    ) -> Result<(), DecodeError> {
        let name = self.symbol(name_ref)?;
        let value = self.symbol(value_ref)?;
        if let Some(l) = limits {
            let len = (value.end - value.start) as usize;
            if len > l.max_label_value_bytes {
                return Err(DecodeError::LabelValueTooLong {
                    name: String::from_utf8_lossy(name.bytes(buf)).into_owned(),
                    len,
                    limit: l.max_label_value_bytes,
                });
            }
        }
        ensure_room!(self.labels);
        self.labels.push(LabelSpan { name, value });
        // A 1.0 `Label`: two tagged, length-prefixed strings in a tagged message.
        self.expanded_bytes = self
            .expanded_bytes
            .saturating_add(name.len() + value.len() + LABEL_OVERHEAD);
        Ok(())
    }

    /// The label references of a series packed in one field, as every 2.0 sender writes
    /// them: resolved pair by pair without going through `self.refs`. An odd reference
    /// left at the end goes to `self.refs`, where a later refs field may complete it.
    fn push_packed_label_refs(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> Result<(), DecodeError> {
        let first = self.labels.len();
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let name = symbol_ref(r.varint()?, self.symbols.len())?;
            if r.is_done() {
                self.refs.push(name);
                break;
            }
            let value = symbol_ref(r.varint()?, self.symbols.len())?;
            if self.labels.len() - first >= limits.max_labels_per_series {
                return Err(DecodeError::TooManyLabels(limits.max_labels_per_series));
            }
            self.push_label_ref(buf, name, value, Some(limits))?;
        }
        Ok(())
    }

    /// Refuses the request once its labels spelled out pass the limit: counted as
    /// references resolve, before anything is rebuilt from them.
    fn check_expanded(&self, limits: &DecodeLimits) -> Result<(), DecodeError> {
        if self.expanded_bytes > limits.max_expanded_bytes {
            return Err(DecodeError::ExpandedTooLarge {
                limit: limits.max_expanded_bytes,
            });
        }
        Ok(())
    }

    fn decode_series_v2(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> Result<(), DecodeError> {
        if self.decode_series_v2_fast(buf, start, end, limits)? {
            return Ok(());
        }
        let labels_start = self.labels.len() as u32;
        let samples_start = self.samples.len() as u32;
        let exemplars_start = self.exemplars.len() as u32;
        let hist_start = self.histograms.len() as u32;
        let mut has_exemplars = false;
        let mut created = 0i64;
        let mut md = SeriesMetadata::default();
        self.refs.clear();
        let mut r = Reader::new(buf, start, end);
        // Every sender writes the label references first, packed (key 0x0a).
        if r.eat(0x0a) {
            let (s, e) = r.len_delimited()?;
            self.push_packed_label_refs(buf, s, e, limits)?;
        }
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => self.read_refs(buf, &mut r, wire)?,
                2 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.samples")?;
                    let (s, e) = r.len_delimited()?;
                    let smp = decode_sample_v2(buf, s, e)?;
                    self.has_start_timestamps |= smp.start_timestamp != 0;
                    ensure_room!(self.samples);
                    self.samples.push(smp);
                }
                3 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.histograms")?;
                    let (s, e) = r.len_delimited()?;
                    let (timestamp, start_field, schema) = decode_histogram_v2(buf, s, e)?;
                    // Its bytes are forwarded: a start timestamp field, even 0, must be
                    // cut out for 1.0 backends.
                    self.has_start_timestamps |= start_field;
                    self.has_nhcb |= schema == super::histogram::CUSTOM_BUCKETS_SCHEMA;
                    ensure_room!(self.histograms);
                    self.histograms.push(HistogramView {
                        raw: Span::new(s, e),
                        timestamp,
                        foreign_field_17: false,
                    });
                }
                4 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.exemplars")?;
                    r.len_delimited()?;
                    has_exemplars = true;
                }
                5 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.metadata")?;
                    let (s, e) = r.len_delimited()?;
                    md = self.decode_series_metadata(buf, s, e)?;
                }
                6 => {
                    r.expect(wire, WIRE_VARINT, "TimeSeries.created_timestamp")?;
                    created = r.varint()? as i64;
                }
                _ => r.skip(wire)?,
            }
        }
        let resolved = self.labels.len() - labels_start as usize;
        if self.refs.len() % 2 != 0 {
            return Err(DecodeError::OddLabelRefs(2 * resolved + self.refs.len()));
        }
        if resolved + self.refs.len() / 2 > limits.max_labels_per_series {
            return Err(DecodeError::TooManyLabels(limits.max_labels_per_series));
        }
        self.push_ref_labels(buf, Some(limits))?;
        self.check_expanded(limits)?;
        let labels = Range32 {
            start: labels_start,
            end: self.labels.len() as u32,
        };
        let (name, in_order) = self.check_labels_v2(buf, labels)?;
        let samples = Range32 {
            start: samples_start,
            end: self.samples.len() as u32,
        };
        if created != 0 {
            for smp in &mut self.samples[samples.usize()] {
                if smp.start_timestamp == 0 {
                    smp.start_timestamp = created;
                    self.has_start_timestamps = true;
                }
            }
        }
        if has_exemplars {
            self.decode_exemplars(buf, start, end, 4, Self::decode_exemplar_v2)?;
        }
        if md.present {
            self.add_series_metadata(buf, name, &md);
        }
        self.check_expanded(limits)?;
        self.push_series(
            Span::new(start, end),
            labels,
            (samples_start, exemplars_start, hist_start),
            name,
            false,
            md.metric_type,
        );
        if let Some(s) = self.series.last_mut() {
            s.labels_in_order = in_order;
        }
        Ok(())
    }

    /// The shape every 2.0 sender writes, decoded in one pass with no field dispatch:
    /// the label references packed in one field (key 0x0a), each under 16,384, then
    /// samples in the usual shape (key 0x12, under 128 bytes, no start timestamp), then
    /// at most the metadata (key 0x2a), nothing else. `Ok(false)` with nothing recorded
    /// for anything else or anything wrong: the general decoder then takes the series,
    /// with its errors. The one error returned is the general path's own at the same
    /// point: the request's metadata pushing its spelled-out size past the limit.
    #[inline]
    fn decode_series_v2_fast(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> Result<bool, DecodeError> {
        #[cfg(test)]
        if self.general_only {
            return Ok(false);
        }
        let (labels_at, samples_at) = (self.labels.len(), self.samples.len());
        let expanded_at = self.expanded_bytes;
        let Some((md, in_order, name, samples_raw)) =
            self.series_v2_fast_parts(buf, start, end, limits)
        else {
            self.labels.truncate(labels_at);
            self.samples.truncate(samples_at);
            self.expanded_bytes = expanded_at;
            return Ok(false);
        };
        if md.present {
            self.add_series_metadata(buf, name, &md);
            self.check_expanded(limits)?;
        }
        self.push_series_from(
            Span::new(start, end),
            (labels_at, samples_at),
            name,
            false,
            md.metric_type,
        );
        if let Some(s) = self.series.last_mut() {
            s.labels_in_order = in_order;
            s.samples_raw = samples_raw;
        }
        Ok(true)
    }

    /// [`Self::decode_series_v2_fast`]'s labels, samples and checks: the series'
    /// metadata, whether its labels are in order, its `__name__` value; `None` (the
    /// caller undoes what was pushed) where the general path must look.
    #[inline(always)]
    fn series_v2_fast_parts(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> Option<(SeriesMetadata, bool, Span, Span)> {
        let msg = buf.get(start..end)?;
        let (refs_at, refs_end) = short_field(msg, 0, 0x0a)?;
        let refs = &msg[refs_at..refs_end];
        // A reference takes at most two bytes here: more than this many bytes are more
        // labels than allowed (the general path says so), and bound what is pushed.
        if refs.len() / 4 > limits.max_labels_per_series {
            return None;
        }
        let labels_at = self.labels.len();
        // Three plain loops (resolve, compare, sum) rather than one that keeps every
        // running value at once: the resolving loop then keeps its values in registers.
        let symbols = &self.symbols[..];
        let labels = &mut self.labels;
        labels.reserve(refs.len() / 2);
        let mut p = 0;
        while p < refs.len() {
            let (name_ref, q) = short_ref(refs, p)?;
            let (value_ref, q) = short_ref(refs, q)?;
            p = q;
            labels.push(LabelSpan {
                name: *symbols.get(name_ref)?,
                value: *symbols.get(value_ref)?,
            });
        }
        let new = &self.labels[labels_at..];
        if new.len() > limits.max_labels_per_series {
            return None;
        }
        // The names are the last sorted series': `check_labels_v2`'s first branch, done
        // here with the empty-value test folded into the sum below (calling it instead,
        // inlined: 4,107 against 4,064 instructions per sample).
        let same_names = !self.sorted_names.is_empty()
            && new.len() == self.sorted_names.len()
            && new
                .iter()
                .zip(&self.sorted_names)
                .all(|(l, n)| l.name == *n);
        let (mut spelled, mut longest, mut no_empty_value) = (0usize, 0u32, true);
        for l in new {
            // A 1.0 `Label`: two tagged, length-prefixed strings in a tagged message.
            // Symbols are spans with `start <= end`.
            let value_len = l.value.end - l.value.start;
            spelled += (l.name.end - l.name.start) as usize + value_len as usize + LABEL_OVERHEAD;
            longest = longest.max(value_len);
            no_empty_value &= value_len != 0;
        }
        if longest as usize > limits.max_label_value_bytes {
            return None;
        }
        self.expanded_bytes = self.expanded_bytes.saturating_add(spelled);
        if self.expanded_bytes > limits.max_expanded_bytes {
            return None;
        }
        let mut p = refs_end;
        let samples_at = p;
        if !self.room_for_usual_samples(msg.len().saturating_sub(p)) {
            return None;
        }
        while msg.get(p) == Some(&0x12) {
            let len = *msg.get(p + 1)? as usize;
            if len >= 0x80 || p + 2 + len > msg.len() {
                return None;
            }
            let at = start + p + 2;
            self.samples
                .push(super::decode::sample_in_usual_shape(buf, at, at + len)?);
            p += 2 + len;
        }
        let samples_raw = Span::new(start + samples_at, start + p);
        let mut md = SeriesMetadata::default();
        if msg.get(p) == Some(&0x2a) {
            let (s, e) = short_field(msg, p, 0x2a)?;
            md = self
                .decode_series_metadata(buf, start + s, start + e)
                .ok()?;
            p = e;
        }
        if p != msg.len() {
            return None;
        }
        if same_names {
            // What `check_labels_v2` checks of such a series, read on the way.
            let name = self.labels[labels_at + self.sorted_name_at].value;
            return (!name.is_empty()).then_some((md, no_empty_value, name, samples_raw));
        }
        let labels = Range32 {
            start: labels_at as u32,
            end: self.labels.len() as u32,
        };
        let (name, in_order) = self.check_labels_v2(buf, labels).ok()?;
        Some((md, in_order, name, samples_raw))
    }

    /// [`check_labels`], or, for a series whose label names are the previous sorted
    /// series' (the same symbols: one family, one target, in the sender's order), only
    /// what can differ: empty values and the `__name__` value.
    fn check_labels_v2(
        &mut self,
        buf: &[u8],
        labels: Range32,
    ) -> Result<(Span, bool), DecodeError> {
        let ls = &mut self.labels[labels.usize()];
        if !self.sorted_names.is_empty()
            && ls.len() == self.sorted_names.len()
            && ls.iter().zip(&self.sorted_names).all(|(l, n)| l.name == *n)
        {
            let name = ls[self.sorted_name_at].value;
            if name.is_empty() {
                return Err(DecodeError::MissingMetricName);
            }
            return Ok((name, ls.iter().all(|l| !l.value.is_empty())));
        }
        let (name, in_order) = check_labels(buf, ls)?;
        self.sorted_names.clear();
        if in_order
            && let Some(at) = ls
                .iter()
                .position(|l| super::decode::is_metric_name(l.name.bytes(buf)))
        {
            self.sorted_names.extend(ls.iter().map(|l| l.name));
            self.sorted_name_at = at;
        }
        Ok((name, in_order))
    }

    fn decode_series_metadata(
        &self,
        buf: &[u8],
        start: usize,
        end: usize,
    ) -> Result<SeriesMetadata, DecodeError> {
        let mut md = SeriesMetadata::default();
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => {
                    r.expect(wire, WIRE_VARINT, "Metadata.type")?;
                    // Unknown types (beyond STATESET) are kept as "unknown".
                    md.metric_type = u8::try_from(r.varint()?).unwrap_or(0);
                }
                3 | 4 => {
                    r.expect(wire, WIRE_VARINT, "Metadata refs")?;
                    let v = r.varint()?;
                    let idx = u32::try_from(v).map_err(|_| DecodeError::SymbolRef {
                        index: v,
                        symbols: self.symbols.len(),
                    })?;
                    let span = self.symbol(idx)?;
                    if field == 3 {
                        md.help = span;
                    } else {
                        md.unit = span;
                    }
                }
                _ => r.skip(wire)?,
            }
        }
        md.present = md.metric_type != 0 || !md.help.is_empty() || !md.unit.is_empty();
        Ok(md)
    }

    /// One [`MetadataView`] per family and request: series of one family repeat it.
    fn add_series_metadata(&mut self, buf: &[u8], name: Span, md: &SeriesMetadata) {
        // The series before, of the same name symbol and type: the same family, whose
        // view is recorded.
        if self.md_last == (name, md.metric_type) {
            return;
        }
        self.md_last = (name, md.metric_type);
        let name_bytes = name.bytes(buf);
        let family = family_of(name_bytes, md.metric_type);
        let family_span = Span {
            start: name.start,
            end: name.start + family.len() as u32,
        };
        let mut h = self.md_hasher.build_hasher();
        h.write(family);
        let key = h.finish();
        if let Some(&i) = self.md_index.get(&key)
            && self
                .metadata
                .get(i as usize)
                .is_some_and(|m| m.family.bytes(buf) == family)
        {
            return;
        }
        self.md_index.insert(key, self.metadata.len() as u32);
        self.expanded_bytes = self
            .expanded_bytes
            .saturating_add(family.len() + md.help.len() + md.unit.len() + METADATA_OVERHEAD);
        self.metadata.push(MetadataView {
            raw: Span::default(),
            metric_type: i32::from(md.metric_type),
            family: family_span,
            help: md.help,
            unit: md.unit,
        });
    }

    fn decode_exemplar_v2(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
    ) -> Result<ExemplarView, DecodeError> {
        let labels_start = self.labels.len() as u32;
        let mut value_bits = 0u64;
        let mut timestamp = 0i64;
        self.refs.clear();
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => self.read_refs(buf, &mut r, wire)?,
                2 => {
                    r.expect(wire, WIRE_I64, "Exemplar.value")?;
                    value_bits = r.fixed64()?;
                }
                3 => {
                    r.expect(wire, WIRE_VARINT, "Exemplar.timestamp")?;
                    timestamp = r.varint()? as i64;
                }
                _ => r.skip(wire)?,
            }
        }
        self.push_ref_labels(buf, None)?;
        Ok(ExemplarView {
            labels: Range32 {
                start: labels_start,
                end: self.labels.len() as u32,
            },
            value_bits,
            timestamp,
        })
    }
}

/// A 2.0 `Sample`: value, timestamp and start timestamp.
#[inline]
fn decode_sample_v2(buf: &[u8], start: usize, end: usize) -> Result<SampleView, DecodeError> {
    let mut smp = SampleView {
        value_bits: 0,
        timestamp: 0,
        start_timestamp: 0,
    };
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match field {
            1 => {
                r.expect(wire, WIRE_I64, "Sample.value")?;
                smp.value_bits = r.fixed64()?;
            }
            2 => {
                r.expect(wire, WIRE_VARINT, "Sample.timestamp")?;
                smp.timestamp = r.varint()? as i64;
            }
            3 => {
                r.expect(wire, WIRE_VARINT, "Sample.start_timestamp")?;
                smp.start_timestamp = r.varint()? as i64;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(smp)
}

/// Walks a 2.0 native histogram, checking every known field's wire type and packed
/// contents (its bytes are forwarded, so they must be what a receiver can decode); returns
/// its timestamp, whether it has a `start_timestamp` field (17, whatever its value), and
/// its schema. Its bytes are a valid 1.0 `Histogram` (same field numbers; a 1.0 receiver
/// skips field 17, which promnorm removes for 1.0 backends).
fn decode_histogram_v2(
    buf: &[u8],
    start: usize,
    end: usize,
) -> Result<(i64, bool, i32), DecodeError> {
    let mut timestamp = 0i64;
    let mut start_field = false;
    let mut schema = 0i32;
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match field {
            15 => {
                r.expect(wire, WIRE_VARINT, "Histogram.timestamp")?;
                timestamp = r.varint()? as i64;
            }
            super::histogram::START_TIMESTAMP_FIELD => {
                r.expect(wire, WIRE_VARINT, "Histogram.start_timestamp")?;
                r.varint()?;
                start_field = true;
            }
            4 => {
                r.expect(wire, WIRE_VARINT, "Histogram.schema")?;
                let v = r.varint()?;
                schema = ((v >> 1) as i64 ^ -((v & 1) as i64)) as i32;
            }
            // Bucket spans: messages of two varints.
            8 | 11 => {
                r.expect(wire, WIRE_LEN, "Histogram spans")?;
                let (s, e) = r.len_delimited()?;
                let mut sr = Reader::new(buf, s, e);
                while !sr.is_done() {
                    let (f, w) = sr.key()?;
                    if f == 1 || f == 2 {
                        sr.expect(w, WIRE_VARINT, "BucketSpan")?;
                    }
                    sr.skip(w)?;
                }
            }
            // Deltas: packed (or single) varints.
            9 | 12 if wire == WIRE_LEN => {
                let (s, e) = r.len_delimited()?;
                let mut pr = Reader::new(buf, s, e);
                while !pr.is_done() {
                    pr.varint()?;
                }
            }
            // Counts and custom values: packed (or single) doubles.
            10 | 13 | 16 if wire == WIRE_LEN => {
                let (s, e) = r.len_delimited()?;
                if (e - s) % 8 != 0 {
                    return Err(DecodeError::Truncated);
                }
            }
            f @ 1..=16 => {
                let want = match f {
                    1 | 4 | 6 | 9 | 12 | 14 => WIRE_VARINT,
                    _ => WIRE_I64,
                };
                r.expect(wire, want, "Histogram field")?;
                r.skip(wire)?;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok((timestamp, start_field, schema))
}

/// A length-delimited field with key `key` at `msg[p..]` whose length takes one or two
/// bytes: the (start, end) of its contents in `msg`.
#[inline(always)]
fn short_field(msg: &[u8], p: usize, key: u8) -> Option<(usize, usize)> {
    if *msg.get(p)? != key {
        return None;
    }
    let (len, at) = short_ref(msg, p + 1)?;
    let end = at.checked_add(len)?;
    (end <= msg.len()).then_some((at, end))
}

/// A varint of one or two bytes at `msg[p..]` (a symbol reference under 16,384, a
/// length under 16 KiB): its value and the position after it.
#[inline(always)]
fn short_ref(msg: &[u8], p: usize) -> Option<(usize, usize)> {
    let b = *msg.get(p)?;
    if b < 0x80 {
        return Some((usize::from(b), p + 1));
    }
    let c = *msg.get(p + 1)?;
    (c < 0x80).then_some((usize::from(b & 0x7f) | (usize::from(c) << 7), p + 2))
}

/// A label reference as read (a varint), as an index: past `u32` it can name no symbol.
fn symbol_ref(v: u64, symbols: usize) -> Result<u32, DecodeError> {
    u32::try_from(v).map_err(|_| DecodeError::SymbolRef { index: v, symbols })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::write_v2 as v2;
    use prost::Message;

    /// `series` series of `labels` labels each (short names and values, few symbols:
    /// about three bytes a label on the wire, 16 in the view) and one sample.
    fn many_labels(series: usize, labels: usize) -> Vec<u8> {
        let mut symbols: Vec<String> = vec!["".into(), "__name__".into(), "m".into()];
        let base = symbols.len() as u32;
        for l in 0..labels {
            symbols.push(format!("l{l}"));
        }
        for v in 0..100 {
            symbols.push(format!("{v}"));
        }
        let values = base + labels as u32;
        let timeseries = (0..series)
            .map(|i| {
                let mut refs = vec![1, 2];
                for l in 0..labels as u32 {
                    refs.push(base + l);
                    refs.push(values + (i as u32 + l) % 100);
                }
                v2::TimeSeries {
                    labels_refs: refs,
                    samples: vec![v2::Sample {
                        value: 1.0,
                        timestamp: 1_700_000_000_000 + i as i64,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect();
        v2::Request {
            symbols,
            timeseries,
        }
        .encode_to_vec()
    }

    /// Large 2.0 requests of many short labels take several times their size as a view
    /// (references are small): they decode, on a fresh decoder and a warm one alike.
    #[test]
    fn large_requests_of_many_short_labels_fit_their_view() {
        for (series, labels) in [(20_000, 15), (20_000, 10), (50_000, 8)] {
            let body = many_labels(series, labels);
            for warm in [false, true] {
                let mut d = DecodedRequest::default();
                if warm {
                    d.decode_v2(&many_labels(100, 3), DecodeLimits::default())
                        .unwrap();
                }
                d.decode_v2(&body, DecodeLimits::default())
                    .unwrap_or_else(|e| panic!("{series} x {labels}: {e}"));
                assert_eq!(d.series.len(), series);
                println!(
                    "{series} x {labels}: {} bytes, view {} ({:.1}x)",
                    body.len(),
                    d.view_bytes(),
                    d.view_bytes() as f64 / body.len() as f64
                );
            }
        }
    }

    fn request(refs_packed: bool) -> Vec<u8> {
        let req = v2::Request {
            symbols: vec![
                "".into(),
                "__name__".into(),
                "http_seconds_bucket".into(),
                "le".into(),
                "0.5".into(),
                "Latency.".into(),
            ],
            timeseries: vec![v2::TimeSeries {
                labels_refs: vec![3, 4, 1, 2],
                samples: vec![v2::Sample {
                    value: 2.0,
                    timestamp: 10,
                    start_timestamp: 0,
                }],
                metadata: Some(v2::Metadata {
                    r#type: 3,
                    help_ref: 5,
                    unit_ref: 0,
                }),
                created_timestamp: 4,
                ..Default::default()
            }],
        };
        let bytes = req.encode_to_vec();
        if refs_packed {
            return bytes;
        }
        // The same request with unpacked label refs (each its own varint field).
        let mut ts = Vec::new();
        for r in [3u8, 4, 1, 2] {
            ts.extend_from_slice(&[0x08, r]);
        }
        let mut rest = req.timeseries[0].clone();
        rest.labels_refs.clear();
        ts.extend_from_slice(&rest.encode_to_vec());
        let mut out = Vec::new();
        for s in &req.symbols {
            out.push(0x22);
            out.push(s.len() as u8);
            out.extend_from_slice(s.as_bytes());
        }
        out.push(0x2a);
        out.push(ts.len() as u8);
        out.extend_from_slice(&ts);
        out
    }

    /// Series with the label names of the sorted series before them skip the sort
    /// check but not the checks of values: an empty value, an empty `__name__` (the same
    /// symbol as another label's value, so `__name__` is found by name).
    #[test]
    fn series_repeating_the_names_before_them_are_still_checked() {
        let symbols: Vec<String> = ["", "__name__", "up", "job", "b", "a"]
            .into_iter()
            .map(String::from)
            .collect();
        let series = |refs: Vec<u32>| v2::TimeSeries {
            labels_refs: refs,
            samples: vec![v2::Sample {
                value: 1.0,
                timestamp: 10,
                start_timestamp: 0,
            }],
            ..Default::default()
        };
        let decode = |ts: Vec<v2::TimeSeries>| {
            let buf = v2::Request {
                symbols: symbols.clone(),
                timeseries: ts,
            }
            .encode_to_vec();
            let mut d = DecodedRequest::default();
            d.decode_v2(&buf, DecodeLimits::default()).map(|()| {
                d.series
                    .iter()
                    .map(|s| (s.name.str(&buf).to_owned(), s.labels_in_order))
                    .collect::<Vec<_>>()
            })
        };
        // job="up" first, then __name__: the same symbol; unsorted, then sorted.
        let got = decode(vec![
            series(vec![3, 2, 1, 2]),
            series(vec![1, 2, 3, 2]),
            series(vec![1, 2, 3, 4]),
            series(vec![1, 2, 3, 0]),
        ])
        .unwrap();
        assert_eq!(
            got,
            [
                ("up".into(), false),
                ("up".into(), true),
                ("up".into(), true),
                ("up".into(), false)
            ]
        );
        let err = decode(vec![series(vec![1, 2, 3, 4]), series(vec![1, 0, 3, 4])]);
        assert!(
            matches!(err, Err(DecodeError::MissingMetricName)),
            "{err:?}"
        );
    }

    #[test]
    fn packed_and_unpacked_refs_decode_alike() {
        for packed in [true, false] {
            let buf = request(packed);
            let mut d = DecodedRequest::default();
            d.decode_v2(&buf, DecodeLimits::default()).unwrap();
            assert!(d.v2);
            assert_eq!(d.series.len(), 1);
            let s = d.series[0];
            assert!(!s.canonical, "2.0 bytes are never a 1.0 series");
            assert!(
                !s.labels_in_order,
                "le came before __name__: sorted here, so rebuilt"
            );
            assert_eq!(s.name.str(&buf), "http_seconds_bucket");
            assert_eq!(s.metric_type, 3);
            // Sorted by name: __name__ first.
            let names: Vec<&str> = d.labels.iter().map(|l| l.name.str(&buf)).collect();
            assert_eq!(names, ["__name__", "le"]);
            // created_timestamp becomes the samples' start timestamp.
            assert_eq!(d.samples[0].start_timestamp, 4);
            assert!(d.has_start_timestamps);
            // One MetricMetadata for the family, without the histogram suffix.
            assert_eq!(d.metadata.len(), 1);
            assert_eq!(d.metadata[0].family.str(&buf), "http_seconds");
            assert_eq!(d.metadata[0].help.str(&buf), "Latency.");
            assert!(d.metadata[0].raw.is_empty());
        }
    }

    /// A request's bytes with every series' label references unpacked (one varint
    /// field each, as the spec allows), which only the general path reads.
    fn unpacked(req: &v2::Request) -> Vec<u8> {
        use crate::wire::pb::put_varint;
        let mut out = Vec::new();
        for s in &req.symbols {
            out.push(0x22);
            put_varint(&mut out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        for ts in &req.timeseries {
            let mut body = Vec::new();
            for r in &ts.labels_refs {
                body.push(0x08);
                put_varint(&mut body, u64::from(*r));
            }
            let mut rest = ts.clone();
            rest.labels_refs.clear();
            body.extend_from_slice(&rest.encode_to_vec());
            out.push(0x2a);
            put_varint(&mut out, body.len() as u64);
            out.extend_from_slice(&body);
        }
        out
    }

    /// What a decoded request says, as owned values (spans read out of their buffer).
    fn view(d: &DecodedRequest, buf: &[u8]) -> String {
        let mut text = format!(
            "expanded {} start_ts {}\n",
            d.expanded_bytes, d.has_start_timestamps
        );
        for s in &d.series {
            let labels: Vec<(&str, &str)> = d.labels[s.labels.usize()]
                .iter()
                .map(|l| (l.name.str(buf), l.value.str(buf)))
                .collect();
            text += &format!(
                "{} {:?} in_order {} type {} samples {:?}\n",
                s.name.str(buf),
                labels,
                s.labels_in_order,
                s.metric_type,
                &d.samples[s.samples.usize()]
            );
        }
        for m in &d.metadata {
            text += &format!(
                "md {} {} {:?} {:?}\n",
                m.metric_type,
                m.family.str(buf),
                m.help.str(buf),
                m.unit.str(buf)
            );
        }
        text
    }

    proptest::proptest! {
        /// The fast path (packed references, the usual shapes) reads every request as
        /// the general path does (the same request with unpacked references), errors
        /// included, whatever the labels (unsorted, repeated, empty, missing
        /// `__name__`), references (past 127 and 16,383, out of range, odd), samples
        /// (zero values, start timestamps), metadata and limits. Where it takes a series'
        /// samples as they stand, those bytes are their 1.0 encoding.
        #[test]
        fn the_fast_path_reads_what_the_general_path_reads(
            series in proptest::collection::vec(
                (
                    proptest::collection::vec(0u32..40, 0..12),
                    proptest::collection::vec((0u8..3, 0usize..6, 0u8..8), 0..3),
                    0u8..5,
                    proptest::bool::weighted(0.1),
                    proptest::bool::weighted(0.85),
                ),
                1..8,
            ),
            far in 0usize..3,
            max_labels in 3usize..16,
            max_value in 6usize..60,
        ) {
            // Symbols: names and values at 1..40 (one long value), then padding so that
            // references past 127 or 16,383 exist: ref r >= 20 reads symbol r + offset.
            let mut symbols: Vec<String> = vec![String::new(), "__name__".into()];
            for n in ["a", "b", "job", "le", "zz"] { symbols.push(n.into()); }
            for v in ["up", "x", "0.5", "", "node", "q_bucket", "http_total"] { symbols.push(v.into()); }
            symbols.push("v".repeat(30));
            while symbols.len() < 20 { symbols.push(format!("s{}", symbols.len())); }
            let offset = [0usize, 150, 16_400][far];
            for i in 0..offset { symbols.push(format!("p{i}")); }
            for i in 20..40 { symbols.push(format!("t{i}")); }
            let reference = |r: u32| if r >= 20 { r + offset as u32 } else { r };
            let timeseries: Vec<v2::TimeSeries> = series
                .iter()
                .map(|(refs, samples, md, created, sorted)| {
                    let mut refs: Vec<u32> = refs.iter().map(|r| reference(*r)).collect();
                    if *sorted && refs.len() >= 2 {
                        // __name__ first, then a few other names: the usual sorted shape.
                        refs[0] = 1;
                        refs[1] = 7 + refs[1] % 6;
                        for (k, pair) in refs[2..].chunks_mut(2).enumerate() {
                            pair[0] = 2 + (k as u32 % 5);
                            if let Some(v) = pair.get_mut(1) {
                                // Values of the names' own, the empty one among them.
                                *v = 7 + *v % 8;
                            }
                        }
                    }
                    v2::TimeSeries {
                        labels_refs: refs,
                        samples: samples
                            .iter()
                            .map(|&(v, t, st)| v2::Sample {
                                value: [0.0, 1.5, f64::from_bits(0x7ff0_0000_0000_0002)][v as usize],
                                timestamp: [0, 1_700_000_000_000, 5, 1_700_000_015_000, 1_700_000_030_000, 300][t],
                                start_timestamp: if st == 0 { 7 } else { 0 },
                            })
                            .collect(),
                        metadata: (*md > 0).then_some(v2::Metadata {
                            r#type: i32::from(*md) - 1,
                            help_ref: u32::from(*md) * 3,
                            unit_ref: 0,
                        }),
                        created_timestamp: if *created { 3 } else { 0 },
                        ..Default::default()
                    }
                })
                .collect();
            let req = v2::Request { symbols, timeseries };
            let limits = DecodeLimits {
                max_labels_per_series: max_labels,
                max_label_value_bytes: max_value,
                ..DecodeLimits::default()
            };
            let (fast_buf, unpacked_buf) = (req.encode_to_vec(), unpacked(&req));
            let (mut fast, mut general) = (DecodedRequest::default(), DecodedRequest::default());
            general.general_only = true;
            let a = fast.decode_v2(&fast_buf, limits).map(|()| view(&fast, &fast_buf));
            let b = general.decode_v2(&fast_buf, limits).map(|()| view(&general, &fast_buf));
            let a = a.map_err(|e| e.to_string());
            proptest::prop_assert_eq!(&a, &b.map_err(|e| e.to_string()));
            // Unpacked references (read by the general path only) give the same view
            // when the request is good (errors may come in another order; the input,
            // so the spelled-out size, is larger).
            let mut other = DecodedRequest::default();
            let series_of = |v: &str| v.split_once('\n').map(|(_, rest)| rest.to_owned());
            if let (Ok(()), Ok(a)) = (other.decode_v2(&unpacked_buf, limits), &a) {
                proptest::prop_assert_eq!(series_of(&view(&other, &unpacked_buf)), series_of(a));
            }
            for s in fast.series.iter().filter(|s| !s.samples_raw.is_empty()) {
                let mut want = Vec::new();
                let mut w = crate::wire::encode::SeriesWriter::new(&mut want);
                for smp in &fast.samples[s.samples.usize()] {
                    w.sample_view(smp);
                }
                proptest::prop_assert_eq!(s.samples_raw.bytes(&fast_buf), &want[..]);
            }
            // General-path series never claim raw samples.
            proptest::prop_assert!(general.series.iter().all(|s| s.samples_raw.is_empty()));
        }
    }

    #[test]
    fn family_names_by_type() {
        assert_eq!(family_of(b"x_bucket", TYPE_HISTOGRAM), b"x");
        assert_eq!(family_of(b"x_sum", TYPE_SUMMARY), b"x");
        assert_eq!(family_of(b"x_bucket", TYPE_SUMMARY), b"x_bucket");
        assert_eq!(family_of(b"x_total", TYPE_COUNTER), b"x_total");
        assert_eq!(family_of(b"_count", TYPE_HISTOGRAM), b"_count");
    }

    #[test]
    fn limits_apply_to_2_0_too() {
        let buf = request(true);
        let mut d = DecodedRequest::default();
        let limits = DecodeLimits {
            max_labels_per_series: 1,
            ..DecodeLimits::default()
        };
        assert!(matches!(
            d.decode_v2(&buf, limits),
            Err(DecodeError::TooManyLabels(1))
        ));
        let limits = DecodeLimits {
            max_series: 0,
            ..DecodeLimits::default()
        };
        assert!(d.decode_v2(&buf, limits).unwrap_err().is_too_large());
        // Spelled out, the request is larger than its bytes: the limit counts that.
        d.decode_v2(&buf, DecodeLimits::default()).unwrap();
        let expanded = d.expanded_bytes;
        assert!(expanded > buf.len(), "{expanded} <= {}", buf.len());
        let limits = DecodeLimits {
            max_expanded_bytes: expanded - 1,
            ..DecodeLimits::default()
        };
        let e = d.decode_v2(&buf, limits).unwrap_err();
        assert!(
            matches!(e, DecodeError::ExpandedTooLarge { .. }) && e.is_too_large(),
            "{e}"
        );
        let limits = DecodeLimits {
            max_expanded_bytes: expanded,
            ..DecodeLimits::default()
        };
        d.decode_v2(&buf, limits).unwrap();
    }
}
