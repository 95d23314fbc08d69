//! Sums of a physical per-rank family over its rank label (`sum_over_ranks`, docs/rules.md):
//! the latest value of every rank of a group, emitted once per timestamp at which every
//! rank has reported. Ranks of one scrape share its timestamp but may arrive in
//! different requests, in any order.

use crate::mapping::STALE_NAN_BITS;

/// Ranks per group, at most (a label of unbounded cardinality cannot grow the state).
pub const MAX_RANKS: usize = 256;
/// A rank value longer than this is not kept (real ranks are a few digits).
pub const MAX_RANK_BYTES: usize = 1024;
/// What a kept rank costs besides its value's bytes (its history and bookkeeping),
/// counted against the deriver's label-byte budget with the value.
pub const RANK_ENTRY_BYTES: usize = 96;
/// Timestamps remembered per rank: how far one rank may run ahead of another.
const HISTORY: usize = 4;
const EMPTY: i64 = i64::MIN;

#[derive(Debug)]
struct Rank {
    value_of_rank: Box<[u8]>,
    history: [(i64, f64); HISTORY],
    next: usize,
    newest: i64,
}

impl Rank {
    fn at(&self, timestamp: i64) -> Option<f64> {
        self.history
            .iter()
            .find(|(t, _)| *t == timestamp)
            .map(|(_, v)| *v)
    }

    fn oldest(&self) -> i64 {
        self.history
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| *t != EMPTY)
            .min()
            .unwrap_or(EMPTY)
    }
}

#[derive(Debug)]
pub struct RankSumState {
    pub last_seen_s: u32,
    last_emitted: i64,
    /// The group's first timestamp: its scrape only teaches which ranks exist (they
    /// arrive one by one, so a sum then would miss the ranks not yet seen).
    first: i64,
    ranks: Vec<Rank>,
    /// [`RankSumState::cost`] summed over the ranks kept.
    bytes: usize,
    /// A sum was emitted since the last stale marker.
    open: bool,
    /// The newest timestamp of a rank that could not be kept ([`RankSumState::end`]):
    /// while it is as recent as a reporting rank's oldest remembered timestamp (the
    /// rule that forgets a rank that stopped), no sum is emitted, in whatever order
    /// the refused rank arrives among the others.
    refused_newest: i64,
}

impl RankSumState {
    /// What keeping a rank of this value costs.
    pub fn cost(rank: &[u8]) -> usize {
        rank.len() + RANK_ENTRY_BYTES
    }

