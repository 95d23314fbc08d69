//! Native histograms with custom buckets (NHCB, schema -53) unrolled into classic
//! series, for receivers that cannot take them (remote-write 1.0: Prometheus itself
//! drops NHCB there). A mapped body in, the same body with every NHCB histogram written
//! as `G_bucket{le}`, `G_sum`, `G_count` out (docs/wire.md, "Native histograms").
//! Buffers are reused: a warm unroll allocates nothing.

use std::hash::{BuildHasher, Hasher};

use ahash::AHashSet;

use super::number::{FloatStyle, write_float};
use crate::wire::DecodeError;
use crate::wire::STALE_NAN_BITS;
use crate::wire::encode::{SeriesWriter, write_metadata};
use crate::wire::fields::{
    Field, RequestField, SeriesField, metadata_family, nhcb_shape, request_fields, series_fields,
};
use crate::wire::histogram::{CUSTOM_BUCKETS_SCHEMA, NativeHistogram};

/// `MetricMetadata.type` HISTOGRAM.
const HISTOGRAM: i32 = 3;

/// What one unroll did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unrolled {
    /// Histograms (NHCB, and stale markers among them) written as classic series (0:
    /// the output equals the input).
    pub histograms: u64,
    /// Float samples written in their place.
    pub samples: u64,
    /// NHCB histograms left as they are: unrolling them would have taken the body over
    /// its size limit.
    pub skipped: u64,
}

/// One histogram of the group being unrolled.
#[derive(Clone, Copy, Debug)]
struct Row {
    timestamp: i64,
    start_timestamp: i64,
    sum_bits: u64,
    count: f64,
    stale: bool,
    /// Where the row's cumulative counts start in `Unroller::cumulative`.
    offset: usize,
}

/// Reusable state of [`Unroller::unroll`].
#[derive(Default)]
pub struct Unroller {
    hist: NativeHistogram,
    /// The series' labels: (name, value) byte ranges of the body.
    labels: Vec<(usize, usize, usize, usize)>,
    /// Byte ranges of the series' fields kept on it (samples, other histograms).
    kept: Vec<(usize, usize)>,
    /// The series' exemplars: byte range and value (they go to the bucket of their value).
    exemplars: Vec<(usize, usize, f64)>,
    rows: Vec<Row>,
    /// Cumulative bucket counts, `bounds.len() + 1` per row (the last: `+Inf`).
    cumulative: Vec<f64>,
    bounds: Vec<f64>,
    name: Vec<u8>,
    le: Vec<u8>,
    series: Vec<u8>,
    /// Families with metadata in the body, or given HISTOGRAM metadata.
    families: AHashSet<u64>,
    family_names: Vec<u8>,
    family_ends: Vec<usize>,
    hasher: ahash::RandomState,
}

impl Unroller {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes its buffers hold between requests.
    pub fn retained_bytes(&self) -> usize {
        use crate::wire::held;
        self.hist.retained_bytes()
            + held(&self.labels)
            + held(&self.kept)
            + held(&self.exemplars)
            + held(&self.rows)
            + held(&self.cumulative)
            + held(&self.bounds)
            + held(&self.name)
            + held(&self.le)
            + held(&self.series)
            + self.families.capacity() * 9
            + held(&self.family_names)
            + held(&self.family_ends)
    }

