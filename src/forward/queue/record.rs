//! One queued request: the encoded body, its protocol, the sender's headers this backend
//! passes through, and what it holds (for drop counts and age). On disk a record is
//! framed as `[u32 payload length][u32 CRC-32 of the payload][payload]`, little endian.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::forward::{Encoded, Protocol};

#[derive(Clone, Debug)]
pub struct Record {
    pub body: Bytes,
    pub protocol: Protocol,
    /// Sender headers this backend passes through (e.g. `X-Scope-OrgID`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Samples (float and histogram) in the body.
    pub samples: u64,
    /// When the record was queued, in milliseconds since the Unix epoch.
    pub enqueued_ms: u64,
}

/// Frame header: payload length and checksum.
pub const FRAME_HEADER: usize = 8;
/// A payload longer than this is corruption, not data (bodies are limited far below).
pub const MAX_PAYLOAD: usize = 1 << 30;

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
    pub fn encoded(&self) -> Encoded {
        Encoded {
            body: self.body.clone(),
            protocol: self.protocol,
            samples: self.samples,
        }
    }

    pub fn header_map(&self) -> HeaderMap {
        let mut m = HeaderMap::with_capacity(self.headers.len());
        for (k, v) in &self.headers {
            m.append(k.clone(), v.clone());
        }
        m
    }

    /// Bytes the record holds in a queue (body plus headers), for the queue's budget.
    pub fn size(&self) -> u64 {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        (FRAME_HEADER + 19 + headers + self.body.len()) as u64
    }

    /// Appends the framed record to `out`.
    pub fn write_framed(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER]);
        out.extend_from_slice(&self.enqueued_ms.to_le_bytes());
        out.extend_from_slice(&self.samples.to_le_bytes());
        out.push(protocol_byte(self.protocol));
        out.extend_from_slice(&(self.headers.len() as u16).to_le_bytes());
        for (k, v) in &self.headers {
            for part in [k.as_str().as_bytes(), v.as_bytes()] {
                out.extend_from_slice(&(part.len() as u16).to_le_bytes());
                out.extend_from_slice(part);
            }
        }
        out.extend_from_slice(&self.body);
        let payload = &out[start + FRAME_HEADER..];
        let len = payload.len() as u32;
        let crc = crc32fast::hash(payload);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads a frame header: the payload's length and checksum.
    pub fn read_frame_header(h: &[u8]) -> Result<(usize, u32), RecordError> {
        if h.len() < FRAME_HEADER {
            return Err(RecordError::Truncated);
        }
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if len > MAX_PAYLOAD {
            return Err(RecordError::Malformed("length"));
        }
        Ok((len, crc))
    }

    /// Decodes a payload whose checksum was `crc`.
    pub fn from_payload(payload: &[u8], crc: u32) -> Result<Record, RecordError> {
        if crc32fast::hash(payload) != crc {
            return Err(RecordError::Checksum);
        }
        let mut r = Cursor { buf: payload };
        let enqueued_ms = u64::from_le_bytes(r.array()?);
        let samples = u64::from_le_bytes(r.array()?);
        let protocol = protocol_from_byte(r.array::<1>()?[0])?;
        let n = u16::from_le_bytes(r.array()?) as usize;
        let mut headers = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let k = r.part()?;
            let v = r.part()?;
            let k = HeaderName::from_bytes(k).map_err(|_| RecordError::Malformed("header"))?;
            let v = HeaderValue::from_bytes(v).map_err(|_| RecordError::Malformed("header"))?;
            headers.push((k, v));
        }
        Ok(Record {
            body: Bytes::copy_from_slice(r.buf),
            protocol,
            headers,
            samples,
            enqueued_ms,
        })
    }
}

fn protocol_byte(p: Protocol) -> u8 {
    match p {
        Protocol::V1 => 1,
    }
}

fn protocol_from_byte(b: u8) -> Result<Protocol, RecordError> {
    match b {
        1 => Ok(Protocol::V1),
        _ => Err(RecordError::Malformed("protocol")),
    }
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
        let n = u16::from_le_bytes(self.array()?) as usize;
        if self.buf.len() < n {
            return Err(RecordError::Truncated);
        }
        let (p, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(p)
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
            body: Bytes::from_static(b"\x0a\x03abc"),
            protocol: Protocol::V1,
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
        let (len, crc) = Record::read_frame_header(&buf).unwrap();
        assert_eq!(len, buf.len() - FRAME_HEADER);
        let back = Record::from_payload(&buf[FRAME_HEADER..], crc).unwrap();
        assert_eq!(back.body, record().body);
        assert_eq!(back.samples, 7);
        assert_eq!(back.enqueued_ms, 1_700_000_000_123);
        assert_eq!(back.header_map()["x-scope-orgid"], "team-a");
        for i in FRAME_HEADER..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x10;
            assert_eq!(
                Record::from_payload(&bad[FRAME_HEADER..], crc).unwrap_err(),
                RecordError::Checksum
            );
        }
    }
}
