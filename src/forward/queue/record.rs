//! One queued request: its bodies (1.0, and 2.0 when the backend takes 2.0), the sender's
//! headers this backend passes through, and what it holds (for drop counts and age). On
//! disk a record is framed as `[u32 FRAME_MAGIC][u32 payload length][u64 samples][u32
//! CRC-32 of the payload][u32 CRC-32 of the 20 bytes before]` then the payload, little
//! endian. The magic lets a reader find the next record after damage (resynchronise);
//! the header's own checksum makes its length and sample count trustworthy, so a damaged
//! payload is skipped exactly and its samples counted. Queues written before the magic
//! (frames `[u32 payload length][u32 CRC-32][payload]`) are still read: an old frame's
//! length is at most [`MAX_PAYLOAD`], below the magic's value, so the first word tells
//! them apart. The payload is `[u8 format version][u64 queued ms][u64 samples][u8 flags]
//! [u32 2.0 series][u32 headers]{[u32 len][name][u32 len][value]}[u32 1.0 length][1.0 body]
//! [2.0 body]`. A tenant-routed record also keeps its tenant header, and a pseudo-header
//! [`TENANT_HEADER_MARKER`] whose value names it.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::forward::{Payload, TenantHeader};

/// Among a record's headers: names the header that carries the record's tenant (never
/// sent; not a valid header for a sender to pass through).
pub const TENANT_HEADER_MARKER: &str = "promnorm-tenant-header";

#[derive(Clone, Debug)]
pub struct Record {
    /// The 1.0 body (every backend can fall back to it).
    pub v1: Bytes,
    /// The 2.0 body, when the backend took 2.0 at queueing time.
    pub v2: Option<Bytes>,
    pub v2_series: u32,
    /// Sender headers this backend passes through (e.g. `X-Scope-OrgID`), and the
    /// tenant header with its marker.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Samples (float and histogram) in the body.
    pub samples: u64,
    /// When the record was queued, in milliseconds since the Unix epoch.
    pub enqueued_ms: u64,
}

/// Frame header: magic, payload length, samples, payload checksum, header checksum.
pub const FRAME_HEADER: usize = 24;
/// The frame header written before the magic: payload length and checksum.
pub const OLD_FRAME_HEADER: usize = 8;
/// First word of every frame (little endian `DE C0 51 9E`): above [`MAX_PAYLOAD`], so an
/// old frame's length is never mistaken for it.
pub const FRAME_MAGIC: u32 = 0x9E51_C0DE;
/// Version, queueing time, samples, flags, 2.0 series, header count.
const HEADER_FIXED: usize = 1 + 8 + 8 + 1 + 4 + 4;
/// The record layout written now; a record of another version is reported, not guessed at.
pub const FORMAT_VERSION: u8 = 1;
/// Flag: a 2.0 body follows the 1.0 body.
const HAS_V2: u8 = 1;
/// A payload longer than this is corruption, not data (bodies are limited far below).
pub const MAX_PAYLOAD: usize = 1 << 30;

/// Why bytes at some offset are not a readable frame.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Too few bytes for the frame its (trustworthy) header announces: a torn tail.
    Truncated,
    /// The header cannot be trusted (no magic, bad header checksum, impossible length):
    /// the reader must look for the next magic.
    Header,
    /// The header is sound but the payload is damaged: the frame is `len` bytes long and
    /// held `samples` (unknown in the old format).
    Payload { len: usize, samples: Option<u64> },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record truncated")]
    Truncated,
    #[error("record checksum mismatch")]
    Checksum,
    #[error("record malformed: {0}")]
    Malformed(&'static str),
}

impl Record {
    pub fn payload(&self) -> Payload {
        Payload {
            v1: self.v1.clone(),
            v2: self.v2.clone(),
            v2_series: self.v2_series as usize,
            samples: self.samples,
            tenant: self.tenant(),
        }
    }

