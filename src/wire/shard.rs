//! Splits an encoded remote-write 1.0 `WriteRequest` into `n` requests by a hash of each
//! series' labels, so that one series always lands in the same part: a queue that sends
//! its shards concurrently keeps every series' samples in order. Series are copied
//! whole (their bytes are not re-encoded); metadata goes to part 0.

use std::hash::Hasher;

use super::DecodeError;
use super::pb::{Reader, WIRE_LEN};

/// Samples (float plus histogram) per part, filled by [`split_by_series`].
pub type PartSamples = [u64];

/// Splits `req` into `parts.len()` requests (each part is cleared first). Every field
/// is copied into exactly one part, so the concatenation of the parts holds every
/// series and metadata entry of `req`.
pub fn split_by_series(
    req: &[u8],
    parts: &mut [Vec<u8>],
    samples: &mut PartSamples,
) -> Result<(), DecodeError> {
    let n = parts.len().max(1) as u64;
    for p in parts.iter_mut() {
        p.clear();
    }
    samples.iter_mut().for_each(|s| *s = 0);
    let mut r = Reader::new(req, 0, req.len());
    while !r.is_done() {
        let field_start = r.pos();
        let (field, wire) = r.key()?;
        if field == 1 && wire == WIRE_LEN {
            let (start, end) = r.len_delimited()?;
            let (hash, count) = series_hash(req, start, end)?;
            let part = (hash % n) as usize;
            parts[part].extend_from_slice(&req[field_start..end]);
            samples[part] += count;
        } else {
            r.skip(wire)?;
            parts[0].extend_from_slice(&req[field_start..r.pos()]);
        }
    }
    Ok(())
}

/// A hash of a series' label fields (stable across requests and processes: FNV-1a, not
/// a randomly seeded hasher), and its number of samples and histograms.
fn series_hash(buf: &[u8], start: usize, end: usize) -> Result<(u64, u64), DecodeError> {
    let mut h = Fnv1a::default();
    let mut count = 0;
    let mut r = Reader::new(buf, start, end);
    while !r.is_done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, WIRE_LEN) => {
                let (s, e) = r.len_delimited()?;
                h.write(&buf[s..e]);
                h.write_u8(0xff);
            }
            (2 | 4, WIRE_LEN) => {
                r.len_delimited()?;
                count += 1;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok((h.finish(), count))
}

/// FNV-1a of `bytes`: stable across processes, so a queue's shard of a key (a tenant)
/// survives a restart.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::default();
    h.write(bytes);
    h.finish()
}

struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};
    use prost::Message;

    fn series(name: &str, inst: &str, ts: &[i64]) -> TimeSeries {
        TimeSeries {
            labels: vec![
                Label {
                    name: "__name__".into(),
                    value: name.into(),
                },
                Label {
                    name: "instance".into(),
                    value: inst.into(),
                },
            ],
            samples: ts
                .iter()
                .map(|&t| Sample {
                    value: t as f64,
                    timestamp: t,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn every_series_lands_whole_in_one_part_and_always_the_same_one() {
        let mut all = Vec::new();
        for i in 0..200 {
            all.push(series("m", &format!("i{i}"), &[1, 2, 3]));
        }
        let req = WriteRequest {
            timeseries: all.clone(),
            ..Default::default()
        }
        .encode_to_vec();
        let mut parts = vec![Vec::new(); 4];
        let mut samples = vec![0; 4];
        split_by_series(&req, &mut parts, &mut samples).unwrap();
        assert_eq!(samples.iter().sum::<u64>(), 600);
        let mut seen = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let back = WriteRequest::decode(p.as_slice()).unwrap();
            assert!(!back.timeseries.is_empty(), "part {i} is empty");
            assert_eq!(samples[i], 3 * back.timeseries.len() as u64);
            seen.extend(back.timeseries);
        }
        seen.sort_by(|a, b| a.labels[1].value.cmp(&b.labels[1].value));
        all.sort_by(|a, b| a.labels[1].value.cmp(&b.labels[1].value));
        assert_eq!(seen, all);
        // The same series in another request (other samples) goes to the same part.
        let again = WriteRequest {
            timeseries: vec![series("m", "i7", &[9])],
            ..Default::default()
        }
        .encode_to_vec();
        let mut parts2 = vec![Vec::new(); 4];
        split_by_series(&again, &mut parts2, &mut samples).unwrap();
        let part_of = |parts: &[Vec<u8>]| {
            parts.iter().position(|p| {
                WriteRequest::decode(p.as_slice())
                    .unwrap()
                    .timeseries
                    .iter()
                    .any(|t| t.labels[1].value == "i7")
            })
        };
        assert_eq!(part_of(&parts), part_of(&parts2));
    }

    #[test]
    fn a_truncated_request_is_an_error_not_a_panic() {
        let req = WriteRequest {
            timeseries: vec![series("m", "a", &[1])],
            ..Default::default()
        }
        .encode_to_vec();
        let mut parts = vec![Vec::new(); 2];
        let mut samples = vec![0; 2];
        for cut in 0..req.len() {
            let _ = split_by_series(&req[..cut], &mut parts, &mut samples);
        }
    }
}
