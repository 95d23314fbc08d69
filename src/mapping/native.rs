//! Rescaling native histograms (docs/rules.md, "Native histograms"): exact for custom
//! bounds (NHCB) and for exponential schemas under a power of two, a deterministic
//! re-bucketing into a float histogram otherwise.

use super::number::{Factor, power_of_two};
use crate::wire::STALE_NAN_BITS;
use crate::wire::histogram::{BucketSpan, CUSTOM_BUCKETS_SCHEMA, NativeHistogram};

/// The exponential schemas Prometheus defines.
pub const MIN_SCHEMA: i32 = -4;
pub const MAX_SCHEMA: i32 = 8;

/// The split proportion of a re-bucketing is rounded to a multiple of 2^-20, so that a
/// bucket count below 2^33 splits into two parts that add up to it exactly (and every
/// sum of parts is exact): the target buckets then add up to the source's total.
const SPLIT_BITS: i32 = 20;

/// Bucket indices stay within ±2^30, so that span offsets (sint32) never overflow.
const MAX_INDEX: i64 = 1 << 30;

/// What rescaling did to one histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rescaled {
    /// Bounds (NHCB) or indices (exponential, a power of two) moved exactly.
    Exact,
    /// Re-bucketed into a float histogram.
    Rebucketed,
    /// A stale marker: nothing to rescale, forwarded as it is.
    Stale,
    /// Not rescalable (an unknown schema, indices out of range): forwarded unchanged.
    Unscaled,
}

/// How a factor moves the buckets of exponential schema `schema`: `Ok(shift)` when the
/// indices shift exactly by `shift`, else `Err((shift, q))`: a re-bucketing that sends
/// `1 - q` of each bucket `i` to `i + shift` and `q` to `i + shift + 1`.
pub fn exponential_shift(factor: Factor, schema: i32) -> Result<i64, (i64, f64)> {
    if let Some(k) = power_of_two(factor) {
        let k = k as i64;
        if schema >= 0 {
            return Ok(k << schema);
        }
        let per = 1i64 << (-schema);
        if k % per == 0 {
            return Ok(k / per);
        }
    }
    // Bucket i of schema s is (2^((i-1)/2^s), 2^(i/2^s)]: scaling by f moves it by
    // log2(f)·2^s index units; the fractional part is split in log space.
    let d = ((factor.num as f64).log2() - (factor.den as f64).log2()) * (schema as f64).exp2();
    let shift = d.floor();
    let scale = (SPLIT_BITS as f64).exp2();
    let q = ((d - shift) * scale).round() / scale;
    if q >= 1.0 {
        Err((shift as i64 + 1, 0.0))
    } else {
        Err((shift as i64, q))
    }
}

/// Rescales `h` by `factor` in place. `scratch` is reused across calls.
pub fn rescale(h: &mut NativeHistogram, factor: Factor, scratch: &mut Vec<(i64, f64)>) -> Rescaled {
    if h.sum_bits == STALE_NAN_BITS {
        return Rescaled::Stale;
    }
    if h.schema == CUSTOM_BUCKETS_SCHEMA {
        // The bound the classic path's rewritten `le` text parses to: that text is the
        // shortest round-trip form of `factor.apply(le)`, so it parses to this double.
        for v in h.custom_values.iter_mut() {
            *v = factor.apply(*v);
        }
        scale_sum(h, factor);
        return Rescaled::Exact;
    }
    if !(MIN_SCHEMA..=MAX_SCHEMA).contains(&h.schema) {
        return Rescaled::Unscaled;
    }
    match exponential_shift(factor, h.schema) {
        Ok(shift) => {
            if !shift_first(&mut h.positive_spans, shift) {
                return Rescaled::Unscaled;
            }
            if !shift_first(&mut h.negative_spans, shift) {
                shift_first(&mut h.positive_spans, -shift);
                return Rescaled::Unscaled;
            }
            h.zero_threshold = factor.apply(h.zero_threshold);
            scale_sum(h, factor);
            Rescaled::Exact
        }
        Err((shift, q)) => {
            // Both sides are computed before anything changes, so a histogram out of
            // range is forwarded untouched.
            scratch.clear();
            split(h, false, shift, q, scratch);
            let positives = scratch.len();
            split(h, true, shift, q, scratch);
            if scratch
                .iter()
                .any(|(i, _)| !(-MAX_INDEX..=MAX_INDEX).contains(i))
            {
                return Rescaled::Unscaled;
            }
            h.count_float = h.count();
            h.zero_count_float = h.zero_count();
            h.float = true;
            h.positive_deltas.clear();
            h.negative_deltas.clear();
            write_buckets(
                &scratch[..positives],
                &mut h.positive_spans,
                &mut h.positive_counts,
            );
            write_buckets(
                &scratch[positives..],
                &mut h.negative_spans,
                &mut h.negative_counts,
            );
            h.zero_threshold = factor.apply(h.zero_threshold);
            scale_sum(h, factor);
            Rescaled::Rebucketed
        }
    }
}

