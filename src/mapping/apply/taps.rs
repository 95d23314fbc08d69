//! Taps: the output series the derive stage reads, recorded while the mapper writes them.

use super::*;
use crate::wire::decode::is_metric_name;

/// The tap set of a pipeline without a derive stage.
pub(super) static NO_TAPS: std::sync::LazyLock<TapSet> = std::sync::LazyLock::new(TapSet::default);

/// Output metric names the derive stage reads (inputs of derived series). The mapper
/// records the output series with these names, after every rule has applied.
#[derive(Debug, Default, Clone)]
pub struct TapSet {
    names: AHashSet<Box<[u8]>>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Tapped {
    pub(super) labels: Range32,
    pub(super) samples: Range32,
    pub(super) rank_label: Option<Str>,
}

/// One recorded output series: its final labels (with `__name__`) and float samples.
pub struct TappedSeries<'a> {
    pub(super) mapper: &'a Mapper,
    pub(super) buf: &'a [u8],
    pub(super) tapped: Tapped,
}

impl TapSet {
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        TapSet {
            names: names.into_iter().map(|n| n.as_bytes().into()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    #[inline]
    pub fn contains(&self, name: &[u8]) -> bool {
        self.names.contains(name)
    }
}

impl<'a> TappedSeries<'a> {
    pub fn labels(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone + 'a {
        let (m, buf) = (self.mapper, self.buf);
        m.tap_labels[self.tapped.labels.usize()]
            .iter()
            .map(move |(n, v)| (m.str_bytes(*n, buf), m.str_bytes(*v, buf)))
    }

    pub fn name(&self) -> &'a [u8] {
        self.labels()
            .find(|(n, _)| is_metric_name(n))
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    pub fn samples(&self) -> &'a [SampleView] {
        &self.mapper.tap_samples[self.tapped.samples.usize()]
    }

    /// The rank label to sum this physical series over, when its pack asks for it.
    pub fn rank_label(&self) -> Option<&'a [u8]> {
        self.tapped
            .rank_label
            .map(|l| self.mapper.str_bytes(l, self.buf))
    }
}

impl Mapper {
    /// The output series recorded for the derive stage by the last [`Mapper::map_request`].
    pub fn tapped<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = TappedSeries<'a>> + 'a {
        self.taps.iter().map(move |t| TappedSeries {
            mapper: self,
            buf,
            tapped: *t,
        })
    }

    pub(super) fn tap_raw(
        &mut self,
        taps: &TapSet,
        buf: &[u8],
        req: &DecodedRequest,
        s: &SeriesView,
    ) {
        if taps.is_empty() || s.samples.is_empty() || !self.is_tapped(taps, buf, Str::In(s.name)) {
            return;
        }
        let l_start = self.tap_labels.len() as u32;
        for l in &req.labels[s.labels.usize()] {
            self.tap_labels.push((Str::In(l.name), Str::In(l.value)));
        }
        let s_start = self.tap_samples.len() as u32;
        self.tap_samples
            .extend_from_slice(&req.samples[s.samples.usize()]);
        self.close_tap(l_start, s_start, None);
    }

    /// Whether series named `name` are tapped. A family's series come one after another:
    /// the answer for the previous name is reused, no hash of the name.
    #[inline]
    pub(super) fn is_tapped(&mut self, taps: &TapSet, buf: &[u8], name: Str) -> bool {
        if let Some((prev, tapped)) = self.tap_memo
            && short_eq(self.str_bytes(prev, buf), self.str_bytes(name, buf))
        {
            return tapped;
        }
        let tapped = taps.contains(self.str_bytes(name, buf));
        self.tap_memo = Some((name, tapped));
        tapped
    }

    /// Records the tap whose labels and samples were appended from these offsets on.
    pub(super) fn close_tap(&mut self, l_start: u32, s_start: u32, rank_label: Option<Str>) {
        self.taps.push(Tapped {
            labels: Range32 {
                start: l_start,
                end: self.tap_labels.len() as u32,
            },
            samples: Range32 {
                start: s_start,
                end: self.tap_samples.len() as u32,
            },
            rank_label,
        });
    }

    /// Records a merged output series the derive stage reads ([`OutSeries::tapped`]),
    /// with the samples just written for it: `samples` of one chunk, or (`None`) the
    /// gathered ones.
    pub(super) fn tap_merged(&mut self, o: OutSeries, samples: Option<Range32>) {
        let l_start = self.tap_labels.len() as u32;
        for i in o.labels.usize() {
            let l = self.out_labels[i];
            self.tap_labels.push((l.name, l.value));
        }
        let s_start = self.tap_samples.len() as u32;
        match samples {
            Some(r) => self.tap_samples.extend_from_slice(&self.samples[r.usize()]),
            None => self.tap_samples.extend_from_slice(&self.gather_samples),
        }
        self.close_tap(l_start, s_start, o.rank_label);
    }
}
