//! A native histogram read out of its bytes and written back: for the histograms the
//! mapping stage rewrites (rescaled, re-bucketed). Every vector is reused, so a warm
//! parse and encode allocate nothing. Field numbers are 1.0's `prometheus.Histogram`,
//! which 2.0's `io.prometheus.write.v2.Histogram` shares (plus `start_timestamp`, 17).

use super::DecodeError;
use super::pb::{Reader, WIRE_I64, WIRE_LEN, WIRE_VARINT, put_key, put_varint, varint_len};

/// The schema of native histograms with custom bucket bounds (NHCB).
pub const CUSTOM_BUCKETS_SCHEMA: i32 = -53;

/// 2.0's `Histogram.start_timestamp`; 1.0 has no field of this number.
pub const START_TIMESTAMP_FIELD: u32 = 17;

/// A bucket span: `offset` from the previous span's end (the first: the absolute index),
/// `length` buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketSpan {
    pub offset: i32,
    pub length: u32,
}

/// A decoded native histogram. Integer histograms keep their bucket deltas, float ones
/// their absolute counts, as on the wire.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NativeHistogram {
    /// Counts are floats (`count_float`, `zero_count_float`, `*_counts`).
    pub float: bool,
    pub count_int: u64,
    pub count_float: f64,
    /// Raw bits, so that a stale marker's NaN payload is kept.
    pub sum_bits: u64,
    pub schema: i32,
    pub zero_threshold: f64,
    pub zero_count_int: u64,
    pub zero_count_float: f64,
    pub negative_spans: Vec<BucketSpan>,
    pub negative_deltas: Vec<i64>,
    pub negative_counts: Vec<f64>,
    pub positive_spans: Vec<BucketSpan>,
    pub positive_deltas: Vec<i64>,
    pub positive_counts: Vec<f64>,
    pub reset_hint: u64,
    pub timestamp: i64,
    pub custom_values: Vec<f64>,
    /// 2.0's start timestamp; 0 when unknown.
    pub start_timestamp: i64,
}

impl NativeHistogram {
    /// Bytes its vectors hold (a reused decode target keeps them between requests).
    pub fn retained_bytes(&self) -> usize {
        use super::held;
        held(&self.negative_spans)
            + held(&self.negative_deltas)
            + held(&self.negative_counts)
            + held(&self.positive_spans)
            + held(&self.positive_deltas)
            + held(&self.positive_counts)
            + held(&self.custom_values)
    }
}

#[inline]
fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[inline]
fn unzigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

impl NativeHistogram {
    /// Reads `buf[start..end]` (a `Histogram` message) into `self`, replacing it.
    pub fn parse(&mut self, buf: &[u8], start: usize, end: usize) -> Result<(), DecodeError> {
        self.float = false;
        self.count_int = 0;
        self.count_float = 0.0;
        self.sum_bits = 0;
        self.schema = 0;
        self.zero_threshold = 0.0;
        self.zero_count_int = 0;
        self.zero_count_float = 0.0;
        self.negative_spans.clear();
        self.negative_deltas.clear();
        self.negative_counts.clear();
        self.positive_spans.clear();
        self.positive_deltas.clear();
        self.positive_counts.clear();
        self.reset_hint = 0;
        self.timestamp = 0;
        self.custom_values.clear();
        self.start_timestamp = 0;
        let mut r = Reader::new(buf, start, end);
        while !r.is_done() {
            let (field, wire) = r.key()?;
            match (field, wire) {
                (1, WIRE_VARINT) => {
                    self.count_int = r.varint()?;
                    self.float = false;
                }
                (2, WIRE_I64) => {
                    self.count_float = f64::from_bits(r.fixed64()?);
                    self.float = true;
                }
                (3, WIRE_I64) => self.sum_bits = r.fixed64()?,
                (4, WIRE_VARINT) => self.schema = zigzag(r.varint()?) as i32,
                (5, WIRE_I64) => self.zero_threshold = f64::from_bits(r.fixed64()?),
                (6, WIRE_VARINT) => self.zero_count_int = r.varint()?,
                (7, WIRE_I64) => self.zero_count_float = f64::from_bits(r.fixed64()?),
                (8 | 11, WIRE_LEN) => {
                    let (s, e) = r.len_delimited()?;
                    let span = parse_span(buf, s, e)?;
                    if field == 8 {
                        self.negative_spans.push(span);
                    } else {
                        self.positive_spans.push(span);
                    }
                }
                (9 | 12, _) => {
                    let out = if field == 9 {
                        &mut self.negative_deltas
                    } else {
                        &mut self.positive_deltas
                    };
                    read_sint64s(&mut r, buf, wire, out)?;
                }
                (10 | 13 | 16, _) => {
                    let out = match field {
                        10 => &mut self.negative_counts,
                        13 => &mut self.positive_counts,
                        _ => &mut self.custom_values,
                    };
                    read_doubles(&mut r, buf, wire, out)?;
                }
                (14, WIRE_VARINT) => self.reset_hint = r.varint()?,
                (15, WIRE_VARINT) => self.timestamp = r.varint()? as i64,
                (START_TIMESTAMP_FIELD, WIRE_VARINT) => self.start_timestamp = r.varint()? as i64,
                (1..=17, _) => return Err(DecodeError::UnexpectedWireType("Histogram", wire)),
                _ => r.skip(wire)?,
            }
        }
        Ok(())
    }

