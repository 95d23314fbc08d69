//! Native histograms under a rescale rule: decoded, rescaled (`mapping::native`) and
//! re-encoded into the request's histogram arena.

use super::*;
use crate::mapping::native::{Rescaled, rescale};
use crate::mapping::number::Factor;

impl Mapper {
    /// Rescales the histogram at `raw` by `factor` (a rule of pack `pack`); returns the
    /// bytes to forward: rewritten ones in the histogram arena, or the input's.
    pub(super) fn rescale_native(
        &mut self,
        buf: &[u8],
        raw: Span,
        factor: Factor,
        pack: u16,
    ) -> Str {
        // Decoding checked every field already; a failure here forwards it unchanged.
        if self
            .native
            .parse(buf, raw.start as usize, raw.end as usize)
            .is_err()
        {
            self.stats.native_unscaled += 1;
            return Str::In(raw);
        }
        match rescale(&mut self.native, factor, &mut self.native_scratch) {
            Rescaled::Stale => return Str::In(raw),
            Rescaled::Unscaled => {
                self.stats.native_unscaled += 1;
                return Str::In(raw);
            }
            Rescaled::Exact => self.stats.native_exact += 1,
            Rescaled::Rebucketed => {
                if let Some(c) = self.stats.native_rebucketed.get_mut(pack as usize) {
                    *c += 1;
                }
            }
        }
        let start = self.hist_arena.len() as u32;
        self.native.encode(&mut self.hist_arena);
        Str::Arena(start, self.hist_arena.len() as u32)
    }
}
