//! Decodes a `prometheus.WriteRequest` into a borrowed view: every string is a span
//! into the decompressed buffer, every vector is reused across requests, so a warm
//! decode allocates nothing.

use super::DecodeError;
use super::pb::{Reader, WIRE_I64, WIRE_LEN, WIRE_VARINT};

/// A byte range `[start, end)` of the request buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    #[inline]
    pub fn new(start: usize, end: usize) -> Self {
        Span {
            start: start as u32,
            end: end as u32,
        }
    }
    #[inline]
    pub fn bytes<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.start as usize..self.end as usize]
    }
    /// Valid UTF-8 was checked at decode time; non-UTF-8 never reaches a span.
    #[inline]
    pub fn str<'a>(&self, buf: &'a [u8]) -> &'a str {
        std::str::from_utf8(self.bytes(buf)).unwrap_or("")
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
    #[inline]
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start) as usize
    }
}

/// Index range into one of the [`DecodedRequest`] vectors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range32 {
    pub start: u32,
    pub end: u32,
}

impl Range32 {
    #[inline]
    pub fn usize(&self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
    #[inline]
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

#[derive(Clone, Copy, Debug)]
pub struct LabelSpan {
    pub name: Span,
    pub value: Span,
}

/// A float sample. The value is kept as raw bits so that stale markers (a NaN payload)
/// can never be canonicalised on the way through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleView {
    pub value_bits: u64,
    pub timestamp: i64,
    /// Remote-write 2.0's start (created) timestamp; 0 when unknown (always, for 1.0).
    pub start_timestamp: i64,
}

#[derive(Clone, Copy, Debug)]
pub struct ExemplarView {
    pub labels: Range32,
    pub value_bits: u64,
    pub timestamp: i64,
}

/// A native histogram: its encoded bytes are forwarded as they are; only the timestamp is
/// read (for ordering when two series merge).
#[derive(Clone, Copy, Debug)]
pub struct HistogramView {
    pub raw: Span,
    pub timestamp: i64,
    /// A 1.0 histogram with a field 17, which 1.0 does not define. The mapped body numbers
    /// histograms like 2.0, where 17 is `start_timestamp`, so the histogram is forwarded
    /// without that field (its series is never canonical).
    pub foreign_field_17: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct SeriesView {
    /// The whole encoded `TimeSeries` message (without its key and length).
    pub raw: Span,
    pub labels: Range32,
    pub samples: Range32,
    pub exemplars: Range32,
    pub histograms: Range32,
    pub name: Span,
    /// Labels arrived sorted, unique and without empty values: the raw bytes are valid output.
    /// Never set for remote-write 2.0 input (its bytes are not a 1.0 `TimeSeries`).
    pub canonical: bool,
    /// Labels arrived sorted, unique and without empty values (1.0 or 2.0): a series no
    /// rule touches can be written from the view as it is.
    pub labels_in_order: bool,
    /// Every label stands in the input encoded exactly as [`super::encode::SeriesWriter::label`]
    /// writes it (a 1.0 series read by the one-pass decoder: every length one byte,
    /// name and value non-empty): a label's bytes are `name.start - 4 .. value.end`.
    pub labels_encoded: bool,
    /// The metric type of the series' own 2.0 metadata (`MetricMetadata` numbering);
    /// 0 when unknown, always for 1.0 input.
    pub metric_type: u8,
    /// A 2.0 series read in the usual shape ([`DecodedRequest::decode_v2`]'s fast path):
    /// its samples' fields as they stand in the input, which are byte for byte a 1.0
    /// `TimeSeries`' samples (the field numbers agree and none has a start timestamp).
    /// Empty otherwise.
    pub samples_raw: Span,
}

#[derive(Clone, Copy, Debug)]
pub struct MetadataView {
    /// The encoded 1.0 `MetricMetadata`; empty for metadata that came with 2.0 series
    /// (written from its fields instead).
    pub raw: Span,
    pub metric_type: i32,
    pub family: Span,
    pub help: Span,
    pub unit: Span,
}

/// Limits enforced while decoding.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    pub max_series: usize,
    pub max_labels_per_series: usize,
    pub max_label_value_bytes: usize,
    /// The most bytes a request may take once its labels are spelled out (2.0's label
    /// references expanded, as the mapped output and any 1.0 body hold them): a 2.0
    /// request of a few KiB can refer to one large symbol millions of times.
    pub max_expanded_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_series: 1_000_000,
            max_labels_per_series: 1_000,
            max_label_value_bytes: 64 << 10,
            max_expanded_bytes: 256 << 20,
        }
    }
}

#[derive(Default, Debug)]
pub struct DecodedRequest {
    pub series: Vec<SeriesView>,
    pub labels: Vec<LabelSpan>,
    pub samples: Vec<SampleView>,
    pub exemplars: Vec<ExemplarView>,
    pub histograms: Vec<HistogramView>,
    pub metadata: Vec<MetadataView>,
    /// The request was remote-write 2.0.
    pub v2: bool,
    /// Some sample carries a start timestamp, or some histogram a start timestamp field
    /// (even 0, since histograms are forwarded as their bytes); 2.0 only. The 1.0
    /// output is then written without them.
    pub has_start_timestamps: bool,
    /// Some native histogram has custom buckets (NHCB, schema -53).
    pub has_nhcb: bool,
    /// What the request occupies with every label spelled out: the input's size for
    /// 1.0; for 2.0, the input plus each resolved label and metadata text (see
    /// [`DecodeLimits::max_expanded_bytes`]).
    pub expanded_bytes: usize,
    /// 2.0 decoding scratch: the symbols table, label refs, metadata seen per family.
    pub(super) symbols: Vec<Span>,
    pub(super) refs: Vec<u32>,
    pub(super) md_index: ahash::AHashMap<u64, u32>,
    pub(super) md_hasher: ahash::RandomState,
    /// 2.0: the label names (symbol spans) of the last series that arrived sorted, and
    /// where its `__name__` is: a series with the same names needs no sort check.
    pub(super) sorted_names: Vec<Span>,
    pub(super) sorted_name_at: usize,
    /// 2.0: the name and metric type of the last series whose metadata was recorded (its
    /// family has its [`MetadataView`]): the series after it, of the same name, skip the
    /// family lookup. An empty name when none.
    pub(super) md_last: (Span, u8),
    /// The request's decoded size: the view may take [`VIEW_FACTOR`] times it (or, for
    /// 2.0, its spelled-out size, `expanded_bytes`, when larger), plus [`VIEW_SLACK`].
    pub(super) view_base: usize,
    /// Tests: every 2.0 series through the general path, to compare the fast one with.
    #[cfg(test)]
    pub(super) general_only: bool,
}

/// The view of a request (its series, labels, samples, … as spans) may take this many
/// times the request's decoded size (for 2.0, its size with every label spelled out,
/// when larger: a label is two or three bytes of references and 16 bytes of view). What
/// senders write takes one to four times: about one for a usual series (300 bytes, one
/// sample: 250 of view), 2.7 for samples of value 0 (nine bytes each, 24 of view), 4.75
/// for the smallest valid series. A request of nothing but two-byte samples (`12 00`)
/// would take twelve times, and metadata entries of two bytes eighteen.
pub const VIEW_FACTOR: usize = 6;
/// View bytes every request may take whatever its size.
pub const VIEW_SLACK: usize = 1 << 20;

/// Makes room for one more entry in the view's vector `$s.$v`, or returns the view's
/// error: while the vector has room, at once; when it must grow (rarely), only if one
/// more entry keeps the view within its limit, and then grown by at most what is left
/// of it.
macro_rules! ensure_room {
    ($s:ident . $v:ident) => {
        if $s.$v.len() == $s.$v.capacity() && {
            let (view, limit) = ($s.view_bytes(), $s.view_limit());
            !$crate::wire::decode::reserve_within(&mut $s.$v, 1, view, limit)
        } {
            return Err($s.view_error());
        }
    };
}
pub(super) use ensure_room;

