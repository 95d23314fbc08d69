//! The mapper's per-worker caches of things computed once per metric name (plans for
//! names that prefix or regex rules match, metadata plans, `le` styles, `_total` fix
//! plans; and, keyed by a bound's text, rescaled `le` bounds). Bounded in entries and in
//! bytes: a sender with unbounded name churn, or with very long names, makes a cache start
//! over, never grow without limit; a name longer than [`NAME_CACHE_MAX_KEY`] is not cached
//! at all (its value is computed each time it is needed). A warm cache costs one hash
//! lookup and no allocation. Keyed by the name's bytes, as they stand in the request: a
//! lookup converts nothing to `str`.

use ahash::AHashMap;
use std::collections::hash_map::Entry;

/// Names a cache holds at most before it starts over (unless it says another limit).
pub const NAME_CACHE_LIMIT: usize = 100_000;

/// Bytes of names (plus [`ENTRY_OVERHEAD`] each) a cache holds at most before it starts
/// over. The values are a few times their name at most (a plan's new name and trace), so
/// a cache stays within a small multiple of this whatever names a sender writes, where
/// [`NAME_CACHE_LIMIT`] alone would let 100,000 names of 64 KiB take gigabytes.
pub const NAME_CACHE_BYTES: usize = 4 << 20;

/// Names longer than this are never cached (no real metric name comes near).
pub const NAME_CACHE_MAX_KEY: usize = 1024;

/// What an entry costs besides its name's bytes (the table's slot, the box's header, the
/// allocator's rounding), counted against [`NAME_CACHE_BYTES`].
const ENTRY_OVERHEAD: usize = 64;

/// A cache of at most `LIMIT` names and [`NAME_CACHE_BYTES`] of them.
pub struct NameCache<V, const LIMIT: usize = NAME_CACHE_LIMIT> {
    map: AHashMap<Box<[u8]>, V>,
    /// The names' bytes plus [`ENTRY_OVERHEAD`] per entry.
    bytes: usize,
}

impl<V, const LIMIT: usize> Default for NameCache<V, LIMIT> {
    fn default() -> Self {
        NameCache {
            map: AHashMap::new(),
            bytes: 0,
        }
    }
}

impl<V: Clone, const LIMIT: usize> NameCache<V, LIMIT> {
    pub fn get(&self, name: &[u8]) -> Option<&V> {
        self.map.get(name)
    }

    /// The cached value for `name`, computed by `make` (and cached) on first sight.
    pub fn get_or_insert_with(&mut self, name: &[u8], make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.map.get(name) {
            return v.clone();
        }
        let v = make();
        self.insert(name, v.clone());
        v
    }

    /// Caches `value` for `name`; a full cache starts over first. A name longer than
    /// [`NAME_CACHE_MAX_KEY`] is not cached.
    pub fn insert(&mut self, name: &[u8], value: V) {
        let _ = self.insert_and_get(name, value);
    }

    /// Caches `value` for `name` ([`NameCache::insert`]) and returns the cached value,
    /// or gives `value` back when `name` is too long to be cached.
    pub fn insert_and_get(&mut self, name: &[u8], value: V) -> Result<&V, V> {
        if name.len() > NAME_CACHE_MAX_KEY {
            return Err(value);
        }
        let cost = name.len() + ENTRY_OVERHEAD;
        if self.map.len() >= LIMIT || self.bytes + cost > NAME_CACHE_BYTES {
            self.clear();
        }
        Ok(match self.map.entry(name.into()) {
            Entry::Occupied(mut o) => {
                o.insert(value);
                o.into_mut()
            }
            Entry::Vacant(v) => {
                self.bytes += cost;
                v.insert(value)
            }
        })
    }

    /// Moves the cache out, leaving an empty one with the same hasher: no new random
    /// state (which takes a locked increment of a counter every worker shares).
    pub fn take(&mut self) -> Self {
        let empty = AHashMap::with_hasher(self.map.hasher().clone());
        NameCache {
            map: std::mem::replace(&mut self.map, empty),
            bytes: std::mem::take(&mut self.bytes),
        }
    }

