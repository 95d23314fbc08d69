//! Encodes `prometheus.WriteRequest` bytes directly into reusable buffers.

use super::decode::Span;
use super::pb::{
    WIRE_I64, WIRE_LEN, WIRE_VARINT, put_bytes_field, put_key, put_varint, put_varint_at,
    varint_len,
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

/// The labels of the previous series written through it, for a 2.0 request, whose
/// labels are spans into its symbols table: a label at the same position with the same
/// name and value spans (the same symbols, so the same bytes) is copied from where the
/// previous series' encoding stands in the output instead of encoded again, neighbours
/// in one copy. Consecutive series mostly share all but one or two labels (a family's
/// buckets, a target's series). Keys are spans into one request's buffer, positions are
/// offsets into one output buffer: [`LabelMemo::clear`] before each request, and use one
/// memo with one output buffer, either series written in place
/// ([`SeriesWriter::labels_memo`]) or a buffer of label sets ([`LabelMemo::append_set`]).
#[derive(Default)]
pub struct LabelMemo {
    /// The previous series' labels: label `k`'s key and the end of its encoding,
    /// relative to `prev_at`.
    prev: Vec<(LabelKey, u32)>,
    /// Where the previous series' labels start in the output.
    prev_at: usize,
    /// Where the previous series' labels end in the output: an output now shorter than
    /// that was cleared or cut and no longer holds them (checked; an output cut and
    /// grown again is not, so one memo serves one output that only grows, cleared with it).
    settled_len: usize,
    /// The labels of the series being written, settled by [`SeriesWriter::close_memo`].
    cur: Vec<(LabelKey, u32)>,
    /// Where `cur`'s labels start in the series' body; `None` when they were not
    /// written in place (nothing later can be copied from them).
    cur_offset: Option<usize>,
}

impl LabelMemo {
    /// Bytes its vectors hold between requests.
    pub fn retained_bytes(&self) -> usize {
        super::held(&self.prev) + super::held(&self.cur)
    }
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
    /// Appends `count` labels to `out` (label `k`: key `key(k)`, (name, value)
    /// `bytes(k)`, read only when it is encoded), copying those the previous labels
    /// share at the same position from where they stand in `out`, and records them in
    /// `cur` (settled by the caller). The previous labels are forgotten first when `out`
    /// is shorter than their end (cut off since).
    #[inline]
    fn append_labels<'l>(
        &mut self,
        out: &mut Vec<u8>,
        count: usize,
        key: impl Fn(usize) -> LabelKey,
        bytes: impl Fn(usize) -> (&'l [u8], &'l [u8]),
    ) {
        let start = out.len();
        if start < self.settled_len {
            self.prev.clear();
        }
        let base = self.prev_at;
        let (prev, cur) = (&self.prev, &mut self.cur);
        cur.clear();
        // A run of labels copied from the previous series: `base + a .. base + b`.
        let mut run: Option<(usize, usize)> = None;
        let mut from = 0usize;
        let mut written = 0usize;
        for k in 0..count {
            let key = key(k);
            match prev.get(k) {
                Some(&(seen, to)) if seen == key && key != NO_KEY => {
                    let to = to as usize;
                    match &mut run {
                        Some((_, run_to)) if *run_to == from => *run_to = to,
                        _ => {
                            if let Some((a, b)) = run.replace((from, to)) {
                                out.extend_from_within(base + a..base + b);
                            }
                        }
                    }
                    written += to - from;
                }
                _ => {
                    if let Some((a, b)) = run.take() {
                        out.extend_from_within(base + a..base + b);
                    }
                    let (name, value) = bytes(k);
                    put_label(out, 1, name, value);
                    written = out.len() - start;
                }
            }
            // Where the previous series' label k + 1 starts.
            from = prev.get(k).map_or(0, |l| l.1 as usize);
            cur.push((key, written as u32));
        }
        if let Some((a, b)) = run {
            out.extend_from_within(base + a..base + b);
        }
    }

    /// Appends one label set to `out` as [`write_series_label`] would, one label after
    /// another, copying the labels it shares at the same position with the set appended
    /// before (see [`LabelMemo`]): for a buffer of label sets, which grows by one set after
    /// another and is cut only back to where the last one started. Returns where the set
    /// starts.
    #[inline]
    pub fn append_set<'l>(
        &mut self,
        out: &mut Vec<u8>,
        count: usize,
        key: impl Fn(usize) -> LabelKey,
        bytes: impl Fn(usize) -> (&'l [u8], &'l [u8]),
    ) -> usize {
        let start = out.len();
        self.append_labels(out, count, key, bytes);
        std::mem::swap(&mut self.prev, &mut self.cur);
        self.prev_at = start;
        self.settled_len = out.len();
        start
    }

    pub fn clear(&mut self) {
        self.prev.clear();
        self.cur.clear();
        self.prev_at = 0;
        self.settled_len = 0;
        self.cur_offset = None;
    }
}

