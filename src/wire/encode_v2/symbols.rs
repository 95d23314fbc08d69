//! A 2.0 request's symbols table, built while its series are encoded: the strings in one
//! byte buffer, an open-addressing table of their indices, no `String` per symbol, all
//! reused from request to request.

use std::hash::{BuildHasher, Hasher};

use crate::wire::decode::short_eq;
use crate::wire::pb::put_bytes_field;

#[derive(Default)]
pub(super) struct Symbols {
    hasher: ahash::RandomState,
    /// Symbol `i` is `bytes[ends[i-1]..ends[i]]`.
    bytes: Vec<u8>,
    ends: Vec<u32>,
    /// Open addressing: symbol index + 1, 0 for an empty slot.
    slots: Vec<u32>,
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
        self.ends.push(0);
        let h = self.hash(b"");
        let mask = self.slots.len() - 1;
        self.slots[h as usize & mask] = 1;
    }

    /// The index of `s`, added when new.
    pub(super) fn intern(&mut self, s: &[u8]) -> u32 {
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