    /// The tenant header the record was queued with: the header [`TENANT_HEADER_MARKER`]
    /// names, among the record's headers.
    fn tenant(&self) -> Option<TenantHeader> {
        let (_, named) = self
            .headers
            .iter()
            .find(|(k, _)| k.as_str() == TENANT_HEADER_MARKER)?;
        let name = HeaderName::from_bytes(named.as_bytes()).ok()?;
        let (_, value) = self.headers.iter().find(|(k, _)| *k == name)?;
        Some(TenantHeader {
            name,
            value: value.clone(),
        })
    }

    /// The sender's headers the record keeps (the tenant marker is not one of them).
    pub fn header_map(&self) -> HeaderMap {
        let mut m = HeaderMap::with_capacity(self.headers.len());
        for (k, v) in &self.headers {
            if k.as_str() != TENANT_HEADER_MARKER {
                m.append(k.clone(), v.clone());
            }
        }
        m
    }

    /// Bytes the record holds in a queue (body plus headers), for the queue's budget.
    pub fn size(&self) -> u64 {
        framed_size(
            self.v1.len(),
            self.v2.as_ref().map_or(0, |b| b.len()),
            &self.headers,
        )
    }

    /// Appends the framed record to `out`.
    pub fn write_framed(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER]);
        self.write_payload(out);
        let payload = &out[start + FRAME_HEADER..];
        let len = payload.len() as u32;
        let crc = crc32fast::hash(payload);
        let h = &mut out[start..start + FRAME_HEADER];
        h[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&len.to_le_bytes());
        h[8..16].copy_from_slice(&self.samples.to_le_bytes());
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        let hcrc = crc32fast::hash(&h[..20]);
        h[20..24].copy_from_slice(&hcrc.to_le_bytes());
    }

    /// Appends the record in the format written before [`FRAME_MAGIC`] (tests of the
    /// reader's compatibility).
    #[cfg(test)]
    pub fn write_framed_old(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; OLD_FRAME_HEADER]);
        self.write_payload(out);
        let payload = &out[start + OLD_FRAME_HEADER..];
        let len = payload.len() as u32;
        let crc = crc32fast::hash(payload);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&self.enqueued_ms.to_le_bytes());
        out.extend_from_slice(&self.samples.to_le_bytes());
        out.push(if self.v2.is_some() { HAS_V2 } else { 0 });
        out.extend_from_slice(&self.v2_series.to_le_bytes());
        out.extend_from_slice(&(self.headers.len() as u32).to_le_bytes());
        for (k, v) in &self.headers {
            for part in [k.as_str().as_bytes(), v.as_bytes()] {
                out.extend_from_slice(&(part.len() as u32).to_le_bytes());
                out.extend_from_slice(part);
            }
        }
        out.extend_from_slice(&(self.v1.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.v1);
        if let Some(v2) = &self.v2 {
            out.extend_from_slice(v2);
        }
    }

    /// Reads the frame at the start of `buf` (either format): the record and the
    /// frame's length.
    pub fn read_frame(buf: &[u8]) -> Result<(Record, usize), FrameError> {
        Record::read_frame_with(buf, Bytes::copy_from_slice)
    }

    /// [`Record::read_frame`] whose bodies are slices of `buf`, not copies (a record
    /// read back from disk to be sent).
    pub fn read_frame_shared(buf: &Bytes) -> Result<(Record, usize), FrameError> {
        Record::read_frame_with(buf, |part| buf.slice_ref(part))
    }

    /// `body` makes a body's `Bytes` of its bytes in `buf`.
    fn read_frame_with(
        buf: &[u8],
        body: impl Fn(&[u8]) -> Bytes,
    ) -> Result<(Record, usize), FrameError> {
        let word = |at: usize| {
            buf.get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let Some(first) = word(0) else {
            return Err(FrameError::Truncated);
        };
        if first != FRAME_MAGIC {
            // The old format: nothing but the length to go by.
            let len = first as usize;
            if len > MAX_PAYLOAD {
                return Err(FrameError::Header);
            }
            let Some(crc) = word(4) else {
                return Err(FrameError::Truncated);
            };
            let end = OLD_FRAME_HEADER + len;
            let Some(payload) = buf.get(OLD_FRAME_HEADER..end) else {
                // A damaged length and a torn tail look the same here.
                return Err(FrameError::Header);
            };
            return match Record::from_payload(payload, crc, body) {
                Ok(r) => Ok((r, end)),
                Err(_) => Err(FrameError::Payload {
                    len: end,
                    samples: None,
                }),
            };
        }
        let Some(h) = buf.get(..FRAME_HEADER) else {
            return Err(FrameError::Truncated);
        };
        let field = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        if crc32fast::hash(&h[..20]) != field(20) {
            return Err(FrameError::Header);
        }
        let len = field(4) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::Header);
        }
        let mut samples = [0u8; 8];
        samples.copy_from_slice(&h[8..16]);
        let samples = u64::from_le_bytes(samples);
        let end = FRAME_HEADER + len;
        let Some(payload) = buf.get(FRAME_HEADER..end) else {
            return Err(FrameError::Truncated);
        };
        match Record::from_payload(payload, field(16), body) {
            Ok(r) => Ok((r, end)),
            Err(_) => Err(FrameError::Payload {
                len: end,
                samples: Some(samples),
            }),
        }
    }

    /// The offset, after `from`, of the next frame whose header is sound (a magic and a
    /// matching header checksum): where a reader resumes after damage.
    pub fn next_frame(buf: &[u8], from: usize) -> Option<usize> {
        let magic = FRAME_MAGIC.to_le_bytes();
        let mut at = from + 1;
        while at + FRAME_HEADER <= buf.len() {
            let i = buf[at..].windows(4).position(|w| w == magic)?;
            at += i;
            match Record::read_frame(&buf[at..]) {
                Ok(_) | Err(FrameError::Payload { .. }) | Err(FrameError::Truncated) => {
                    return Some(at);
                }
                Err(FrameError::Header) => at += 1,
            }
        }
        None
    }

    /// Decodes a payload whose checksum was `crc`; `body` makes each body's `Bytes`.
    fn from_payload(
        payload: &[u8],
        crc: u32,
        body: impl Fn(&[u8]) -> Bytes,
    ) -> Result<Record, RecordError> {
        if crc32fast::hash(payload) != crc {
            return Err(RecordError::Checksum);
        }
        let mut r = Cursor { buf: payload };
        if r.array::<1>()?[0] != FORMAT_VERSION {
            return Err(RecordError::Malformed("format version"));
        }
        let enqueued_ms = u64::from_le_bytes(r.array()?);
        let samples = u64::from_le_bytes(r.array()?);
        let flags = r.array::<1>()?[0];
        if flags & !HAS_V2 != 0 {
            return Err(RecordError::Malformed("flags"));
        }
        let v2_series = u32::from_le_bytes(r.array()?);
        let n = u32::from_le_bytes(r.array()?) as usize;
        let mut headers = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let k = r.part()?;
            let v = r.part()?;
            let k = HeaderName::from_bytes(k).map_err(|_| RecordError::Malformed("header"))?;
            let v = HeaderValue::from_bytes(v).map_err(|_| RecordError::Malformed("header"))?;
            headers.push((k, v));
        }
        let v1_len = u32::from_le_bytes(r.array()?) as usize;
        if r.buf.len() < v1_len {
            return Err(RecordError::Truncated);
        }
        let (v1, v2) = r.buf.split_at(v1_len);
        if flags & HAS_V2 == 0 && !v2.is_empty() {
            return Err(RecordError::Malformed("trailing bytes"));
        }
        Ok(Record {
            v1: body(v1),
            v2: (flags & HAS_V2 != 0).then(|| body(v2)),
            v2_series,
            headers,
            samples,
            enqueued_ms,
        })
    }
}