    /// Forgets every name (keeps the table's memory).
    pub fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    /// The names' bytes held, plus a fixed overhead per entry (what
    /// [`NAME_CACHE_BYTES`] bounds).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What the cache holds in memory: its names and their overhead, and its table,
    /// which keeps its size when the cache starts over.
    pub fn held_bytes(&self) -> usize {
        self.bytes + self.map.capacity() * (std::mem::size_of::<(Box<[u8]>, V)>() + 1)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_over_at_its_limit() {
        let mut c: NameCache<u32, 3> = NameCache::default();
        for (i, n) in [b"a", b"b", b"c"].into_iter().enumerate() {
            assert_eq!(c.get_or_insert_with(n, || i as u32), i as u32);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.get_or_insert_with(b"a", || 99), 0, "cached");
        assert_eq!(c.get_or_insert_with(b"d", || 7), 7);
        assert_eq!(c.len(), 1, "started over instead of growing");
    }

    #[test]
    fn insert_and_get_returns_what_it_cached_or_gives_a_long_name_back() {
        let mut c: NameCache<u32, 2> = NameCache::default();
        assert_eq!(c.insert_and_get(b"a", 1), Ok(&1));
        assert_eq!(c.insert_and_get(b"a", 2), Ok(&2), "replaced, counted once");
        assert_eq!(c.bytes(), 1 + ENTRY_OVERHEAD);
        let long = vec![b'x'; NAME_CACHE_MAX_KEY + 1];
        assert_eq!(c.insert_and_get(&long, 3), Err(3));
        assert_eq!(c.len(), 1);
        assert_eq!(c.insert_and_get(b"b", 4), Ok(&4));
        assert_eq!(
            c.insert_and_get(b"c", 5),
            Ok(&5),
            "started over at the limit"
        );
        assert_eq!((c.len(), c.get(b"a")), (1, None));
    }

    #[test]
    fn take_moves_the_names_out_and_leaves_an_empty_cache() {
        let mut c: NameCache<u32> = NameCache::default();
        c.insert(b"a", 1);
        let mut taken = c.take();
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
        assert_eq!(
            (taken.get(b"a"), taken.bytes()),
            (Some(&1), 1 + ENTRY_OVERHEAD)
        );
        taken.insert(b"b", 2);
        c = taken;
        assert_eq!((c.len(), c.get(b"b")), (2, Some(&2)));
    }

    #[test]
    fn long_names_are_bounded_in_bytes_not_only_in_count() {
        let mut c: NameCache<u32> = NameCache::default();
        let mut calls = 0;
        let long = vec![b'x'; NAME_CACHE_MAX_KEY + 1];
        for _ in 0..2 {
            c.get_or_insert_with(&long, || {
                calls += 1;
                1
            });
        }
        assert_eq!(calls, 2, "a name over the key limit is computed each time");
        assert!(c.is_empty());
        // Names at the key limit, each new: the byte bound, far below the count bound,
        // makes the cache start over.
        let mut peak = 0;
        for i in 0..20_000u32 {
            let mut name = vec![b'n'; NAME_CACHE_MAX_KEY];
            name[..4].copy_from_slice(&i.to_le_bytes());
            c.insert(&name, i);
            peak = peak.max(c.bytes());
            assert!(c.bytes() <= NAME_CACHE_BYTES);
        }
        assert!(c.len() < 20_000, "started over");
        assert!(
            peak > NAME_CACHE_BYTES - 2 * NAME_CACHE_MAX_KEY,
            "filled up to the bound"
        );
        let mut name = vec![b'n'; NAME_CACHE_MAX_KEY];
        name[..4].copy_from_slice(&19_999u32.to_le_bytes());
        assert_eq!(c.get(&name), Some(&19_999), "the newest names stay cached");
        // Inserting a name again counts it once.
        let before = c.bytes();
        c.insert(&name, 0);
        assert_eq!(c.bytes(), before);
    }
}