    /// Appends the encoded message (without key and length) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        if self.float {
            put_key(out, 2, WIRE_I64);
            out.extend_from_slice(&self.count_float.to_bits().to_le_bytes());
        } else {
            put_key(out, 1, WIRE_VARINT);
            put_varint(out, self.count_int);
        }
        if self.sum_bits != 0 {
            put_key(out, 3, WIRE_I64);
            out.extend_from_slice(&self.sum_bits.to_le_bytes());
        }
        if self.schema != 0 {
            put_key(out, 4, WIRE_VARINT);
            put_varint(out, unzigzag(self.schema as i64));
        }
        if self.zero_threshold.to_bits() != 0 {
            put_key(out, 5, WIRE_I64);
            out.extend_from_slice(&self.zero_threshold.to_bits().to_le_bytes());
        }
        if self.float {
            put_key(out, 7, WIRE_I64);
            out.extend_from_slice(&self.zero_count_float.to_bits().to_le_bytes());
        } else {
            put_key(out, 6, WIRE_VARINT);
            put_varint(out, self.zero_count_int);
        }
        put_spans(out, 8, &self.negative_spans);
        put_sint64s(out, 9, &self.negative_deltas);
        put_doubles(out, 10, &self.negative_counts);
        put_spans(out, 11, &self.positive_spans);
        put_sint64s(out, 12, &self.positive_deltas);
        put_doubles(out, 13, &self.positive_counts);
        if self.reset_hint != 0 {
            put_key(out, 14, WIRE_VARINT);
            put_varint(out, self.reset_hint);
        }
        if self.timestamp != 0 {
            put_key(out, 15, WIRE_VARINT);
            put_varint(out, self.timestamp as u64);
        }
        put_doubles(out, 16, &self.custom_values);
        if self.start_timestamp != 0 {
            put_key(out, START_TIMESTAMP_FIELD, WIRE_VARINT);
            put_varint(out, self.start_timestamp as u64);
        }
    }

    /// The count as a float, whichever kind the histogram is.
    pub fn count(&self) -> f64 {
        if self.float {
            self.count_float
        } else {
            self.count_int as f64
        }
    }

    /// The zero bucket's count as a float.
    pub fn zero_count(&self) -> f64 {
        if self.float {
            self.zero_count_float
        } else {
            self.zero_count_int as f64
        }
    }

    /// Calls `f(index, count)` for every positive bucket (`negative`: every negative one)
    /// in index order; integer deltas are summed into absolute counts.
    pub fn for_each_bucket(&self, negative: bool, mut f: impl FnMut(i64, f64)) {
        let (spans, deltas, counts) = if negative {
            (
                &self.negative_spans,
                &self.negative_deltas,
                &self.negative_counts,
            )
        } else {
            (
                &self.positive_spans,
                &self.positive_deltas,
                &self.positive_counts,
            )
        };
        let mut idx = 0i64;
        let mut k = 0usize;
        let mut acc = 0i64;
        for span in spans {
            // The first span's offset is absolute; a later one is the gap after the last.
            idx += span.offset as i64;
            for _ in 0..span.length {
                let c = if self.float {
                    counts.get(k).copied()
                } else {
                    deltas.get(k).map(|d| {
                        acc = acc.wrapping_add(*d);
                        acc as f64
                    })
                };
                let Some(c) = c else { return };
                f(idx, c);
                idx += 1;
                k += 1;
            }
        }
    }
}

