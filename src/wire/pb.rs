//! Protobuf wire primitives: just enough of the encoding to read and write the small
//! remote-write schema without building owned messages.

use super::DecodeError;

pub const WIRE_VARINT: u8 = 0;
pub const WIRE_I64: u8 = 1;
pub const WIRE_LEN: u8 = 2;
pub const WIRE_I32: u8 = 5;

/// A cursor over one message's bytes. Positions are absolute offsets into the
/// request buffer so that spans can be stored without lifetimes.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], start: usize, end: usize) -> Self {
        Reader {
            buf,
            pos: start,
            end,
        }
    }

    /// The absolute offset of the next byte to read.
    #[inline]
    pub fn pos(&self) -> usize {
        self.pos
    }

    #[inline]
    pub fn is_done(&self) -> bool {
        self.pos >= self.end
    }

    #[inline(always)]
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        // Keys, lengths of labels and most timestamps' first byte: one byte is the norm.
        if self.pos < self.end {
            let byte = self.buf[self.pos];
            if byte < 0x80 {
                self.pos += 1;
                return Ok(u64::from(byte));
            }
            // Two bytes: 2.0's symbol references past 127, lengths past 127.
            if self.pos + 1 < self.end {
                let next = self.buf[self.pos + 1];
                if next < 0x80 {
                    self.pos += 2;
                    return Ok(u64::from(byte & 0x7f) | (u64::from(next) << 7));
                }
            }
        }
        self.varint_slow()
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64, DecodeError> {
        // Millisecond timestamps take 6 bytes: with 10 bytes left, read them without a
        // bounds check per byte (the loop unrolls).
        if let Some(bytes) = self.buf[..self.end].get(self.pos..self.pos + 10) {
            let mut value: u64 = 0;
            for (i, &byte) in bytes.iter().enumerate() {
                value |= u64::from(byte & 0x7f) << (7 * i);
                if byte < 0x80 {
                    if i == 9 && byte > 1 {
                        return Err(DecodeError::VarintOverflow);
                    }
                    self.pos += i + 1;
                    return Ok(value);
                }
            }
            return Err(DecodeError::VarintOverflow);
        }
        let mut value: u64 = 0;
        let mut shift = 0u32;
        loop {
            if self.pos >= self.end {
                return Err(DecodeError::Truncated);
            }
            let byte = self.buf[self.pos];
            self.pos += 1;
            if shift == 63 && byte > 1 {
                return Err(DecodeError::VarintOverflow);
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
            shift += 7;
            if shift > 63 {
                return Err(DecodeError::VarintOverflow);
            }
        }
    }

    /// Consumes the next byte when it is `byte` (a one-byte field key the caller expects:
    /// a branch the CPU predicts, where a `match` on the key is an indirect jump).
    #[inline(always)]
    pub fn eat(&mut self, byte: u8) -> bool {
        if self.pos < self.end && self.buf[self.pos] == byte {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Reads a field key; returns (field number, wire type).
    #[inline(always)]
    pub fn key(&mut self) -> Result<(u32, u8), DecodeError> {
        let key = self.varint()?;
        let field = key >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(DecodeError::BadFieldNumber);
        }
        Ok((field as u32, (key & 7) as u8))
    }

    #[inline]
    pub fn fixed64(&mut self) -> Result<u64, DecodeError> {
        if self.end - self.pos < 8 {
            return Err(DecodeError::Truncated);
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 8]);
        self.pos += 8;
        Ok(u64::from_le_bytes(b))
    }

    /// Reads a length-delimited field and returns its [start, end) range.
    #[inline(always)]
    pub fn len_delimited(&mut self) -> Result<(usize, usize), DecodeError> {
        let len = self.varint()?;
        let remaining = (self.end - self.pos) as u64;
        if len > remaining {
            return Err(DecodeError::Truncated);
        }
        let start = self.pos;
        self.pos += len as usize;
        Ok((start, self.pos))
    }

    /// Skips a field of the given wire type (unknown fields are tolerated, as protobuf requires).
    pub fn skip(&mut self, wire: u8) -> Result<(), DecodeError> {
        match wire {
            WIRE_VARINT => {
                self.varint()?;
            }
            WIRE_I64 => {
                self.fixed64()?;
            }
            WIRE_LEN => {
                self.len_delimited()?;
            }
            WIRE_I32 => {
                if self.end - self.pos < 4 {
                    return Err(DecodeError::Truncated);
                }
                self.pos += 4;
            }
            other => return Err(DecodeError::BadWireType(other)),
        }
        Ok(())
    }

    #[inline]
    pub fn expect(&self, wire: u8, want: u8, field: &'static str) -> Result<(), DecodeError> {
        if wire == want {
            Ok(())
        } else {
            Err(DecodeError::UnexpectedWireType(field, wire))
        }
    }
}

