//! The mapper's per-worker caches of things computed once per metric name (plans for
//! names that prefix or regex rules match, metadata plans, `le` styles, `_total` fix
//! plans; and, keyed by a bound's text, rescaled `le` bounds). Bounded: a sender with unbounded name churn makes a cache start over, never
//! grow without limit; a warm cache costs one hash lookup and no allocation. Keyed by the
//! name's bytes, as they stand in the request: a lookup converts nothing to `str`.

use ahash::AHashMap;

/// Names a cache holds at most before it starts over (unless it says another limit).
pub const NAME_CACHE_LIMIT: usize = 100_000;

/// A cache of at most `LIMIT` names.
pub struct NameCache<V, const LIMIT: usize = NAME_CACHE_LIMIT> {
    map: AHashMap<Box<[u8]>, V>,
}

impl<V, const LIMIT: usize> Default for NameCache<V, LIMIT> {
    fn default() -> Self {
        NameCache {
            map: AHashMap::new(),
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

    /// Caches `value` for `name`; a full cache starts over first.
    pub fn insert(&mut self, name: &[u8], value: V) {
        if self.map.len() >= LIMIT {
            self.map.clear();
        }
        self.map.insert(name.into(), value);
    }

    /// Forgets every name (keeps the memory).
    pub fn clear(&mut self) {
        self.map.clear();
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
}
