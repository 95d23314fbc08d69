//! Field-level walks over an encoded 1.0 `WriteRequest` and its `TimeSeries`, for stages
//! that rewrite a body in place rather than decode it (`mapping::unroll`): each item is
//! a field's byte range in the body and what it is, nothing is copied or allocated.

use super::DecodeError;
use super::histogram::CUSTOM_BUCKETS_SCHEMA;
use super::pb::{Reader, WIRE_I64, WIRE_LEN, WIRE_VARINT};

/// One top-level field of a `WriteRequest`: `timeseries` (1), `metadata` (3) with their
/// message's byte range, or any other field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestField {
    Series { start: usize, end: usize },
    Metadata { start: usize, end: usize },
    Other,
}

/// One field of a `TimeSeries`: a label (name and value byte ranges), an exemplar (its
/// value), a histogram (its message's byte range), or any other field (samples).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SeriesField {
    Label {
        name: (usize, usize),
        value: (usize, usize),
    },
    Exemplar {
        value: f64,
    },
    Histogram {
        start: usize,
        end: usize,
    },
    Other,
}

/// A field and the byte range of its whole encoding (key included) in the body.
pub struct Field<T> {
    pub from: usize,
    pub to: usize,
    pub kind: T,
}

/// The fields of the `WriteRequest` in `buf`, in order.
pub fn request_fields(buf: &[u8]) -> RequestFields<'_> {
    RequestFields {
        r: Reader::new(buf, 0, buf.len()),
        failed: false,
    }
}

pub struct RequestFields<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl Iterator for RequestFields<'_> {
    type Item = Result<Field<RequestField>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.is_done() {
            return None;
        }
        let item = next_request_field(&mut self.r);
        self.failed = item.is_err();
        Some(item)
    }
}

fn next_request_field(r: &mut Reader<'_>) -> Result<Field<RequestField>, DecodeError> {
    let from = r.pos();
    let (field, wire) = r.key()?;
    let kind = match (field, wire) {
        (1, WIRE_LEN) => {
            let (start, end) = r.len_delimited()?;
            RequestField::Series { start, end }
        }
        (3, WIRE_LEN) => {
            let (start, end) = r.len_delimited()?;
            RequestField::Metadata { start, end }
        }
        _ => {
            r.skip(wire)?;
            RequestField::Other
        }
    };
    Ok(Field {
        from,
        to: r.pos(),
        kind,
    })
}

/// The fields of the `TimeSeries` at `buf[start..end]`, in order.
pub fn series_fields(buf: &[u8], start: usize, end: usize) -> SeriesFields<'_> {
    SeriesFields {
        buf,
        r: Reader::new(buf, start, end),
        failed: false,
    }
}

pub struct SeriesFields<'a> {
    buf: &'a [u8],
    r: Reader<'a>,
    failed: bool,
}

impl Iterator for SeriesFields<'_> {
    type Item = Result<Field<SeriesField>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.is_done() {
            return None;
        }
        let item = next_series_field(self.buf, &mut self.r);
        self.failed = item.is_err();
        Some(item)
    }
}

fn next_series_field(buf: &[u8], r: &mut Reader<'_>) -> Result<Field<SeriesField>, DecodeError> {
    let from = r.pos();
    let (field, wire) = r.key()?;
    let kind = match (field, wire) {
        (1, WIRE_LEN) => {
            let (s, e) = r.len_delimited()?;
            let (name, value) = label_ranges(buf, s, e)?;
            SeriesField::Label { name, value }
        }
        (3, WIRE_LEN) => {
            let (s, e) = r.len_delimited()?;
            SeriesField::Exemplar {
                value: exemplar_value(buf, s, e)?,
            }
        }
        (4, WIRE_LEN) => {
            let (start, end) = r.len_delimited()?;
            SeriesField::Histogram { start, end }
        }
        _ => {
            r.skip(wire)?;
            SeriesField::Other
        }
    };
    Ok(Field {
        from,
        to: r.pos(),
        kind,
    })
}

/// For the `TimeSeries` at `buf[s..e]`: its labels' encoded bytes and, for each of its
/// native histograms with custom buckets, the number of bounds (one count per NHCB).
/// The caller's estimate of what unrolling it writes rests on these.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NhcbShape {
    pub label_bytes: usize,
    /// Sum over its NHCB of (bounds + 3): bucket series, `+Inf`, `_sum`, `_count`.
    pub classic_series: usize,
    pub nhcb: u64,
}

