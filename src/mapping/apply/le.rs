//! Rescaling `le` bucket bounds, in the float style (Go or Python) the family uses.

use super::*;

/// The longest `le` text the cache of rescaled bounds keeps (`0.005`, `1.048576e+06`,
/// `2.5e-05`: well under), so that its 4,096 entries stay small whatever a sender writes.
const LE_CACHED_BYTES: usize = 32;

impl Mapper {
    pub(super) fn rescale_le(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
        factor: crate::mapping::number::Factor,
    ) {
        let Some(i) = self.find(buf, b"le") else {
            return;
        };
        let text_bytes = self.str_bytes(self.work[i].value, buf);
        let Ok(text) = std::str::from_utf8(text_bytes) else {
            return;
        };
        let text_len = text.len();
        let Some(v) = parse_float(text) else { return };
        if !v.is_finite() {
            return;
        }
        let style = match style_of(text) {
            StyleEvidence::Known(st) => st,
            StyleEvidence::Ambiguous => self.family_le_style(buf, req, s),
        };
        let start = self.arena.len() as u32;
        // A family's bounds repeat in every label set it has: each (factor, style,
        // bound) is formatted once, then copied. No exporter writes a bound longer than
        // `LE_CACHED_BYTES`: such a one is not worth an entry of its size.
        let mut key = std::mem::take(&mut self.le_key);
        key.clear();
        if text_len <= LE_CACHED_BYTES {
            key.extend_from_slice(&factor.num.to_le_bytes());
            key.extend_from_slice(&factor.den.to_le_bytes());
            key.push(style as u8);
            key.extend_from_slice(self.str_bytes(self.work[i].value, buf));
        }
        match self.le_rescaled.get(&key).filter(|_| !key.is_empty()) {
            Some(text) => self.arena.extend_from_slice(text),
            None => {
                write_float(&mut self.arena, factor.apply(v), style);
                if !key.is_empty() {
                    let text = Box::<[u8]>::from(&self.arena[start as usize..]);
                    self.le_rescaled.insert(&key, text);
                }
            }
        }
        self.le_key = key;
        self.work[i].value = Str::Arena(start, self.arena.len() as u32);
    }

    /// The `le` style of a family whose bucket at hand is ambiguous (e.g. `0.5`):
    /// learned from the family's other buckets in this request, remembered afterwards.
    pub(super) fn family_le_style(
        &mut self,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
    ) -> FloatStyle {
        let name = s.name.bytes(buf);
        if let Some(st) = self.le_styles.get(name) {
            return *st;
        }
        // A family whose bounds this request all leaves ambiguous is scanned once, not
        // once per series of it (that would be quadratic in the request's size).
        let key = self.hasher.hash_one(name);
        if self
            .le_unproven
            .get(&key)
            .is_some_and(|seen| seen.bytes(buf) == name)
        {
            return FloatStyle::Go;
        }
        let mut found = None;
        for other in &req.series {
            if other.name.bytes(buf) != name {
                continue;
            }
            for l in &req.labels[other.labels.usize()] {
                if l.name.bytes(buf) == b"le"
                    && let StyleEvidence::Known(st) = style_of(l.value.str(buf))
                {
                    found = Some(st);
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        match found {
            Some(st) => {
                self.le_styles.insert(name, st);
                st
            }
            None => {
                self.le_unproven.entry(key).or_insert(s.name);
                FloatStyle::Go
            }
        }
    }
}
