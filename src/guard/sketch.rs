//! Distinct label values of one metric, estimated: per label name and generation (an
//! active-series window) the first 16 distinct values' hashes, exactly, and a small
//! HyperLogLog past them; the current and the previous generation merged when read.
//! Exact up to 16 values a window, about 13 % off beyond; updated once per series and
//! generation, never per sample.

/// Registers per sketch (64 bytes).
const REGISTERS: usize = 64;
const INDEX_BITS: u32 = 6;
/// Label names per metric with a sketch; a metric with more reports the rest as
/// truncated (a label name per series is a bug of its own, and shown as such).
pub const MAX_LABEL_NAMES: usize = 32;

/// Label names longer than this are not sketched (reported as truncated): the names'
/// bytes stay within [`MAX_BYTES`].
pub const MAX_NAME_BYTES: usize = 128;

/// Bytes one metric's sketches hold at most.
pub const MAX_BYTES: usize =
    MAX_LABEL_NAMES * (2 * std::mem::size_of::<Generation>() + 48 + MAX_NAME_BYTES);

/// Values counted exactly per generation.
const EXACT: usize = 16;

/// One label's values in one generation.
#[derive(Clone, Copy, Debug)]
struct Generation {
    registers: [u8; REGISTERS],
    exact: [u32; EXACT],
    /// Values in `exact`; `EXACT + 1` once more were seen.
    n: u8,
}

const EMPTY: Generation = Generation {
    registers: [0; REGISTERS],
    exact: [0; EXACT],
    n: 0,
};

impl Generation {
    fn add(&mut self, h: u64) {
        let register = (h & (REGISTERS as u64 - 1)) as usize;
        let rank = ((h >> INDEX_BITS).trailing_zeros() + 1).min(64 - INDEX_BITS + 1) as u8;
        self.registers[register] = self.registers[register].max(rank);
        let n = usize::from(self.n);
        let short = (h >> 32) as u32;
        if n <= EXACT && !self.exact[..n.min(EXACT)].contains(&short) {
            if n < EXACT {
                self.exact[n] = short;
            }
            self.n += 1;
        }
    }

    fn exact(&self) -> Option<&[u32]> {
        (usize::from(self.n) <= EXACT).then(|| &self.exact[..usize::from(self.n)])
    }
}

#[derive(Debug)]
struct LabelSketch {
    name: Box<[u8]>,
    current: Generation,
    previous: Generation,
}

/// The sketches of one metric's labels.
#[derive(Debug, Default)]
pub struct LabelSketches {
    generation: u32,
    labels: Vec<LabelSketch>,
    truncated: bool,
}

fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    )
}

impl LabelSketches {
    /// Moves to `generation`: the current sketches become the previous ones (or both
    /// are cleared after a gap of more than one generation).
    fn enter(&mut self, generation: u32) {
        if generation == self.generation {
            return;
        }
        let next = generation == self.generation.wrapping_add(1);
        for l in &mut self.labels {
            l.previous = if next { l.current } else { EMPTY };
            l.current = EMPTY;
        }
        self.generation = generation;
    }

    /// Records one series' label (`name`, `value`) in `generation`.
    pub fn add(&mut self, generation: u32, name: &[u8], value: &[u8]) {
        self.enter(generation);
        let i = match self.labels.iter().position(|l| &*l.name == name) {
            Some(i) => i,
            None if self.labels.len() < MAX_LABEL_NAMES && name.len() <= MAX_NAME_BYTES => {
                self.labels.push(LabelSketch {
                    name: name.into(),
                    current: EMPTY,
                    previous: EMPTY,
                });
                self.labels.len() - 1
            }
            None => {
                self.truncated = true;
                return;
            }
        };
        self.labels[i].current.add(hasher().hash_one(value));
    }

    /// Each label name with its estimated number of distinct values in the last one or
    /// two windows, most first; and whether label names were left out.
    pub fn estimates(&self, generation: u32) -> (Vec<(String, u64)>, bool) {
        let mut out: Vec<(String, u64)> = self
            .labels
            .iter()
            .map(|l| {
                // The generations the last one or two windows cover.
                let (a, b) = if generation == self.generation {
                    (l.current, l.previous)
                } else if generation == self.generation.wrapping_add(1) {
                    (l.current, EMPTY)
                } else {
                    (EMPTY, EMPTY)
                };
                let n = match (a.exact(), b.exact()) {
                    (Some(x), Some(y)) => {
                        (x.len() + y.iter().filter(|h| !x.contains(h)).count()) as u64
                    }
                    _ => estimate(&std::array::from_fn(|i| a.registers[i].max(b.registers[i]))),
                };
                (String::from_utf8_lossy(&l.name).into_owned(), n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        (out, self.truncated)
    }
}

/// HyperLogLog's estimate, with linear counting while registers are still empty.
fn estimate(registers: &[u8; REGISTERS]) -> u64 {
    let m = REGISTERS as f64;
    let zeros = registers.iter().filter(|&&r| r == 0).count();
    if zeros == REGISTERS {
        return 0;
    }
    let sum: f64 = registers.iter().map(|&r| 2f64.powi(-i32::from(r))).sum();
    let alpha = 0.709;
    let raw = alpha * m * m / sum;
    let e = if raw <= 2.5 * m && zeros > 0 {
        m * (m / zeros as f64).ln()
    } else {
        raw
    };
    e.round().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: usize) -> u64 {
        let mut s = LabelSketches::default();
        for i in 0..n {
            s.add(1, b"pod", format!("pod-{i}").as_bytes());
        }
        s.estimates(1).0[0].1
    }

    #[test]
    fn few_values_are_counted_exactly_and_many_within_the_error() {
        assert_eq!(count(1), 1);
        assert_eq!(count(3), 3);
        assert_eq!(count(10), 10);
        assert_eq!(count(16), 16);
        for n in [1_000usize, 50_000] {
            let e = count(n) as f64;
            assert!((e - n as f64).abs() / n as f64 <= 0.3, "{n}: {e}");
        }
    }

    #[test]
    fn values_of_two_windows_back_are_forgotten() {
        let mut s = LabelSketches::default();
        s.add(1, b"pod", b"a");
        s.add(1, b"pod", b"b");
        s.add(2, b"pod", b"c");
        assert_eq!(s.estimates(2).0, vec![("pod".to_string(), 3)]);
        s.add(3, b"pod", b"c");
        assert_eq!(s.estimates(3).0, vec![("pod".to_string(), 1)]);
        assert!(s.estimates(9).0.is_empty());
    }

    #[test]
    fn label_names_past_the_cap_are_reported_as_truncated() {
        let mut s = LabelSketches::default();
        for i in 0..MAX_LABEL_NAMES + 3 {
            s.add(1, format!("l{i}").as_bytes(), b"v");
        }
        let (labels, truncated) = s.estimates(1);
        assert_eq!(labels.len(), MAX_LABEL_NAMES);
        assert!(truncated);
    }
}
