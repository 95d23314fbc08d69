//! The one-pass encoder for the series shape the mapper writes: at most [`FAST_LABELS`]
//! labels in the short shape (`0x0a LEN 0x0a NL name 0x12 VL value`, lengths under 128),
//! then samples only (`0x12 LEN`).
//!
//! Consecutive series mostly share their labels (one family, one target). The previous
//! series' labels are kept by index ([`PreviousLabels`]); from label `k` on, the current
//! series' bytes are compared with the previous series' labels `k..` in one go, and the
//! labels the equal bytes cover take the previous series' references as they are: the
//! run's references copied in one piece from where the previous series' stand in the
//! output. Only a label that differs is read and looked up.
//! The series is written straight into the encoder's output at its end, its length bytes
//! patched once known.

use super::{ByteRange, MetadataMemory, SERIES_KEY, V2Encoder, put_series_metadata, slice};
use crate::wire::decode::{common_prefix, is_metric_name, short_eq};
use crate::wire::pb::{WIRE_LEN, put_varint_at, varint_len};

/// Labels a series may have for the one-pass encoder (a bit each in a `u32`).
pub(super) const FAST_LABELS: usize = 32;

/// A `TimeSeries`' `labels_refs` (field 1), length-delimited.
const REFS_KEY: u8 = (1 << 3) | WIRE_LEN;

/// A label's two references as varints, in the first `.1` bytes (at most ten; sixteen so
/// that they are copied as one fixed-size block). Built in registers: written byte by
/// byte into memory and read back as one 16-byte block, the read waited for the bytes'
/// stores (no store forwarding from narrow stores to a wide load), a tenth of the
/// encoder's time.
#[inline(always)]
pub(super) fn pack_refs(name_ref: u32, value_ref: u32) -> ([u8; 16], u8) {
    let (name, name_len) = varint_word(name_ref);
    let (value, value_len) = varint_word(value_ref);
    let packed = u128::from(name) | (u128::from(value) << (8 * name_len));
    (packed.to_le_bytes(), (name_len + value_len) as u8)
}

/// `v` as a varint in the low bytes of a word (at most five), and its length.
#[inline(always)]
fn varint_word(v: u32) -> (u64, u32) {
    if v < 0x80 {
        return (u64::from(v), 1);
    }
    let (mut v, mut word, mut len) = (u64::from(v), 0u64, 0u32);
    while v >= 0x80 {
        word |= ((v & 0x7f) | 0x80) << (8 * len);
        v >>= 7;
        len += 1;
    }
    (word | (v << (8 * len)), len + 1)
}

/// Copies `src[from..from + len]` to the start of `out` and returns `len`: one fixed-size
/// copy of 32 bytes when `len` is at most that and `src` holds them (the bytes past `len`
/// are the caller's to write over), else an exact one. `None` when either is too short.
#[inline(always)]
fn copy_short(src: &[u8], from: usize, len: usize, out: &mut [u8]) -> Option<usize> {
    match src.get(from..from + 32) {
        Some(block) if len <= 32 => out.get_mut(..32)?.copy_from_slice(block),
        _ => out
            .get_mut(..len)?
            .copy_from_slice(src.get(from..from + len)?),
    }
    Some(len)
}

/// The labels of the previous series the one-pass encoder wrote, by index. Label `m`'s
/// encoded field follows label `m-1`'s in the mapped body, from `begin` to `end`, and
/// its references follow label `m-1`'s in the encoder's output, from `refs_at`. Its
/// name and value spans may point into an earlier series of the request: bytes equal to
/// this series', which is all they are used for.
pub(super) struct PreviousLabels {
    /// How many; 0: nothing to compare with (the request's first series, or the previous
    /// one went through the general encoder).
    pub(super) len: usize,
    begin: usize,
    end: usize,
    /// Where the previous series' packed references start in `series_out` (it lies
    /// wholly before the series being written, which never writes there).
    refs_at: usize,
    /// The encoded field's length, key and length byte included (at most 129).
    field_len: [u8; FAST_LABELS],
    name: [ByteRange; FAST_LABELS],
    name_ref: [u32; FAST_LABELS],
    value: [ByteRange; FAST_LABELS],
    value_ref: [u32; FAST_LABELS],
    /// Label `m`'s packed references' length in bytes.
    refs_len: [u8; FAST_LABELS],
    /// Bit `m`: label `m` is `__name__`.
    metric_names: u32,
}