    /// Writes `mapped` (a mapped 1.0 body; it may carry 2.0's start timestamps) into
    /// `out` with its NHCB histograms unrolled. A series whose unrolling would take
    /// `out` over `max_bytes` is copied as it is (one bound costs a whole series: a small
    /// request could otherwise ask for gigabytes).
    pub fn unroll(
        &mut self,
        mapped: &[u8],
        out: &mut Vec<u8>,
        max_bytes: usize,
    ) -> Result<Unrolled, DecodeError> {
        out.clear();
        self.families.clear();
        self.family_names.clear();
        self.family_ends.clear();
        let mut done = Unrolled::default();
        for field in request_fields(mapped) {
            let Field { from, to, kind } = field?;
            match kind {
                RequestField::Series { start, end } => match nhcb_cost(mapped, start, end)? {
                    Some((cost, _)) if out.len().saturating_add(cost) <= max_bytes => {
                        self.unroll_series(mapped, start, end, out, &mut done)?;
                    }
                    Some((_, n)) => {
                        done.skipped += n;
                        out.extend_from_slice(&mapped[from..to]);
                    }
                    None => out.extend_from_slice(&mapped[from..to]),
                },
                RequestField::Metadata { start, end } => {
                    if let Some(family) = metadata_family(mapped, start, end)? {
                        let h = self.hash(family);
                        self.families.insert(h);
                    }
                    out.extend_from_slice(&mapped[from..to]);
                }
                RequestField::Other => out.extend_from_slice(&mapped[from..to]),
            }
        }
        // The 1.0 metadata request says HISTOGRAM for each unrolled family the body
        // has no metadata for.
        let mut start = 0;
        for i in 0..self.family_ends.len() {
            let end = self.family_ends[i];
            let h = self.hash(&self.family_names[start..end]);
            if self.families.insert(h) {
                write_metadata(out, HISTOGRAM, &self.family_names[start..end], b"", b"");
            }
            start = end;
        }
        Ok(done)
    }

    fn hash(&self, bytes: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(bytes);
        h.finish()
    }

    fn unroll_series(
        &mut self,
        buf: &[u8],
        s: usize,
        e: usize,
        out: &mut Vec<u8>,
        done: &mut Unrolled,
    ) -> Result<(), DecodeError> {
        self.labels.clear();
        self.kept.clear();
        self.exemplars.clear();
        self.rows.clear();
        self.cumulative.clear();
        self.bounds.clear();
        let mut name = None;
        // Labels come first in promnorm's output; exemplars are placed at the end.
        for field in series_fields(buf, s, e) {
            let Field { from, to, kind } = field?;
            match kind {
                SeriesField::Label { name: n, value: v } => {
                    if &buf[n.0..n.1] == b"__name__" {
                        name = Some(v);
                    }
                    self.labels.push((n.0, n.1, v.0, v.1));
                }
                SeriesField::Exemplar { value } => self.exemplars.push((from, to, value)),
                SeriesField::Histogram { start, end } => {
                    self.hist.parse(buf, start, end)?;
                    if self.hist.sum_bits == STALE_NAN_BITS {
                        // A stale marker ends every classic series of the group.
                        self.push_row(true);
                        continue;
                    }
                    if self.hist.schema != CUSTOM_BUCKETS_SCHEMA {
                        self.kept.push((from, to));
                        continue;
                    }
                    let started = self.rows.iter().any(|r| !r.stale);
                    if started && self.hist.custom_values != self.bounds {
                        // Bounds changed within one request: the group so far first.
                        self.flush(buf, name, false, out, done);
                    }
                    if !started || self.rows.is_empty() {
                        self.bounds.clone_from(&self.hist.custom_values);
                    }
                    self.push_row(false);
                }
                SeriesField::Other => self.kept.push((from, to)),
            }
        }
        // Whatever else the series holds (float samples, exponential histograms) stays.
        if !self.kept.is_empty() {
            let mut w = SeriesWriter::new(&mut self.series);
            for &(ns, ne, vs, ve) in &self.labels {
                w.label(&buf[ns..ne], &buf[vs..ve]);
            }
            for &(a, b) in &self.kept {
                w.raw_fields(&buf[a..b]);
            }
            w.finish(out);
        }
        self.flush(buf, name, true, out, done);
        Ok(())
    }