fn parse_span(buf: &[u8], start: usize, end: usize) -> Result<BucketSpan, DecodeError> {
    let mut span = BucketSpan::default();
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match field {
            1 => {
                r.expect(wire, WIRE_VARINT, "BucketSpan")?;
                span.offset = zigzag(r.varint()?) as i32;
            }
            2 => {
                r.expect(wire, WIRE_VARINT, "BucketSpan")?;
                span.length = r.varint()? as u32;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(span)
}

fn read_sint64s(
    r: &mut Reader<'_>,
    buf: &[u8],
    wire: u8,
    out: &mut Vec<i64>,
) -> Result<(), DecodeError> {
    if wire == WIRE_LEN {
        let (s, e) = r.len_delimited()?;
        let mut p = Reader::new(buf, s, e);
        while !p.is_done() {
            out.push(zigzag(p.varint()?));
        }
        Ok(())
    } else {
        r.expect(wire, WIRE_VARINT, "Histogram deltas")?;
        out.push(zigzag(r.varint()?));
        Ok(())
    }
}

fn read_doubles(
    r: &mut Reader<'_>,
    buf: &[u8],
    wire: u8,
    out: &mut Vec<f64>,
) -> Result<(), DecodeError> {
    if wire == WIRE_LEN {
        let (s, e) = r.len_delimited()?;
        if (e - s) % 8 != 0 {
            return Err(DecodeError::Truncated);
        }
        for c in buf[s..e].chunks_exact(8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            out.push(f64::from_le_bytes(b));
        }
        Ok(())
    } else {
        r.expect(wire, WIRE_I64, "Histogram counts")?;
        out.push(f64::from_bits(r.fixed64()?));
        Ok(())
    }
}

fn put_spans(out: &mut Vec<u8>, field: u32, spans: &[BucketSpan]) {
    for s in spans {
        let off = unzigzag(s.offset as i64);
        let mut len = 0;
        if off != 0 {
            len += 1 + varint_len(off);
        }
        if s.length != 0 {
            len += 1 + varint_len(s.length as u64);
        }
        put_key(out, field, WIRE_LEN);
        put_varint(out, len as u64);
        if off != 0 {
            put_key(out, 1, WIRE_VARINT);
            put_varint(out, off);
        }
        if s.length != 0 {
            put_key(out, 2, WIRE_VARINT);
            put_varint(out, s.length as u64);
        }
    }
}

fn put_sint64s(out: &mut Vec<u8>, field: u32, v: &[i64]) {
    if v.is_empty() {
        return;
    }
    let len: usize = v.iter().map(|d| varint_len(unzigzag(*d))).sum();
    put_key(out, field, WIRE_LEN);
    put_varint(out, len as u64);
    for d in v {
        put_varint(out, unzigzag(*d));
    }
}

fn put_doubles(out: &mut Vec<u8>, field: u32, v: &[f64]) {
    if v.is_empty() {
        return;
    }
    put_key(out, field, WIRE_LEN);
    put_varint(out, (v.len() * 8) as u64);
    for c in v {
        out.extend_from_slice(&c.to_bits().to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus as pb;
    use prost::Message;

    fn roundtrip(h: &pb::Histogram) -> (NativeHistogram, pb::Histogram) {
        let bytes = h.encode_to_vec();
        let mut nh = NativeHistogram::default();
        nh.parse(&bytes, 0, bytes.len()).unwrap();
        let mut out = Vec::new();
        nh.encode(&mut out);
        (nh, pb::Histogram::decode(&out[..]).unwrap())
    }

    #[test]
    fn integer_float_and_custom_histograms_roundtrip() {
        let int = pb::Histogram {
            count: Some(pb::histogram::Count::CountInt(12)),
            sum: 18.4,
            schema: -2,
            zero_threshold: 1e-128,
            zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(1)),
            negative_spans: vec![pb::BucketSpan {
                offset: -3,
                length: 2,
            }],
            negative_deltas: vec![2, -1],
            positive_spans: vec![
                pb::BucketSpan {
                    offset: 0,
                    length: 2,
                },
                pb::BucketSpan {
                    offset: 3,
                    length: 1,
                },
            ],
            positive_deltas: vec![3, 1, -2],
            reset_hint: 3,
            timestamp: 1_700_000_000_000,
            ..Default::default()
        };
        let (nh, back) = roundtrip(&int);
        assert_eq!(back, int);
        let mut seen = Vec::new();
        nh.for_each_bucket(false, |i, c| seen.push((i, c)));
        assert_eq!(seen, [(0, 3.0), (1, 4.0), (5, 2.0)]);
        let float = pb::Histogram {
            count: Some(pb::histogram::Count::CountFloat(7.5)),
            sum: -2.0,
            schema: 3,
            zero_count: Some(pb::histogram::ZeroCount::ZeroCountFloat(0.5)),
            positive_spans: vec![pb::BucketSpan {
                offset: 7,
                length: 2,
            }],
            positive_counts: vec![3.0, 4.0],
            timestamp: 5,
            ..Default::default()
        };
        assert_eq!(roundtrip(&float).1, float);
        let nhcb = pb::Histogram {
            count: Some(pb::histogram::Count::CountInt(4)),
            sum: 250.0,
            schema: CUSTOM_BUCKETS_SCHEMA,
            zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(0)),
            positive_spans: vec![pb::BucketSpan {
                offset: 0,
                length: 3,
            }],
            positive_deltas: vec![1, 1, -2],
            custom_values: vec![10.0, 100.0],
            timestamp: 5,
            ..Default::default()
        };
        assert_eq!(roundtrip(&nhcb).1, nhcb);
    }

    #[test]
    fn start_timestamp_and_stale_sum_survive() {
        let h = crate::wire::proto::write_v2::Histogram {
            count: Some(crate::wire::proto::write_v2::histogram::Count::CountInt(0)),
            sum: f64::from_bits(crate::wire::STALE_NAN_BITS),
            timestamp: 9,
            start_timestamp: 3,
            ..Default::default()
        };
        let bytes = h.encode_to_vec();
        let mut nh = NativeHistogram::default();
        nh.parse(&bytes, 0, bytes.len()).unwrap();
        assert_eq!(nh.sum_bits, crate::wire::STALE_NAN_BITS);
        assert_eq!(nh.start_timestamp, 3);
        let mut out = Vec::new();
        nh.encode(&mut out);
        let back = crate::wire::proto::write_v2::Histogram::decode(&out[..]).unwrap();
        assert_eq!(back.sum.to_bits(), crate::wire::STALE_NAN_BITS);
        assert_eq!((back.timestamp, back.start_timestamp), (9, 3));
    }

    #[test]
    fn wrong_wire_types_are_errors_not_panics() {
        for bad in [
            &[0x08u8, 0x01, 0x19][..],
            &[0x21, 1, 2],
            &[0x62, 0x05, 0x80],
        ] {
            let mut nh = NativeHistogram::default();
            assert!(nh.parse(bad, 0, bad.len()).is_err(), "{bad:?}");
        }
    }
}
