//! Per-series state of one derived series: pairs the inputs' samples by timestamp and
//! turns consecutive complete points into a value, with PromQL `rate()` semantics.

use std::collections::VecDeque;

use super::defs::{Definition, Formula, MAX_INPUTS};
use crate::wire::STALE_NAN_BITS;

/// Timestamps an input may run ahead of another before the oldest half-filled point is
/// given up. Prometheus' shards usually lag each other by a batch or two, but catching up
/// after an outage they can drift further apart.
pub const MAX_PENDING_POINTS: usize = 64;

/// Half points kept while the other input has never been seen: enough for a shard that
/// starts ahead, without growing for an engine version that lacks the other counter.
const UNSEEN_PENDING_POINTS: usize = 4;

/// Points a series keeps for `derived.window`: a rate over the window is taken from its
/// oldest point, and samples closer together than `window / MAX_WINDOW_POINTS` would
/// otherwise grow the state without bound (a 1 h window holds 1,024 points at one every
/// 3.5 s; denser samples shorten the span the rate covers, never its correctness).
pub const MAX_WINDOW_POINTS: usize = 1024;

const EMPTY: i64 = i64::MIN;

#[derive(Clone, Copy, Debug)]
struct Pending {
    timestamp: i64,
    values: [f64; MAX_INPUTS],
    mask: u8,
}

const NO_PENDING: Pending = Pending {
    timestamp: EMPTY,
    values: [0.0; MAX_INPUTS],
    mask: 0,
};

/// Half-filled points, oldest first. The first lives inline: with inputs in step there
/// is at most one, and the state of a series then needs no heap of its own.
#[derive(Debug)]
struct PendingList {
    first: Pending,
    rest: VecDeque<Pending>,
}

impl Default for PendingList {
    fn default() -> Self {
        PendingList {
            first: NO_PENDING,
            rest: VecDeque::new(),
        }
    }
}

impl PendingList {
    fn len(&self) -> usize {
        usize::from(self.first.timestamp != EMPTY) + self.rest.len()
    }

    fn get(&self, i: usize) -> Option<&Pending> {
        match i {
            _ if i >= self.len() => None,
            0 => Some(&self.first),
            _ => self.rest.get(i - 1),
        }
    }

    /// Callers pass `i < len()`.
    fn get_mut(&mut self, i: usize) -> &mut Pending {
        if i == 0 {
            &mut self.first
        } else {
            &mut self.rest[i - 1]
        }
    }

    /// Index of the first point not older than `timestamp`.
    fn position(&self, timestamp: i64) -> usize {
        if self.first.timestamp == EMPTY || self.first.timestamp >= timestamp {
            return 0;
        }
        1 + self.rest.partition_point(|p| p.timestamp < timestamp)
    }

    fn insert(&mut self, i: usize, p: Pending) {
        if self.first.timestamp == EMPTY {
            self.first = p;
        } else if i == 0 {
            self.rest.push_front(std::mem::replace(&mut self.first, p));
        } else {
            self.rest.insert(i - 1, p);
        }
    }

    fn pop_front(&mut self) {
        self.first = self.rest.pop_front().unwrap_or(NO_PENDING);
    }

    fn clear(&mut self) {
        self.first = NO_PENDING;
        self.rest.clear();
    }
}

/// A timestamp at which every input had a sample.
#[derive(Clone, Copy, Debug)]
struct Point {
    timestamp: i64,
    raw: [f64; MAX_INPUTS],
    /// Reset-adjusted increase since the series was first seen (for windows).
    increase: [f64; MAX_INPUTS],
}

#[derive(Debug)]
pub struct SeriesState {
    pub def: u16,
    /// Peak FLOP/s or bytes/s for utilisation formulas.
    pub peak: f64,
    /// Coarse clock (seconds since the deriver started) of the last input seen.
    pub last_seen_s: u32,
    last_emitted: i64,
    stale: bool,
    /// Seen since the eviction hand last passed (CLOCK's second chance).
    pub referenced: bool,
    /// Inputs ever seen (bit per slot): while one never showed up (an engine version
    /// without that counter), few half points are kept.
    seen: u8,
    /// Half-filled points, oldest first (allocated only for two-input series that need it).
    pending: PendingList,
    last: Option<Point>,
    /// Points within the window (window mode only).
    window: VecDeque<Point>,
}