impl Default for PreviousLabels {
    fn default() -> Self {
        PreviousLabels {
            len: 0,
            begin: 0,
            end: 0,
            refs_at: 0,
            field_len: [0; FAST_LABELS],
            name: [(0, 0); FAST_LABELS],
            name_ref: [0; FAST_LABELS],
            value: [(0, 0); FAST_LABELS],
            value_ref: [0; FAST_LABELS],
            refs_len: [0; FAST_LABELS],
            metric_names: 0,
        }
    }
}

/// What the one-pass encoder may write past the series' own bytes: fixed-size copies
/// (sixteen bytes of a label's references, 32 of a run's, 32 of samples, 32 of metadata)
/// and two more length bytes.
const SLACK: usize = 128;

impl V2Encoder {
    /// Encodes the series `buf[start..end]` when it has the mapper's shape (module docs),
    /// appended to `series_out` at `series_len`. `None`: anything else; what was written
    /// lies past `series_len` (and symbols interned stay, unused), and the general
    /// [`V2Encoder::encode_series`] takes the series (and forgets `previous`, some of
    /// whose labels this one may have overwritten).
    #[inline(always)]
    pub(super) fn encode_series_fast(
        &mut self,
        buf: &[u8],
        start: usize,
        end: usize,
        memory: Option<&MetadataMemory>,
    ) -> Option<()> {
        let msg = buf.get(start..end)?;
        let head = self.series_len;
        let room = msg.len() + FAST_LABELS * 10 + SLACK;
        if self.series_out.len() < head + room {
            // Grown, zeroed, rarely: written bytes are tracked by `series_len`, so the
            // buffer keeps this length from request to request.
            let want = (head + room).max(self.series_out.len() * 2);
            self.series_out.resize(want, 0);
        }
        let V2Encoder {
            symbols,
            previous,
            series_out,
            ..
        } = self;
        // The labels behind the box, once: through `&mut Box` every store to a label
        // reloaded the box's pointer.
        let prev: &mut PreviousLabels = previous;
        // What was written before this series (the previous series' references among it),
        // and this series' room.
        let (done, o) = series_out.split_at_mut(head);
        let o = o.get_mut(..room)?;
        // The series' key and its length (one byte, patched below), then the references'.
        o[0] = SERIES_KEY;
        o[2] = REFS_KEY;
        let mut w = 4;
        let prev_len = prev.len;
        let prev_end = prev.end;
        // Where the previous series' label `k` starts in `buf`.
        let mut prev_at = prev.begin;
        // Where the previous series' label `k`'s references start in `done`.
        let mut prev_refs = prev.refs_at;
        let mut rest = msg;
        // Where `rest` starts in `buf`.
        let mut pos = start;
        let mut k = 0usize;
        // The first label at which a run of the previous series' labels is looked for.
        let mut run_from = 0usize;
        while rest.first() == Some(&0x0a) {
            if k < prev_len && k >= run_from {
                // The previous series' labels from its `k`-th on against this series'
                // bytes: every one the equal bytes cover is this series' next label.
                let equal = common_prefix(rest, buf.get(prev_at..prev_end)?);
                let (mut covered, mut refs) = (0, 0);
                let lens = prev.field_len.get(k..prev_len)?;
                let refs_lens = prev.refs_len.get(k..prev_len)?;
                for (&len, &label_refs) in lens.iter().zip(refs_lens) {
                    let len = usize::from(len);
                    if covered + len > equal {
                        break;
                    }
                    covered += len;
                    refs += usize::from(label_refs);
                    k += 1;
                }
                // The covered labels' references, one piece (its bytes past `refs` are
                // written over or lie past the series).
                w += copy_short(done, prev_refs, refs, o.get_mut(w..)?)?;
                prev_refs += refs;
                rest = rest.get(covered..)?;
                pos += covered;
                prev_at += covered;
                // Not again before the label that differs has been read.
                run_from = k + 1;
                continue;
            }
            if k >= FAST_LABELS {
                return None;
            }
            let key = *rest.first_chunk::<4>()?;
            if u32::from_le_bytes(key) & 0x80ff_80ff != 0x000a_000a {
                return None;
            }
            let (len, name_len) = (usize::from(key[1]), usize::from(key[3]));
            let (field, after) = rest.split_at_checked(2 + len)?;
            let (n, value_field) = field.get(4..)?.split_at_checked(name_len)?;
            let (&[0x12, value_len], v) = value_field.split_first_chunk::<2>()? else {
                return None;
            };
            if v.len() != usize::from(value_len) {
                return None;
            }
            let name_at = (pos + 4) as u32;
            let value_at = name_at + name_len as u32 + 2;
            // Mostly only the value changed (`le`, a family's other series' names): the
            // name's symbol is the previous label's then.
            let name_ref = if k < prev_len && short_eq(slice(buf, prev.name[k]), n) {
                prev.name_ref[k]
            } else {
                symbols.intern(n)
            };
            let value_ref = symbols.intern(v);
            if k < prev_len {
                prev_at += usize::from(prev.field_len[k]);
                prev_refs += usize::from(prev.refs_len[k]);
            }
            let (packed, packed_len) = pack_refs(name_ref, value_ref);
            o.get_mut(w..w + 16)?.copy_from_slice(&packed);
            w += usize::from(packed_len);
            prev.field_len[k] = (2 + len) as u8;
            prev.name[k] = (name_at, name_at + name_len as u32);
            prev.name_ref[k] = name_ref;
            prev.value[k] = (value_at, value_at + u32::from(value_len));
            prev.value_ref[k] = value_ref;
            prev.refs_len[k] = packed_len;
            let bit = 1u32 << k;
            if is_metric_name(n) {
                prev.metric_names |= bit;
            } else {
                prev.metric_names &= !bit;
            }
            rest = after;
            pos += 2 + len;
            k += 1;
        }
        let samples_at = pos;
        let mut tail = rest;
        while let Some((&0x12, after_key)) = tail.split_first() {
            let (&len, after_len) = after_key.split_first()?;
            if len >= 0x80 {
                return None;
            }
            tail = after_len.get(usize::from(len)..)?;
        }
        if !tail.is_empty() {
            return None;
        }
        // This series is the previous one for the next.
        let names = prev.metric_names & u32::MAX.checked_shr(32 - k as u32).unwrap_or(0);
        prev.metric_names = names;
        prev.len = k;
        prev.begin = start;
        prev.end = samples_at;
        // The series' name is its last `__name__` (the mapper writes one).
        let name = names
            .checked_ilog2()
            .map(|h| (prev.value[h as usize], prev.value_ref[h as usize]));
        // The general encoder's memory of labels is another series' now.
        self.labels_seen.clear();
        let metadata =
            self.series_metadata(buf, name.map_or((0, 0), |n| n.0), name.map(|n| n.1), memory);
        let o = self.series_out.get_mut(head..head + room)?;
        let refs_len = w - 4;
        // Where the references start in the series as written (one more for a second
        // length byte of the series', below).
        let mut refs_at = 4;
        if refs_len == 0 {
            // No references field: what follows starts after the series' header.
            w = 2;
        } else if refs_len < 0x80 {
            o[3] = refs_len as u8;
        } else {
            // At most ten bytes a label: two length bytes.
            o.copy_within(4..w, 5);
            o[3] = (refs_len as u8) | 0x80;
            o[4] = (refs_len >> 7) as u8;
            w += 1;
            refs_at = 5;
        }
        // The samples as they are (2.0 numbers them like 1.0), reading on into the next
        // series' bytes, which the metadata and the next series write over or which lie
        // past `series_len`.
        w += copy_short(buf, samples_at, end - samples_at, o.get_mut(w..)?)?;
        if metadata.is_some() {
            w += put_series_metadata(o.get_mut(w..w + 32)?.try_into().ok()?, metadata);
        }
        let len = w - 2;
        if len < 0x80 {
            o[1] = len as u8;
        } else {
            let extra = varint_len(len as u64) - 1;
            o.copy_within(2..w, 2 + extra);
            put_varint_at(o, 1, len as u64);
            w += extra;
            refs_at += extra;
        }
        self.previous.refs_at = head + refs_at;
        self.series_len = head + w;
        Some(())
    }
}