/// Reserves room for at least `want` more entries in `v` (doubling its capacity, as a
/// push would, but never past `limit` bytes of view, of which `view` are taken): false,
/// nothing reserved, when `want` do not fit.
#[cold]
#[inline(never)]
pub(super) fn reserve_within<T>(v: &mut Vec<T>, want: usize, view: usize, limit: usize) -> bool {
    let allowance = limit.saturating_sub(view) / std::mem::size_of::<T>().max(1);
    if allowance < want {
        return false;
    }
    v.reserve_exact(v.capacity().max(64).max(want).min(allowance));
    true
}

impl DecodedRequest {
    /// The value every series of the request gives label `name`, when they all give it
    /// one and the same non-empty value (`buf`: the buffer the request was decoded
    /// from); `None` when a series lacks the label or gives it another value, or when
    /// the request has no series. A decoded series holds each label name once.
    pub fn common_label_value<'b>(&self, buf: &'b [u8], name: &[u8]) -> Option<&'b [u8]> {
        let mut common: Option<&'b [u8]> = None;
        let is_name =
            |l: &LabelSpan| l.name.len() == name.len() && short_eq(l.name.bytes(buf), name);
        // Where the label was in the series before: series of one target come together,
        // their labels in the same places.
        let mut at = 0;
        for s in &self.series {
            let labels = self.labels.get(s.labels.usize())?;
            if !labels.get(at).is_some_and(is_name) {
                at = labels.iter().position(is_name)?;
            }
            let value = labels[at].value.bytes(buf);
            match common {
                Some(c) if short_eq(c, value) => {}
                None if !value.is_empty() => common = Some(value),
                _ => return None,
            }
        }
        common
    }

    pub fn clear(&mut self) {
        self.series.clear();
        self.labels.clear();
        self.samples.clear();
        self.exemplars.clear();
        self.histograms.clear();
        self.metadata.clear();
        self.v2 = false;
        self.has_start_timestamps = false;
        self.has_nhcb = false;
        self.expanded_bytes = 0;
        self.symbols.clear();
        self.refs.clear();
        self.md_index.clear();
        self.sorted_names.clear();
        self.md_last = (Span::default(), 0);
    }

    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// The view's vectors as (entries, capacity, bytes an entry).
    fn view_vectors(&self) -> [(usize, usize, usize); 8] {
        fn of<T>(v: &Vec<T>) -> (usize, usize, usize) {
            (v.len(), v.capacity(), std::mem::size_of::<T>())
        }
        [
            of(&self.series),
            of(&self.labels),
            of(&self.samples),
            of(&self.exemplars),
            of(&self.histograms),
            of(&self.metadata),
            of(&self.refs),
            of(&self.symbols),
        ]
    }

    /// What this request's view takes (entries held, not the vectors' capacities, which
    /// earlier requests may have grown).
    pub fn view_bytes(&self) -> usize {
        self.view_vectors()
            .iter()
            .map(|(n, _, size)| n * size)
            .sum()
    }

    /// Bytes the view's vectors hold (what a pooled workspace keeps).
    pub fn retained_bytes(&self) -> usize {
        let held: usize = self
            .view_vectors()
            .iter()
            .map(|(_, c, size)| c * size)
            .sum();
        held + self.sorted_names.capacity() * std::mem::size_of::<Span>()
            + self.md_index.capacity() * 16
    }

    /// The bytes this request's view may take (see [`VIEW_FACTOR`]).
    pub(super) fn view_limit(&self) -> usize {
        self.view_base
            .max(self.expanded_bytes)
            .saturating_mul(VIEW_FACTOR)
            .saturating_add(VIEW_SLACK)
    }

    /// The view past its limit: checked after every 64th series, so series and their
    /// labels grow by at most 64 series' worth between checks (at most 64 × (a series'
    /// view and 1,000 labels) ≈ 1 MiB, the limit's slack); samples, exemplars,
    /// histograms, metadata, symbols and 2.0's labels are checked as their vectors grow.
    #[inline(always)]
    pub(super) fn check_view(&self) -> Result<(), DecodeError> {
        if self.series.len() % 64 == 0 && self.view_bytes() > self.view_limit() {
            return Err(self.view_error());
        }
        Ok(())
    }

    #[cold]
    pub(super) fn view_error(&self) -> DecodeError {
        DecodeError::ViewTooLarge {
            limit: self.view_limit(),
            factor: VIEW_FACTOR,
        }
    }

    /// Room for the samples of `bytes` of a series in the usual shape (at least four
    /// bytes each, `12 02 10 00`), made once per series so that its loop pushes without
    /// growing. False sends the series to the general path, which checks sample by
    /// sample (the bound of four bytes a sample overestimates most series' samples).
    #[inline(always)]
    pub(super) fn room_for_usual_samples(&mut self, bytes: usize) -> bool {
        let most = bytes / 4;
        self.samples.capacity() - self.samples.len() >= most || {
            let (view, limit) = (self.view_bytes(), self.view_limit());
            reserve_within(&mut self.samples, most, view, limit)
        }
    }

    pub fn histogram_count(&self) -> usize {
        self.histograms.len()
    }

    /// Decodes `buf` (a complete `WriteRequest`) into `self`, replacing its contents.
    pub fn decode(&mut self, buf: &[u8], limits: DecodeLimits) -> Result<(), DecodeError> {
        self.clear();
        if buf.len() > u32::MAX as usize {
            return Err(DecodeError::TooLarge);
        }
        // 1.0 spells every label out already.
        self.expanded_bytes = buf.len();
        self.view_base = buf.len();
        let mut v2_fields = false;
        let mut r = Reader::new(buf, 0, buf.len());
        // Every series (field 1, length-delimited: key 0x0a) in a row, before the general
        // loop: a predicted branch per series instead of the field `match`.
        while r.eat(0x0a) {
            if self.series.len() >= limits.max_series {
                return Err(DecodeError::TooManySeries(limits.max_series));
            }
            let (s, e) = r.len_delimited()?;
            self.decode_series(buf, s, e, &limits)?;
            self.check_view()?;
        }
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => {
                    r.expect(wire, WIRE_LEN, "WriteRequest.timeseries")?;
                    if self.series.len() >= limits.max_series {
                        return Err(DecodeError::TooManySeries(limits.max_series));
                    }
                    let (s, e) = r.len_delimited()?;
                    self.decode_series(buf, s, e, &limits)?;
                    self.check_view()?;
                }
                3 => {
                    r.expect(wire, WIRE_LEN, "WriteRequest.metadata")?;
                    let (s, e) = r.len_delimited()?;
                    self.decode_metadata(buf, s, e)?;
                }
                4 | 5 if wire == WIRE_LEN => {
                    v2_fields = true;
                    r.skip(wire)?;
                }
                _ => r.skip(wire)?,
            }
        }
        // 2.0's symbols (4) and series (5) are unknown to 1.0: a 2.0 body read as 1.0
        // would be an empty request, its data lost without a word.
        if v2_fields && self.series.is_empty() && self.metadata.is_empty() {
            return Err(DecodeError::V2BodyAsV1);
        }
        Ok(())
    }

    fn decode_series(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> Result<(), DecodeError> {
        if self.decode_series_fast(buf, start, end, limits) {
            return Ok(());
        }
        let labels_start = self.labels.len() as u32;
        let samples_start = self.samples.len() as u32;
        let exemplars_start = self.exemplars.len() as u32;
        let hist_start = self.histograms.len() as u32;
        // Exemplar labels are appended to `labels` too, so the series' own labels are
        // collected first and exemplars decoded in a second pass.
        let mut has_exemplars = false;
        let mut r = Reader::new(buf, start, end);
        // Senders write the labels (key 0x0a), then the samples (0x12): each run in a
        // tight loop first; the general loop below takes any other order.
        while r.eat(0x0a) {
            self.series_label(buf, &mut r, labels_start, limits)?;
        }
        let mut other_fields = false;
        while r.eat(0x12) {
            let (s, e) = r.len_delimited()?;
            ensure_room!(self.samples);
            self.samples
                .push(decode_sample(buf, s, e, &mut other_fields)?);
        }
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.labels")?;
                    self.series_label(buf, &mut r, labels_start, limits)?;
                }
                2 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.samples")?;
                    let (s, e) = r.len_delimited()?;
                    ensure_room!(self.samples);
                    self.samples
                        .push(decode_sample(buf, s, e, &mut other_fields)?);
                }
                3 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.exemplars")?;
                    r.len_delimited()?;
                    has_exemplars = true;
                }
                4 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.histograms")?;
                    let (s, e) = r.len_delimited()?;
                    let (timestamp, schema, foreign_field_17) =
                        decode_histogram_timestamp(buf, s, e)?;
                    self.has_nhcb |= schema == super::histogram::CUSTOM_BUCKETS_SCHEMA;
                    other_fields |= foreign_field_17;
                    ensure_room!(self.histograms);
                    self.histograms.push(HistogramView {
                        raw: Span::new(s, e),
                        timestamp,
                        foreign_field_17,
                    });
                }
                _ => r.skip(wire)?,
            }
        }
        let labels_end = self.labels.len() as u32;
        let labels = Range32 {
            start: labels_start,
            end: labels_end,
        };
        let (name, labels_canonical) = check_labels(buf, &mut self.labels[labels.usize()])?;
        // A sample with other fields, or a histogram with a field 17: the series is
        // rewritten from the view, not copied.
        let canonical = labels_canonical && !other_fields;
        if has_exemplars {
            self.decode_exemplars(buf, start, end, 3, Self::decode_exemplar)?;
        }
        self.push_series(
            Span::new(start, end),
            labels,
            (samples_start, exemplars_start, hist_start),
            name,
            canonical,
            0,
        );
        Ok(())
    }

    /// The shape every sender writes, decoded in one pass with no field dispatch: labels
    /// first (each `Label` and its name and value under 128 bytes, name then value, both
    /// non-empty), sorted by name, ASCII (checked once over all of them), then samples
    /// under 128 bytes, nothing else. Such a series is canonical. Anything else (or
    /// anything wrong) returns false with nothing recorded, and the general decoder
    /// takes the series, with its errors.
    #[inline]
    fn decode_series_fast(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> bool {
        let (labels_at, samples_at) = (self.labels.len(), self.samples.len());
        let recorded = self.series_fast_parts(buf, start, end, limits);
        let Some(name) = recorded else {
            self.labels.truncate(labels_at);
            self.samples.truncate(samples_at);
            return false;
        };
        self.push_series_from(
            Span::new(start, end),
            (labels_at, samples_at),
            name,
            true,
            0,
        );
        if let Some(s) = self.series.last_mut() {
            // `short_labels` took every label in `short_label_at`'s shape, non-empty.
            s.labels_encoded = true;
        }
        true
    }

    /// [`Self::push_series`] for a series read in one pass: its labels and samples are
    /// the entries from `labels_at` and `samples_at` on, it has no exemplars or
    /// histograms.
    #[inline(always)]
    pub(super) fn push_series_from(
        &mut self,
        raw: Span,
        (labels_at, samples_at): (usize, usize),
        name: Span,
        canonical: bool,
        metric_type: u8,
    ) {
        let (exemplars, histograms) = (self.exemplars.len() as u32, self.histograms.len() as u32);
        let labels = Range32 {
            start: labels_at as u32,
            end: self.labels.len() as u32,
        };
        self.push_series(
            raw,
            labels,
            (samples_at as u32, exemplars, histograms),
            name,
            canonical,
            metric_type,
        );
    }

    /// [`Self::decode_series_fast`]'s labels and samples; the `__name__` value, or `None`
    /// (the caller undoes what was pushed).
    #[inline(always)]
    fn series_fast_parts(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        limits: &DecodeLimits,
    ) -> Option<Span> {
        // Positions are the buffer's, `start..end`: spans need no offset added.
        let msg = buf.get(..end)?;
        let first_label = self.labels.len();
        let labels = &mut self.labels;
        let (mut p, wrong) = short_labels(labels, msg, start)?;
        let ours = &labels[first_label..];
        if wrong
            || p == start
            || ours.len() > limits.max_labels_per_series
            || !all_ascii(&msg[start..p])
            // A short label's value is under 128 bytes: under the usual limit (64 KiB)
            // none is too long.
            || (limits.max_label_value_bytes < 128
                && ours.iter().any(|l| l.value.len() > limits.max_label_value_bytes))
        {
            return None;
        }
        // `__name__` sorts before every lowercase name: nearly always the first label.
        let name = ours
            .iter()
            .find(|l| is_metric_name(l.name.bytes(buf)))
            .map(|l| l.value);
        if !self.room_for_usual_samples(end - p) {
            return None;
        }
        // Sample: 0x12 LEN (value, timestamp).
        while p < end {
            let head = msg.get(p..p + 2)?;
            let len = head[1] as usize;
            if head[0] != 0x12 || len >= 0x80 || p + 2 + len > end {
                return None;
            }
            let sample = sample_in_usual_shape(buf, p + 2, p + 2 + len)?;
            self.samples.push(sample);
            p += 2 + len;
        }
        name
    }

    /// One label of a series (its key already read), checked against the limits.
    #[inline(always)]
    fn series_label(
        &mut self,
        buf: &[u8],
        r: &mut Reader<'_>,
        labels_start: u32,
        limits: &DecodeLimits,
    ) -> Result<(), DecodeError> {
        if self.labels.len() - labels_start as usize >= limits.max_labels_per_series {
            return Err(DecodeError::TooManyLabels(limits.max_labels_per_series));
        }
        let (s, e) = r.len_delimited()?;
        let label = decode_label(buf, s, e)?;
        let value_len = (label.value.end - label.value.start) as usize;
        if value_len > limits.max_label_value_bytes {
            return Err(DecodeError::LabelValueTooLong {
                name: String::from_utf8_lossy(label.name.bytes(buf)).into_owned(),
                len: value_len,
                limit: limits.max_label_value_bytes,
            });
        }
        self.labels.push(label);
        Ok(())
    }

    /// The exemplars of a series (field `field` of its message), decoded after its own
    /// labels: exemplar labels go into `labels` too, behind the series'.
    pub(super) fn decode_exemplars(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        field: u32,
        decode: fn(&mut Self, &[u8], usize, usize) -> Result<ExemplarView, DecodeError>,
    ) -> Result<(), DecodeError> {
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (f, wire) = r.key()?;
            if f == field {
                let (s, e) = r.len_delimited()?;
                let ex = decode(self, buf, s, e)?;
                ensure_room!(self.exemplars);
                self.exemplars.push(ex);
            } else {
                r.skip(wire)?;
            }
        }
        Ok(())
    }

    /// Records a decoded series whose samples, exemplars and histograms are the entries
    /// from the given starts (`(samples, exemplars, histograms)`) to the vectors' ends.
    pub(super) fn push_series(
        &mut self,
        raw: Span,
        labels: Range32,
        (samples, exemplars, histograms): (u32, u32, u32),
        name: Span,
        canonical: bool,
        metric_type: u8,
    ) {
        let to_end = |start: u32, len: usize| Range32 {
            start,
            end: len as u32,
        };
        self.series.push(SeriesView {
            raw,
            labels,
            samples: to_end(samples, self.samples.len()),
            exemplars: to_end(exemplars, self.exemplars.len()),
            histograms: to_end(histograms, self.histograms.len()),
            name,
            canonical,
            labels_in_order: canonical,
            labels_encoded: false,
            metric_type,
            samples_raw: Span::default(),
        });
    }

    fn decode_exemplar(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
    ) -> Result<ExemplarView, DecodeError> {
        let labels_start = self.labels.len() as u32;
        let mut value_bits = 0u64;
        let mut timestamp = 0i64;
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => {
                    r.expect(wire, WIRE_LEN, "Exemplar.labels")?;
                    let (s, e) = r.len_delimited()?;
                    let label = decode_label(buf, s, e)?;
                    ensure_room!(self.labels);
                    self.labels.push(label);
                }
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
        Ok(ExemplarView {
            labels: Range32 {
                start: labels_start,
                end: self.labels.len() as u32,
            },
            value_bits,
            timestamp,
        })
    }

    fn decode_metadata(&mut self, buf: &[u8], start: usize, end: usize) -> Result<(), DecodeError> {
        let mut md = MetadataView {
            raw: Span::new(start, end),
            metric_type: 0,
            family: Span::default(),
            help: Span::default(),
            unit: Span::default(),
        };
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => {
                    r.expect(wire, WIRE_VARINT, "MetricMetadata.type")?;
                    md.metric_type = r.varint()? as i32;
                }
                2 | 4 | 5 => {
                    r.expect(wire, WIRE_LEN, "MetricMetadata string")?;
                    let (s, e) = r.len_delimited()?;
                    utf8(buf, s, e)?;
                    let span = Span::new(s, e);
                    match field {
                        2 => md.family = span,
                        4 => md.help = span,
                        _ => md.unit = span,
                    }
                }
                _ => r.skip(wire)?,
            }
        }
        ensure_room!(self.metadata);
        self.metadata.push(md);
        Ok(())
    }
}

