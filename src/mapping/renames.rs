//! Cut-over tracking: which old names the rules still rename, how many samples and when
//! last (docs/migrations.md). One slot per (pack, input name) with a rename, assigned
//! once when the name's plan is built (compile time for exact names, first sight for
//! names prefix or regex rules match); past [`RENAME_SLOTS`] names a pack's renames
//! share its `other` slot. The mapper adds a request's samples per run of series of one
//! slot into `MapStats::renames`; the server adds those to the slots' atomics once per
//! request, so the hot path pays nothing per sample.
//!
//! The same tracker, a second instance in `Rules::families`, counts every plan (family):
//! one slot per (first pack, input name) with a plan, series and samples per request,
//! for the per-rule counters of the web UI's `/rules`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use ahash::AHashMap;

/// Input names tracked one by one; more share their pack's `other` slot.
pub const RENAME_SLOTS: usize = 4096;

/// The longest `from`, `to` and `rule` together that get a slot of their own (the
/// built-in packs' longest is far below; names of 64 KiB share `other`).
pub const SLOT_TEXT_BYTES: usize = 8192;

/// The `from` of the overflow slots.
pub const OTHER: &str = "other";

/// Packs with an `other` slot each (pack indices above share the last).
const OTHER_SLOTS: usize = 64;

#[derive(Default)]
struct Counters {
    /// Series (added once per request and slot); renames leave it at 0.
    series: AtomicU64,
    samples: AtomicU64,
    /// Unix milliseconds; 0: never. Kept to the second (see [`Counters::seen_at`]).
    last_seen_ms: AtomicI64,
}

/// How far `last_seen_ms` may lag behind the last request that counted in the slot.
const LAST_SEEN_GRANULARITY_MS: i64 = 1000;

impl Counters {
    /// Notes a request at `now_ms`. A read first, and the read-modify-write (a compare-
    /// and-swap loop: `fetch_max` has no instruction of its own) only when the time
    /// held is a second or more behind: with every pack on, a request counts in a few
    /// hundred slots, and a locked instruction each cost 1 % of the request path.
    #[inline]
    fn seen_at(&self, now_ms: i64) {
        if self.last_seen_ms.load(Ordering::Relaxed) <= now_ms - LAST_SEEN_GRANULARITY_MS {
            self.last_seen_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Debug)]
struct SlotInfo {
    pack: u16,
    from: Box<str>,
    to: Box<str>,
    rule: Box<str>,
}

/// The slots in order, and each (pack, old name)'s slot.
type SlotIndex = (Vec<SlotInfo>, AHashMap<(u16, Box<str>), u32>);

pub struct RenameTracker {
    counters: Box<[Counters]>,
    slots: Mutex<SlotIndex>,
}

impl std::fmt::Debug for RenameTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenameTracker").finish_non_exhaustive()
    }
}

impl Default for RenameTracker {
    fn default() -> Self {
        RenameTracker {
            counters: (0..RENAME_SLOTS + OTHER_SLOTS)
                .map(|_| Counters::default())
                .collect(),
            slots: Mutex::new((Vec::new(), AHashMap::new())),
        }
    }
}

/// One tracked rename, as `/api/v1/renames` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq)]
pub struct RenameSeen {
    pub pack: u16,
    pub from: String,
    pub to: String,
    pub rule: String,
    /// Series counted by [`RenameTracker::record_families`] (0 for renames).
    pub series: u64,
    pub samples: u64,
    /// Unix seconds of the last request that carried the old name (up to a second
    /// earlier: [`Counters::seen_at`]).
    pub last_seen: Option<f64>,
}

impl RenameTracker {
    /// The slot of `from` renamed by `pack` (to `to`, by `rule`). Names whose texts
    /// together pass [`SLOT_TEXT_BYTES`] share the pack's `other` slot, as names past
    /// [`RENAME_SLOTS`] do: slots are kept for good, and names may be 64 KiB each.
    pub fn slot(&self, pack: u16, from: &str, to: &str, rule: &str) -> u32 {
        if from.len() + to.len() + rule.len() > SLOT_TEXT_BYTES {
            return other_slot(pack);
        }
        let Ok(mut guard) = self.slots.lock() else {
            return other_slot(pack);
        };
        let (infos, index) = &mut *guard;
        if let Some(&s) = index.get(&(pack, from.into())) {
            return s;
        }
        if infos.len() >= RENAME_SLOTS {
            return other_slot(pack);
        }
        let s = infos.len() as u32;
        infos.push(SlotInfo {
            pack,
            from: from.into(),
            to: to.into(),
            rule: rule.into(),
        });
        index.insert((pack, from.into()), s);
        s
    }