fn scale_sum(h: &mut NativeHistogram, factor: Factor) {
    h.sum_bits = factor.apply(f64::from_bits(h.sum_bits)).to_bits();
}

/// Moves the first span (whose offset is the absolute index) by `shift`.
fn shift_first(spans: &mut [BucketSpan], shift: i64) -> bool {
    let Some(first) = spans.first_mut() else {
        return true;
    };
    let moved = first.offset as i64 + shift;
    if !(-MAX_INDEX..=MAX_INDEX).contains(&moved) {
        return false;
    }
    first.offset = moved as i32;
    true
}

/// Appends the target buckets of one side (index order, equal indices merged).
fn split(h: &NativeHistogram, negative: bool, shift: i64, q: f64, out: &mut Vec<(i64, f64)>) {
    let start = out.len();
    let mut push = |i: i64, c: f64| {
        if out.len() > start
            && let Some(last) = out.last_mut()
            && last.0 == i
        {
            last.1 += c;
            return;
        }
        out.push((i, c));
    };
    h.for_each_bucket(negative, |i, c| {
        let i = i.saturating_add(shift);
        if q == 0.0 {
            push(i, c);
            return;
        }
        let upper = c * q;
        push(i, c - upper);
        push(i.saturating_add(1), upper);
    });
}