impl SeriesState {
    pub fn new(def: u16, peak: f64, now_s: u32) -> Self {
        SeriesState {
            def,
            peak,
            last_seen_s: now_s,
            last_emitted: EMPTY,
            stale: false,
            referenced: false,
            seen: 0,
            pending: PendingList::default(),
            last: None,
            window: VecDeque::new(),
        }
    }

    fn forget(&mut self) {
        self.pending.clear();
        self.last = None;
        self.window.clear();
    }

    /// Feeds one sample of input `slot`. `window_ms` 0 means "previous point".
    pub fn observe(
        &mut self,
        def: &Definition,
        slot: usize,
        timestamp: i64,
        value_bits: u64,
        window_ms: i64,
        incomplete: &mut u32,
    ) -> Option<(i64, u64)> {
        if value_bits == STALE_NAN_BITS {
            // The input series ended: end the derived series too, once.
            let was_live = !self.stale && self.last_emitted != EMPTY;
            self.stale = true;
            self.forget();
            if was_live && timestamp > self.last_emitted {
                self.last_emitted = timestamp;
                return Some((timestamp, STALE_NAN_BITS));
            }
            return None;
        }
        let value = f64::from_bits(value_bits);
        if !value.is_finite() {
            return None;
        }
        if self.last.is_some_and(|p| timestamp <= p.timestamp) {
            return None; // a resent or older sample: already accounted for
        }
        self.stale = false;
        let n = def.inputs.len();
        let full: u8 = (1u8 << n) - 1;
        if n == 1 {
            let mut raw = [0.0; MAX_INPUTS];
            raw[0] = value;
            return self.complete(def, timestamp, raw, n, window_ms);
        }
        self.seen |= 1 << slot;
        if self.seen != full && self.pending.len() >= UNSEEN_PENDING_POINTS {
            self.pending.pop_front();
        }
        // Oldest first: find the point for this timestamp or where it belongs.
        let at = self.pending.position(timestamp);
        if self
            .pending
            .get(at)
            .is_none_or(|p| p.timestamp != timestamp)
        {
            if self.pending.len() >= MAX_PENDING_POINTS {
                if at == 0 {
                    *incomplete += 1;
                    return None; // older than everything we still wait for
                }
                self.pending.pop_front();
                *incomplete += 1;
                self.pending.insert(
                    at - 1,
                    Pending {
                        timestamp,
                        ..NO_PENDING
                    },
                );
                return self.fill(def, at - 1, slot, value, full, n, window_ms, incomplete);
            }
            self.pending.insert(
                at,
                Pending {
                    timestamp,
                    ..NO_PENDING
                },
            );
        }
        self.fill(def, at, slot, value, full, n, window_ms, incomplete)
    }

    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        def: &Definition,
        at: usize,
        slot: usize,
        value: f64,
        full: u8,
        n: usize,
        window_ms: i64,
        incomplete: &mut u32,
    ) -> Option<(i64, u64)> {
        let p = self.pending.get_mut(at);
        p.values[slot] = value;
        p.mask |= 1 << slot;
        if p.mask != full {
            return None;
        }
        let (timestamp, raw) = (p.timestamp, p.values);
        // This point and every earlier half-filled one go: inputs arrive in order, so
        // the earlier ones can never complete now.
        *incomplete += at as u32;
        for _ in 0..=at {
            self.pending.pop_front();
        }
        self.complete(def, timestamp, raw, n, window_ms)
    }

    fn complete(
        &mut self,
        def: &Definition,
        timestamp: i64,
        raw: [f64; MAX_INPUTS],
        n: usize,
        window_ms: i64,
    ) -> Option<(i64, u64)> {
        let Some(prev) = self.last else {
            let first = Point {
                timestamp,
                raw,
                increase: [0.0; MAX_INPUTS],
            };
            self.last = Some(first);
            if window_ms > 0 {
                self.window.push_back(first);
            }
            return None;
        };
        let mut increase = prev.increase;
        for i in 0..n {
            // A decrease is a counter reset: the increase is the new value.
            increase[i] += if raw[i] >= prev.raw[i] {
                raw[i] - prev.raw[i]
            } else {
                raw[i]
            };
        }
        let point = Point {
            timestamp,
            raw,
            increase,
        };
        self.last = Some(point);
        let base = if window_ms > 0 {
            let window = &mut self.window;
            let window_start = timestamp.saturating_sub(window_ms);
            while window.front().is_some_and(|p| p.timestamp < window_start)
                || window.len() >= MAX_WINDOW_POINTS
            {
                window.pop_front();
            }
            let base = window.front().copied();
            window.push_back(point);
            base?
        } else {
            prev
        };
        let mut delta = [0.0; MAX_INPUTS];
        for (d, (now, then)) in delta
            .iter_mut()
            .zip(point.increase.iter().zip(&base.increase))
            .take(n)
        {
            *d = now - then;
        }
        let dt = timestamp.saturating_sub(base.timestamp) as f64 / 1000.0;
        let value = match def.formula {
            Formula::Ratio if delta[1] > 0.0 => delta[0] / delta[1],
            Formula::OnePlusRatio if delta[1] > 0.0 => 1.0 + delta[0] / delta[1],
            Formula::ShareOfSum if delta[0] + delta[1] > 0.0 => delta[0] / (delta[0] + delta[1]),
            Formula::FlopsUtilisation if dt > 0.0 && self.peak > 0.0 => delta[0] / dt / self.peak,
            Formula::BandwidthUtilisation if dt > 0.0 && self.peak > 0.0 => {
                (delta[0] + delta[1]) / dt / self.peak
            }
            _ => return None,
        };
        if !value.is_finite() || timestamp <= self.last_emitted {
            return None;
        }
        self.last_emitted = timestamp;
        Some((timestamp, value.to_bits()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::derive::defs::DEFINITIONS;

    fn def(name: &str) -> &'static Definition {
        DEFINITIONS.iter().find(|d| d.name == name).unwrap()
    }

    fn feed(
        s: &mut SeriesState,
        d: &Definition,
        slot: usize,
        ts: i64,
        v: f64,
        w: i64,
    ) -> Option<f64> {
        let mut inc = 0;
        s.observe(d, slot, ts, v.to_bits(), w, &mut inc)
            .map(|(t, b)| {
                assert_eq!(t, ts);
                f64::from_bits(b)
            })
    }

    #[test]
    fn ratio_pairs_by_timestamp_in_either_order() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        assert_eq!(feed(&mut s, d, 0, 1000, 10.0, 0), None);
        assert_eq!(feed(&mut s, d, 1, 1000, 100.0, 0), None, "first point");
        // Denominator first this time.
        assert_eq!(feed(&mut s, d, 1, 2000, 200.0, 0), None);
        assert_eq!(feed(&mut s, d, 0, 2000, 40.0, 0), Some(0.3));
    }

    #[test]
    fn counter_reset_and_zero_denominator() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        feed(&mut s, d, 0, 1000, 50.0, 0);
        feed(&mut s, d, 1, 1000, 100.0, 0);
        // Both reset: increases are the new values.
        feed(&mut s, d, 0, 2000, 5.0, 0);
        assert_eq!(feed(&mut s, d, 1, 2000, 20.0, 0), Some(0.25));
        // No new queries: nothing, never NaN.
        feed(&mut s, d, 0, 3000, 5.0, 0);
        assert_eq!(feed(&mut s, d, 1, 3000, 20.0, 0), None);
    }

    #[test]
    fn missing_half_is_skipped() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        let mut inc = 0;
        feed(&mut s, d, 0, 1000, 0.0, 0);
        feed(&mut s, d, 1, 1000, 0.0, 0);
        feed(&mut s, d, 0, 2000, 10.0, 0); // denominator of 2000 never comes
        feed(&mut s, d, 0, 3000, 30.0, 0);
        let got = s.observe(d, 1, 3000, 60f64.to_bits(), 0, &mut inc);
        assert_eq!(got, Some((3000, 0.5f64.to_bits())));
        assert_eq!(inc, 1, "the half point at 2000 is given up");
    }

    #[test]
    fn window_uses_oldest_point_within_it() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        let w = 2000;
        for (ts, h, q) in [(1000, 0.0, 0.0), (2000, 10.0, 10.0), (3000, 10.0, 30.0)] {
            feed(&mut s, d, 0, ts, h, w);
            let got = feed(&mut s, d, 1, ts, q, w);
            if ts == 3000 {
                // Between 1000 and 3000: 10 / 30.
                assert_eq!(got, Some(10.0 / 30.0));
            }
        }
        // At 4000 the window [2000, 4000] starts at 2000: (15-10)/(40-10).
        feed(&mut s, d, 0, 4000, 15.0, w);
        assert_eq!(feed(&mut s, d, 1, 4000, 40.0, w), Some(5.0 / 30.0));
    }

    #[test]
    fn window_holds_a_bounded_number_of_points() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        // One point a millisecond into an hour-long window: the rate is taken over the
        // last MAX_WINDOW_POINTS points, the state never holds more.
        let w = 3_600_000;
        let n = MAX_WINDOW_POINTS as i64 * 3;
        let mut last = None;
        for ts in 1..=n {
            feed(&mut s, d, 0, ts, ts as f64, w);
            last = feed(&mut s, d, 1, ts, 2.0 * ts as f64, w);
            assert!(s.window.len() <= MAX_WINDOW_POINTS);
        }
        assert_eq!(s.window.len(), MAX_WINDOW_POINTS);
        assert_eq!(last, Some(0.5), "still the right ratio");
    }

    #[test]
    fn extreme_timestamps_neither_panic_nor_wrap() {
        for w in [0, 60_000] {
            let d = def("vllm:mfu_ratio");
            let mut s = SeriesState::new(0, 1e15, 0);
            feed(&mut s, d, 0, i64::MIN + 1, 0.0, w);
            let got = feed(&mut s, d, 0, i64::MAX, 6e15, w);
            // Either nothing (outside the window) or a finite, non-negative value.
            if let Some(v) = got {
                assert!(v.is_finite() && v >= 0.0, "{v}");
            }
            let d = def("vllm:prefix_cache_hit_ratio");
            let mut s = SeriesState::new(0, 0.0, 0);
            for ts in [i64::MIN + 1, i64::MIN + 2, i64::MAX - 1, i64::MAX] {
                feed(&mut s, d, 0, ts, 1.0, w);
                feed(&mut s, d, 1, ts, 2.0, w);
            }
        }
    }

    #[test]
    fn utilisation_uses_elapsed_seconds_and_peak() {
        let d = def("vllm:mfu_ratio");
        let mut s = SeriesState::new(0, 1e15, 0);
        feed(&mut s, d, 0, 0, 0.0, 0);
        // 15 s, 6e15 FLOP: 4e14 FLOP/s of 1e15.
        assert_eq!(feed(&mut s, d, 0, 15_000, 6e15, 0), Some(0.4));
        let d = def("vllm:mbu_ratio");
        let mut s = SeriesState::new(0, 4e12, 0);
        feed(&mut s, d, 0, 0, 0.0, 0);
        feed(&mut s, d, 1, 0, 0.0, 0);
        feed(&mut s, d, 0, 10_000, 2e13, 0);
        assert_eq!(feed(&mut s, d, 1, 10_000, 0.0, 0), Some(0.5));
    }

    #[test]
    fn stale_input_ends_the_series_once() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        for ts in [1000, 2000] {
            feed(&mut s, d, 0, ts, ts as f64, 0);
            feed(&mut s, d, 1, ts, 2.0 * ts as f64, 0);
        }
        let mut inc = 0;
        assert_eq!(
            s.observe(d, 0, 3000, STALE_NAN_BITS, 0, &mut inc),
            Some((3000, STALE_NAN_BITS))
        );
        assert_eq!(s.observe(d, 1, 3000, STALE_NAN_BITS, 0, &mut inc), None);
        // Comes back: starts over.
        feed(&mut s, d, 0, 4000, 1.0, 0);
        assert_eq!(feed(&mut s, d, 1, 4000, 1.0, 0), None);
    }

    #[test]
    fn duplicates_are_ignored() {
        let d = def("vllm:prefix_cache_hit_ratio");
        let mut s = SeriesState::new(0, 0.0, 0);
        feed(&mut s, d, 0, 1000, 1.0, 0);
        feed(&mut s, d, 1, 1000, 2.0, 0);
        feed(&mut s, d, 0, 2000, 2.0, 0);
        assert_eq!(feed(&mut s, d, 1, 2000, 4.0, 0), Some(0.5));
        // A retried request resends both samples.
        assert_eq!(feed(&mut s, d, 0, 2000, 2.0, 0), None);
        assert_eq!(feed(&mut s, d, 1, 2000, 4.0, 0), None);
    }
}