/// The labels in the shape every sender writes ([`short_label_at`]) from `msg[p..]` on,
/// pushed to `labels` as spans of `msg`: where they end, and whether a check that does
/// not decide where the next label starts failed (names strictly ascending: sorted, none
/// twice, none empty, as an empty name is never greater than the one before; values not
/// empty). Those checks are folded into one flag for the caller to test once: fewer
/// branches and live values in the loop, which has a function of its own so that its
/// values stay in registers. `None`: a label in another shape.
#[inline(never)]
fn short_labels(labels: &mut Vec<LabelSpan>, msg: &[u8], mut p: usize) -> Option<(usize, bool)> {
    let mut prev_name: &[u8] = &[];
    let mut wrong = false;
    // Label: 0x0a LEN 0x0a NL name 0x12 VL value, LEN = 4 + NL + VL.
    while msg.get(p) == Some(&0x0a) {
        let label = short_label_at(msg, p)?;
        let label_name = &msg[label.name.clone()];
        wrong |= label.value.is_empty() | !name_less(prev_name, label_name);
        labels.push(LabelSpan {
            name: Span::new(label.name.start, label.name.end),
            value: Span::new(label.value.start, label.value.end),
        });
        prev_name = label_name;
        p = label.value.end;
    }
    Some((p, wrong))
}

