//! Merging output series that land on one label set (the collision invariant), and
//! encoding them in timestamp order.

use super::*;
use crate::wire::decode::{name_cmp, name_less, short_eq};
use crate::wire::encode::{NO_KEY, encoded_label_at, label_key, write_series_label};

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
        // Only the labels a step renamed or added are out of place (one or two); the
        // others are the input's, still in order. Those few are sorted among themselves
        // and each put in place by a binary search: the result is the stable sort by
        // (name, renamed) over the work order with the first of a name kept, which is
        // the rule (an input label beats one renamed or added onto its name; of two
        // moved onto one name, the first in that order).
        let mut moved = std::mem::take(&mut self.work_moved);
        moved.clear();
        moved.extend(work.iter().filter(|l| l.renamed || l.added).copied());
        if !moved.is_empty() {
            work.retain(|l| !(l.renamed || l.added));
            debug_assert!(
                work.windows(2).all(|w| name_less(
                    self.str_bytes(w[0].name, buf),
                    self.str_bytes(w[1].name, buf)
                )),
                "a step changed a name without marking it renamed or added"
            );
            if moved.len() > 1 {
                moved.sort_by(|a, b| {
                    name_cmp(self.str_bytes(a.name, buf), self.str_bytes(b.name, buf))
                        .then(a.renamed.cmp(&b.renamed))
                });
            }
            for m in &moved {
                let name = self.str_bytes(m.name, buf);
                let at = work.partition_point(|k| name_less(self.str_bytes(k.name, buf), name));
                if work
                    .get(at)
                    .is_some_and(|k| short_eq(self.str_bytes(k.name, buf), name))
                {
                    continue;
                }
                work.insert(at, *m);
            }
        }
        self.work_moved = moved;
        self.work = work;
    }

    /// Appends the labels in `work` to [`Mapper::out_label_bytes`] encoded exactly as
    /// [`SeriesWriter::label`] writes them, one `Label` field after another (equal sets,
    /// equal bytes: the encoding is a function of the names and values, and the work
    /// area is in output order), and returns where they stand. Labels of a 1.0 input
    /// that stand encoded so in it are copied from it, neighbours in one copy (most of
    /// a series' labels are one run of the input); the others are encoded. A 2.0 set
    /// copies the labels it shares with the set encoded before it instead
    /// ([`Mapper::encode_symbol_labels`]). `input` says how the series' labels stand in
    /// the input.
    pub(super) fn encode_work_labels(&mut self, buf: &[u8], input: InputLabels) -> Range32 {
        if input == InputLabels::Symbols {
            return self.encode_symbol_labels(buf);
        }
        let mut out = std::mem::take(&mut self.out_label_bytes);
        let start = out.len();
        let mut run: Option<(usize, usize)> = None;
        for l in &self.work {
            // A work label whose name and value are both spans of the input is one of
            // the series' own labels as it came (`build_work`; steps write new names and
            // values to the arena).
            let at = match (l.name, l.value, input) {
                (Str::In(n), Str::In(v), InputLabels::Encoded) => {
                    let at = n.start.checked_sub(4).map(|a| (a as usize, v.end as usize));
                    debug_assert_eq!(at, encoded_label_at(buf, n, v));
                    at
                }
                (Str::In(n), Str::In(v), InputLabels::Check) => encoded_label_at(buf, n, v),
                _ => None,
            };
            match (at, &mut run) {
                (Some((from, to)), Some((_, run_end))) if *run_end == from => *run_end = to,
                (Some(span), _) => {
                    if let Some((a, b)) = run.replace(span) {
                        out.extend_from_slice(&buf[a..b]);
                    }
                }
                (None, _) => {
                    if let Some((a, b)) = run.take() {
                        out.extend_from_slice(&buf[a..b]);
                    }
                    write_series_label(
                        &mut out,
                        self.str_bytes(l.name, buf),
                        self.str_bytes(l.value, buf),
                    );
                }
            }
        }
        if let Some((a, b)) = run {
            out.extend_from_slice(&buf[a..b]);
        }
        let end = out.len();
        self.out_label_bytes = out;
        Range32 {
            start: start as u32,
            end: end as u32,
        }
    }

    /// [`Mapper::encode_work_labels`] for a 2.0 request, whose labels stand nowhere
    /// encoded: a label that is the same symbols at the same position as in the label
    /// set encoded just before is copied from that set's encoding (consecutive series
    /// mostly share all but one or two labels), neighbours in one copy; the others are
    /// encoded.
    fn encode_symbol_labels(&mut self, buf: &[u8]) -> Range32 {
        let (work, arena) = (&self.work, &self.arena);
        let bytes = |s: Str| match s {
            Str::In(span) => span.bytes(buf),
            Str::Arena(a, b) => &arena[a as usize..b as usize],
        };
        let start = self.set_memo.append_set(
            &mut self.out_label_bytes,
            work.len(),
            // Spans of the request: the same key, the same bytes. The arena's strings
            // are no other label's.
            |k| match (work[k].name, work[k].value) {
                (Str::In(n), Str::In(v)) => label_key(n, v),
                _ => NO_KEY,
            },
            |k| (bytes(work[k].name), bytes(work[k].value)),
        );
        Range32 {
            start: start as u32,
            end: self.out_label_bytes.len() as u32,
        }
    }

    /// The merge index's key of an encoded label set ([`Mapper::encode_work_labels`]):
    /// one seeded hash over its bytes (a sender cannot aim collisions at the index).
    pub(super) fn label_hash(&self, encoded: Range32) -> u64 {
        self.hasher.hash_one(&self.out_label_bytes[encoded.usize()])
    }

    pub(super) fn insert(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        factor: Option<crate::mapping::number::Factor>,
        scale: Option<(crate::mapping::number::Factor, u16)>,
        tap: MergedTap,
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

        let label_bytes = self.encode_work_labels(buf, InputLabels::of(req, s));
        let hash = self.label_hash(label_bytes);
        let mut cursor = self.index.get(&hash).copied().unwrap_or(NONE);
        let head = cursor;
        while cursor != NONE {
            let o = self.out_series[cursor as usize];
            let (theirs, ours) = (o.label_bytes.usize(), label_bytes.usize());
            if self.out_label_bytes[theirs] == self.out_label_bytes[ours] {
                self.out_label_bytes.truncate(label_bytes.start as usize);
                self.chunks[o.last_chunk as usize].next = chunk_id;
                self.out_series[cursor as usize].last_chunk = chunk_id;
                self.stats.collisions += 1;
                return;
            }
            cursor = o.next_same_hash;
        }
        // Only the derive stage reads the labels as a list.
        let l_start = self.out_labels.len() as u32;
        if tap.tapped {
            self.out_labels.extend_from_slice(&self.work);
        }
        let id = self.out_series.len() as u32;
        self.out_series.push(OutSeries {
            labels: Range32 {
                start: l_start,
                end: self.out_labels.len() as u32,
            },
            label_bytes,
            first_chunk: chunk_id,
            last_chunk: chunk_id,
            next_same_hash: head,
            rank_label: tap.rank_label,
            tapped: tap.tapped,
        });
        self.index.insert(hash, id);
    }

    pub(super) fn encode_merged(&mut self, buf: &[u8], req: &DecodedRequest, out: &mut Vec<u8>) {
        for oi in 0..self.out_series.len() {
            let o = self.out_series[oi];
            // Straight into the output, no scratch copy.
            let mut w = SeriesWriter::in_place(out);
            w.raw_fields(&self.out_label_bytes[o.label_bytes.usize()]);
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
                if o.tapped && !first.samples.is_empty() {
                    self.tap_merged(o, Some(first.samples));
                }
            } else {
                self.encode_chunks(&mut w, o.first_chunk, buf, req);
                if o.tapped && !self.gather_samples.is_empty() {
                    self.tap_merged(o, None);
                }
            }
            w.close();
            self.stats.series_out += 1;
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

/// How a series' labels stand in the input, for [`Mapper::encode_work_labels`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum InputLabels {
    /// 2.0: symbols, none stands encoded as a `Label`.
    Symbols,
    /// 1.0: each may stand encoded as `SeriesWriter::label` writes it; checked per label.
    Check,
    /// 1.0 read by the one-pass decoder: every one does
    /// ([`crate::wire::decode::SeriesView::labels_encoded`]).
    Encoded,
}

