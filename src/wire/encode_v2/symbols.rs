//! A 2.0 request's symbols table, built while its series are encoded: the strings in one
//! byte buffer, an open-addressing table of their indices, no `String` per symbol, all
//! reused from request to request.

use std::hash::{BuildHasher, Hasher};

use crate::wire::decode::{short_eq, word4, word8};
use crate::wire::pb::put_bytes_field;

/// An odd constant of mixed bits (2^64 over the golden ratio) to spread a short
/// symbol's key over [`Symbols::recent`].
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

pub(super) struct Symbols {
    hasher: ahash::RandomState,
    /// Symbol `i` is `bytes[ends[i-1]..ends[i]]`.
    bytes: Vec<u8>,
    ends: Vec<u32>,
    /// Open addressing: symbol index + 1, 0 for an empty slot.
    slots: Vec<u32>,
    /// The symbols of at most 16 bytes interned last, direct-mapped by their bytes: the
    /// values a series changes from the previous one (`le`, a GPU's index) come back
    /// family after family. A look here stays in a few KiB; the table above is tens of
    /// KiB, and the load of its slot took a fifth of the interning's time (`perf`).
    /// Fixed in size (6 KiB), so not in [`Symbols::retained_bytes`], which counts what
    /// grows with requests.
    recent: Box<[RecentSymbol; RECENT]>,
}

impl Default for Symbols {
    fn default() -> Self {
        Symbols {
            hasher: ahash::RandomState::default(),
            bytes: Vec::new(),
            ends: Vec::new(),
            slots: Vec::new(),
            recent: Box::new([RecentSymbol::default(); RECENT]),
        }
    }
}

/// Entries of [`Symbols::recent`] (a power of two).
const RECENT: usize = 256;

/// A short symbol as [`short_key`] packs it, and its index + 1 (0: empty).
#[derive(Clone, Copy, Default)]
struct RecentSymbol {
    key: (u64, u64),
    len: u32,
    index_plus_one: u32,
}

/// A string of at most 16 bytes as two words that, with its length, tell it from any
/// other such string: its first and last eight bytes (overlapping under 16), four and four
/// under 8, and under 4 its first, middle and last byte (all of them). `None` over 16.
#[inline(always)]
fn short_key(s: &[u8]) -> Option<(u64, u64)> {
    let n = s.len();
    match n {
        0 => Some((0, 0)),
        1..=3 => Some((
            u64::from(s[0]) | u64::from(s[n / 2]) << 8 | u64::from(s[n - 1]) << 16,
            0,
        )),
        4..=7 => Some((u64::from(word4(s, 0)), u64::from(word4(s, n - 4)))),
        8..=16 => Some((word8(s, 0), word8(s, n - 8))),
        _ => None,
    }
}

impl Symbols {
    /// Bytes the table holds between requests.
    pub(super) fn retained_bytes(&self) -> usize {
        self.bytes.capacity() + 4 * (self.ends.capacity() + self.slots.capacity())
    }

