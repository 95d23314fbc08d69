//! Encodes `prometheus.WriteRequest` bytes directly into reusable buffers.

use super::decode::Span;
use super::pb::{
    WIRE_I64, WIRE_LEN, WIRE_VARINT, put_bytes_field, put_key, put_varint, varint_len,
};

/// Field numbers of `WriteRequest`.
pub const FIELD_TIMESERIES: u32 = 1;
pub const FIELD_METADATA: u32 = 3;

/// Appends a series whose encoded bytes are forwarded unchanged.
#[inline]
pub fn write_raw_series(out: &mut Vec<u8>, raw: &[u8]) {
    put_bytes_field(out, FIELD_TIMESERIES, raw);
}

#[inline]
fn label_len(name: &[u8], value: &[u8]) -> usize {
    let mut n = 0;
    if !name.is_empty() {
        n += 1 + varint_len(name.len() as u64) + name.len();
    }
    if !value.is_empty() {
        n += 1 + varint_len(value.len() as u64) + value.len();
    }
    n
}

#[inline]
fn put_label(out: &mut Vec<u8>, field: u32, name: &[u8], value: &[u8]) {
    // The common shape, every length one byte: one reservation, four copies.
    let len = 4 + name.len() + value.len();
    if field < 16 && !name.is_empty() && !value.is_empty() && len < 0x80 {
        out.reserve(len + 2);
        out.extend_from_slice(&[
            (field << 3) as u8 | WIRE_LEN,
            len as u8,
            0x0a,
            name.len() as u8,
        ]);
        out.extend_from_slice(name);
        out.extend_from_slice(&[0x12, value.len() as u8]);
        out.extend_from_slice(value);
        return;
    }
    put_key(out, field, WIRE_LEN);
    put_varint(out, label_len(name, value) as u64);
    if !name.is_empty() {
        put_bytes_field(out, 1, name);
    }
    if !value.is_empty() {
        put_bytes_field(out, 2, value);
    }
}

/// Appends one `Label` as field 1 of a `TimeSeries` (the shape of a series' label list).
/// Where in `buf` label (`name`, `value`) already stands encoded exactly as
/// [`SeriesWriter::label`] would write it (key, length, name field, value field, every
/// length one byte): the bytes to copy instead. Checked byte by byte, so any input
/// qualifies only if the copy is identical to a fresh encoding.
#[inline]
pub fn encoded_label_at(buf: &[u8], name: Span, value: Span) -> Option<(usize, usize)> {
    let (ns, ve) = (name.start as usize, value.end as usize);
    let label = super::decode::short_label_at(buf, ns.checked_sub(4)?)?;
    (label.name == (ns..name.end as usize)
        && label.value == (value.start as usize..ve)
        && !label.name.is_empty()
        && !label.value.is_empty())
    .then_some((ns - 4, ve))
}

/// The labels of the previous series written through it, encoded, for a 2.0 request,
/// whose labels are spans into its symbols table: a label at the same position with the
/// same name and value spans (the same symbols, so the same bytes) is copied from there
/// instead of encoded again, neighbours in one copy. Consecutive series mostly share all
/// but one or two labels (a family's buckets, a target's series). Keys are spans into one
/// request's buffer: [`LabelMemo::clear`] before each request.
#[derive(Default)]
pub struct LabelMemo {
    prev: MemoSeries,
    cur: MemoSeries,
}

/// One series' labels in a [`LabelMemo`]: label `k`'s key and the end of its encoding
/// in `bytes`.
#[derive(Default)]
struct MemoSeries {
    labels: Vec<(LabelKey, u32)>,
    bytes: Vec<u8>,
}

/// A label as spans of the request buffer, name start, name end, value start and value
/// end from the high bits down ([`label_key`]); [`NO_KEY`] for a label that is not.
pub type LabelKey = u128;

/// The key of a label that is not spans of the request buffer: never equal to one that
/// is (a label's name is never empty, so its end differs from its start).
pub const NO_KEY: LabelKey = 0;

/// The [`LabelKey`] of a label whose name and value are `name` and `value` of the request.
#[inline(always)]
pub fn label_key(name: Span, value: Span) -> LabelKey {
    (u128::from(name.start) << 96)
        | (u128::from(name.end) << 64)
        | (u128::from(value.start) << 32)
        | u128::from(value.end)
}

impl LabelMemo {
    pub fn clear(&mut self) {
        self.prev.clear();
        self.cur.clear();
    }
}

impl MemoSeries {
    fn clear(&mut self) {
        self.labels.clear();
        self.bytes.clear();
    }
}

#[inline]
pub fn write_series_label(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    put_label(out, 1, name, value);
}

/// Builds one `TimeSeries` message in a scratch buffer, then appends it with its key and
/// length. Callers must add labels first, sorted, then samples, exemplars, histograms.
pub struct SeriesWriter<'a> {
    body: &'a mut Vec<u8>,
}