impl InputLabels {
    pub(super) fn of(req: &DecodedRequest, s: &SeriesView) -> InputLabels {
        if req.v2 {
            InputLabels::Symbols
        } else if s.labels_encoded {
            InputLabels::Encoded
        } else {
            InputLabels::Check
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::pb::varint_len;

    fn label(m: &mut Mapper, name: &str, value: &str) -> WorkLabel {
        WorkLabel {
            name: m.intern(name.as_bytes()),
            value: m.intern(value.as_bytes()),
            renamed: false,
            added: false,
        }
    }

    /// 2.0 label sets copy the labels they share, at the same position, with the set
    /// encoded before (when it still stands: a set merged away is cut off) and encode
    /// the others: every set's bytes are its fresh encoding.
    #[test]
    fn symbol_label_sets_copy_what_the_set_before_shares() {
        let symbols = b"__name__upjobainstancea:1a:2zone";
        let span = |text: &str| {
            let at = symbols
                .windows(text.len())
                .position(|w| w == text.as_bytes())
                .unwrap();
            Str::In(Span::new(at, at + text.len()))
        };
        let sym = |n: &str, v: &str| WorkLabel {
            name: span(n),
            value: span(v),
            renamed: false,
            added: false,
        };
        let sets: Vec<Vec<(&str, &str, bool)>> = vec![
            vec![
                ("__name__", "up", true),
                ("instance", "a:1", true),
                ("job", "a", true),
            ],
            vec![
                ("__name__", "up", true),
                ("instance", "a:2", true),
                ("job", "a", true),
            ],
            vec![
                ("__name__", "up", true),
                ("instance", "a:2", true),
                ("job", "a", true),
            ],
            vec![
                ("__name__", "up", false),
                ("instance", "a:2", true),
                ("job", "a", true),
            ],
            vec![("__name__", "up", true), ("instance", "a:2", true)],
            vec![
                ("__name__", "up", true),
                ("instance", "a:2", true),
                ("job", "a", true),
                ("zone", "a", true),
            ],
            vec![
                ("instance", "a:2", true),
                ("job", "a", true),
                ("zone", "a", true),
            ],
        ];
        let mut m = Mapper::new();
        for cut in [false, true] {
            m.out_label_bytes.clear();
            m.set_memo.clear();
            for (i, set) in sets.iter().enumerate() {
                m.work = set
                    .iter()
                    .map(|&(n, v, symbol)| {
                        if symbol {
                            sym(n, v)
                        } else {
                            label(&mut m, n, v)
                        }
                    })
                    .collect();
                let got = m.encode_work_labels(symbols, InputLabels::Symbols);
                let mut expected = Vec::new();
                let mut w = SeriesWriter::new(&mut expected);
                for (n, v, _) in set {
                    w.label(n.as_bytes(), v.as_bytes());
                }
                assert_eq!(
                    &m.out_label_bytes[got.usize()],
                    &expected[..],
                    "set {i}, cut {cut}"
                );
                if cut && i % 2 == 1 {
                    // Merged into an earlier series: its bytes are cut off.
                    m.out_label_bytes.truncate(got.start as usize);
                }
            }
        }
    }

    /// A 1.0 series read by the one-pass decoder is marked `labels_encoded`, and its
    /// labels copied on that word are the bytes a fresh encoding writes, as are those of
    /// series the general decoder reads (a long value, unsorted labels), checked label by
    /// label.
    #[test]
    fn labels_known_encoded_copy_as_a_fresh_encoding_writes_them() {
        use crate::wire::decode::{DecodeLimits, DecodedRequest};
        use crate::wire::proto::prometheus as pb;
        use prost::Message;
        let series = |labels: &[(&str, &str)]| pb::TimeSeries {
            labels: labels
                .iter()
                .map(|(n, v)| pb::Label {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            samples: vec![pb::Sample {
                value: 1.0,
                timestamp: 1,
            }],
            ..Default::default()
        };
        let long = "v".repeat(200);
        let body = pb::WriteRequest {
            timeseries: vec![
                series(&[("__name__", "up"), ("instance", "a:1"), ("job", "j")]),
                series(&[("__name__", "up"), ("instance", &long), ("job", "j")]),
                series(&[("job", "j"), ("__name__", "up"), ("instance", "a:2")]),
            ],
            ..Default::default()
        }
        .encode_to_vec();
        let mut req = DecodedRequest::default();
        req.decode(&body, DecodeLimits::default()).unwrap();
        let marked: Vec<bool> = req.series.iter().map(|s| s.labels_encoded).collect();
        assert_eq!(marked, [true, false, false]);
        let mut m = Mapper::new();
        for s in &req.series {
            m.build_work(&req, s);
            let known = m.encode_work_labels(&body, InputLabels::of(&req, s));
            let checked = m.encode_work_labels(&body, InputLabels::Check);
            let fresh = m.encode_work_labels(&body, InputLabels::Symbols);
            let bytes = |r: Range32| m.out_label_bytes[r.usize()].to_vec();
            assert_eq!(bytes(known), bytes(fresh));
            assert_eq!(bytes(checked), bytes(fresh));
        }
    }

    /// A label set encodes to the bytes `SeriesWriter::label` writes, whether its labels
    /// are copied from a 1.0 input or encoded; equal sets share a key, and a set with
    /// two labels swapped, however far apart, or one label repeated, gets another.
    #[test]
    fn equal_label_sets_encode_alike_from_input_or_arena_and_others_get_other_keys() {
        let pairs: Vec<(String, String)> = (0..130)
            .map(|i| (format!("l{i:03}"), format!("v{}", i % 7)))
            .collect();
        // The input: the same labels as a 1.0 series encodes them, a long value among
        // them (two-byte lengths are encoded, not copied).
        let mut input = Vec::new();
        let mut spans = Vec::new();
        for (i, (n, v)) in pairs.iter().enumerate() {
            let v = if i == 5 { "x".repeat(200) } else { v.clone() };
            let at = input.len();
            write_series_label(&mut input, n.as_bytes(), v.as_bytes());
            // The label's key and length, then the name's key and one-byte length.
            let name_at = at + 1 + varint_len((4 + n.len() + v.len()) as u64) + 2;
            let value_end = input.len();
            spans.push((
                Span::new(name_at, name_at + n.len()),
                Span::new(value_end - v.len(), value_end),
                v,
            ));
        }
        let mut expected = Vec::new();
        let mut w = SeriesWriter::new(&mut expected);
        for ((n, _), (_, _, v)) in pairs.iter().zip(&spans) {
            w.label(n.as_bytes(), v.as_bytes());
        }
        let mut m = Mapper::new();
        m.work = spans
            .iter()
            .map(|&(n, v, _)| WorkLabel {
                name: Str::In(n),
                value: Str::In(v),
                renamed: false,
                added: false,
            })
            .collect();
        let from_input = m.encode_work_labels(&input, InputLabels::Check);
        assert_eq!(&m.out_label_bytes[from_input.usize()], &expected[..]);
        m.work = pairs
            .iter()
            .zip(&spans)
            .map(|((n, _), (_, _, v))| label(&mut m, n, v))
            .collect();
        let from_arena = m.encode_work_labels(&input, InputLabels::Check);
        assert_eq!(&m.out_label_bytes[from_arena.usize()], &expected[..]);
        let key = m.label_hash(from_input);
        assert_eq!(m.label_hash(from_arena), key);
        let all = m.work.clone();
        for (a, b) in [(0, 64), (1, 65), (3, 128), (0, 1)] {
            m.work = all.clone();
            m.work.swap(a, b);
            let swapped = m.encode_work_labels(&input, InputLabels::Check);
            assert_ne!(m.label_hash(swapped), key, "labels {a} and {b} swapped");
        }
        m.work = all[..64].to_vec();
        m.work.push(all[100]);
        let once = m.encode_work_labels(&input, InputLabels::Check);
        m.work.push(all[100]);
        let twice = m.encode_work_labels(&input, InputLabels::Check);
        assert_ne!(m.label_hash(once), m.label_hash(twice));
    }

    /// `finish_labels` orders labels as the stable sort by (name, renamed) over the work
    /// order keeping the first of each name (the rule it implements more cheaply), for
    /// random sets with labels renamed, added and dropped.
    #[test]
    fn finished_labels_are_the_stable_sort_keeping_the_first_of_a_name() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let names = [
            "a", "ab", "b", "gpu", "instance", "job", "le", "model", "z", "zz",
        ];
        for _ in 0..5_000 {
            let mut m = Mapper::new();
            let mut work = Vec::new();
            for (i, n) in names.iter().enumerate() {
                if next(2) == 0 {
                    work.push(label(&mut m, n, &format!("in{i}")));
                }
            }
            for step in 0..next(4) {
                match next(3) {
                    0 if !work.is_empty() => {
                        let i = next(work.len() as u64) as usize;
                        work[i].name =
                            m.intern(names[next(names.len() as u64) as usize].as_bytes());
                        work[i].renamed = true;
                    }
                    1 => {
                        let mut l = label(&mut m, names[next(names.len() as u64) as usize], "");
                        l.value = m.intern(format!("added{step}").as_bytes());
                        l.added = true;
                        work.push(l);
                    }
                    _ if !work.is_empty() => {
                        work.remove(next(work.len() as u64) as usize);
                    }
                    _ => {}
                }
            }
            let mut reference = work.clone();
            reference.sort_by(|a, b| {
                m.str_bytes(a.name, &[])
                    .cmp(m.str_bytes(b.name, &[]))
                    .then(a.renamed.cmp(&b.renamed))
            });
            reference.dedup_by(|b, a| m.str_bytes(a.name, &[]) == m.str_bytes(b.name, &[]));
            m.work = work.clone();
            m.finish_labels(&[], true, false);
            let show = |m: &Mapper, ls: &[WorkLabel]| -> Vec<(String, String)> {
                ls.iter()
                    .map(|l| {
                        let s = |x| String::from_utf8_lossy(m.str_bytes(x, &[])).into_owned();
                        (s(l.name), s(l.value))
                    })
                    .collect()
            };
            assert_eq!(
                show(&m, &m.work),
                show(&m, &reference),
                "from {:?}",
                show(&m, &work)
            );
        }
    }
}