    /// Records the parsed histogram (or a stale marker) as a row of the group.
    fn push_row(&mut self, stale: bool) {
        let h = &self.hist;
        let base = self.cumulative.len();
        self.rows.push(Row {
            timestamp: h.timestamp,
            start_timestamp: h.start_timestamp,
            sum_bits: h.sum_bits,
            count: h.count(),
            stale,
            offset: base,
        });
        if stale {
            return;
        }
        let n = self.bounds.len();
        self.cumulative.resize(base + n + 1, 0.0);
        let row = &mut self.cumulative[base..];
        h.for_each_bucket(false, |i, c| {
            if let Ok(i) = usize::try_from(i) {
                row[i.min(n)] += c;
            }
        });
        let mut acc = 0.0;
        for c in row.iter_mut() {
            acc += *c;
            *c = acc;
        }
        // The +Inf bucket is the count.
        row[n] = h.count();
    }

    /// Writes the group's classic series and empties it; `last`: the series' exemplars
    /// go with it.
    fn flush(
        &mut self,
        buf: &[u8],
        name: Option<(usize, usize)>,
        last: bool,
        out: &mut Vec<u8>,
        done: &mut Unrolled,
    ) {
        // A group of stale markers alone still ends `le="+Inf"`, `_sum` and `_count`.
        let Some((vs, ve)) = name.filter(|_| !self.rows.is_empty()) else {
            self.rows.clear();
            self.cumulative.clear();
            return;
        };
        let family = &buf[vs..ve];
        let n = self.bounds.len();
        for b in 0..=n {
            self.le.clear();
            if b == n {
                self.le.extend_from_slice(b"+Inf");
            } else {
                write_float(&mut self.le, self.bounds[b], FloatStyle::Go);
            }
            let exemplars = |v: f64| {
                last && (b == n || v <= self.bounds[b]) && (b == 0 || v > self.bounds[b - 1])
            };
            self.name.clear();
            self.name.extend_from_slice(family);
            self.name.extend_from_slice(b"_bucket");
            let w = Classic {
                buf,
                labels: &self.labels,
                name: &self.name,
                le: Some(&self.le),
                rows: &self.rows,
            };
            w.write(
                &mut self.series,
                out,
                |k| {
                    let at = self.rows[k].offset + b;
                    self.cumulative.get(at).map_or(0, |c| c.to_bits())
                },
                self.exemplars.iter().filter(|x| exemplars(x.2)),
            );
        }
        for (suffix, sum) in [(&b"_sum"[..], true), (&b"_count"[..], false)] {
            self.name.clear();
            self.name.extend_from_slice(family);
            self.name.extend_from_slice(suffix);
            let w = Classic {
                buf,
                labels: &self.labels,
                name: &self.name,
                le: None,
                rows: &self.rows,
            };
            let rows = &self.rows;
            w.write(
                &mut self.series,
                out,
                |k| {
                    if sum {
                        rows[k].sum_bits
                    } else {
                        rows[k].count.to_bits()
                    }
                },
                [].iter(),
            );
        }
        done.histograms += self.rows.len() as u64;
        done.samples += self.rows.len() as u64 * (n as u64 + 3);
        self.family_names.extend_from_slice(family);
        self.family_ends.push(self.family_names.len());
        self.rows.clear();
        self.cumulative.clear();
    }
}

/// One classic series of a group: the series' labels with `__name__` = `name` and, for
/// `_bucket`, `le`.
struct Classic<'a> {
    buf: &'a [u8],
    labels: &'a [(usize, usize, usize, usize)],
    name: &'a [u8],
    le: Option<&'a [u8]>,
    rows: &'a [Row],
}

