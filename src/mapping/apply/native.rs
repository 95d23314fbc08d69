//! Native histograms under a rescale rule: decoded, rescaled (`mapping::native`) and
//! re-encoded into the request's histogram arena.

use super::*;
use crate::mapping::native::{Rescaled, rescale};
use crate::mapping::number::Factor;

impl Mapper {
    /// Rescales the histogram `source` (from [`Mapper::histogram_source`]) by `factor`
    /// (a rule of pack `pack`); returns the bytes to forward: rewritten ones in the
    /// histogram arena, or `source`.
    pub(super) fn rescale_native(
        &mut self,
        buf: &[u8],
        source: Str,
        factor: Factor,
        pack: u16,
    ) -> Str {
        let parsed = match source {
            Str::In(span) => self
                .native
                .parse(buf, span.start as usize, span.end as usize),
            Str::Arena(a, b) => self.native.parse(&self.hist_arena, a as usize, b as usize),
        };
        // Decoding checked every field already; a failure here forwards it unchanged.
        if parsed.is_err() {
            self.stats.native_unscaled += 1;
            return source;
        }
        match rescale(&mut self.native, factor, &mut self.native_scratch) {
            Rescaled::Stale => return source,
            Rescaled::Unscaled => {
                self.stats.native_unscaled += 1;
                return source;
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
