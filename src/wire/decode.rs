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
    /// The metric type of the series' own 2.0 metadata (`MetricMetadata` numbering);
    /// 0 when unknown, always for 1.0 input.
    pub metric_type: u8,
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
    /// Some sample or histogram carries a start timestamp (2.0 only).
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
}

impl DecodedRequest {
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
    }

    pub fn sample_count(&self) -> usize {
        self.samples.len()
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
        let mut v2_fields = false;
        let mut r = Reader::new(buf, 0, buf.len());
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
        let labels_start = self.labels.len() as u32;
        let samples_start = self.samples.len() as u32;
        let exemplars_start = self.exemplars.len() as u32;
        let hist_start = self.histograms.len() as u32;
        // Exemplar labels are appended to `labels` too, so the series' own labels are
        // collected first and exemplars decoded in a second pass.
        let mut has_exemplars = false;
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match field {
                1 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.labels")?;
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
                }
                2 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.samples")?;
                    let (s, e) = r.len_delimited()?;
                    self.samples.push(decode_sample(buf, s, e)?);
                }
                3 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.exemplars")?;
                    r.len_delimited()?;
                    has_exemplars = true;
                }
                4 => {
                    r.expect(wire, WIRE_LEN, "TimeSeries.histograms")?;
                    let (s, e) = r.len_delimited()?;
                    let (timestamp, schema) = decode_histogram_timestamp(buf, s, e)?;
                    self.has_nhcb |= schema == super::histogram::CUSTOM_BUCKETS_SCHEMA;
                    self.histograms.push(HistogramView {
                        raw: Span::new(s, e),
                        timestamp,
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
        let (name, canonical) = check_labels(buf, &mut self.labels[labels.usize()])?;

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
            metric_type,
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
        self.metadata.push(md);
        Ok(())
    }
}

#[inline]
pub(super) fn utf8(buf: &[u8], s: usize, e: usize) -> Result<(), DecodeError> {
    let bytes = &buf[s..e];
    // Label names and values are almost always ASCII: a word-wise check, no call.
    if bytes.is_ascii() {
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
            if value_end == b.len() && b.is_ascii() {
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

#[inline]
fn decode_sample(buf: &[u8], start: usize, end: usize) -> Result<SampleView, DecodeError> {
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

            _ => r.skip(wire)?,
        }
    }
    Ok(SampleView {
        value_bits,
        timestamp,
        start_timestamp: 0,
    })
}

/// Walks a native histogram (checking it is well-formed) and returns its timestamp and
/// schema.
fn decode_histogram_timestamp(
    buf: &[u8],
    start: usize,
    end: usize,
) -> Result<(i64, i32), DecodeError> {
    // A histogram is forwarded as its original bytes, so every field is checked here as
    // a protobuf decoder would: a malformed one would make the backend refuse the whole
    // request (found by tests/fuzz.rs).
    let mut timestamp = 0i64;
    let mut schema = 0i32;
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
            _ => r.skip(wire)?,
        }
    }
    Ok((timestamp, schema))
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

/// `a < b` by bytes; label names of one series nearly always differ in their first byte,
/// which decides without a call to `memcmp`.
#[inline(always)]
fn name_less(a: &[u8], b: &[u8]) -> bool {
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x != y => x < y,
        _ => a < b,
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
        .find(|l| l.name.bytes(buf) == b"__name__")
        .map(|l| l.value)
        .filter(|v| !v.is_empty())
        .ok_or(DecodeError::MissingMetricName)?;
    Ok((name, sorted && !has_empty_value))
}