impl<'a> SeriesWriter<'a> {
    pub fn new(scratch: &'a mut Vec<u8>) -> Self {
        scratch.clear();
        SeriesWriter { body: scratch }
    }

    #[inline]
    pub fn label(&mut self, name: &[u8], value: &[u8]) {
        put_label(self.body, 1, name, value);
    }

    /// Appends a series' `count` labels, in order, through `memo` (see [`LabelMemo`]):
    /// label `k` has key `key(k)` and is (name, value) `bytes(k)`, read only when it is
    /// encoded.
    #[inline]
    pub fn labels_memo<'l>(
        &mut self,
        memo: &mut LabelMemo,
        count: usize,
        key: impl Fn(usize) -> LabelKey,
        bytes: impl Fn(usize) -> (&'l [u8], &'l [u8]),
    ) {
        let start = self.body.len();
        let (prev, cur) = (&memo.prev, &mut memo.cur);
        cur.clear();
        // A run of labels copied from the previous series: `prev.bytes[from..to]`.
        let mut run: Option<(usize, usize)> = None;
        let mut from = 0usize;
        let mut written = 0usize;
        for k in 0..count {
            let key = key(k);
            match prev.labels.get(k) {
                Some(&(seen, to)) if seen == key && key != NO_KEY => {
                    let to = to as usize;
                    match &mut run {
                        Some((_, run_to)) if *run_to == from => *run_to = to,
                        _ => {
                            if let Some((a, b)) = run.replace((from, to)) {
                                self.body.extend_from_slice(&prev.bytes[a..b]);
                            }
                        }
                    }
                    written += to - from;
                }
                _ => {
                    if let Some((a, b)) = run.take() {
                        self.body.extend_from_slice(&prev.bytes[a..b]);
                    }
                    let (name, value) = bytes(k);
                    put_label(self.body, 1, name, value);
                    written = self.body.len() - start;
                }
            }
            // Where the previous series' label k + 1 starts.
            from = prev.labels.get(k).map_or(0, |l| l.1 as usize);
            cur.labels.push((key, written as u32));
        }
        if let Some((a, b)) = run {
            self.body.extend_from_slice(&prev.bytes[a..b]);
        }
        cur.bytes.extend_from_slice(&self.body[start..]);
        std::mem::swap(&mut memo.prev, &mut memo.cur);
    }

    /// Appends labels already encoded by [`write_series_label`], in order.
    #[inline]
    pub fn raw_labels(&mut self, encoded: &[u8]) {
        self.body.extend_from_slice(encoded);
    }

    #[inline]
    pub fn sample(&mut self, value_bits: u64, timestamp: i64) {
        let mut len = 0;
        if value_bits != 0 {
            len += 9;
        }
        if timestamp != 0 {
            len += 1 + varint_len(timestamp as u64);
        }
        put_key(self.body, 2, WIRE_LEN);
        put_varint(self.body, len as u64);
        if value_bits != 0 {
            put_key(self.body, 1, WIRE_I64);
            self.body.extend_from_slice(&value_bits.to_le_bytes());
        }
        if timestamp != 0 {
            put_key(self.body, 2, WIRE_VARINT);
            put_varint(self.body, timestamp as u64);
        }
    }

    /// Writes a sample with its 2.0 start timestamp, when it has one, as `Sample` field 3
    /// (2.0's numbering; promnorm's 1.0 bodies leave it out, see `encode_v2::strip_v2`).
    #[inline]
    pub fn sample_view(&mut self, s: &super::decode::SampleView) {
        if s.start_timestamp == 0 {
            return self.sample(s.value_bits, s.timestamp);
        }
        let mut len = 1 + varint_len(s.start_timestamp as u64);
        if s.value_bits != 0 {
            len += 9;
        }
        if s.timestamp != 0 {
            len += 1 + varint_len(s.timestamp as u64);
        }
        put_key(self.body, 2, WIRE_LEN);
        put_varint(self.body, len as u64);
        if s.value_bits != 0 {
            put_key(self.body, 1, WIRE_I64);
            self.body.extend_from_slice(&s.value_bits.to_le_bytes());
        }
        if s.timestamp != 0 {
            put_key(self.body, 2, WIRE_VARINT);
            put_varint(self.body, s.timestamp as u64);
        }
        put_key(self.body, 3, WIRE_VARINT);
        put_varint(self.body, s.start_timestamp as u64);
    }

    /// Writes an exemplar; `labels` yields (name, value) pairs.
    pub fn exemplar<'l, I>(&mut self, labels: I, value_bits: u64, timestamp: i64)
    where
        I: Iterator<Item = (&'l [u8], &'l [u8])> + Clone,
    {
        let mut len = 0;
        for (n, v) in labels.clone() {
            let l = label_len(n, v);
            len += 1 + varint_len(l as u64) + l;
        }
        if value_bits != 0 {
            len += 9;
        }
        if timestamp != 0 {
            len += 1 + varint_len(timestamp as u64);
        }
        put_key(self.body, 3, WIRE_LEN);
        put_varint(self.body, len as u64);
        for (n, v) in labels {
            put_label(self.body, 1, n, v);
        }
        if value_bits != 0 {
            put_key(self.body, 2, WIRE_I64);
            self.body.extend_from_slice(&value_bits.to_le_bytes());
        }
        if timestamp != 0 {
            put_key(self.body, 3, WIRE_VARINT);
            put_varint(self.body, timestamp as u64);
        }
    }

    #[inline]
    pub fn histogram_raw(&mut self, raw: &[u8]) {
        put_bytes_field(self.body, 4, raw);
    }

    pub fn finish(self, out: &mut Vec<u8>) {
        put_bytes_field(out, FIELD_TIMESERIES, self.body);
    }
}