impl Classic<'_> {
    fn write<'x>(
        &self,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
        value: impl Fn(usize) -> u64,
        exemplars: impl Iterator<Item = &'x (usize, usize, f64)>,
    ) {
        let buf = self.buf;
        let mut w = SeriesWriter::new(scratch);
        let mut le = self.le;
        for &(ns, ne, vs, ve) in self.labels {
            let n = &buf[ns..ne];
            if let Some(v) = le
                && n >= &b"le"[..]
            {
                w.label(b"le", v);
                le = None;
                if n == b"le" {
                    continue;
                }
            }
            if n == b"__name__" {
                w.label(n, self.name);
            } else {
                w.label(n, &buf[vs..ve]);
            }
        }
        if let Some(v) = le {
            w.label(b"le", v);
        }
        for (k, row) in self.rows.iter().enumerate() {
            let value_bits = if row.stale { STALE_NAN_BITS } else { value(k) };
            w.sample_view(&crate::wire::decode::SampleView {
                value_bits,
                timestamp: row.timestamp,
                start_timestamp: row.start_timestamp,
            });
        }
        for &(a, b, _) in exemplars {
            w.raw_fields(&buf[a..b]);
        }
        w.finish(out);
    }
}

/// For a series with NHCB histograms: an upper estimate of the bytes its unrolling
/// writes, and how many NHCB it has; `None` without NHCB.
fn nhcb_cost(buf: &[u8], s: usize, e: usize) -> Result<Option<(usize, u64)>, DecodeError> {
    let shape = nhcb_shape(buf, s, e)?;
    // Per classic series and histogram: the labels, `le`, one sample; 64 covers the
    // name suffix, `le` text and the sample.
    Ok((shape.nhcb > 0).then(|| {
        (
            shape.classic_series.saturating_mul(shape.label_bytes + 64),
            shape.nhcb,
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus as pb;
    use prost::Message;

    fn label(n: &str, v: &str) -> pb::Label {
        pb::Label {
            name: n.into(),
            value: v.into(),
        }
    }

    fn nhcb(ts: i64, counts: &[i64], sum: f64) -> pb::Histogram {
        let mut prev = 0;
        pb::Histogram {
            count: Some(pb::histogram::Count::CountInt(
                counts.iter().sum::<i64>() as u64
            )),
            sum,
            schema: -53,
            zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(0)),
            positive_spans: vec![pb::BucketSpan {
                offset: 0,
                length: counts.len() as u32,
            }],
            positive_deltas: counts
                .iter()
                .map(|c| {
                    let d = c - prev;
                    prev = *c;
                    d
                })
                .collect(),
            custom_values: vec![0.005, 0.1, 2.5],
            timestamp: ts,
            ..Default::default()
        }
    }

    fn find<'a>(r: &'a pb::WriteRequest, name: &str, le: Option<&str>) -> &'a pb::TimeSeries {
        r.timeseries
            .iter()
            .find(|t| {
                t.labels.contains(&label("__name__", name))
                    && le.is_none_or(|le| t.labels.contains(&label("le", le)))
            })
            .unwrap_or_else(|| panic!("{name} {le:?} in {r:?}"))
    }

    #[test]
    fn nhcb_becomes_classic_series_with_metadata() {
        let stale = pb::Histogram {
            sum: f64::from_bits(STALE_NAN_BITS),
            timestamp: 3000,
            ..Default::default()
        };
        let req = pb::WriteRequest {
            timeseries: vec![
                pb::TimeSeries {
                    labels: vec![label("__name__", "lat_seconds"), label("job", "a")],
                    histograms: vec![
                        nhcb(1000, &[1, 2, 0, 4], 9.5),
                        nhcb(2000, &[2, 2, 1, 4], 11.0),
                        stale,
                    ],
                    exemplars: vec![pb::Exemplar {
                        labels: vec![label("trace_id", "t")],
                        value: 0.05,
                        timestamp: 999,
                    }],
                    ..Default::default()
                },
                pb::TimeSeries {
                    labels: vec![label("__name__", "up")],
                    samples: vec![pb::Sample {
                        value: 1.0,
                        timestamp: 1000,
                    }],
                    ..Default::default()
                },
            ],
            metadata: vec![],
        };
        let body = req.encode_to_vec();
        let mut u = Unroller::new();
        let mut out = Vec::new();
        let done = u.unroll(&body, &mut out, usize::MAX).unwrap();
        assert_eq!(
            done,
            Unrolled {
                histograms: 3,
                samples: 3 * 6,
                skipped: 0
            }
        );
        let got = pb::WriteRequest::decode(out.as_slice()).unwrap();
        assert_eq!(got.timeseries.len(), 1 + 4 + 2);
        assert_eq!(find(&got, "up", None), &req.timeseries[1]);
        for (le, want) in [
            ("0.005", [1.0, 2.0]),
            ("0.1", [3.0, 4.0]),
            ("2.5", [3.0, 5.0]),
            ("+Inf", [7.0, 9.0]),
        ] {
            let s = find(&got, "lat_seconds_bucket", Some(le));
            assert_eq!(
                s.labels,
                [
                    label("__name__", "lat_seconds_bucket"),
                    label("job", "a"),
                    label("le", le)
                ]
            );
            let v: Vec<f64> = s.samples.iter().map(|s| s.value).collect();
            assert_eq!(&v[..2], want, "{le}");
            assert_eq!(s.samples[2].value.to_bits(), STALE_NAN_BITS, "{le}: stale");
            assert_eq!(s.samples[2].timestamp, 3000);
            // The exemplar (0.05) lands in the bucket of its value.
            assert_eq!(s.exemplars.len(), usize::from(le == "0.1"), "{le}");
        }
        let sum = find(&got, "lat_seconds_sum", None);
        assert_eq!((sum.samples[0].value, sum.samples[1].value), (9.5, 11.0));
        assert_eq!(find(&got, "lat_seconds_count", None).samples[1].value, 9.0);
        assert_eq!(
            got.metadata,
            [pb::MetricMetadata {
                r#type: 3,
                metric_family_name: "lat_seconds".into(),
                ..Default::default()
            }]
        );
        // Metadata the body has already is not repeated; a body without NHCB is unchanged.
        let mut with_md = req.clone();
        with_md.metadata.push(pb::MetricMetadata {
            r#type: 3,
            metric_family_name: "lat_seconds".into(),
            help: "Latency.".into(),
            ..Default::default()
        });
        u.unroll(&with_md.encode_to_vec(), &mut out, usize::MAX)
            .unwrap();
        assert_eq!(
            pb::WriteRequest::decode(out.as_slice()).unwrap().metadata,
            with_md.metadata
        );
        let plain = pb::WriteRequest {
            timeseries: vec![req.timeseries[1].clone()],
            metadata: vec![],
        }
        .encode_to_vec();
        assert_eq!(
            u.unroll(&plain, &mut out, usize::MAX).unwrap(),
            Unrolled::default()
        );
        assert_eq!(out, plain);
    }

    /// Many bounds on a series with long labels: a small request that would unroll into
    /// a huge one is forwarded as it is, within the limit.
    #[test]
    fn unrolling_stays_within_the_size_limit() {
        let mut h = nhcb(1000, &[1, 1], 1.0);
        h.custom_values = (1..=5000).map(f64::from).collect();
        let req = pb::WriteRequest {
            timeseries: vec![pb::TimeSeries {
                labels: vec![label("__name__", "big"), label("pad", &"x".repeat(60_000))],
                histograms: vec![h],
                ..Default::default()
            }],
            metadata: vec![],
        };
        let body = req.encode_to_vec();
        let mut u = Unroller::new();
        let mut out = Vec::new();
        let limit = 16 << 20;
        let done = u.unroll(&body, &mut out, limit).unwrap();
        assert_eq!((done.histograms, done.skipped), (0, 1));
        assert_eq!(out, body);
        // Under a limit it fits, it is unrolled.
        let done = u.unroll(&body, &mut out, usize::MAX).unwrap();
        assert_eq!(done.histograms, 1);
        assert!(out.len() > limit);
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let mut u = Unroller::new();
        let mut out = Vec::new();
        for bad in [
            &[0x0au8, 0x05, 0x22, 0x09][..],
            &[0x0a, 0x02, 0x22, 0x00, 0x1a],
        ] {
            assert!(u.unroll(bad, &mut out, usize::MAX).is_err(), "{bad:?}");
        }
    }
}