/// A `Label` field at `msg[p..]` in the shape every sender writes: key 0x0a, a length,
/// the name field (0x0a, length, name), the value field (0x12, length, value), every
/// length one byte and the two fields filling the label exactly. Positions in `msg`.
pub struct ShortLabel {
    pub name: std::ops::Range<usize>,
    pub value: std::ops::Range<usize>,
}

/// [`ShortLabel`] at `msg[p..]`, or `None` for any other shape (the general walk's).
#[inline(always)]
pub fn short_label_at(msg: &[u8], p: usize) -> Option<ShortLabel> {
    let mut head = [0u8; 4];
    head.copy_from_slice(msg.get(p..p + 4)?);
    // Key 0x0a, length < 128, name key 0x0a, name length < 128: one comparison.
    if u32::from_le_bytes(head) & 0x80ff_80ff != 0x000a_000a {
        return None;
    }
    let (len, nl) = (head[1] as usize, head[3] as usize);
    let value_key = p + 4 + nl;
    let next = p + 2 + len;
    // The value's key and length fill the rest of the label exactly.
    if next > msg.len()
        || value_key + 2 > next
        || msg[value_key] != 0x12
        || value_key + 2 + msg[value_key + 1] as usize != next
    {
        return None;
    }
    Some(ShortLabel {
        name: p + 4..value_key,
        value: value_key + 2..next,
    })
}

/// True when every byte is ASCII. ORs all bytes together with no early exit (they are
/// almost always ASCII): 64-byte blocks the compiler turns into vector ORs, then 8-byte
/// words, the last one overlapping; cheaper than `<[u8]>::is_ascii` on the few hundred
/// bytes of a series' labels.
#[inline]
pub fn all_ascii(bytes: &[u8]) -> bool {
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    fn word(b: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    }
    if bytes.len() < 8 {
        return bytes.iter().fold(0u8, |acc, &b| acc | b) < 0x80;
    }
    // Eight word lanes, folded together once at the end (a vector register or two).
    let mut lanes = [0u64; 8];
    let mut blocks = bytes.chunks_exact(64);
    for block in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            *lane |= word(w);
        }
    }
    let mut acc = lanes.iter().fold(0, |a, l| a | l);
    for w in blocks.remainder().chunks_exact(8) {
        acc |= word(w);
    }
    acc |= word(&bytes[bytes.len() - 8..]);
    acc & HIGH_BITS == 0
}

#[inline]
pub(super) fn utf8(buf: &[u8], s: usize, e: usize) -> Result<(), DecodeError> {
    let bytes = &buf[s..e];
    // Label names and values are almost always ASCII: a vectorised check, no call.
    if all_ascii(bytes) {
        return Ok(());
    }
    std::str::from_utf8(bytes)
        .map(|_| ())
        .map_err(|_| DecodeError::InvalidUtf8)
}

/// Decodes a `Label`. The shape every sender writes (name then value, each shorter than
/// 128 bytes, ASCII) is read directly; anything else takes the general path.
#[inline(always)]
fn decode_label(buf: &[u8], start: usize, end: usize) -> Result<LabelSpan, DecodeError> {
    let b = &buf[start..end];
    if b.len() >= 4 && b[0] == 0x0a && b[1] < 0x80 {
        let name_end = 2 + b[1] as usize;
        if name_end + 2 <= b.len() && b[name_end] == 0x12 && b[name_end + 1] < 0x80 {
            let value_end = name_end + 2 + b[name_end + 1] as usize;
            if value_end == b.len() && all_ascii(b) {
                return Ok(LabelSpan {
                    name: Span::new(start + 2, start + name_end),
                    value: Span::new(start + name_end + 2, end),
                });
            }
        }
    }
    decode_label_general(buf, start, end)
}