#[inline]
pub fn write_series_label(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    put_label(out, 1, name, value);
}

/// Builds one `TimeSeries` message, in a scratch buffer then appended with its key and
/// length ([`SeriesWriter::new`], [`SeriesWriter::finish`]), or straight in the output
/// ([`SeriesWriter::in_place`], [`SeriesWriter::close`]). Callers must add labels first,
/// sorted, then samples, exemplars, histograms.
pub struct SeriesWriter<'a> {
    body: &'a mut Vec<u8>,
    /// In place: where the series' body starts in `body` (its key and a two-byte length
    /// stand before it).
    in_place_at: Option<usize>,
}

/// A series' key and a placeholder of two length bytes: bodies of 128 bytes to 16 KiB,
/// the usual size, need no move when the length is written.
const IN_PLACE_HEADER: usize = 3;

impl<'a> SeriesWriter<'a> {
    pub fn new(scratch: &'a mut Vec<u8>) -> Self {
        scratch.clear();
        SeriesWriter {
            body: scratch,
            in_place_at: None,
        }
    }

    /// Writes one `TimeSeries` (field 1 of a `WriteRequest`) straight at the end of
    /// `out`, with no scratch buffer and no copy of its body; [`SeriesWriter::close`]
    /// writes its length.
    pub fn in_place(out: &'a mut Vec<u8>) -> Self {
        out.extend_from_slice(&[(FIELD_TIMESERIES << 3) as u8 | WIRE_LEN, 0x80, 0x00]);
        let at = out.len();
        SeriesWriter {
            body: out,
            in_place_at: Some(at),
        }
    }

    #[inline]
    pub fn label(&mut self, name: &[u8], value: &[u8]) {
        put_label(self.body, 1, name, value);
    }

