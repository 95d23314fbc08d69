//! Merging output series that land on one label set (the collision invariant), and
//! encoding them in timestamp order.

use super::*;
use crate::wire::decode::{name_cmp, short_eq};
use crate::wire::encode::encoded_label_at;

/// A name's first eight bytes as a big-endian number, zero-padded: `name_key(a) <
/// name_key(b)` implies `a < b` (bytewise); equal keys say nothing.
#[inline]
fn name_key(name: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    if name.len() >= 8 {
        w.copy_from_slice(&name[..8]);
    } else {
        for (d, s) in w.iter_mut().zip(name) {
            *d = *s;
        }
    }
    u64::from_be_bytes(w)
}

impl Mapper {
    /// Removes empty values, sorts by name and resolves duplicate names (a label renamed
    /// onto an existing one loses to the existing one). The input's labels arrive sorted
    /// and unique (the decoder sees to it), so only a step that renamed or added a label
    /// (`names_changed`) can need the sort, and only empty input values or a step that
    /// wrote an empty value (`may_have_empty`) the removal.
    pub(super) fn finish_labels(&mut self, buf: &[u8], names_changed: bool, may_have_empty: bool) {
        let mut work = std::mem::take(&mut self.work);
        if may_have_empty {
            work.retain(|l| !self.str_bytes(l.value, buf).is_empty());
        }
        if !names_changed {
            self.work = work;
            return;
        }
        // Sorted by each name's first eight bytes, compared as one number; the whole
        // names only where those are equal.
        let mut keys = std::mem::take(&mut self.sort_keys);
        keys.clear();
        keys.extend(
            work.iter()
                .enumerate()
                .map(|(i, l)| (name_key(self.str_bytes(l.name, buf)), i as u32)),
        );
        if keys.windows(2).all(|w| w[0].0 < w[1].0) {
            self.sort_keys = keys;
            self.work = work;
            return;
        }
        // Stable, as the plain sort by (name, renamed) over the work order was.
        keys.sort_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                let (la, lb) = (&work[a.1 as usize], &work[b.1 as usize]);
                name_cmp(self.str_bytes(la.name, buf), self.str_bytes(lb.name, buf))
                    .then(la.renamed.cmp(&lb.renamed))
            })
        });
        let mut sorted = std::mem::take(&mut self.work_sorted);
        sorted.clear();
        let mut last_key = None;
        for &(key, i) in &keys {
            let l = work[i as usize];
            // The first of a name is kept.
            if last_key == Some(key)
                && let Some(prev) = sorted.last()
                && short_eq(self.str_bytes(prev.name, buf), self.str_bytes(l.name, buf))
            {
                continue;
            }
            last_key = Some(key);
            sorted.push(l);
        }
        self.work_sorted = work;
        self.work = sorted;
        self.sort_keys = keys;
    }

    /// The merge index's key of the label set in `work` (in its output order: the same
    /// for equal sets). Each label is hashed on its own, with its position, and the
    /// hashes folded together: one hasher through every label made one chain of
    /// dependent multiplies, a quarter of the mapper's time; the labels' chains now
    /// overlap. The position is inside each label's keyed hash (a fold by rotation alone
    /// would repeat every 64 labels: sets with two labels swapped 64 places apart would
    /// share a key whatever the seed, and a sender could make every series collide).
    pub(super) fn label_hash(&self, buf: &[u8]) -> u64 {
        let mut key = self.work.len() as u64;
        for (i, l) in self.work.iter().enumerate() {
            let (name, value) = (self.str_bytes(l.name, buf), self.str_bytes(l.value, buf));
            let mut h = self.hasher.build_hasher();
            // The position and both lengths (under 4 GiB, snappy's limit) in one word,
            // one step of the hasher; the lengths keep `a="bc"` and `ab="c"` apart.
            h.write_u128(((i as u128) << 64) | ((name.len() as u128) << 32) | value.len() as u128);
            h.write(name);
            h.write(value);
            key ^= h.finish();
        }
        key
    }

    pub(super) fn same_labels(&self, buf: &[u8], o: &OutSeries) -> bool {
        let theirs = &self.out_labels[o.labels.usize()];
        theirs.len() == self.work.len()
            && theirs.iter().zip(&self.work).all(|(a, b)| {
                self.str_bytes(a.name, buf) == self.str_bytes(b.name, buf)
                    && self.str_bytes(a.value, buf) == self.str_bytes(b.value, buf)
            })
    }

    pub(super) fn insert(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        factor: Option<crate::mapping::number::Factor>,
        scale: Option<(crate::mapping::number::Factor, u16)>,
        rank_label: Option<Str>,
    ) {
        let exemplar_factor = scale.map(|(f, _)| f);
        // Samples (rescaled when a factor applies; stale markers never touched).
        let s_start = self.samples.len() as u32;
        for smp in &req.samples[s.samples.usize()] {
            let value_bits = match factor {
                Some(f) if smp.value_bits != STALE_NAN_BITS => {
                    f.apply(f64::from_bits(smp.value_bits)).to_bits()
                }
                _ => smp.value_bits,
            };
            self.samples.push(SampleView { value_bits, ..*smp });
        }
        let e_start = self.exemplars.len() as u32;
        for ex in &req.exemplars[s.exemplars.usize()] {
            let value_bits = match exemplar_factor {
                Some(f) if ex.value_bits != STALE_NAN_BITS => {
                    f.apply(f64::from_bits(ex.value_bits)).to_bits()
                }
                _ => ex.value_bits,
            };
            self.exemplars.push(ExemplarOut {
                labels: ex.labels,
                value_bits,
                timestamp: ex.timestamp,
            });
        }
        let h_start = self.histograms.len() as u32;
        for h in &req.histograms[s.histograms.usize()] {
            let source = self.histogram_source(buf, h);
            let bytes = match scale {
                Some((f, pack)) if !f.is_one() => self.rescale_native(buf, source, f, pack),
                _ => source,
            };
            self.histograms.push(HistOut {
                timestamp: h.timestamp,
                bytes,
            });
        }
        let chunk = Chunk {
            samples: Range32 {
                start: s_start,
                end: self.samples.len() as u32,
            },
            exemplars: Range32 {
                start: e_start,
                end: self.exemplars.len() as u32,
            },
            histograms: Range32 {
                start: h_start,
                end: self.histograms.len() as u32,
            },
            next: NONE,
        };
        let chunk_id = self.chunks.len() as u32;
        self.chunks.push(chunk);

        let hash = self.label_hash(buf);
        let mut cursor = self.index.get(&hash).copied().unwrap_or(NONE);
        let head = cursor;
        while cursor != NONE {
            let o = self.out_series[cursor as usize];
            if self.same_labels(buf, &o) {
                self.chunks[o.last_chunk as usize].next = chunk_id;
                self.out_series[cursor as usize].last_chunk = chunk_id;
                self.stats.collisions += 1;
                return;
            }
            cursor = o.next_same_hash;
        }
        let l_start = self.out_labels.len() as u32;
        self.out_labels.extend_from_slice(&self.work);
        let id = self.out_series.len() as u32;
        self.out_series.push(OutSeries {
            labels: Range32 {
                start: l_start,
                end: self.out_labels.len() as u32,
            },
            first_chunk: chunk_id,
            last_chunk: chunk_id,
            next_same_hash: head,
            rank_label,
        });
        self.index.insert(hash, id);
    }

    pub(super) fn encode_merged(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        out: &mut Vec<u8>,
        taps: &TapSet,
    ) {
        let mut memo = std::mem::take(&mut self.label_memo);
        for oi in 0..self.out_series.len() {
            let o = self.out_series[oi];
            // Straight into the output, no scratch copy.
            let mut w = SeriesWriter::in_place(out);
            if req.v2 {
                // No label of a 2.0 request stands encoded in its buffer: through the memo.
                let labels = &self.out_labels[o.labels.usize()];
                w.labels_memo(
                    &mut memo,
                    labels.len(),
                    |k| match (labels[k].name, labels[k].value) {
                        (Str::In(n), Str::In(v)) => label_key(n, v),
                        _ => NO_KEY,
                    },
                    |k| {
                        (
                            self.str_bytes(labels[k].name, buf),
                            self.str_bytes(labels[k].value, buf),
                        )
                    },
                );
            } else {
                self.write_labels(&mut w, o.labels, buf);
            }
            let first = self.chunks[o.first_chunk as usize];
            if first.next == NONE {
                for smp in &self.samples[first.samples.usize()] {
                    w.sample_view(smp);
                }
                self.stats.samples_out += first.samples.len() as u64;
                for ex in &self.exemplars[first.exemplars.usize()] {
                    let labels = req.labels[ex.labels.usize()]
                        .iter()
                        .map(|l| (l.name.bytes(buf), l.value.bytes(buf)));
                    w.exemplar(labels, ex.value_bits, ex.timestamp);
                }
                for h in &self.histograms[first.histograms.usize()] {
                    w.histogram_raw(self.hist_bytes(h.bytes, buf));
                }
                self.stats.histograms_out += first.histograms.len() as u64;
                if (!taps.is_empty() || o.rank_label.is_some()) && !first.samples.is_empty() {
                    self.tap_merged(taps, buf, o, Some(first.samples));
                }
            } else {
                self.encode_chunks(&mut w, o.first_chunk, buf, req);
                if (!taps.is_empty() || o.rank_label.is_some()) && !self.gather_samples.is_empty() {
                    self.tap_merged(taps, buf, o, None);
                }
            }
            if req.v2 {
                w.close_memo(&mut memo);
            } else {
                w.close();
            }
            self.stats.series_out += 1;
        }
        self.label_memo = memo;
    }

    /// Writes an output series' labels. Labels the rules left as they came are copied
    /// from the input as it encoded them, neighbours in one copy (most of a series'
    /// labels are one run of the input); the others are encoded.
    fn write_labels(&self, w: &mut SeriesWriter<'_>, labels: Range32, buf: &[u8]) {
        let mut run: Option<(usize, usize)> = None;
        for l in &self.out_labels[labels.usize()] {
            let at = match (l.name, l.value) {
                (Str::In(n), Str::In(v)) => encoded_label_at(buf, n, v),
                _ => None,
            };
            match (at, &mut run) {
                (Some((start, end)), Some((_, run_end))) if *run_end == start => *run_end = end,
                (Some(span), _) => {
                    if let Some((a, b)) = run.replace(span) {
                        w.raw_fields(&buf[a..b]);
                    }
                }
                (None, _) => {
                    if let Some((a, b)) = run.take() {
                        w.raw_fields(&buf[a..b]);
                    }
                    w.label(self.str_bytes(l.name, buf), self.str_bytes(l.value, buf));
                }
            }
        }
        if let Some((a, b)) = run {
            w.raw_fields(&buf[a..b]);
        }
    }

    /// Merges the chunks of several inputs that landed on one label set: timestamp order,
    /// first sample kept for a repeated timestamp (the rest counted as dropped).
    pub(super) fn encode_chunks(
        &mut self,
        w: &mut SeriesWriter<'_>,
        first: u32,
        buf: &[u8],
        req: &DecodedRequest,
    ) {
        self.gather_samples.clear();
        self.gather_hist.clear();
        self.gather_ex.clear();
        let mut c = first;
        while c != NONE {
            let ch = self.chunks[c as usize];
            self.gather_samples
                .extend_from_slice(&self.samples[ch.samples.usize()]);
            self.gather_ex
                .extend_from_slice(&self.exemplars[ch.exemplars.usize()]);
            self.gather_hist
                .extend_from_slice(&self.histograms[ch.histograms.usize()]);
            c = ch.next;
        }
        // Stable sorts keep the first-received sample first among equal timestamps.
        self.gather_samples.sort_by_key(|s| s.timestamp);
        let before = self.gather_samples.len();
        self.gather_samples.dedup_by_key(|s| s.timestamp);
        let mut dups = (before - self.gather_samples.len()) as u64;
        self.gather_hist.sort_by_key(|h| h.timestamp);
        let before = self.gather_hist.len();
        self.gather_hist.dedup_by_key(|h| h.timestamp);
        dups += (before - self.gather_hist.len()) as u64;
        self.gather_ex.sort_by_key(|e| e.timestamp);
        self.gather_ex.dedup_by_key(|e| e.timestamp);
        if let Some(d) = self
            .stats
            .dropped
            .get_mut(REASON_DUPLICATE_TIMESTAMP as usize)
        {
            *d += dups;
        }
        for smp in &self.gather_samples {
            w.sample_view(smp);
        }
        self.stats.samples_out += self.gather_samples.len() as u64;
        for ex in &self.gather_ex {
            let labels = req.labels[ex.labels.usize()]
                .iter()
                .map(|l| (l.name.bytes(buf), l.value.bytes(buf)));
            w.exemplar(labels, ex.value_bits, ex.timestamp);
        }
        for h in &self.gather_hist {
            w.histogram_raw(self.hist_bytes(h.bytes, buf));
        }
        self.stats.histograms_out += self.gather_hist.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal label sets share a key; two labels swapped, however far apart (a fold by
    /// rotation alone repeats every 64 places), give another.
    #[test]
    fn label_sets_with_labels_swapped_far_apart_get_other_keys() {
        let mut m = Mapper::new();
        let labels: Vec<WorkLabel> = (0..130)
            .map(|i| WorkLabel {
                name: m.intern(format!("l{i:03}").as_bytes()),
                value: m.intern(format!("v{}", i % 7).as_bytes()),
                renamed: false,
            })
            .collect();
        m.work = labels.clone();
        let key = m.label_hash(&[]);
        assert_eq!(m.label_hash(&[]), key);
        for (a, b) in [(0, 64), (1, 65), (3, 128), (0, 1)] {
            m.work = labels.clone();
            m.work.swap(a, b);
            assert_ne!(m.label_hash(&[]), key, "labels {a} and {b} swapped");
        }
        // A label twice does not cancel out: sets that differ only in their repeated
        // label get other keys.
        let twice = |m: &mut Mapper, l: WorkLabel| {
            m.work = labels[..64].to_vec();
            m.work.extend([l, l]);
            m.label_hash(&[])
        };
        assert_ne!(twice(&mut m, labels[100]), twice(&mut m, labels[101]));
    }
}