#[inline(never)]
fn decode_label_general(buf: &[u8], start: usize, end: usize) -> Result<LabelSpan, DecodeError> {
    let mut name = Span::new(start, start);
    let mut value = Span::new(start, start);
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match field {
            1 | 2 => {
                r.expect(wire, WIRE_LEN, "Label")?;
                let (s, e) = r.len_delimited()?;
                utf8(buf, s, e)?;
                if field == 1 {
                    name = Span::new(s, e);
                } else {
                    value = Span::new(s, e);
                }
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(LabelSpan { name, value })
}

/// A 1.0 `Sample`. `other_fields` is set when it has fields besides the value and the
/// timestamp: its bytes cannot be passed on then (field 3 is 2.0's start timestamp, which
/// the mapped body carries in that field too).
#[inline]
fn decode_sample(
    buf: &[u8],
    start: usize,
    end: usize,
    other_fields: &mut bool,
) -> Result<SampleView, DecodeError> {
    let (value_bits, ts_at) = match sample_head(&buf[start..end]) {
        Some(head) => head,
        None => return decode_sample_general(buf, start, end, other_fields),
    };
    let mut r = Reader::new(buf, start + ts_at, end);
    let timestamp = r.varint()? as i64;
    if !r.is_done() {
        return decode_sample_general(buf, start, end, other_fields);
    }
    Ok(SampleView {
        value_bits,
        timestamp,
        start_timestamp: 0,
    })
}

/// The value and where the timestamp's varint starts, of a `Sample` in the usual
/// shape (see [`sample_in_usual_shape`]).
#[inline(always)]
fn sample_head(b: &[u8]) -> Option<(u64, usize)> {
    if b.len() >= 11 && b[0] == 0x09 && b[9] == 0x10 {
        let mut value = [0u8; 8];
        value.copy_from_slice(&b[1..9]);
        Some((u64::from_le_bytes(value), 10))
    } else if b.len() >= 2 && b[0] == 0x10 {
        Some((0, 1))
    } else {
        None
    }
}

/// A `Sample` (1.0, or 2.0 without a start timestamp: the field numbers agree) in the
/// shapes every sender writes: the value (key 0x09, 8 bytes; absent when 0.0, as proto3
/// leaves zeros out), then the timestamp (key 0x10, a varint) ending the message. `None`
/// for anything else, errors included: the caller's general loop takes it.
#[inline]
pub(super) fn sample_in_usual_shape(buf: &[u8], start: usize, end: usize) -> Option<SampleView> {
    let msg = buf.get(start..end)?;
    let (value_bits, ts_at) = sample_head(msg)?;
    let timestamp = varint_filling(&msg[ts_at..])? as i64;
    Some(SampleView {
        value_bits,
        timestamp,
        start_timestamp: 0,
    })
}

/// The varint that is exactly `bytes` (every byte but the last with its continuation
/// bit, at most 10, no overflow), or `None`. The timestamp ends its `Sample`, so its
/// length is known: no byte-by-byte search for the end, and no call (the general
/// reader's multi-byte path needs 10 bytes left to skip its bounds checks, which the
/// last field of a message has only when it is a 10-byte varint: a negative timestamp).
#[inline(always)]
fn varint_filling(bytes: &[u8]) -> Option<u64> {
    let n = bytes.len();
    if n == 0 || n > 10 || (n == 10 && bytes[9] > 1) {
        return None;
    }
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate() {
        if (byte < 0x80) != (i + 1 == n) {
            return None;
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
    }
    Some(value)
}

#[inline(never)]
fn decode_sample_general(
    buf: &[u8],
    start: usize,
    end: usize,
    other_fields: &mut bool,
) -> Result<SampleView, DecodeError> {
    let mut value_bits = 0u64;
    let mut timestamp = 0i64;
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match field {
            1 => {
                r.expect(wire, WIRE_I64, "Sample.value")?;
                value_bits = r.fixed64()?;
            }
            2 => {
                r.expect(wire, WIRE_VARINT, "Sample.timestamp")?;
                timestamp = r.varint()? as i64;
            }
            _ => {
                *other_fields = true;
                r.skip(wire)?;
            }
        }
    }
    Ok(SampleView {
        value_bits,
        timestamp,
        start_timestamp: 0,
    })
}

/// Walks a native histogram (checking it is well-formed) and returns its timestamp, its
/// schema and whether it has a field 17 (see [`HistogramView::foreign_field_17`]).
fn decode_histogram_timestamp(
    buf: &[u8],
    start: usize,
    end: usize,
) -> Result<(i64, i32, bool), DecodeError> {
    // A histogram is forwarded as its original bytes, so every field is checked here as
    // a protobuf decoder would: a malformed one would make the backend refuse the whole
    // request (found by tests/fuzz.rs).
    let mut timestamp = 0i64;
    let mut schema = 0i32;
    let mut field_17 = false;
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match field {
            15 => {
                r.expect(wire, WIRE_VARINT, "Histogram.timestamp")?;
                timestamp = r.varint()? as i64;
            }
            4 => {
                r.expect(wire, WIRE_VARINT, "Histogram.schema")?;
                let v = r.varint()?;
                schema = ((v >> 1) as i64 ^ -((v & 1) as i64)) as i32;
            }
            1 | 6 | 14 => {
                r.expect(wire, WIRE_VARINT, "Histogram integer")?;
                r.varint()?;
            }
            2 | 3 | 5 | 7 => {
                r.expect(wire, WIRE_I64, "Histogram double")?;
                r.fixed64()?;
            }
            8 | 11 => {
                r.expect(wire, WIRE_LEN, "Histogram.spans")?;
                let (s, e) = r.len_delimited()?;
                check_bucket_span(buf, s, e)?;
            }
            // Repeated sint64 deltas: packed varints, or one unpacked varint.
            9 | 12 if wire == WIRE_LEN => {
                let (s, e) = r.len_delimited()?;
                let mut packed = Reader::new(buf, s, e);
                while !packed.is_done() {
                    packed.varint()?;
                }
            }
            9 | 12 => {
                r.expect(wire, WIRE_VARINT, "Histogram deltas")?;
                r.varint()?;
            }
            // Repeated doubles: packed (a multiple of 8 bytes), or one unpacked double.
            10 | 13 | 16 if wire == WIRE_LEN => {
                let (s, e) = r.len_delimited()?;
                if (e - s) % 8 != 0 {
                    return Err(DecodeError::Truncated);
                }
            }
            10 | 13 | 16 => {
                r.expect(wire, WIRE_I64, "Histogram counts")?;
                r.fixed64()?;
            }
            super::histogram::START_TIMESTAMP_FIELD => {
                field_17 = true;
                r.skip(wire)?;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok((timestamp, schema, field_17))
}

fn check_bucket_span(buf: &[u8], start: usize, end: usize) -> Result<(), DecodeError> {
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        if field == 1 || field == 2 {
            r.expect(wire, WIRE_VARINT, "BucketSpan")?;
            r.varint()?;
        } else {
            r.skip(wire)?;
        }
    }
    Ok(())
}

/// `a < b` by bytes, for label names: short, and nearly always different in their first
/// byte. A loop here, where a slice comparison calls `memcmp` (measured: that call was
/// a quarter of a pass-through request's CPU time).
#[inline(always)]
pub fn name_less(a: &[u8], b: &[u8]) -> bool {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x < y;
        }
    }
    a.len() < b.len()
}

/// The order of label names ([`name_less`]'s), as an `Ordering`, without `memcmp`.
#[inline(always)]
pub fn name_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

/// How many leading bytes `a` and `b` share, 32 at a time.
#[inline]
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    // Equal runs are long (a series' labels against the previous series'): 32 bytes a
    // step while they last, compared as arrays (vector compares inline, no call); the
    // first difference is then looked for in the 32 bytes that differ.
    while let (Some(x), Some(y)) = (a[i..].first_chunk::<32>(), b[i..].first_chunk::<32>()) {
        if x != y {
            return i + first_difference(x, y);
        }
        i += 32;
    }
    // Fewer than 32 left: the last 32 bytes, overlapping bytes already known equal (so
    // their first difference is at `i` or later).
    if n >= 32
        && let (Some(x), Some(y)) = (a.last_chunk::<32>(), b.last_chunk::<32>())
    {
        return if x == y {
            n
        } else {
            n - 32 + first_difference(x, y)
        };
    }
    while i + 8 <= n {
        let (Some(x), Some(y)) = (a[i..].first_chunk::<8>(), b[i..].first_chunk::<8>()) else {
            break;
        };
        let diff = u64::from_le_bytes(*x) ^ u64::from_le_bytes(*y);
        if diff != 0 {
            return i + (diff.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    // Fewer than eight left: the last eight bytes as one word, overlapping bytes already
    // known equal (so its first difference is at `i` or later).
    if n >= 8
        && let (Some(x), Some(y)) = (a.last_chunk::<8>(), b.last_chunk::<8>())
    {
        let diff = u64::from_le_bytes(*x) ^ u64::from_le_bytes(*y);
        return if diff == 0 {
            n
        } else {
            n - 8 + (diff.trailing_zeros() / 8) as usize
        };
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Where 32 bytes that differ first differ, a word at a time (32 when equal).
#[inline(always)]
fn first_difference(x: &[u8; 32], y: &[u8; 32]) -> usize {
    let word = |s: &[u8; 32], q: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[8 * q..8 * q + 8]);
        u64::from_le_bytes(w)
    };
    for q in 0..4 {
        let diff = word(x, q) ^ word(y, q);
        if diff != 0 {
            return 8 * q + (diff.trailing_zeros() / 8) as usize;
        }
    }
    32
}

/// The eight bytes of `s` at `at` as a word (0 when `s` ends before).
#[inline(always)]
pub fn word8(s: &[u8], at: usize) -> u64 {
    s.get(at..at + 8)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map_or(0, u64::from_ne_bytes)
}

/// The four bytes of `s` at `at` as a word (0 when `s` ends before).
#[inline(always)]
pub fn word4(s: &[u8], at: usize) -> u32 {
    s.get(at..at + 4)
        .and_then(|w| <[u8; 4]>::try_from(w).ok())
        .map_or(0, u32::from_ne_bytes)
}

/// `a == b` for label names, values and whole labels: short, so compared a word at a
/// time inline, where `==` calls `memcmp`. The tail is one more word overlapping the
/// last one compared (and a short slice two overlapping halves), not a byte loop.
#[inline(always)]
pub fn short_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if word8(a, at) != word8(b, at) {
                return false;
            }
            at += 8;
        }
        return word8(a, n - 8) == word8(b, n - 8);
    }
    if n >= 4 {
        return word4(a, 0) == word4(b, 0) && word4(a, n - 4) == word4(b, n - 4);
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// `name == "__name__"`, without a call to `memcmp`.
#[inline(always)]
pub fn is_metric_name(name: &[u8]) -> bool {
    match <[u8; 8]>::try_from(name) {
        Ok(word) => u64::from_le_bytes(word) == u64::from_le_bytes(*b"__name__"),
        Err(_) => false,
    }
}

/// Validates a series' labels in place. Sorts them when the sender did not (so later
/// stages can rely on order), rejects empty or duplicate names and a missing `__name__`.
/// Returns the `__name__` value and whether the labels were already canonical.
pub(super) fn check_labels(
    buf: &[u8],
    labels: &mut [LabelSpan],
) -> Result<(Span, bool), DecodeError> {
    let mut sorted = true;
    let mut has_empty_value = false;
    for i in 0..labels.len() {
        if labels[i].name.is_empty() {
            return Err(DecodeError::EmptyLabelName);
        }
        if labels[i].value.is_empty() {
            has_empty_value = true;
        }
        if i > 0 && !name_less(labels[i - 1].name.bytes(buf), labels[i].name.bytes(buf)) {
            sorted = false;
        }
    }
    if !sorted {
        labels.sort_unstable_by(|a, b| a.name.bytes(buf).cmp(b.name.bytes(buf)));
        for w in labels.windows(2) {
            if w[0].name.bytes(buf) == w[1].name.bytes(buf) {
                return Err(DecodeError::DuplicateLabel(w[0].name.str(buf).to_owned()));
            }
        }
    }
    let name = labels
        .iter()
        .find(|l| is_metric_name(l.name.bytes(buf)))
        .map(|l| l.value)
        .filter(|v| !v.is_empty())
        .ok_or(DecodeError::MissingMetricName)?;
    Ok((name, sorted && !has_empty_value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus::{Label, Sample, WriteRequest};
    use prost::Message;

    /// The value every series gives a label: one non-empty value in every series, or
    /// none (a series without it, another value, an empty one, no series); 1.0 and 2.0.
    #[test]
    fn common_label_value_is_the_one_value_every_series_gives() {
        use crate::wire::proto::write_v2 as v2;
        let v1 = |tenants: &[Option<&str>]| {
            let timeseries = tenants
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut labels = vec![("__name__", format!("m{}", i % 2)), ("a", "x".into())];
                    if let Some(t) = t {
                        labels.push(("ns", t.to_string()));
                    }
                    labels.push(("z", i.to_string()));
                    crate::wire::proto::prometheus::TimeSeries {
                        labels: labels
                            .into_iter()
                            .map(|(n, v)| Label {
                                name: n.into(),
                                value: v,
                            })
                            .collect(),
                        samples: vec![Sample {
                            value: 1.0,
                            timestamp: 1,
                        }],
                        ..Default::default()
                    }
                })
                .collect();
            WriteRequest {
                timeseries,
                metadata: vec![],
            }
            .encode_to_vec()
        };
        let common = |body: &[u8], name: &str| {
            let mut d = DecodedRequest::default();
            d.decode(body, DecodeLimits::default()).unwrap();
            d.common_label_value(body, name.as_bytes())
                .map(<[u8]>::to_vec)
        };
        let a = Some(b"team-a".to_vec());
        assert_eq!(common(&v1(&[Some("team-a"); 3]), "ns"), a);
        assert_eq!(common(&v1(&[Some("team-a"); 3]), "a"), Some(b"x".to_vec()));
        assert_eq!(
            common(&v1(&[Some("team-a"); 3]), "z"),
            None,
            "values differ"
        );
        assert_eq!(
            common(&v1(&[Some("team-a"); 3]), "n"),
            None,
            "no such label"
        );
        assert_eq!(
            common(&v1(&[Some("team-a"), None, Some("team-a")]), "ns"),
            None
        );
        assert_eq!(common(&v1(&[Some("team-a"), Some("team-b")]), "ns"), None);
        assert_eq!(
            common(&v1(&[Some(""), Some("")]), "ns"),
            None,
            "empty: no tenant"
        );
        assert_eq!(common(&v1(&[]), "ns"), None, "no series");

        // 2.0: labels are references into the symbols.
        let symbols: Vec<String> = [
            "", "__name__", "up", "ns", "team-a", "team-b", "i", "1", "2",
        ]
        .map(String::from)
        .to_vec();
        let series = |refs: Vec<u32>| v2::TimeSeries {
            labels_refs: refs,
            samples: vec![v2::Sample {
                value: 1.0,
                timestamp: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v2_common = |refs: Vec<Vec<u32>>| {
            let body = v2::Request {
                symbols: symbols.clone(),
                timeseries: refs.into_iter().map(series).collect(),
            }
            .encode_to_vec();
            let mut d = DecodedRequest::default();
            d.decode_v2(&body, DecodeLimits::default()).unwrap();
            d.common_label_value(&body, b"ns").map(<[u8]>::to_vec)
        };
        assert_eq!(
            v2_common(vec![vec![1, 2, 6, 7, 3, 4], vec![1, 2, 6, 8, 3, 4]]),
            a
        );
        assert_eq!(
            v2_common(vec![vec![1, 2, 6, 7, 3, 4], vec![1, 2, 6, 8, 3, 5]]),
            None
        );
    }

    #[test]
    fn common_prefix_finds_the_first_difference_at_every_length_and_position() {
        let naive = |a: &[u8], b: &[u8]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        for len in 0..100usize {
            let a: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            // Equal, and either one longer.
            assert_eq!(common_prefix(&a, &a), len);
            let mut longer = a.clone();
            longer.extend_from_slice(b"tail");
            assert_eq!(common_prefix(&a, &longer), len);
            assert_eq!(common_prefix(&longer, &a), len);
            for at in 0..len {
                let mut b = a.clone();
                b[at] ^= 0x40;
                assert_eq!(common_prefix(&a, &b), at, "len {len} at {at}");
                assert_eq!(common_prefix(&b, &a), naive(&b, &a));
                // A second difference further on changes nothing.
                if at + 1 < len {
                    b[len - 1] ^= 0x01;
                    assert_eq!(common_prefix(&a, &b), naive(&a, &b), "len {len} at {at}");
                }
            }
        }
    }

    #[test]
    fn a_varint_filling_its_bytes_reads_as_the_general_reader_reads_it() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..200_000 {
            let n = (next() % 12) as usize;
            let mut bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            // Mostly well-formed (continuation bits as a varint has them), some not.
            if round % 4 != 0 {
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = if i + 1 == n { *b & 0x7f } else { *b | 0x80 };
                }
                if n == 10 && round % 3 == 0 {
                    bytes[9] &= 1;
                }
            }
            let mut r = Reader::new(&bytes, 0, bytes.len());
            let general = match r.varint() {
                Ok(v) if r.is_done() => Some(v),
                _ => None,
            };
            assert_eq!(varint_filling(&bytes), general, "{bytes:02x?}");
        }
    }

    #[test]
    fn all_ascii_agrees_with_the_standard_check_at_every_length_and_position() {
        for len in 0..80 {
            let ascii: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            assert!(all_ascii(&ascii));
            for at in 0..len {
                for high in [0x80u8, 0xc3, 0xff] {
                    let mut b = ascii.clone();
                    b[at] = high;
                    assert_eq!(all_ascii(&b), b.is_ascii(), "len {len} at {at}");
                    assert!(!all_ascii(&b));
                }
            }
        }
    }

    /// A series `{__name__="a"}` with `n` samples of two bytes each (`12 00`: value 0 at
    /// time 0), `series` times.
    fn tiny_samples(series: usize, n: usize) -> Vec<u8> {
        let mut ts = Vec::new();
        crate::wire::pb::put_bytes_field(&mut ts, 1, b"\x0a\x08__name__\x12\x01a");
        for _ in 0..n {
            ts.extend_from_slice(&[0x12, 0x00]);
        }
        let mut body = Vec::new();
        for _ in 0..series {
            crate::wire::pb::put_bytes_field(&mut body, 1, &ts);
        }
        body
    }

    #[test]
    fn a_view_far_larger_than_the_request_is_refused_as_too_large() {
        // 2 MB of two-byte samples would take 24 MB as a view: twelve times.
        let body = tiny_samples(1, 1 << 20);
        let mut d = DecodedRequest::default();
        let err = d.decode(&body, DecodeLimits::default()).unwrap_err();
        assert!(matches!(err, DecodeError::ViewTooLarge { .. }), "{err}");
        assert!(err.is_too_large());
        assert!(
            d.samples.capacity() * std::mem::size_of::<SampleView>()
                <= VIEW_FACTOR * body.len() + VIEW_SLACK,
            "stopped before growing past the limit"
        );
        // Spread over many series, the same.
        let body = tiny_samples(1 << 14, 64);
        let err = d.decode(&body, DecodeLimits::default()).unwrap_err();
        assert!(matches!(err, DecodeError::ViewTooLarge { .. }), "{err}");
        // The same samples in a request of their size decode: small requests have the
        // slack, and a sender's usual samples (value and timestamp) are not tiny.
        let small = tiny_samples(1, 1 << 12);
        d.decode(&small, DecodeLimits::default()).unwrap();
        assert_eq!(d.samples.len(), 1 << 12);
        let usual = WriteRequest {
            timeseries: vec![crate::wire::proto::prometheus::TimeSeries {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "up".into(),
                }],
                samples: (0..200_000)
                    .map(|i| Sample {
                        value: 0.0,
                        timestamp: 1_700_000_000_000 + i,
                    })
                    .collect(),
                ..Default::default()
            }],
            metadata: vec![],
        }
        .encode_to_vec();
        d.decode(&usual, DecodeLimits::default()).unwrap();
        assert_eq!(d.samples.len(), 200_000);
    }

    /// Samples of value 0 (nine bytes each, 2.7 times as a view) decode at any count, on
    /// a fresh decoder and on one earlier requests grew: the limit counts entries, not
    /// what the vectors happen to hold.
    #[test]
    fn the_view_limit_does_not_depend_on_what_earlier_requests_grew() {
        let zeros = |series: usize, per_series: usize| {
            WriteRequest {
                timeseries: (0..series)
                    .map(|i| crate::wire::proto::prometheus::TimeSeries {
                        labels: vec![Label {
                            name: "__name__".into(),
                            value: format!("z{i}"),
                        }],
                        samples: (0..per_series)
                            .map(|t| Sample {
                                value: 0.0,
                                timestamp: 1_700_000_000_000 + t as i64,
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                metadata: vec![],
            }
            .encode_to_vec()
        };
        let mut warm = DecodedRequest::default();
        for (series, per_series) in [(1, 70_000), (1, 200_000), (1, 300_000), (5_000, 100)] {
            let body = zeros(series, per_series);
            let mut fresh = DecodedRequest::default();
            for d in [&mut fresh, &mut warm] {
                d.decode(&body, DecodeLimits::default())
                    .unwrap_or_else(|e| panic!("{series} x {per_series}: {e}"));
                assert_eq!(d.samples.len(), series * per_series);
            }
        }
    }

    /// Metadata entries of two bytes (`1a 00`) take eighteen times as a view: a request
    /// of nothing else is refused too.
    #[test]
    fn a_request_of_tiny_metadata_is_refused() {
        let body = [0x1a, 0x00].repeat(1 << 20);
        let mut d = DecodedRequest::default();
        let err = d.decode(&body, DecodeLimits::default()).unwrap_err();
        assert!(matches!(err, DecodeError::ViewTooLarge { .. }), "{err}");
    }

    /// Series in the shape the fast path reads but breaking a rule it checks after its
    /// loop (an empty value, names out of order, a name twice, an empty name) go to the
    /// general decoder: not canonical, sorted, or refused, as that decoder decides.
    #[test]
    fn short_labels_breaking_a_rule_are_left_to_the_general_decoder() {
        // Every label as 0x0a LEN 0x0a NL name 0x12 VL value, whatever its lengths.
        fn series(labels: &[(&str, &str)]) -> Vec<u8> {
            let mut ts = Vec::new();
            for (n, v) in labels {
                ts.extend([0x0a, (4 + n.len() + v.len()) as u8, 0x0a, n.len() as u8]);
                ts.extend(n.as_bytes());
                ts.extend([0x12, v.len() as u8]);
                ts.extend(v.as_bytes());
            }
            ts.extend([0x12, 11, 0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 1]);
            let mut body = vec![0x0a, ts.len() as u8];
            body.extend(ts);
            body
        }
        let decode = |labels: &[(&str, &str)]| {
            let body = series(labels);
            let mut d = DecodedRequest::default();
            d.decode(&body, DecodeLimits::default()).map(|()| {
                let s = d.series[0];
                let names: Vec<String> = d.labels[s.labels.usize()]
                    .iter()
                    .map(|l| l.name.str(&body).to_owned())
                    .collect();
                (s.canonical, names)
            })
        };
        let (canonical, _) = decode(&[("__name__", "up"), ("job", "a")]).unwrap();
        assert!(canonical, "the usual shape");
        let (canonical, _) = decode(&[("__name__", "up"), ("job", "")]).unwrap();
        assert!(!canonical, "an empty value");
        let (canonical, names) = decode(&[("__name__", "up"), ("b", "1"), ("a", "2")]).unwrap();
        assert!(!canonical, "names out of order");
        assert_eq!(names, ["__name__", "a", "b"]);
        assert!(matches!(
            decode(&[("__name__", "up"), ("a", "1"), ("a", "2")]),
            Err(DecodeError::DuplicateLabel(_))
        ));
        assert!(matches!(
            decode(&[("", "x"), ("__name__", "up")]),
            Err(DecodeError::EmptyLabelName)
        ));
    }

    #[test]
    fn a_label_value_over_the_limit_is_refused_at_every_limit() {
        let value = [b'v'; 100];
        for (limit, len, ok) in [
            (16, 16, true),
            (16, 17, false),
            (99, 100, false),
            (100, 100, true),
            (127, 100, true),
            (64 << 10, 100, true),
        ] {
            let body = encode(
                vec![vec![(b"__name__", b"up"), (b"job", &value[..len])]],
                &[(1.0, 1)],
            );
            let limits = DecodeLimits {
                max_label_value_bytes: limit,
                ..DecodeLimits::default()
            };
            let got = DecodedRequest::default().decode(&body, limits);
            match got {
                Ok(()) => assert!(ok, "limit {limit}, value of {len}: accepted"),
                Err(DecodeError::LabelValueTooLong { len: l, .. }) => {
                    assert!(!ok && l == len, "limit {limit}, value of {len}: refused")
                }
                Err(e) => panic!("limit {limit}, value of {len}: {e}"),
            }
        }
    }

    fn encode(series: Vec<Vec<(&[u8], &[u8])>>, samples: &[(f64, i64)]) -> Vec<u8> {
        // prost's `Label` holds Strings: build the bytes by hand for non-UTF-8 cases.
        let mut out = Vec::new();
        for labels in series {
            let mut ts = Vec::new();
            for (n, v) in labels {
                let mut l = Vec::new();
                if !n.is_empty() {
                    crate::wire::pb::put_bytes_field(&mut l, 1, n);
                }
                if !v.is_empty() {
                    crate::wire::pb::put_bytes_field(&mut l, 2, v);
                }
                crate::wire::pb::put_bytes_field(&mut ts, 1, &l);
            }
            for (v, t) in samples {
                let s = Sample {
                    value: *v,
                    timestamp: *t,
                };
                crate::wire::pb::put_bytes_field(&mut ts, 2, &s.encode_to_vec());
            }
            crate::wire::pb::put_bytes_field(&mut out, 1, &ts);
        }
        out
    }

    fn decode(buf: &[u8], limits: DecodeLimits) -> Result<DecodedRequest, DecodeError> {
        let mut d = DecodedRequest::default();
        d.decode(buf, limits).map(|()| d)
    }

    fn labels_of(d: &DecodedRequest, buf: &[u8], i: usize) -> Vec<(String, String)> {
        d.labels[d.series[i].labels.usize()]
            .iter()
            .map(|l| (l.name.str(buf).to_owned(), l.value.str(buf).to_owned()))
            .collect()
    }

    #[test]
    fn the_fast_and_the_general_path_agree_with_prost() {
        let long = "x".repeat(200);
        let cases: Vec<Vec<(&[u8], &[u8])>> = vec![
            // sorted, ASCII, short: the fast path
            vec![(b"__name__", b"up"), (b"instance", b"a:1"), (b"job", b"j")],
            // unsorted: sorted by the general path
            vec![(b"job", b"j"), (b"__name__", b"up")],
            // a value of 200 bytes (two-byte lengths)
            vec![(b"__name__", b"up"), (b"v", long.as_bytes())],
            // UTF-8 outside ASCII
            vec![(b"__name__", b"up"), (b"v", "\u{e9}t\u{e9}".as_bytes())],
            // an empty value (the field left out)
            vec![(b"__name__", b"up"), (b"empty", b""), (b"z", b"1")],
            // names sharing their first bytes
            vec![(b"__name__", b"up"), (b"gpu", b"0"), (b"gpu_uuid", b"u")],
        ];
        for labels in cases {
            let samples = [(1.5, 1_700_000_000_123), (0.0, 1_700_000_015_123), (2.0, 0)];
            let buf = encode(vec![labels.clone()], &samples);
            let d = decode(&buf, DecodeLimits::default()).unwrap();
            let oracle = WriteRequest::decode(&buf[..]).unwrap();
            let mut want: Vec<(String, String)> = oracle.timeseries[0]
                .labels
                .iter()
                .map(|l: &Label| (l.name.clone(), l.value.clone()))
                .collect();
            want.sort();
            assert_eq!(labels_of(&d, &buf, 0), want, "{labels:?}");
            let got: Vec<(u64, i64)> = d
                .samples
                .iter()
                .map(|s| (s.value_bits, s.timestamp))
                .collect();
            let want: Vec<(u64, i64)> = oracle.timeseries[0]
                .samples
                .iter()
                .map(|s| (s.value.to_bits(), s.timestamp))
                .collect();
            assert_eq!(got, want);
            let sorted = labels.windows(2).all(|w| w[0].0 < w[1].0);
            let no_empty = labels.iter().all(|(_, v)| !v.is_empty());
            assert_eq!(d.series[0].canonical, sorted && no_empty, "{labels:?}");
            assert_eq!(d.series[0].name.str(&buf), "up");
        }
    }

    #[test]
    fn the_fast_path_leaves_every_error_to_the_general_one() {
        let dup = encode(
            vec![vec![(b"__name__", b"up"), (b"a", b"1"), (b"a", b"2")]],
            &[],
        );
        assert!(matches!(
            decode(&dup, DecodeLimits::default()),
            Err(DecodeError::DuplicateLabel(n)) if n == "a"
        ));
        let bad_utf8 = encode(vec![vec![(b"__name__", b"up"), (b"v", &[0xff, 0xfe])]], &[]);
        assert!(matches!(
            decode(&bad_utf8, DecodeLimits::default()),
            Err(DecodeError::InvalidUtf8)
        ));
        let no_name = encode(vec![vec![(b"job", b"j")]], &[(1.0, 1)]);
        assert!(matches!(
            decode(&no_name, DecodeLimits::default()),
            Err(DecodeError::MissingMetricName)
        ));
        let ok = encode(
            vec![vec![(b"__name__", b"up"), (b"a", b"12345")]],
            &[(1.0, 1)],
        );
        let tight = DecodeLimits {
            max_label_value_bytes: 4,
            ..DecodeLimits::default()
        };
        assert!(matches!(
            decode(&ok, tight),
            Err(DecodeError::LabelValueTooLong {
                len: 5,
                limit: 4,
                ..
            })
        ));
        let few = DecodeLimits {
            max_labels_per_series: 1,
            ..DecodeLimits::default()
        };
        assert!(matches!(
            decode(&ok, few),
            Err(DecodeError::TooManyLabels(1))
        ));
        // Cut anywhere, a series is an error or fewer complete series, never a panic.
        for cut in 0..ok.len() {
            let _ = decode(&ok[..cut], DecodeLimits::default());
        }
    }

    #[test]
    fn label_name_order_and_the_metric_name_test() {
        assert!(name_less(b"", b"a"));
        assert!(!name_less(b"a", b""));
        assert!(name_less(b"gpu", b"gpu_uuid"));
        assert!(!name_less(b"gpu", b"gpu"));
        assert!(name_less(b"__name__", b"instance"));
        assert!(!name_less(b"b", b"a"));
        let long_a = b"instance=10.0.3.17:8000,namespace=serving-a";
        let long_b = b"instance=10.0.3.17:8000,namespace=serving-b";
        assert!(short_eq(long_a, long_a) && !short_eq(long_a, long_b));
        assert!(!short_eq(&long_a[..16], &long_b[..17]));
        assert!(short_eq(&long_a[..17], &long_b[..17]));
        for (a, b) in [
            (&b"gpu"[..], &b"gpu_uuid"[..]),
            (b"a", b"b"),
            (b"x", b"x"),
            (b"", b""),
        ] {
            assert_eq!(name_cmp(a, b), a.cmp(b));
            assert_eq!(name_cmp(b, a), b.cmp(a));
            assert_eq!(short_eq(a, b), a == b);
        }
        // Every length up to three words, a difference at every position.
        let base: Vec<u8> = (0..24u8).map(|i| b'a' + i).collect();
        for n in 0..=base.len() {
            assert!(short_eq(&base[..n], &base[..n]));
            for at in 0..n {
                let mut other = base[..n].to_vec();
                other[at] ^= 0x20;
                assert!(!short_eq(&base[..n], &other), "length {n}, byte {at}");
            }
            if n > 0 {
                assert!(!short_eq(&base[..n], &base[..n - 1]));
            }
        }
        assert!(is_metric_name(b"__name__"));
        assert!(!is_metric_name(b"instance"));
        assert!(!is_metric_name(b"__name"));
    }
}