    /// Adds one request's samples per slot, seen at `now_ms`.
    pub fn record(&self, hits: &[(u32, u64)], now_ms: i64) {
        for &(slot, n) in hits {
            if let Some(c) = self.counters.get(slot as usize) {
                c.samples.fetch_add(n, Ordering::Relaxed);
                c.seen_at(now_ms);
            }
        }
    }

    /// Adds one request's (series, samples) per slot, seen at `now_ms` (the per-family
    /// counters of `/rules`).
    pub fn record_families(&self, hits: &[(u32, u64, u64)], now_ms: i64) {
        for &(slot, series, n) in hits {
            if let Some(c) = self.counters.get(slot as usize) {
                c.series.fetch_add(series, Ordering::Relaxed);
                c.samples.fetch_add(n, Ordering::Relaxed);
                c.seen_at(now_ms);
            }
        }
    }

    /// The `other` slot of `pack`, for names past [`RENAME_SLOTS`].
    pub fn other(&self, pack: u16) -> u32 {
        other_slot(pack)
    }

    /// Every tracked rename (the `other` slots when used), by pack then name.
    pub fn snapshot(&self) -> Vec<RenameSeen> {
        let infos = match self.slots.lock() {
            Ok(g) => g.0.clone(),
            Err(_) => Vec::new(),
        };
        let seen = |slot: usize| {
            let c = &self.counters[slot];
            let ms = c.last_seen_ms.load(Ordering::Relaxed);
            (
                c.series.load(Ordering::Relaxed),
                c.samples.load(Ordering::Relaxed),
                (ms > 0).then_some(ms as f64 / 1000.0),
            )
        };
        let mut out: Vec<RenameSeen> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                let (series, samples, last_seen) = seen(i);
                RenameSeen {
                    pack: info.pack,
                    from: info.from.to_string(),
                    to: info.to.to_string(),
                    rule: info.rule.to_string(),
                    series,
                    samples,
                    last_seen,
                }
            })
            .collect();
        for p in 0..OTHER_SLOTS {
            let (series, samples, last_seen) = seen(RENAME_SLOTS + p);
            if samples > 0 || series > 0 {
                out.push(RenameSeen {
                    pack: p as u16,
                    from: OTHER.into(),
                    to: String::new(),
                    rule: format!("names past the first {RENAME_SLOTS}"),
                    series,
                    samples,
                    last_seen,
                });
            }
        }
        out.sort_by(|a, b| (a.pack, &a.from).cmp(&(b.pack, &b.from)));
        out
    }
}

fn other_slot(pack: u16) -> u32 {
    (RENAME_SLOTS + (pack as usize).min(OTHER_SLOTS - 1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_stable_counted_and_bounded() {
        let t = RenameTracker::default();
        let a = t.slot(0, "old_a", "new_a", "r1");
        assert_eq!(t.slot(0, "old_a", "new_a", "r1"), a, "one slot a name");
        let b = t.slot(1, "old_b", "new_b", "r2");
        t.record(&[(a, 5), (b, 2), (a, 1)], 1_000_500);
        t.record(&[(a, 1)], 999_000);
        let snap = t.snapshot();
        assert_eq!(snap[0].from, "old_a");
        assert_eq!(snap[0].samples, 7);
        assert_eq!(snap[0].last_seen, Some(1000.5), "the latest time wins");
        assert_eq!(snap[1].samples, 2);
        for i in 0..RENAME_SLOTS {
            t.slot(2, &format!("n{i}"), "x", "r");
        }
        let over = t.slot(2, "one_too_many", "x", "r");
        assert_eq!(over, other_slot(2));
        t.record(&[(over, 3)], 2_000_000);
        let snap = t.snapshot();
        assert_eq!(
            snap.len(),
            RENAME_SLOTS + 1,
            "bounded: the rest share `other`"
        );
        assert!(snap.iter().any(|s| s.from == OTHER && s.samples == 3));
    }

    #[test]
    fn long_names_share_the_other_slot() {
        let t = RenameTracker::default();
        let long = "x".repeat(SLOT_TEXT_BYTES);
        assert_eq!(t.slot(3, &long, "new", "r"), other_slot(3));
        assert_eq!(t.slot(3, "old", &long, "r"), other_slot(3));
        assert!(t.snapshot().iter().all(|s| s.from.len() < SLOT_TEXT_BYTES));
        assert_ne!(t.slot(3, "old", "new", "r"), other_slot(3));
    }
}