/// Appends a `MetricMetadata` message.
pub fn write_metadata(
    out: &mut Vec<u8>,
    metric_type: i32,
    family: &[u8],
    help: &[u8],
    unit: &[u8],
) {
    let mut len = 0;
    if metric_type != 0 {
        len += 1 + varint_len(metric_type as u64);
    }
    for s in [family, help, unit] {
        if !s.is_empty() {
            len += 1 + varint_len(s.len() as u64) + s.len();
        }
    }
    put_key(out, FIELD_METADATA, WIRE_LEN);
    put_varint(out, len as u64);
    if metric_type != 0 {
        put_key(out, 1, WIRE_VARINT);
        put_varint(out, metric_type as u64);
    }
    if !family.is_empty() {
        put_bytes_field(out, 2, family);
    }
    if !help.is_empty() {
        put_bytes_field(out, 4, help);
    }
    if !unit.is_empty() {
        put_bytes_field(out, 5, unit);
    }
}

/// Appends a metadata message whose bytes are forwarded unchanged.
#[inline]
pub fn write_raw_metadata(out: &mut Vec<u8>, raw: &[u8]) {
    put_bytes_field(out, FIELD_METADATA, raw);
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Series after series, labels written through the memo are byte for byte what
        /// encoding each label writes, whatever the previous series had at that position
        /// (same spans, other spans, no spans, more or fewer labels).
        #[test]
        fn the_memo_writes_what_encoding_writes(
            series in proptest::collection::vec(
                proptest::collection::vec((0usize..5, 0usize..6, proptest::bool::ANY), 0..12),
                1..30,
            ),
        ) {
            // A request buffer: names and values at fixed spans; value 5 is 200 bytes.
            let long = "v".repeat(200);
            let names = ["__name__", "job", "le", "instance", "pod"];
            let values = ["up", "a", "0.5", "10.0.0.1:9000", "x", long.as_str()];
            let mut buf = Vec::new();
            let mut at = |s: &str| {
                let start = buf.len() as u32;
                buf.extend_from_slice(s.as_bytes());
                Span { start, end: buf.len() as u32 }
            };
            let name_spans: Vec<Span> = names.iter().map(|n| at(n)).collect();
            let value_spans: Vec<Span> = values.iter().map(|v| at(v)).collect();
            let mut memo = LabelMemo::default();
            let (mut body, mut want) = (Vec::new(), Vec::new());
            for labels in &series {
                let mut w = SeriesWriter::new(&mut body);
                w.labels_memo(
                    &mut memo,
                    labels.len(),
                    |k| {
                        let (n, v, keyed) = labels[k];
                        if keyed { label_key(name_spans[n], value_spans[v]) } else { NO_KEY }
                    },
                    |k| (names[labels[k].0].as_bytes(), values[labels[k].1].as_bytes()),
                );
                want.clear();
                for &(n, v, _) in labels {
                    write_series_label(&mut want, names[n].as_bytes(), values[v].as_bytes());
                }
                proptest::prop_assert_eq!(&body, &want);
            }
        }
    }

    fn fresh(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_series_label(&mut out, name, value);
        out
    }

    #[test]
    fn a_label_is_copied_only_where_its_bytes_equal_a_fresh_encoding() {
        let enc = fresh(b"job", b"vllm");
        let (name, value) = (Span::new(4, 7), Span::new(9, 13));
        assert_eq!(encoded_label_at(&enc, name, value), Some((0, enc.len())));
        // The same name and value inside a `Label` with one more field: its length
        // byte differs, so it is encoded afresh, not copied.
        let mut extra = enc.clone();
        extra[1] += 2;
        extra.extend_from_slice(&[0x18, 0x01]);
        assert_eq!(encoded_label_at(&extra, name, value), None);
        // Name and value not next to each other, spans at the buffer's start, empty ones.
        assert_eq!(encoded_label_at(&enc, name, Span::new(10, 13)), None);
        assert_eq!(encoded_label_at(&enc, Span::new(0, 3), value), None);
        assert_eq!(encoded_label_at(&enc, Span::new(4, 4), value), None);
        assert_eq!(encoded_label_at(&enc, name, Span::new(13, 40)), None);
    }
}
