//! Per-request counts of the mapping stage.

/// Per-request counts, flushed into telemetry by the caller.
#[derive(Debug, Default, Clone)]
pub struct MapStats {
    /// Samples (float samples plus native histograms) dropped, per reason index.
    pub dropped: Vec<u64>,
    /// Series renamed / rescaled, per pack index.
    pub renamed: Vec<u64>,
    pub rescaled: Vec<u64>,
    pub collisions: u64,
    /// Native histograms forwarded in their old unit under a rescale rule
    /// (`native_histograms: keep_unit`, an unknown schema, indices out of range).
    pub native_unscaled: u64,
    /// Native histograms rescaled exactly (NHCB bounds, exponential under 2^k).
    pub native_exact: u64,
    /// Native histograms re-bucketed into float histograms, per pack index.
    pub native_rebucketed: Vec<u64>,
    /// Series given `_total` because their family's metadata says COUNTER.
    pub metadata_total_fixes: u64,
    pub series_out: u64,
    pub samples_out: u64,
    pub histograms_out: u64,
    pub metadata_out: u64,
    /// Samples of renamed old names, per cut-over tracking slot, one entry per run of
    /// series of one slot ([`crate::mapping::renames`]).
    pub renames: Vec<(u32, u64)>,
    /// (slot, series, samples) per plan of the request's series (`Rules::families`),
    /// one entry per slot: a request's targets each repeat every family, and each entry
    /// costs three atomic additions when the request is recorded. Private: `family_at`
    /// indexes it.
    families: Vec<(u32, u64, u64)>,
    /// Per slot: its entry in `families` + 1 (0: none yet this request).
    family_at: Vec<u32>,
    /// The entry of the last series noted (series of one family come in runs).
    last_family: usize,
}

impl MapStats {
    /// Bytes its vectors hold between requests (one entry per run of series for the
    /// renames, per family for the families: they grow with a request).
    pub fn retained_bytes(&self) -> usize {
        use crate::wire::held;
        held(&self.dropped)
            + held(&self.renamed)
            + held(&self.rescaled)
            + held(&self.native_rebucketed)
            + held(&self.renames)
            + held(&self.families)
            + held(&self.family_at)
    }

    pub(super) fn reset(&mut self, reasons: usize, packs: usize) {
        self.dropped.clear();
        self.dropped.resize(reasons, 0);
        self.renamed.clear();
        self.renamed.resize(packs, 0);
        self.rescaled.clear();
        self.rescaled.resize(packs, 0);
        self.collisions = 0;
        self.native_unscaled = 0;
        self.native_exact = 0;
        self.native_rebucketed.clear();
        self.native_rebucketed.resize(packs, 0);
        self.metadata_total_fixes = 0;
        self.series_out = 0;
        self.samples_out = 0;
        self.histograms_out = 0;
        self.metadata_out = 0;
        self.renames.clear();
        for &(slot, _, _) in &self.families {
            if let Some(at) = self.family_at.get_mut(slot as usize) {
                *at = 0;
            }
        }
        self.families.clear();
    }

    /// (slot, series, samples) of each plan the request's series went through.
    pub fn families(&self) -> &[(u32, u64, u64)] {
        &self.families
    }

    pub(super) fn note_family(&mut self, slot: u32, samples: u64) {
        if let Some((last, series, n)) = self.families.get_mut(self.last_family)
            && *last == slot
        {
            *series += 1;
            *n += samples;
            return;
        }
        let s = slot as usize;
        if s >= self.family_at.len() {
            // Slots are bounded (`renames::RENAME_SLOTS` and a few more).
            self.family_at.resize(s + 1, 0);
        }
        match self.family_at[s] {
            0 => {
                self.last_family = self.families.len();
                self.families.push((slot, 1, samples));
                self.family_at[s] = self.families.len() as u32;
            }
            at => {
                self.last_family = at as usize - 1;
                let (_, series, n) = &mut self.families[self.last_family];
                *series += 1;
                *n += samples;
            }
        }
    }

    pub(super) fn note_rename(&mut self, slot: u32, samples: u64) {
        match self.renames.last_mut() {
            Some((last, n)) if *last == slot => *n += samples,
            _ => self.renames.push((slot, samples)),
        }
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A family's series count in one entry wherever they come in the request, and a
    /// new request starts from none.
    #[test]
    fn a_family_s_series_add_up_in_one_entry_per_request() {
        let mut s = MapStats::default();
        s.reset(1, 1);
        for (slot, samples) in [(7, 1), (7, 2), (3, 1), (7, 4), (4160, 1), (3, 5)] {
            s.note_family(slot, samples);
        }
        assert_eq!(s.families, [(7, 3, 7), (3, 2, 6), (4160, 1, 1)]);
        s.reset(1, 1);
        assert!(s.families.is_empty());
        s.note_family(3, 1);
        s.note_family(7, 1);
        assert_eq!(s.families, [(3, 1, 1), (7, 1, 1)]);
    }
}
