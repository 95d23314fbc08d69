//! The mapper's working representation: strings as spans of the input or of the
//! per-request arena, and the small index records of the merge area.

use super::*;
use crate::wire::decode::HistogramView;
use crate::wire::histogram::START_TIMESTAMP_FIELD;
use crate::wire::pb::copy_without;

#[derive(Clone, Copy, Debug)]
pub(super) enum Str {
    In(Span),
    Arena(u32, u32),
}

/// 32 bytes, not 28: copied as two whole 16-byte words. At 28, a copy was two
/// overlapping ones, and reading one back just after both were stored stalled on store
/// forwarding (measured: a fifth of `Mapper::apply`'s own time, in one label loop).
#[derive(Clone, Copy, Debug)]
#[repr(align(8))]
pub(super) struct WorkLabel {
    pub(super) name: Str,
    pub(super) value: Str,
    /// A step renamed it: it loses to a label already of its new name.
    pub(super) renamed: bool,
    /// A step added it (after the input's labels, so it loses to one of its name).
    pub(super) added: bool,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct OutSeries {
    pub(super) labels: Range32,
    /// Its labels encoded, in [`Mapper::out_label_bytes`].
    pub(super) label_bytes: Range32,
    /// Rank label to sum this physical series over (derive stage), if its plan says so.
    pub(super) rank_label: Option<Str>,
    /// The derive stage reads it (see [`MergedTap`]); `labels` are kept only then.
    pub(super) tapped: bool,
    pub(super) first_chunk: u32,
    pub(super) last_chunk: u32,
    pub(super) next_same_hash: u32,
}

/// Whether the derive stage reads a merged output series: `tapped` when it sums it over
/// ranks (`rank_label`) or its name is tapped.
#[derive(Clone, Copy, Debug)]
pub(super) struct MergedTap {
    pub(super) rank_label: Option<Str>,
    pub(super) tapped: bool,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) samples: Range32,
    pub(super) exemplars: Range32,
    pub(super) histograms: Range32,
    pub(super) next: u32,
}

/// A native histogram of the merge area: the input's bytes, or a rewritten one in
/// [`Mapper`]'s histogram arena.
#[derive(Clone, Copy, Debug)]
pub(super) struct HistOut {
    pub(super) timestamp: i64,
    pub(super) bytes: Str,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct ExemplarOut {
    pub(super) labels: Range32,
    pub(super) value_bits: u64,
    pub(super) timestamp: i64,
}

impl Mapper {
    /// Empties the per-request buffers, keeping their capacity.
    pub(super) fn reset(&mut self, rules: &Rules) {
        self.label_memo.clear();
        self.arena.clear();
        self.work.clear();
        self.out_series.clear();
        self.out_labels.clear();
        self.out_label_bytes.clear();
        self.set_memo.clear();
        self.chunks.clear();
        self.samples.clear();
        self.exemplars.clear();
        self.histograms.clear();
        self.hist_arena.clear();
        self.index.clear();
        self.meta_seen.clear();
        self.le_unproven.clear();
        self.taps.clear();
        self.tap_labels.clear();
        self.tap_samples.clear();
        self.tap_memo = None;
        self.stats.reset(rules.reasons().len(), rules.packs().len());
    }

    #[inline]
    pub(super) fn str_bytes<'a>(&'a self, s: Str, buf: &'a [u8]) -> &'a [u8] {
        match s {
            Str::In(span) => span.bytes(buf),
            Str::Arena(a, b) => &self.arena[a as usize..b as usize],
        }
    }

    /// A histogram's bytes: `Str::Arena` refers to the histogram arena.
    #[inline]
    pub(super) fn hist_bytes<'a>(&'a self, h: Str, buf: &'a [u8]) -> &'a [u8] {
        match h {
            Str::In(span) => span.bytes(buf),
            Str::Arena(a, b) => &self.hist_arena[a as usize..b as usize],
        }
    }

    /// The bytes an input histogram goes on as: its own, or, for a 1.0 histogram with a
    /// field 17 ([`HistogramView::foreign_field_17`]), a copy without that field in the
    /// histogram arena.
    pub(super) fn histogram_source(&mut self, buf: &[u8], h: &HistogramView) -> Str {
        if !h.foreign_field_17 {
            return Str::In(h.raw);
        }
        let start = self.hist_arena.len() as u32;
        // The decoder walked every field of this histogram, so the copy does not fail;
        // if it did, the fields copied so far are whole ones and still a valid message.
        let _ = copy_without(
            buf,
            h.raw.start as usize,
            h.raw.end as usize,
            START_TIMESTAMP_FIELD,
            &mut self.hist_arena,
        );
        Str::Arena(start, self.hist_arena.len() as u32)
    }

    pub(super) fn intern(&mut self, bytes: &[u8]) -> Str {
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        Str::Arena(start, self.arena.len() as u32)
    }

    pub(super) fn find(&self, buf: &[u8], name: &[u8]) -> Option<usize> {
        self.work
            .iter()
            .position(|l| crate::wire::decode::short_eq(self.str_bytes(l.name, buf), name))
    }

    /// The value of label `name`: from the work area once it is `built`, else from the
    /// input (the same labels, in the same order, until a step changes them).
    pub(super) fn label_value<'a>(
        &'a self,
        built: bool,
        buf: &'a [u8],
        req: &'a DecodedRequest,
        s: &SeriesView,
        name: &[u8],
    ) -> Option<&'a [u8]> {
        if built {
            self.find(buf, name)
                .map(|i| self.str_bytes(self.work[i].value, buf))
        } else {
            req.labels[s.labels.usize()]
                .iter()
                .find(|l| crate::wire::decode::short_eq(l.name.bytes(buf), name))
                .map(|l| l.value.bytes(buf))
        }
    }

    pub(super) fn matches(
        &self,
        built: bool,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        when: &[LabelCond],
    ) -> bool {
        when.iter()
            .all(|c| c.holds(self.label_value(built, buf, req, s, c.name.as_bytes())))
    }

    pub(super) fn drop_series(&mut self, s: &SeriesView, reason: u16) {
        if let Some(c) = self.stats.dropped.get_mut(reason as usize) {
            *c += (s.samples.len() + s.histograms.len()) as u64;
        }
    }

    pub(super) fn count_out(&mut self, s: &SeriesView) {
        self.stats.series_out += 1;
        self.stats.samples_out += s.samples.len() as u64;
        self.stats.histograms_out += s.histograms.len() as u64;
    }
}