    pub(super) fn hash(&self, b: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(b);
        h.finish()
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start as usize..self.ends[i] as usize]
    }

    /// Empties the table for a new request: only the empty string, symbol 0 (the spec
    /// requires it).
    pub(super) fn reset(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        if self.slots.is_empty() {
            self.slots.resize(1024, 0);
        } else {
            self.slots.fill(0);
        }
        self.recent.fill(RecentSymbol::default());
        self.ends.push(0);
        let h = self.hash(b"");
        let mask = self.slots.len() - 1;
        self.slots[h as usize & mask] = 1;
    }

    /// The index of `s`, added when new.
    #[inline(always)]
    pub(super) fn intern(&mut self, s: &[u8]) -> u32 {
        let Some(key) = short_key(s) else {
            return self.intern_in_table(s);
        };
        let len = s.len() as u32;
        let mixed = (key.0 ^ key.1.rotate_left(29) ^ u64::from(len)).wrapping_mul(MIX);
        let at = (mixed >> (64 - RECENT.trailing_zeros())) as usize & (RECENT - 1);
        let seen = self.recent[at];
        if seen.index_plus_one != 0 && seen.key == key && seen.len == len {
            return seen.index_plus_one - 1;
        }
        let index = self.intern_in_table(s);
        self.recent[at] = RecentSymbol {
            key,
            len,
            index_plus_one: index + 1,
        };
        index
    }

    /// [`Symbols::intern`] through the hash table.
    #[inline(never)]
    fn intern_in_table(&mut self, s: &[u8]) -> u32 {
        let h = self.hash(s);
        let mut mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let v = self.slots[i];
            if v == 0 {
                break;
            }
            if short_eq(self.get(v as usize - 1), s) {
                return v - 1;
            }
            i = (i + 1) & mask;
        }
        let idx = self.ends.len() as u32;
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len() as u32);
        if self.ends.len() * 2 > self.slots.len() {
            self.grow();
            mask = self.slots.len() - 1;
            i = h as usize & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
        }
        self.slots[i] = idx + 1;
        idx
    }

    #[inline(never)]
    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        self.slots.clear();
        self.slots.resize(n, 0);
        let mask = n - 1;
        // The newest symbol is placed by the caller.
        for idx in 0..self.ends.len() - 1 {
            let h = self.hash(self.get(idx));
            let mut i = h as usize & mask;
            while self.slots[i] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = idx as u32 + 1;
        }
    }

    /// Writes every symbol, in order, as field `field` of a message.
    pub(super) fn put_fields(&self, out: &mut Vec<u8>, field: u32) {
        for i in 0..self.ends.len() {
            put_bytes_field(out, field, self.get(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// For each length, every byte of the string reaches the key: two strings of one
    /// length with the same key are the same string, so a hit in `recent` is the symbol.
    #[test]
    fn short_keys_cover_every_byte() {
        for n in 0..=16usize {
            let s: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
            let key = short_key(&s).unwrap();
            for at in 0..n {
                for flip in [1u8, 0x80, 0xff] {
                    let mut t = s.clone();
                    t[at] ^= flip;
                    assert_ne!(
                        short_key(&t),
                        Some(key),
                        "length {n}, byte {at}, ^{flip:#x}"
                    );
                }
            }
        }
        assert_eq!(short_key(&[0; 17]), None);
    }

    /// Many more short strings than `recent` holds, with long ones among them, interned
    /// over and over in an order that keeps evicting entries: each gets one index, every
    /// time, and the table holds it at that index.
    #[test]
    fn interning_through_recent_symbols_gives_each_string_one_index() {
        let mut symbols = Symbols::default();
        symbols.reset();
        let strings: Vec<Vec<u8>> = (0..3 * RECENT)
            .map(|i| match i % 3 {
                0 => i.to_string().into_bytes(),
                1 => format!("le-{i:012}").into_bytes(),
                _ => format!("a-label-value-longer-than-sixteen-{i}").into_bytes(),
            })
            .chain([Vec::new(), vec![0], vec![0, 0], b"\0\0\0\0".to_vec()])
            .collect();
        let n = strings.len();
        let mut first = vec![None; n];
        // Forwards, backwards, then by strides of 7 and 11 (prime to `n`).
        let orders: [&dyn Fn(usize) -> usize; 4] =
            [&|i| i, &|i| n - 1 - i, &|i| i * 7 % n, &|i| i * 11 % n];
        for order in orders {
            for i in (0..n).map(order) {
                let s = &strings[i];
                let index = symbols.intern(s);
                assert_eq!(symbols.get(index as usize), s.as_slice());
                let want = *first[i].get_or_insert(index);
                assert_eq!(index, want, "{:?}", String::from_utf8_lossy(s));
            }
        }
        // The empty string is symbol 0 (interned by `reset`), and nothing twice.
        assert_eq!(first[3 * RECENT], Some(0));
        assert_eq!(symbols.len(), strings.len());
        // The next request: nothing of the last one's `recent` answers for its symbols,
        // which take other indices.
        symbols.reset();
        let mut added = 0;
        for s in strings.iter().rev() {
            let index = symbols.intern(s);
            assert_eq!(symbols.get(index as usize), s.as_slice());
            if !s.is_empty() {
                added += 1;
            }
            assert_eq!(index, if s.is_empty() { 0 } else { added });
        }
    }
}