/// Copies the message `buf[start..end]` into `out` without its field `drop`.
pub fn copy_without(
    buf: &[u8],
    start: usize,
    end: usize,
    drop: u32,
    out: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let from = r.pos();
        let (field, wire) = r.key()?;
        r.skip(wire)?;
        if field != drop {
            out.extend_from_slice(&buf[from..r.pos()]);
        }
    }
    Ok(())
}

#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Writes `v` as a varint at `out[at..]`, which must have room for it (see
/// [`varint_len`]); returns the bytes written.
#[inline]
pub fn put_varint_at(out: &mut [u8], at: usize, mut v: u64) -> usize {
    let mut i = at;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1 - at
}

#[inline]
pub fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[inline]
pub fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

#[inline]
pub fn put_bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[inline]
pub fn put_double_field(out: &mut Vec<u8>, field: u32, v: f64) {
    put_key(out, field, WIRE_I64);
    out.extend_from_slice(&v.to_bits().to_le_bytes());
}

#[inline]
pub fn put_int64_field(out: &mut Vec<u8>, field: u32, v: i64) {
    put_key(out, field, WIRE_VARINT);
    put_varint(out, v as u64);
}

/// A 1.0 `WriteRequest`'s series fields alone, its metadata and anything else left out
/// (tests of bodies without metadata).
#[cfg(test)]
pub(crate) fn series_fields_of(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut r = Reader::new(body, 0, body.len());
    while !r.is_done() {
        let from = r.pos();
        let (field, wire) = r.key().unwrap();
        r.skip(wire).unwrap();
        if field == 1 {
            out.extend_from_slice(&body[from..r.pos()]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip_and_len() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "len of {v}");
            let mut r = Reader::new(&out, 0, out.len());
            assert_eq!(r.varint().unwrap(), v);
            assert!(r.is_done());
        }
    }

    #[test]
    fn varints_decode_alike_with_and_without_ten_bytes_left() {
        for v in [128u64, 1_700_000_000_000, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let short = out.len();
            out.extend_from_slice(&[0u8; 10]);
            for end in [short, out.len()] {
                let mut r = Reader::new(&out, 0, end);
                assert_eq!(r.varint().unwrap(), v, "{v} with {end} bytes");
                assert_eq!(r.pos(), short);
            }
        }
        // The tenth byte may carry only the top bit.
        let mut bad = vec![0xffu8; 9];
        bad.push(0x02);
        bad.extend_from_slice(&[0u8; 4]);
        assert!(Reader::new(&bad, 0, bad.len()).varint().is_err());
        assert!(Reader::new(&bad, 0, 10).varint().is_err());
        // A varint running past the message's end is truncated, not read from beyond it.
        let long = [0x80u8, 0x80, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(matches!(
            Reader::new(&long, 0, 2).varint(),
            Err(DecodeError::Truncated)
        ));
        assert_eq!(Reader::new(&long, 0, long.len()).varint().unwrap(), 1 << 14);
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let buf = [0xffu8; 11];
        let mut r = Reader::new(&buf, 0, buf.len());
        assert!(r.varint().is_err());
    }

    #[test]
    fn truncated_length_is_an_error() {
        let buf = [0x0a, 0x05, 1, 2];
        let mut r = Reader::new(&buf, 0, buf.len());
        let (_, wire) = r.key().unwrap();
        assert_eq!(wire, WIRE_LEN);
        assert!(matches!(r.len_delimited(), Err(DecodeError::Truncated)));
    }
}