/// Spans and absolute counts for `(index, count)` pairs in index order.
fn write_buckets(buckets: &[(i64, f64)], spans: &mut Vec<BucketSpan>, counts: &mut Vec<f64>) {
    spans.clear();
    counts.clear();
    let mut next: Option<i64> = None;
    for &(i, c) in buckets {
        match (next, spans.last_mut()) {
            (Some(n), Some(last)) if n == i => last.length += 1,
            _ => spans.push(BucketSpan {
                offset: (i - next.unwrap_or(0)) as i32,
                length: 1,
            }),
        }
        counts.push(c);
        next = Some(i + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::number::{FloatStyle, parse_float, write_float};

    fn f(text: &str) -> Factor {
        Factor::parse(text).unwrap()
    }

    fn int_hist(schema: i32, spans: &[(i32, u32)], deltas: &[i64]) -> NativeHistogram {
        let mut h = NativeHistogram {
            schema,
            sum_bits: 1234.5f64.to_bits(),
            zero_threshold: 0.001,
            zero_count_int: 2,
            ..Default::default()
        };
        h.positive_spans = spans
            .iter()
            .map(|&(offset, length)| BucketSpan { offset, length })
            .collect();
        h.positive_deltas = deltas.to_vec();
        let mut total = h.zero_count_int;
        h.for_each_bucket(false, |_, c| total += c as u64);
        h.count_int = total;
        h
    }

    fn buckets(h: &NativeHistogram) -> Vec<(i64, f64)> {
        let mut v = Vec::new();
        h.for_each_bucket(false, |i, c| v.push((i, c)));
        v
    }

    /// The upper bound of bucket `i` of an exponential schema.
    fn upper(schema: i32, i: i64) -> f64 {
        (i as f64 / (schema as f64).exp2()).exp2()
    }

    #[test]
    fn nhcb_bounds_equal_the_classic_le_text() {
        let mut h = NativeHistogram {
            schema: CUSTOM_BUCKETS_SCHEMA,
            count_int: 6,
            sum_bits: 1500.0f64.to_bits(),
            custom_values: vec![1.0, 2.5, 10.0, 100.0, 333.3, 1e4],
            positive_spans: vec![BucketSpan {
                offset: 0,
                length: 3,
            }],
            positive_deltas: vec![1, 1, 0],
            ..Default::default()
        };
        let before = h.clone();
        let mut scratch = Vec::new();
        assert_eq!(rescale(&mut h, f("1/1000"), &mut scratch), Rescaled::Exact);
        for (old, new) in before.custom_values.iter().zip(&h.custom_values) {
            let mut text = Vec::new();
            write_float(&mut text, f("1/1000").apply(*old), FloatStyle::Go);
            let parsed = parse_float(std::str::from_utf8(&text).unwrap()).unwrap();
            assert_eq!(parsed.to_bits(), new.to_bits(), "{old}");
        }
        assert_eq!(h.custom_values[0], 0.001);
        assert_eq!(f64::from_bits(h.sum_bits), 1.5);
        assert_eq!(
            (h.positive_deltas.clone(), h.count_int),
            (before.positive_deltas, 6)
        );
    }

    #[test]
    fn power_of_two_shifts_indices_exactly() {
        let mut scratch = Vec::new();
        for schema in [-4, -2, 0, 3, 8] {
            let h0 = int_hist(schema, &[(-2, 2), (3, 1)], &[4, -1, 2]);
            for factor in ["2^20", "4", "1/1024"] {
                let fac = f(factor);
                let k = power_of_two(fac).unwrap();
                let mut h = h0.clone();
                let got = rescale(&mut h, fac, &mut scratch);
                let per = if schema < 0 { 1i64 << -schema } else { 1 };
                if schema < 0 && (k as i64) % per != 0 {
                    assert_eq!(got, Rescaled::Rebucketed, "{schema} {factor}");
                    continue;
                }
                assert_eq!(got, Rescaled::Exact, "{schema} {factor}");
                assert!(!h.float);
                // Every bucket's upper bound is the old one × factor, exactly.
                for ((i0, c0), (i1, c1)) in buckets(&h0).into_iter().zip(buckets(&h)) {
                    assert_eq!(c0, c1);
                    assert_eq!(
                        upper(schema, i1),
                        fac.apply(upper(schema, i0)),
                        "{schema} {factor}"
                    );
                }
                assert_eq!(h.zero_threshold, fac.apply(0.001));
                assert_eq!(f64::from_bits(h.sum_bits), fac.apply(1234.5));
            }
        }
    }

    /// The quantile a histogram gives, interpolating in log space within a bucket.
    fn quantile(h: &NativeHistogram, q: f64) -> f64 {
        let b = {
            let mut v = Vec::new();
            h.for_each_bucket(false, |i, c| v.push((i, c)));
            v
        };
        let total: f64 = b.iter().map(|x| x.1).sum::<f64>() + h.zero_count();
        let rank = q * total;
        let mut acc = h.zero_count();
        for (i, c) in b {
            if acc + c >= rank && c > 0.0 {
                let lo = upper(h.schema, i - 1).log2();
                let hi = upper(h.schema, i).log2();
                return (lo + (hi - lo) * (rank - acc) / c).exp2();
            }
            acc += c;
        }
        f64::NAN
    }

    #[test]
    fn other_factors_rebucket_conserving_counts() {
        let mut scratch = Vec::new();
        for schema in [-1, 0, 3, 5, 8] {
            let h0 = int_hist(
                schema,
                &[(10, 4), (2, 3)],
                &[100, 250, -300, 7, 40, 1000, -1],
            );
            for factor in ["1/1000", "1/1000000", "60", "3/2"] {
                let fac = f(factor);
                let mut h = h0.clone();
                assert_eq!(
                    rescale(&mut h, fac, &mut scratch),
                    Rescaled::Rebucketed,
                    "{schema} {factor}"
                );
                assert!(h.float);
                assert_eq!(h.count_float, h0.count_int as f64);
                assert_eq!(h.zero_count_float, 2.0);
                let total: f64 = buckets(&h).iter().map(|b| b.1).sum();
                let total0: f64 = buckets(&h0).iter().map(|b| b.1).sum();
                assert_eq!(
                    total, total0,
                    "counts conserved exactly ({schema} {factor})"
                );
                assert_eq!(f64::from_bits(h.sum_bits), fac.apply(1234.5));
                // A quantile moves by at most one bucket of the schema.
                let width = (1.0 / (schema as f64).exp2()).exp2();
                for q in [0.5, 0.9, 0.99] {
                    let want = fac.apply(quantile(&h0, q));
                    let got = quantile(&h, q);
                    let ratio = got / want;
                    assert!(
                        ratio <= width * (1.0 + 1e-12) && ratio >= 1.0 / width / (1.0 + 1e-12),
                        "{schema} {factor} q={q}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn rebucketing_is_a_fixed_linear_map() {
        // Cumulative counts stay monotonic across samples: a later sample with every
        // bucket at least as large gives every target bucket at least as large.
        let mut scratch = Vec::new();
        let a0 = int_hist(3, &[(5, 3)], &[1, 1, 1]);
        let b0 = int_hist(3, &[(5, 3)], &[2, 1, 0]);
        let (mut a, mut b) = (a0.clone(), b0.clone());
        rescale(&mut a, f("1/1000"), &mut scratch);
        rescale(&mut b, f("1/1000"), &mut scratch);
        for ((ia, ca), (ib, cb)) in buckets(&a).into_iter().zip(buckets(&b)) {
            assert_eq!(ia, ib);
            assert!(cb >= ca);
        }
    }

    #[test]
    fn stale_markers_unknown_schemas_and_huge_offsets_are_left_alone() {
        let mut scratch = Vec::new();
        let mut h = int_hist(3, &[(5, 1)], &[1]);
        h.sum_bits = STALE_NAN_BITS;
        let before = h.clone();
        assert_eq!(rescale(&mut h, f("1/1000"), &mut scratch), Rescaled::Stale);
        assert_eq!(h, before);
        let mut h = int_hist(12, &[(5, 1)], &[1]);
        let before = h.clone();
        assert_eq!(
            rescale(&mut h, f("1/1000"), &mut scratch),
            Rescaled::Unscaled
        );
        assert_eq!(h, before);
        let mut h = int_hist(8, &[(i32::MAX - 10, 1)], &[1]);
        let before = h.clone();
        assert_eq!(rescale(&mut h, f("2^20"), &mut scratch), Rescaled::Unscaled);
        assert_eq!(h, before);
        assert_eq!(
            rescale(&mut h, f("1/1000"), &mut scratch),
            Rescaled::Unscaled
        );
        assert_eq!(h, before);
    }
}