    /// Appends a series' `count` labels, in order, through `memo` (see [`LabelMemo`]):
    /// label `k` has key `key(k)` and is (name, value) `bytes(k)`, read only when it is
    /// encoded. Only in place, as the series' first field; end the series with
    /// [`SeriesWriter::close_memo`].
    #[inline]
    pub fn labels_memo<'l>(
        &mut self,
        memo: &mut LabelMemo,
        count: usize,
        key: impl Fn(usize) -> LabelKey,
        bytes: impl Fn(usize) -> (&'l [u8], &'l [u8]),
    ) {
        let start = self.body.len();
        if self.in_place_at != Some(start) {
            // Not the first field of a series in this output: nothing to copy from.
            memo.prev.clear();
        }
        memo.cur_offset = self.in_place_at.map(|at| start - at);
        memo.append_labels(self.body, count, key, bytes);
    }

    /// Appends fields already encoded as this message's, in order: labels written by
    /// [`write_series_label`], or a series' samples as a 2.0 input holds them
    /// (`SeriesView::samples_raw`).
    #[inline]
    pub fn raw_fields(&mut self, encoded: &[u8]) {
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

    /// Appends the series built in the scratch buffer to `out`.
    pub fn finish(self, out: &mut Vec<u8>) {
        debug_assert!(self.in_place_at.is_none(), "an in-place series is closed");
        put_bytes_field(out, FIELD_TIMESERIES, self.body);
    }

    /// Ends a series begun [`SeriesWriter::in_place`]: writes its length, moving the
    /// body only when that length is not two bytes long. Returns where the body starts.
    pub fn close(self) -> usize {
        let Some(at) = self.in_place_at else {
            unreachable!("close ends an in-place series");
        };
        let out = self.body;
        let len = out.len() - at;
        let len_at = at - (IN_PLACE_HEADER - 1);
        let body_at = len_at + varint_len(len as u64);
        if body_at < at {
            out.copy_within(at.., body_at);
            out.truncate(body_at + len);
        } else if body_at > at {
            out.resize(body_at + len, 0);
            out.copy_within(at..at + len, body_at);
        }
        put_varint_at(out, len_at, len as u64);
        body_at
    }

    /// [`SeriesWriter::close`] for a series whose labels went through `memo`: the next
    /// series' labels are copied from where these now stand.
    pub fn close_memo(self, memo: &mut LabelMemo) {
        let at = self.close();
        let Some(offset) = memo.cur_offset.take() else {
            memo.prev.clear();
            return;
        };
        std::mem::swap(&mut memo.prev, &mut memo.cur);
        memo.prev_at = at + offset;
        // The end of these labels: an output cut shorter no longer holds them.
        memo.settled_len = at + memo.prev.last().map_or(0, |l| l.1 as usize);
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
            let (mut out, mut want) = (vec![0xeeu8; 7], Vec::new());
            for labels in &series {
                let start = out.len();
                let mut w = SeriesWriter::in_place(&mut out);
                w.labels_memo(
                    &mut memo,
                    labels.len(),
                    |k| {
                        let (n, v, keyed) = labels[k];
                        if keyed { label_key(name_spans[n], value_spans[v]) } else { NO_KEY }
                    },
                    |k| (names[labels[k].0].as_bytes(), values[labels[k].1].as_bytes()),
                );
                w.sample(1, 2);
                w.close_memo(&mut memo);
                want.clear();
                for &(n, v, _) in labels {
                    write_series_label(&mut want, names[n].as_bytes(), values[v].as_bytes());
                }
                // The series as a scratch-built one appends it: key, length, body.
                let mut body = Vec::new();
                let mut s = SeriesWriter::new(&mut body);
                s.raw_fields(&want);
                s.sample(1, 2);
                let mut whole = Vec::new();
                s.finish(&mut whole);
                proptest::prop_assert_eq!(&out[start..], &whole[..]);
            }
        }
    }

    #[test]
    fn a_series_written_in_place_equals_one_built_in_scratch_at_every_length_size() {
        // Bodies whose length takes one, two, three and four varint bytes, at the edges.
        for value_len in [0usize, 100, 117, 118, 16_000, 16_373, 16_374, 2_097_200] {
            let value = vec![b'v'; value_len];
            let mut out = vec![0x42u8; 5];
            let mut w = SeriesWriter::in_place(&mut out);
            w.label(b"__name__", b"up");
            w.histogram_raw(&value);
            let at = w.close();
            let mut scratch = Vec::new();
            let mut s = SeriesWriter::new(&mut scratch);
            s.label(b"__name__", b"up");
            s.histogram_raw(&value);
            let mut want = vec![0x42u8; 5];
            s.finish(&mut want);
            assert_eq!(out, want, "body with a value of {value_len} bytes");
            assert_eq!(&out[at..at + 4], &[0x0a, 0x0e, 0x0a, 0x08]);
        }
    }

    /// Labels written after another field are remembered where they stand: the next
    /// series copies the right bytes.
    #[test]
    fn the_memo_copies_labels_that_were_not_a_series_first_field() {
        let buf = b"__name__upjobapi".to_vec();
        let (name, up) = (Span::new(0, 8), Span::new(8, 10));
        let (job, api) = (Span::new(10, 13), Span::new(13, 16));
        let labels = [(name, up), (job, api)];
        let write = |out: &mut Vec<u8>, memo: &mut LabelMemo, sample_first: bool| {
            let mut w = SeriesWriter::in_place(out);
            if sample_first {
                w.sample(7, 8);
            }
            w.labels_memo(
                memo,
                2,
                |k| label_key(labels[k].0, labels[k].1),
                |k| (labels[k].0.bytes(&buf), labels[k].1.bytes(&buf)),
            );
            w.close_memo(memo);
        };
        let (mut out, mut memo) = (Vec::new(), LabelMemo::default());
        write(&mut out, &mut memo, true);
        let first = out.len();
        write(&mut out, &mut memo, false);
        let mut want = Vec::new();
        let mut s = SeriesWriter::new(&mut want);
        s.label(b"__name__", b"up");
        s.label(b"job", b"api");
        let mut whole = Vec::new();
        s.finish(&mut whole);
        assert_eq!(&out[first..], &whole[..]);
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
