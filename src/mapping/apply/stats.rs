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
    /// (slot, series, samples) per run of series of one plan (`Rules::families`).
    pub families: Vec<(u32, u64, u64)>,
}

impl MapStats {
    /// Bytes its vectors hold between requests (one entry per run of series for the
    /// renames and families: they grow with a request).
    pub fn retained_bytes(&self) -> usize {
        use crate::wire::held;
        held(&self.dropped)
            + held(&self.renamed)
            + held(&self.rescaled)
            + held(&self.native_rebucketed)
            + held(&self.renames)
            + held(&self.families)
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
        self.families.clear();
    }

    pub(super) fn note_family(&mut self, slot: u32, samples: u64) {
        match self.families.last_mut() {
            Some((last, series, n)) if *last == slot => {
                *series += 1;
                *n += samples;
            }
            _ => self.families.push((slot, 1, samples)),
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