    /// The bytes its ranks cost (their values and entries).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn rank_count(&self) -> usize {
        self.ranks.len()
    }

    /// Ends the sum (a rank that cannot be kept arrived at `timestamp`: a sum without
    /// it would be wrong): forgets every rank, so that the group learns them again
    /// from its next timestamp on, and returns the timestamp of the stale marker that
    /// ends an open sum: after `timestamp` and after the last sum, so the series stays
    /// in order. The group itself (its label set) stays.
    pub fn end(&mut self, timestamp: i64) -> Option<i64> {
        self.ranks.clear();
        self.bytes = 0;
        self.shrink();
        self.first = EMPTY;
        self.refused_newest = self.refused_newest.max(timestamp);
        if !self.open {
            return None;
        }
        self.open = false;
        let at = timestamp.max(self.last_emitted.saturating_add(1));
        self.last_emitted = at;
        Some(at)
    }

    pub fn has_rank(&self, rank: &[u8]) -> bool {
        self.ranks.iter().any(|r| &*r.value_of_rank == rank)
    }

    fn forget(&mut self, i: usize) {
        self.bytes -= Self::cost(&self.ranks[i].value_of_rank);
        self.ranks.swap_remove(i);
        self.shrink();
    }

    /// Gives back the room of ranks gone: a group that once held many ranks holds
    /// about what it is charged for ([`RANK_ENTRY_BYTES`] a rank).
    fn shrink(&mut self) {
        if self.ranks.len() < self.ranks.capacity() / 4 {
            self.ranks.shrink_to(self.ranks.len() * 2);
        }
    }

    pub fn new(now_s: u32) -> Self {
        RankSumState {
            last_seen_s: now_s,
            last_emitted: EMPTY,
            first: EMPTY,
            ranks: Vec::new(),
            bytes: 0,
            open: false,
            refused_newest: EMPTY,
        }
    }

    /// Feeds one sample of `rank`; returns the sum to emit, if this completes one.
    /// `gone` counts ranks forgotten because they fell behind.
    pub fn observe(
        &mut self,
        rank: &[u8],
        timestamp: i64,
        value_bits: u64,
        gone: &mut u32,
    ) -> Option<(i64, u64)> {
        let pos = self.ranks.iter().position(|r| &*r.value_of_rank == rank);
        if value_bits == STALE_NAN_BITS {
            // The rank's series ended; when the last one ends, the sum ends too.
            if let Some(i) = pos {
                self.forget(i);
            }
            if !self.ranks.is_empty() {
                return None;
            }
            // Ranks that come back are learnt again, as at the group's start.
            self.first = EMPTY;
            if self.open && timestamp > self.last_emitted {
                self.last_emitted = timestamp;
                self.open = false;
                return Some((timestamp, STALE_NAN_BITS));
            }
            return None;
        }
        let value = f64::from_bits(value_bits);
        if value.is_nan() {
            return None;
        }
        let i = match pos {
            Some(i) => i,
            None if self.ranks.len() >= MAX_RANKS => return None,
            None => {
                self.bytes += Self::cost(rank);
                self.ranks.push(Rank {
                    value_of_rank: rank.into(),
                    history: [(EMPTY, 0.0); HISTORY],
                    next: 0,
                    newest: EMPTY,
                });
                self.ranks.len() - 1
            }
        };
        let r = &mut self.ranks[i];
        if timestamp <= r.newest {
            return None;
        }
        r.history[r.next] = (timestamp, value);
        r.next = (r.next + 1) % HISTORY;
        r.newest = timestamp;
        // A rank with nothing as recent as this rank's oldest remembered timestamp has
        // stopped reporting (without a stale marker): stop waiting for it.
        let horizon = self.ranks[i].oldest();
        let mut freed = 0;
        self.ranks.retain(|r| {
            let keep = r.newest >= horizon;
            if !keep {
                freed += Self::cost(&r.value_of_rank);
                *gone += 1;
            }
            keep
        });
        self.bytes -= freed;
        self.shrink();
        if self.first == EMPTY {
            self.first = timestamp;
        }
        if timestamp <= self.last_emitted
            || timestamp <= self.first
            || self.refused_newest >= horizon
        {
            return None;
        }
        let mut sum = 0.0;
        for r in &self.ranks {
            sum += r.at(timestamp)?;
        }
        self.last_emitted = timestamp;
        self.open = true;
        Some((timestamp, sum.to_bits()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(s: &mut RankSumState, rank: &str, ts: i64, v: f64) -> Option<f64> {
        let mut gone = 0;
        s.observe(rank.as_bytes(), ts, v.to_bits(), &mut gone)
            .map(|(t, b)| {
                assert_eq!(t, ts);
                f64::from_bits(b)
            })
    }

    #[test]
    fn a_sample_dated_ahead_holds_the_sums_back_until_the_others_reach_it() {
        let mut s = RankSumState::new(0);
        feed(&mut s, "0", 1000, 1.0);
        feed(&mut s, "1", 1000, 2.0);
        feed(&mut s, "0", 2000, 1.0);
        assert_eq!(feed(&mut s, "1", 2000, 2.0), Some(3.0));
        // Rank 1's clock jumps ahead: its later samples dated before that are refused,
        // as a TSDB refuses them, and no sum lacks it.
        assert_eq!(feed(&mut s, "1", 9000, 20.0), None);
        for ts in [3000, 4000, 5000, 6000] {
            assert_eq!(feed(&mut s, "0", ts, 1.0), None, "at {ts}");
            assert_eq!(feed(&mut s, "1", ts, 2.0), None, "at {ts}");
        }
        assert_eq!(
            feed(&mut s, "0", 9000, 10.0),
            Some(30.0),
            "once rank 0 is there"
        );
        // A rank that cannot be kept, dated ahead: the sum ends after its last sum, at
        // that date, and sums again once the ranks are 4 timestamps past it.
        assert_eq!(s.end(20_000), Some(20_000));
        let mut sums = Vec::new();
        for ts in (10_000..=24_000).step_by(1000) {
            sums.extend(feed(&mut s, "0", ts, 1.0).map(|v| (ts, v)));
            sums.extend(feed(&mut s, "1", ts, 2.0).map(|v| (ts, v)));
        }
        assert_eq!(sums.first(), Some(&(24_000, 3.0)), "{sums:?}");
    }

    #[test]
    fn sums_once_every_rank_reported_in_any_order() {
        let mut s = RankSumState::new(0);
        assert_eq!(
            feed(&mut s, "0", 1000, 1.0),
            None,
            "the first scrape learns ranks"
        );
        assert_eq!(feed(&mut s, "1", 1000, 2.0), None);
        // Rank 1 is ahead: 2000 completes when rank 0 reports it.
        assert_eq!(feed(&mut s, "1", 2000, 20.0), None);
        assert_eq!(feed(&mut s, "1", 3000, 30.0), None);
        assert_eq!(feed(&mut s, "0", 2000, 10.0), Some(30.0));
        assert_eq!(feed(&mut s, "0", 3000, 15.0), Some(45.0));
    }

    #[test]
    fn a_rank_that_stops_is_forgotten_and_stale_ends_the_sum() {
        let mut s = RankSumState::new(0);
        for ts in [1000, 2000] {
            feed(&mut s, "0", ts, 1.0);
            feed(&mut s, "1", ts, 1.0);
        }
        // Rank 1 stops; rank 0 goes on: after HISTORY timestamps rank 1 is dropped.
        let mut got = None;
        for ts in [3000, 4000, 5000, 6000, 7000] {
            got = feed(&mut s, "0", ts, 1.0);
        }
        assert_eq!(got, Some(1.0));
        let mut gone = 0;
        assert_eq!(
            s.observe(b"0", 8000, STALE_NAN_BITS, &mut gone),
            Some((8000, STALE_NAN_BITS))
        );
    }

    #[test]
    fn an_ended_sum_stales_after_its_last_sum_and_learns_its_ranks_again() {
        let mut s = RankSumState::new(0);
        for ts in [1000, 2000] {
            feed(&mut s, "0", ts, 1.0);
            feed(&mut s, "1", ts, 2.0);
        }
        assert_eq!(s.bytes(), 2 * RankSumState::cost(b"0"));
        assert_eq!(s.end(2000), Some(2001), "after the sum at 2000");
        assert_eq!((s.bytes(), s.rank_count()), (0, 0));
        assert_eq!(s.end(2500), None, "nothing open");
        assert_eq!(feed(&mut s, "0", 3000, 1.0), None, "learning again");
        assert_eq!(feed(&mut s, "1", 3000, 2.0), None);
        assert_eq!(feed(&mut s, "0", 4000, 1.0), None);
        assert_eq!(feed(&mut s, "1", 4000, 2.0), Some(3.0));
    }

    #[test]
    fn a_refused_rank_blocks_sums_in_any_order_until_it_stops() {
        let mut s = RankSumState::new(0);
        let mut sums = Vec::new();
        // The refused rank (ended each time) arrives first, then last, then first.
        for (k, refused_first) in [(1, true), (2, false), (3, true), (4, false)] {
            let ts = k * 1000;
            if refused_first {
                s.end(ts);
            }
            sums.extend(feed(&mut s, "0", ts, 1.0));
            sums.extend(feed(&mut s, "1", ts, 2.0));
            if !refused_first {
                s.end(ts);
            }
        }
        assert!(
            sums.is_empty(),
            "no sum short of the refused rank: {sums:?}"
        );
        // It stops: once it is older than what the ranks remember, they sum again.
        for ts in (5..12).map(|k| k * 1000) {
            feed(&mut s, "0", ts, 1.0);
            sums.extend(feed(&mut s, "1", ts, 2.0));
        }
        assert!(
            !sums.is_empty() && sums.iter().all(|v| *v == 3.0),
            "{sums:?}"
        );
    }

    #[test]
    fn ranks_back_after_every_one_went_stale_are_learnt_again() {
        let mut s = RankSumState::new(0);
        for ts in [1000, 2000] {
            feed(&mut s, "0", ts, 1.0);
            feed(&mut s, "1", ts, 2.0);
        }
        let mut gone = 0;
        assert!(s.observe(b"0", 3000, STALE_NAN_BITS, &mut gone).is_none());
        assert_eq!(
            s.observe(b"1", 3000, STALE_NAN_BITS, &mut gone),
            Some((3000, STALE_NAN_BITS))
        );
        assert_eq!(
            s.observe(b"1", 3500, STALE_NAN_BITS, &mut gone),
            None,
            "one stale marker ends the sum"
        );
        assert_eq!(
            feed(&mut s, "0", 4000, 1.0),
            None,
            "learning, not a sum of one"
        );
        assert_eq!(feed(&mut s, "1", 4000, 2.0), None);
        assert_eq!(feed(&mut s, "0", 5000, 1.0), None);
        assert_eq!(feed(&mut s, "1", 5000, 2.0), Some(3.0));
    }
}
