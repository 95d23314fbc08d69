//! Snappy block format with the declared length checked before any allocation.

use super::DecodeError;

/// The most output one byte of a snappy block can produce: a copy with a 2-byte offset
/// is 3 bytes long and copies at most 64 bytes (64/3 < 22); literals and the other copy
/// forms expand less.
pub const MAX_EXPANSION: usize = 22;

/// Decompresses `body` into `out` (reused; grown only when needed). The decoded length
/// that snappy declares in its header is checked against `max_decoded` first, so a tiny
/// body cannot make us allocate gigabytes.
pub fn decompress_into(
    decoder: &mut snap::raw::Decoder,
    body: &[u8],
    max_decoded: usize,
    out: &mut Vec<u8>,
) -> Result<usize, DecodeError> {
    let declared =
        snap::raw::decompress_len(body).map_err(|e| DecodeError::Snappy(e.to_string()))?;
    let header_len = body.iter().take_while(|b| **b & 0x80 != 0).count() + 1;
    let producible = body
        .len()
        .saturating_sub(header_len)
        .saturating_mul(MAX_EXPANSION);
    if declared > producible {
        // A lie in the header would otherwise size our buffer: answer before allocating.
        return Err(DecodeError::Snappy(format!(
            "header declares {declared} decoded bytes, more than {} compressed bytes can hold",
            body.len()
        )));
    }
    if declared > max_decoded {
        return Err(DecodeError::DecodedTooLarge {
            declared,
            limit: max_decoded,
        });
    }
    if out.len() < declared {
        out.resize(declared, 0);
    }
    let n = decoder
        .decompress(body, &mut out[..declared])
        .map_err(|e| DecodeError::Snappy(e.to_string()))?;
    Ok(n)
}

/// Compresses `input` into `out` (reused), returning the compressed length.
pub fn compress_into(encoder: &mut snap::raw::Encoder, input: &[u8], out: &mut Vec<u8>) -> usize {
    let max = snap::raw::max_compress_len(input.len());
    if out.len() < max {
        out.resize(max, 0);
    }
    // An error is only possible for inputs over snappy's 4 GiB limit, which the decode
    // limit has already excluded; treat it as an empty output rather than panic.
    encoder.compress(input, &mut out[..max]).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_length_is_checked_before_allocating() {
        // 100 bytes could hold 2,000 decoded bytes, but the limit is 1,024.
        let mut body = vec![0xd0, 0x0f];
        body.resize(100, 0);
        let mut out = Vec::new();
        let err =
            decompress_into(&mut snap::raw::Decoder::new(), &body, 1 << 10, &mut out).unwrap_err();
        assert!(
            matches!(err, DecodeError::DecodedTooLarge { .. }),
            "{err:?}"
        );
        assert_eq!(out.capacity(), 0);
    }

    #[test]
    fn declared_length_beyond_what_the_body_can_hold_is_refused_before_allocating() {
        // 5 bytes that declare 256 MiB - 1: under the limit, but no 1-byte block makes it.
        let body = [0xff, 0xff, 0xff, 0x7f, 0x00];
        let mut out = Vec::new();
        let err = decompress_into(&mut snap::raw::Decoder::new(), &body, 256 << 20, &mut out)
            .unwrap_err();
        assert!(matches!(err, DecodeError::Snappy(_)), "{err:?}");
        assert!(!err.is_too_large());
        assert_eq!(out.capacity(), 0);
    }

    #[test]
    fn highly_compressible_bodies_still_decode() {
        // Snappy's best case (long runs) stays within the expansion bound.
        let input = vec![0u8; 1 << 20];
        let mut c = Vec::new();
        let n = compress_into(&mut snap::raw::Encoder::new(), &input, &mut c);
        let mut d = Vec::new();
        let m = decompress_into(&mut snap::raw::Decoder::new(), &c[..n], 1 << 21, &mut d).unwrap();
        assert_eq!(m, input.len());
    }

    #[test]
    fn round_trip() {
        let input = b"hello hello hello hello remote write".repeat(10);
        let mut c = Vec::new();
        let n = compress_into(&mut snap::raw::Encoder::new(), &input, &mut c);
        let mut d = Vec::new();
        let m = decompress_into(&mut snap::raw::Decoder::new(), &c[..n], 1 << 20, &mut d).unwrap();
        assert_eq!(&d[..m], &input[..]);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        for body in [&b""[..], b"\x05", b"\x0a\xff\xff\xff", b"\x04\x0c\x01\x02"] {
            let _ = decompress_into(&mut snap::raw::Decoder::new(), body, 1 << 20, &mut out);
        }
    }
}