pub fn nhcb_shape(buf: &[u8], s: usize, e: usize) -> Result<NhcbShape, DecodeError> {
    let mut shape = NhcbShape::default();
    let mut r = Reader::new(buf, s, e);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, WIRE_LEN) => {
                let (ls, le) = r.len_delimited()?;
                shape.label_bytes += le - ls + 4;
            }
            (4, WIRE_LEN) => {
                let (hs, he) = r.len_delimited()?;
                let (schema, n) = histogram_shape(buf, hs, he)?;
                if schema == CUSTOM_BUCKETS_SCHEMA {
                    shape.nhcb += 1;
                    shape.classic_series += n + 3;
                }
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(shape)
}

/// A histogram's schema (field 4, sint32) and number of custom bounds (field 16).
fn histogram_shape(buf: &[u8], s: usize, e: usize) -> Result<(i32, usize), DecodeError> {
    let mut schema = 0;
    let mut bounds = 0;
    let mut r = Reader::new(buf, s, e);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (4, WIRE_VARINT) => {
                let v = r.varint()?;
                schema = ((v >> 1) as i64 ^ -((v & 1) as i64)) as i32;
            }
            (16, WIRE_LEN) => {
                let (a, b) = r.len_delimited()?;
                bounds += (b - a) / 8;
            }
            (16, WIRE_I64) => {
                r.fixed64()?;
                bounds += 1;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok((schema, bounds))
}

type Range = (usize, usize);

fn label_ranges(buf: &[u8], s: usize, e: usize) -> Result<(Range, Range), DecodeError> {
    let (mut n, mut v) = ((s, s), (s, s));
    let mut r = Reader::new(buf, s, e);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, WIRE_LEN) => n = r.len_delimited()?,
            (2, WIRE_LEN) => v = r.len_delimited()?,
            _ => r.skip(wire)?,
        }
    }
    Ok((n, v))
}

fn exemplar_value(buf: &[u8], s: usize, e: usize) -> Result<f64, DecodeError> {
    let mut v = 0.0;
    let mut r = Reader::new(buf, s, e);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        if field == 2 && wire == WIRE_I64 {
            v = f64::from_bits(r.fixed64()?);
        } else {
            r.skip(wire)?;
        }
    }
    Ok(v)
}

/// The family name (field 2) of the `MetricMetadata` at `buf[s..e]`.
pub fn metadata_family(buf: &[u8], s: usize, e: usize) -> Result<Option<&[u8]>, DecodeError> {
    let mut r = Reader::new(buf, s, e);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        if field == 2 && wire == WIRE_LEN {
            let (a, b) = r.len_delimited()?;
            return Ok(Some(&buf[a..b]));
        }
        r.skip(wire)?;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus as pb;
    use prost::Message;

    #[test]
    fn fields_of_a_request_and_its_series_in_order() {
        let req = pb::WriteRequest {
            timeseries: vec![pb::TimeSeries {
                labels: vec![pb::Label {
                    name: "__name__".into(),
                    value: "x".into(),
                }],
                samples: vec![pb::Sample {
                    value: 1.0,
                    timestamp: 5,
                }],
                exemplars: vec![pb::Exemplar {
                    labels: vec![],
                    value: 2.5,
                    timestamp: 5,
                }],
                ..Default::default()
            }],
            metadata: vec![pb::MetricMetadata {
                r#type: 1,
                metric_family_name: "x".into(),
                help: String::new(),
                unit: String::new(),
            }],
        };
        let buf = req.encode_to_vec();
        let top: Vec<_> = request_fields(&buf).map(|f| f.unwrap()).collect();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].from, 0);
        assert_eq!(top.last().unwrap().to, buf.len());
        let RequestField::Series { start, end } = top[0].kind else {
            panic!("series first")
        };
        let RequestField::Metadata { start: ms, end: me } = top[1].kind else {
            panic!("metadata second")
        };
        assert_eq!(metadata_family(&buf, ms, me).unwrap(), Some(&b"x"[..]));
        let kinds: Vec<_> = series_fields(&buf, start, end)
            .map(|f| f.unwrap().kind)
            .collect();
        let SeriesField::Label { name, value } = kinds[0] else {
            panic!("label first: {kinds:?}")
        };
        assert_eq!(&buf[name.0..name.1], b"__name__");
        assert_eq!(&buf[value.0..value.1], b"x");
        assert_eq!(kinds[1], SeriesField::Other);
        assert_eq!(kinds[2], SeriesField::Exemplar { value: 2.5 });
        assert_eq!(nhcb_shape(&buf, start, end).unwrap().nhcb, 0);
    }

    #[test]
    fn a_truncated_body_is_one_error_then_the_end() {
        let req = pb::WriteRequest {
            timeseries: vec![pb::TimeSeries::default(); 2],
            metadata: vec![],
        };
        let mut buf = req.encode_to_vec();
        buf.push(0x0a); // a field key with no length
        let items: Vec<_> = request_fields(&buf).collect();
        assert_eq!(items.len(), 3);
        assert!(items[2].is_err());
    }
}