/// Bytes a record of these bodies and headers takes framed (its share of a queue's budget).
pub fn framed_size(v1: usize, v2: usize, headers: &[(HeaderName, HeaderValue)]) -> u64 {
    let headers: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 8)
        .sum();
    (FRAME_HEADER + HEADER_FIXED + headers + 4 + v1 + v2) as u64
}

struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let (a, rest) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(RecordError::Truncated)?;
        self.buf = rest;
        Ok(*a)
    }

    fn part(&mut self) -> Result<&'a [u8], RecordError> {
        let n = u32::from_le_bytes(self.array()?) as usize;
        if self.buf.len() < n {
            return Err(RecordError::Truncated);
        }
        let (p, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(p)
    }
}

/// The largest uncompressed 1.0 body of a merged batch ([`Record::merge`]): far below
/// what receivers take (VictoriaMetrics `-maxInsertRequestSize` 32 MiB, Mimir's
/// distributor 100 MiB; Prometheus sets no limit).
pub const MAX_MERGED_RAW: u64 = 8 << 20;

/// The uncompressed length a raw snappy block declares (its varint preamble) and the
/// preamble's length in bytes.
fn snappy_preamble(body: &[u8]) -> Option<(u64, usize)> {
    let mut len = 0u64;
    for (i, &b) in body.iter().take(5).enumerate() {
        len |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return (len <= u64::from(u32::MAX)).then_some((len, i + 1));
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Record {
    /// The decoded size the 1.0 body declares (its snappy preamble).
    pub fn v1_decoded_len(&self) -> Option<u64> {
        snappy_preamble(&self.v1).map(|(len, _)| len)
    }

    /// Whether `next` may be sent in one request with `self`: 1.0 bodies only (a 2.0
    /// body's symbol references are indexes into its own table) and the same headers
    /// (the same tenant, the same pass-through headers).
    pub fn mergeable(&self, next: &Record) -> bool {
        self.v2.is_none() && next.v2.is_none() && self.headers == next.headers
    }

    /// One record holding the leading records of `batch` that can be sent together,
    /// in order, and how many it holds; `None` when fewer than two can. The bodies are
    /// joined without decompressing: a 1.0 `WriteRequest` is a message of repeated
    /// fields, so two encodings one after the other are one request with the series and
    /// metadata of both, in order; and a raw snappy block is its length then elements
    /// whose copies reach back only into the block's own output, so the elements of
    /// several blocks after one preamble of their summed lengths decompress to the
    /// joined messages. The joined body stays within [`MAX_MERGED_RAW`] uncompressed.
    /// It is written into `buf`'s allocation (taken when a merge happens; see
    /// [`reusable_body`]).
    pub fn merge(batch: &[Record], buf: &mut Vec<u8>) -> Option<(Record, usize)> {
        let first = batch.first()?;
        let mut raw = 0u64;
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut samples = 0u64;
        for r in batch {
            if !first.mergeable(r) {
                break;
            }
            let Some((len, preamble)) = snappy_preamble(&r.v1) else {
                break;
            };
            if raw + len > MAX_MERGED_RAW {
                break;
            }
            raw += len;
            samples += r.samples;
            parts.push(&r.v1[preamble..]);
        }
        if parts.len() < 2 {
            return None;
        }
        let mut body = std::mem::take(buf);
        body.clear();
        body.reserve(5 + parts.iter().map(|p| p.len()).sum::<usize>());
        put_varint(&mut body, raw);
        for p in &parts {
            body.extend_from_slice(p);
        }
        let merged = Record {
            v1: Bytes::from(body),
            v2: None,
            v2_series: 0,
            headers: first.headers.clone(),
            samples,
            enqueued_ms: first.enqueued_ms,
        };
        Some((merged, parts.len()))
    }
}

/// The largest merged body whose allocation a sender keeps for its next merge
/// ([`reusable_body`]): the default `max_samples_per_send` merges a few hundred KB.
pub const MAX_REUSED_BODY: usize = 1 << 20;

/// The allocation of a merged body whose request is done, for the next merge, when
/// nothing else holds it and it is at most [`MAX_REUSED_BODY`]: a fresh half megabyte
/// for every merge is memory the allocator hands back to the kernel between sends,
/// then new pages the kernel faults in and zeroes on the next copy.
pub fn reusable_body(body: Bytes) -> Vec<u8> {
    match body.try_into_mut() {
        Ok(b) if b.capacity() <= MAX_REUSED_BODY => Vec::from(b),
        _ => Vec::new(),
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            v1: Bytes::from_static(b"\x0a\x03abc"),
            v2: Some(Bytes::from_static(b"\x0a\x00\x0a\x01a")),
            v2_series: 1,
            headers: vec![(
                HeaderName::from_static("x-scope-orgid"),
                HeaderValue::from_static("team-a"),
            )],
            samples: 7,
            enqueued_ms: 1_700_000_000_123,
        }
    }

    #[test]
    fn a_framed_record_reads_back_and_a_flipped_bit_is_caught() {
        let mut buf = Vec::new();
        record().write_framed(&mut buf);
        let (back, len) = Record::read_frame(&buf).unwrap();
        assert_eq!(len, buf.len());
        assert_eq!(back.v1, record().v1);
        assert_eq!(back.v2, record().v2);
        assert_eq!(back.v2_series, 1);
        assert_eq!(buf.len() as u64, record().size());
        assert_eq!(back.samples, 7);
        assert_eq!(back.enqueued_ms, 1_700_000_000_123);
        assert_eq!(back.header_map()["x-scope-orgid"], "team-a");
        // Read in place: the same record, its bodies inside the buffer read.
        let shared = Bytes::from(buf.clone());
        let (inplace, n) = Record::read_frame_shared(&shared).unwrap();
        assert_eq!(
            (inplace.v1.clone(), inplace.v2.clone(), n),
            (back.v1, back.v2, len)
        );
        let within = shared.as_ptr_range();
        assert!(within.contains(&inplace.v1.as_ptr()));
        assert!(within.contains(&inplace.v2.unwrap().as_ptr()));
        // A flipped bit in the header: not trusted; in the payload: skipped exactly, its
        // samples known.
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            let want = if i < FRAME_HEADER {
                FrameError::Header
            } else {
                FrameError::Payload {
                    len: buf.len(),
                    samples: Some(7),
                }
            };
            assert_eq!(Record::read_frame(&bad).unwrap_err(), want, "byte {i}");
            let bad = Bytes::from(bad);
            assert_eq!(
                Record::read_frame_shared(&bad).unwrap_err(),
                want,
                "byte {i}"
            );
        }
        assert_eq!(
            Record::read_frame(&buf[..buf.len() - 1]).unwrap_err(),
            FrameError::Truncated
        );
    }

    #[test]
    fn a_frame_of_the_format_before_the_magic_still_reads() {
        let mut buf = Vec::new();
        record().write_framed_old(&mut buf);
        let (back, len) = Record::read_frame(&buf).unwrap();
        assert_eq!(len, buf.len());
        assert_eq!(back.samples, 7);
        assert_eq!(back.v2, record().v2);
    }

    fn v1_record(series: &[(&str, f64)], headers: &[(&'static str, &'static str)]) -> Record {
        use crate::wire::proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};
        use prost::Message;
        let req = WriteRequest {
            timeseries: series
                .iter()
                .map(|(name, v)| TimeSeries {
                    labels: vec![Label {
                        name: "__name__".into(),
                        value: (*name).into(),
                    }],
                    samples: vec![Sample {
                        value: *v,
                        timestamp: 1_000,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let body = snap::raw::Encoder::new()
            .compress_vec(&req.encode_to_vec())
            .unwrap();
        Record {
            v1: Bytes::from(body),
            v2: None,
            v2_series: 0,
            headers: headers
                .iter()
                .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
                .collect(),
            samples: series.len() as u64,
            enqueued_ms: 5,
        }
    }

    fn names(body: &[u8]) -> Vec<(String, f64)> {
        use prost::Message;
        let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
        crate::wire::proto::prometheus::WriteRequest::decode(raw.as_slice())
            .unwrap()
            .timeseries
            .iter()
            .map(|t| (t.labels[0].value.clone(), t.samples[0].value))
            .collect()
    }

    #[test]
    fn merged_records_decompress_to_one_request_with_every_series_in_order() {
        // Repetitive names, so that the compressed bodies are full of back references.
        let a: Vec<(String, f64)> = (0..300)
            .map(|i| (format!("vllm:num_requests_running_{}", i % 7), i as f64))
            .collect();
        let b: Vec<(String, f64)> = (0..5)
            .map(|i| (format!("vllm:num_requests_running_{}", i % 7), -(i as f64)))
            .collect();
        fn refs(v: &[(String, f64)]) -> Vec<(&str, f64)> {
            v.iter().map(|(n, x)| (n.as_str(), *x)).collect()
        }
        let ra = v1_record(&refs(&a), &[]);
        let rb = v1_record(&refs(&b), &[]);
        let rc = v1_record(&refs(&b), &[("x-scope-orgid", "team-b")]);
        let (merged, n) =
            Record::merge(&[ra.clone(), rb.clone(), ra.clone(), rc], &mut Vec::new()).unwrap();
        // The record with other headers ends the batch.
        assert_eq!(n, 3);
        assert_eq!(merged.samples, 605);
        assert_eq!(merged.enqueued_ms, 5);
        let want: Vec<(String, f64)> = a.iter().chain(&b).chain(&a).cloned().collect();
        assert_eq!(names(&merged.v1), want);
        // Nothing to join: a lone record, a 2.0 body, different headers.
        assert!(Record::merge(std::slice::from_ref(&ra), &mut Vec::new()).is_none());
        assert!(Record::merge(&[record(), record()], &mut Vec::new()).is_none());
        let other = v1_record(&refs(&b), &[("x-scope-orgid", "team-a")]);
        assert!(Record::merge(&[rb, other], &mut Vec::new()).is_none());
    }

    #[test]
    fn a_sent_merged_body_lends_its_allocation_to_the_next_merge() {
        let a: Vec<(String, f64)> = (0..50)
            .map(|i| (format!("vllm:num_requests_running_{i}"), i as f64))
            .collect();
        let refs: Vec<(&str, f64)> = a.iter().map(|(n, x)| (n.as_str(), *x)).collect();
        let r = v1_record(&refs, &[]);
        let mut buf = Vec::new();
        let (first, _) = Record::merge(&[r.clone(), r.clone()], &mut buf).unwrap();
        let at = first.v1.as_ptr();
        // A body still held elsewhere (a request in flight) is not reused.
        let held = first.v1.clone();
        assert_eq!(reusable_body(held.clone()).capacity(), 0);
        drop(held);
        let mut buf = reusable_body(first.v1);
        assert_eq!(buf.as_ptr(), at);
        let (second, n) = Record::merge(&[r.clone(), r.clone()], &mut buf).unwrap();
        assert_eq!((second.v1.as_ptr(), n), (at, 2));
        let want: Vec<(String, f64)> = a.iter().chain(&a).cloned().collect();
        assert_eq!(names(&second.v1), want);
        // Past the bound, the allocation goes back to the allocator.
        let big = Bytes::from(vec![0u8; MAX_REUSED_BODY + 1]);
        assert_eq!(reusable_body(big).capacity(), 0);
    }

    #[test]
    fn a_merged_body_stays_within_its_uncompressed_limit() {
        // Bodies of 3 MiB uncompressed each (compressing to little): two fit, not three.
        let big = |v: f64| {
            let name = "x".repeat(3 << 20);
            let mut r = v1_record(&[(name.as_str(), v)], &[]);
            r.samples = 1;
            r
        };
        let (merged, n) = Record::merge(&[big(1.0), big(2.0), big(3.0)], &mut Vec::new()).unwrap();
        assert_eq!(n, 2);
        let got = names(&merged.v1);
        assert_eq!(
            got.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            vec![1.0, 2.0]
        );
        // A body that declares more than the limit on its own is sent alone.
        let huge = |v: f64| {
            let name = "y".repeat(9 << 20);
            v1_record(&[(name.as_str(), v)], &[])
        };
        assert!(Record::merge(&[huge(1.0), big(2.0)], &mut Vec::new()).is_none());
    }

    #[test]
    fn the_next_sound_frame_is_found_after_garbage() {
        let mut buf = vec![0u8; 100];
        // A stray magic with no sound header after it is passed over.
        buf[10..14].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        record().write_framed(&mut buf);
        assert_eq!(Record::next_frame(&buf, 0), Some(100));
        assert_eq!(Record::next_frame(&buf, 100), None);
    }
}
