//! One scrape → remote-write 1.0 bodies, as Prometheus would have sent them: the
//! target's labels on every series (`honor_labels` decides a clash), `job` and
//! `instance`, staleness markers for the series the previous scrape had and this one
//! lacks, and the report series (`up`, `scrape_duration_seconds`,
//! `scrape_samples_scraped`). Buffers are kept from one scrape to the next.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use super::text::{self, Format, Line, Meta, SampleLine};
use crate::wire::STALE_NAN_BITS;
use crate::wire::pb::{put_bytes_field, put_key, put_varint};

/// A series' identity: its encoded labels' 64-bit FNV-1a hash.
type SeriesHash = u64;

/// The hash is already a hash.
#[derive(Default)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A series seen (for duplicates) that gets no staleness marker.
const NOT_TRACKED: u32 = u32::MAX;

type SeriesMap = HashMap<SeriesHash, (u32, u32), BuildHasherDefault<IdentityHasher>>;

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What a scrape's bodies carried.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeCounts {
    /// Samples the target exposed (`scrape_samples_scraped`).
    pub scraped: u64,
    /// Staleness markers written for series that vanished.
    pub stale: u64,
    /// Samples left out because the scrape exposed their series twice.
    pub duplicates: u64,
}

/// A target's series across scrapes, and the buffers one scrape is encoded into.
pub struct TargetEncoder {
    /// The target's labels, sorted by name (`job`, `instance` included).
    target_labels: Vec<(String, String)>,
    /// Whether a target label's name starts with this byte: most series labels clash
    /// with none, and this says so without a search.
    target_first_bytes: [bool; 256],
    /// Series of the last successful scrape: hash → its encoded labels in `prev_arena`.
    prev: SeriesMap,
    prev_arena: Vec<u8>,
    cur: SeriesMap,
    cur_arena: Vec<u8>,
    /// The report series were sent (so a removal marks them stale).
    reported: bool,
    line: SampleLine,
    labels: Vec<(Pair, Pair)>,
    exported: Vec<u8>,
    label_buf: Vec<u8>,
    families: Vec<Family>,
    seen_families: HashSet<String>,
}

/// A label name or value: where its bytes stand.
#[derive(Clone, Copy)]
enum Pair {
    Body(usize, usize),
    Scratch(usize, usize),
    Target(usize, bool),
    Exported(usize, usize),
    Static(&'static str),
}

struct Family {
    name: String,
    metric_type: i32,
    help: String,
    unit: String,
}

/// Remote-write bodies (uncompressed 1.0 `WriteRequest`s) of at most about this many
/// bytes each, sent in order.
pub const BATCH_BYTES: usize = 1 << 20;

pub struct Batches {
    pub bodies: Vec<Vec<u8>>,
    /// The capacity a new body starts with.
    reserve: usize,
}

/// What a body may pass `BATCH_BYTES` by: its last series (a few KiB at most, unless a
/// series' labels are larger, which only grow that body).
const BATCH_SLACK: usize = 16 << 10;

impl Batches {
    /// Bodies for a scrape expected to encode to about `expected` bytes (the last
    /// one's): each reserved at once, so none is copied as it grows.
    pub fn expecting(expected: usize) -> Batches {
        Batches {
            bodies: Vec::new(),
            reserve: expected.clamp(64 << 10, BATCH_BYTES + BATCH_SLACK),
        }
    }

    /// The bytes the bodies hold.
    pub fn bytes(&self) -> usize {
        self.bodies.iter().map(Vec::len).sum()
    }

    fn current(&mut self) -> &mut Vec<u8> {
        if self.bodies.last().is_none_or(|b| b.len() >= BATCH_BYTES) {
            self.bodies.push(Vec::with_capacity(self.reserve));
        }
        let last = self.bodies.len() - 1;
        &mut self.bodies[last]
    }
}

fn metric_type_of(word: &str) -> i32 {
    match word {
        "counter" => 1,
        "gauge" => 2,
        "histogram" => 3,
        "gaugehistogram" => 4,
        "summary" => 5,
        "info" => 6,
        "stateset" => 7,
        _ => 0,
    }
}

/// How a scrape ended, for the report series.
pub struct Report {
    pub up: bool,
    pub duration_seconds: f64,
}

/// Settings an encoder reads per scrape.
#[derive(Clone, Copy)]
pub struct EncodeOptions {
    pub honor_labels: bool,
    pub honor_timestamps: bool,
}

impl TargetEncoder {
    pub fn new(mut target_labels: Vec<(String, String)>) -> TargetEncoder {
        target_labels.sort();
        target_labels.dedup_by(|a, b| a.0 == b.0);
        let mut target_first_bytes = [false; 256];
        for (n, _) in &target_labels {
            if let Some(&b) = n.as_bytes().first() {
                target_first_bytes[usize::from(b)] = true;
            }
        }
        TargetEncoder {
            target_labels,
            target_first_bytes,
            prev: SeriesMap::default(),
            prev_arena: Vec::new(),
            cur: SeriesMap::default(),
            cur_arena: Vec::new(),
            reported: false,
            line: SampleLine::default(),
            labels: Vec::new(),
            exported: Vec::new(),
            label_buf: Vec::new(),
            families: Vec::new(),
            seen_families: HashSet::new(),
        }
    }

    pub fn target_labels(&self) -> &[(String, String)] {
        &self.target_labels
    }

    /// Series the last successful scrape sent (staleness is tracked for these).
    pub fn tracked_series(&self) -> usize {
        self.prev.len()
    }

    /// Encodes a successful scrape of `body` at `now_ms`. On a parse error nothing is
    /// kept: the caller reports the scrape failed ([`Self::encode_failure`]).
    pub fn encode_scrape(
        &mut self,
        body: &[u8],
        format: Format,
        now_ms: i64,
        opts: EncodeOptions,
        out: &mut Batches,
    ) -> Result<ScrapeCounts, text::ParseError> {
        let mut counts = ScrapeCounts::default();
        self.cur.clear();
        self.cur_arena.clear();
        self.families.clear();
        self.seen_families.clear();
        let mut line = std::mem::take(&mut self.line);
        let first_body = out.bodies.len();
        let result = text::parse(body, format, &mut line, |kind, s| match kind {
            Line::Sample => self.encode_sample(body, s, now_ms, opts, out, &mut counts),
            Line::Meta(m) => {
                self.note_meta(m);
                Ok(())
            }
            Line::Nothing | Line::Eof => Ok(()),
        });
        self.line = line;
        if let Err(e) = result {
            out.bodies.truncate(first_body);
            return Err(e);
        }
        // Staleness: what the last scrape had and this one lacks.
        for (hash, (start, len)) in &self.prev {
            if *start != NOT_TRACKED && !self.cur.contains_key(hash) {
                let labels = &self.prev_arena[*start as usize..(*start + *len) as usize];
                write_series(
                    out.current(),
                    labels,
                    f64::from_bits(STALE_NAN_BITS),
                    now_ms,
                );
                counts.stale += 1;
            }
        }
        std::mem::swap(&mut self.prev, &mut self.cur);
        std::mem::swap(&mut self.prev_arena, &mut self.cur_arena);
        if !self.families.is_empty() {
            let body = out.current();
            for f in &self.families {
                write_metadata(body, f);
            }
        }
        Ok(counts)
    }

    /// A failed scrape: every series of the last one becomes stale.
    pub fn encode_failure(&mut self, now_ms: i64, out: &mut Batches) -> u64 {
        let stale = self.mark_all_stale(now_ms, out);
        self.prev.clear();
        self.prev_arena.clear();
        stale
    }

    fn mark_all_stale(&self, now_ms: i64, out: &mut Batches) -> u64 {
        let mut n = 0;
        for (start, len) in self.prev.values() {
            if *start == NOT_TRACKED {
                continue;
            }
            let labels = &self.prev_arena[*start as usize..(*start + *len) as usize];
            write_series(
                out.current(),
                labels,
                f64::from_bits(STALE_NAN_BITS),
                now_ms,
            );
            n += 1;
        }
        n
    }

    /// The report series of a scrape at `now_ms`.
    pub fn encode_report(&mut self, report: &Report, samples: u64, now_ms: i64, out: &mut Batches) {
        let up = if report.up { 1.0 } else { 0.0 };
        self.write_report(out, "up", up, now_ms);
        self.write_report(
            out,
            "scrape_duration_seconds",
            report.duration_seconds,
            now_ms,
        );
        self.write_report(out, "scrape_samples_scraped", samples as f64, now_ms);
        self.reported = true;
    }

    /// The target is gone: its series and its report series become stale.
    pub fn encode_removal(&mut self, now_ms: i64, out: &mut Batches) -> u64 {
        let mut n = self.mark_all_stale(now_ms, out);
        self.prev.clear();
        self.prev_arena.clear();
        if self.reported {
            let stale = f64::from_bits(STALE_NAN_BITS);
            for name in ["up", "scrape_duration_seconds", "scrape_samples_scraped"] {
                self.write_report(out, name, stale, now_ms);
                n += 1;
            }
            self.reported = false;
        }
        n
    }

    fn write_report(&mut self, out: &mut Batches, name: &str, value: f64, now_ms: i64) {
        self.label_buf.clear();
        let mut named = false;
        for (n, v) in &self.target_labels {
            if !named && n.as_str() > "__name__" {
                write_label(&mut self.label_buf, b"__name__", name.as_bytes());
                named = true;
            }
            write_label(&mut self.label_buf, n.as_bytes(), v.as_bytes());
        }
        if !named {
            write_label(&mut self.label_buf, b"__name__", name.as_bytes());
        }
        write_series(out.current(), &self.label_buf, value, now_ms);
    }

    fn note_meta(&mut self, m: Meta<'_>) {
        let (name, apply): (&str, &dyn Fn(&mut Family)) = match &m {
            Meta::Help(n, h) => (n, &|f: &mut Family| f.help = h.clone()),
            Meta::Type(n, t) => (n, &|f: &mut Family| f.metric_type = metric_type_of(t)),
            Meta::Unit(n, u) => (n, &|f: &mut Family| f.unit = (*u).to_string()),
        };
        if !self.seen_families.contains(name) {
            self.seen_families.insert(name.to_string());
            self.families.push(Family {
                name: name.to_string(),
                metric_type: 0,
                help: String::new(),
                unit: String::new(),
            });
        }
        if let Some(f) = self.families.iter_mut().rev().find(|f| f.name == name) {
            apply(f);
        }
    }

    fn encode_sample(
        &mut self,
        body: &[u8],
        s: &SampleLine,
        now_ms: i64,
        opts: EncodeOptions,
        out: &mut Batches,
        counts: &mut ScrapeCounts,
    ) -> Result<(), String> {
        counts.scraped += 1;
        self.labels.clear();
        self.exported.clear();
        self.labels.push((
            Pair::Static("__name__"),
            Pair::Body(s.name.start, s.name.end),
        ));
        for (n, v) in &s.labels {
            let (vs, ve, scratch) = match v {
                text::Loc::Body(r) => (r.start, r.end, false),
                text::Loc::Scratch(r) => (r.start, r.end, true),
            };
            if vs == ve {
                continue; // an empty value is no label
            }
            let name = &body[n.clone()];
            if name == b"__name__" {
                return Err("a label named __name__ in the label set".into());
            }
            let clashes = name
                .first()
                .is_some_and(|&b| self.target_first_bytes[usize::from(b)])
                && self
                    .target_labels
                    .binary_search_by(|(t, _)| crate::wire::decode::name_cmp(t.as_bytes(), name))
                    .is_ok();
            let value = if scratch {
                Pair::Scratch(vs, ve)
            } else {
                Pair::Body(vs, ve)
            };
            if clashes && !opts.honor_labels {
                let at = self.exported.len();
                self.exported.extend_from_slice(b"exported_");
                self.exported.extend_from_slice(name);
                self.labels
                    .push((Pair::Exported(at, self.exported.len()), value));
            } else {
                self.labels.push((Pair::Body(n.start, n.end), value));
            }
        }
        for (i, (n, _)) in self.target_labels.iter().enumerate() {
            let kept_theirs = opts.honor_labels
                && s.labels
                    .iter()
                    .any(|(ln, v)| &body[ln.clone()] == n.as_bytes() && s.resolve(body, v) != b"");
            if !kept_theirs {
                self.labels
                    .push((Pair::Target(i, true), Pair::Target(i, false)));
            }
        }
        let resolve = |p: &Pair| -> &[u8] {
            match *p {
                Pair::Body(a, b) => &body[a..b],
                Pair::Scratch(a, b) => &s.scratch[a..b],
                Pair::Target(i, true) => self.target_labels[i].0.as_bytes(),
                Pair::Target(i, false) => self.target_labels[i].1.as_bytes(),
                Pair::Exported(a, b) => &self.exported[a..b],
                Pair::Static(t) => t.as_bytes(),
            }
        };
        // Label names are a few bytes: compared inline, not through memcmp.
        self.labels
            .sort_unstable_by(|a, b| crate::wire::decode::name_cmp(resolve(&a.0), resolve(&b.0)));
        if let Some(w) = self
            .labels
            .windows(2)
            .find(|w| crate::wire::decode::short_eq(resolve(&w[0].0), resolve(&w[1].0)))
        {
            return Err(format!(
                "label name {:?} is not unique",
                String::from_utf8_lossy(resolve(&w[0].0))
            ));
        }
        self.label_buf.clear();
        for (n, v) in &self.labels {
            write_label(&mut self.label_buf, resolve(n), resolve(v));
        }
        let explicit = opts.honor_timestamps && s.timestamp_ms.is_some();
        let ts = if explicit {
            s.timestamp_ms.unwrap_or(now_ms)
        } else {
            now_ms
        };
        let hash = fnv1a(&self.label_buf);
        if self.cur.contains_key(&hash) {
            counts.duplicates += 1;
            return Ok(());
        }
        // Series with their own timestamps get no staleness markers (as Prometheus):
        // they are tracked only to find duplicates.
        let start = self.cur_arena.len();
        if !explicit {
            self.cur_arena.extend_from_slice(&self.label_buf);
        }
        let len = self.cur_arena.len() - start;
        if explicit {
            self.cur.insert(hash, (NOT_TRACKED, 0));
        } else {
            self.cur.insert(hash, (start as u32, len as u32));
        }
        write_series(out.current(), &self.label_buf, s.value, ts);
        Ok(())
    }
}

#[inline]
fn write_label(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let (n, v) = (name.len(), value.len());
    if n + v + 4 < 128 {
        // The usual label: every length one byte, one reservation, four copies.
        out.reserve(n + v + 6);
        out.extend_from_slice(&[0x0a, (n + v + 4) as u8, 0x0a, n as u8]);
        out.extend_from_slice(name);
        out.extend_from_slice(&[0x12, v as u8]);
        out.extend_from_slice(value);
        return;
    }
    put_key(out, 1, 2);
    let len = 2 + varint_len(name.len()) + name.len() + varint_len(value.len()) + value.len();
    put_varint(out, len as u64);
    put_bytes_field(out, 1, name);
    put_bytes_field(out, 2, value);
}

fn varint_len(n: usize) -> usize {
    crate::wire::pb::varint_len(n as u64)
}

/// A `TimeSeries` (field 1 of `WriteRequest`) of `labels` (encoded `Label` fields) and
/// one sample.
fn write_series(out: &mut Vec<u8>, labels: &[u8], value: f64, ts: i64) {
    let mut sample = [0u8; 1 + 8 + 1 + 10];
    let mut n = 0;
    sample[n] = 0x09; // field 1, fixed64
    n += 1;
    sample[n..n + 8].copy_from_slice(&value.to_bits().to_le_bytes());
    n += 8;
    sample[n] = 0x10; // field 2, varint
    n += 1;
    let mut v = ts as u64;
    while v >= 0x80 {
        sample[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    sample[n] = v as u8;
    n += 1;
    let series_len = labels.len() + 1 + varint_len(n) + n;
    put_key(out, 1, 2);
    put_varint(out, series_len as u64);
    out.extend_from_slice(labels);
    put_key(out, 2, 2);
    put_varint(out, n as u64);
    out.extend_from_slice(&sample[..n]);
}

/// A `MetricMetadata` (field 3 of `WriteRequest`).
fn write_metadata(out: &mut Vec<u8>, f: &Family) {
    let mut m = Vec::with_capacity(f.name.len() + f.help.len() + f.unit.len() + 16);
    if f.metric_type != 0 {
        put_key(&mut m, 1, 0);
        put_varint(&mut m, f.metric_type as u64);
    }
    put_bytes_field(&mut m, 2, f.name.as_bytes());
    if !f.help.is_empty() {
        put_bytes_field(&mut m, 4, f.help.as_bytes());
    }
    if !f.unit.is_empty() {
        put_bytes_field(&mut m, 5, f.unit.as_bytes());
    }
    put_bytes_field(out, 3, &m);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::prometheus::WriteRequest;
    use prost::Message;

    /// Both ways of writing a label, one-byte lengths and longer ones, encode what
    /// prost encodes for `TimeSeries.labels`.
    #[test]
    fn labels_encode_as_prost_does_at_every_length() {
        use crate::wire::proto::prometheus::{Label, TimeSeries};
        for (n, v) in [
            (1, 1),
            (8, 20),
            (60, 63),
            (61, 63),
            (62, 63),
            (100, 30),
            (3, 300),
        ] {
            let name = "n".repeat(n);
            let value = "v".repeat(v);
            let mut ours = Vec::new();
            write_label(&mut ours, name.as_bytes(), value.as_bytes());
            let theirs = TimeSeries {
                labels: vec![Label { name, value }],
                ..Default::default()
            }
            .encode_to_vec();
            assert_eq!(ours, theirs, "name {n} bytes, value {v} bytes");
        }
    }

    fn decode(out: &Batches) -> Vec<String> {
        let mut lines = Vec::new();
        for b in &out.bodies {
            let req = WriteRequest::decode(b.as_slice()).expect("valid body");
            for ts in req.timeseries {
                let labels: Vec<String> = ts
                    .labels
                    .iter()
                    .map(|l| format!("{}={}", l.name, l.value))
                    .collect();
                for s in ts.samples {
                    let v = if s.value.to_bits() == STALE_NAN_BITS {
                        "STALE".to_string()
                    } else {
                        s.value.to_string()
                    };
                    lines.push(format!("{} {} @{}", labels.join(","), v, s.timestamp));
                }
            }
            for m in req.metadata {
                lines.push(format!(
                    "meta {} {} {:?} {:?}",
                    m.metric_family_name, m.r#type, m.help, m.unit
                ));
            }
        }
        lines
    }

    fn target() -> TargetEncoder {
        TargetEncoder::new(vec![
            ("job".into(), "vllm".into()),
            ("instance".into(), "h:8000".into()),
        ])
    }

    const OPTS: EncodeOptions = EncodeOptions {
        honor_labels: false,
        honor_timestamps: true,
    };

    #[test]
    fn target_labels_join_and_clashes_become_exported() {
        let mut t = target();
        let mut out = Batches::expecting(0);
        let c = t
            .encode_scrape(
                b"# TYPE a gauge\na{job=\"x\",z=\"1\"} 2\nb 3 99\n",
                Format::Text004,
                1000,
                OPTS,
                &mut out,
            )
            .unwrap();
        assert_eq!(c.scraped, 2);
        assert_eq!(
            decode(&out),
            vec![
                "__name__=a,exported_job=x,instance=h:8000,job=vllm,z=1 2 @1000",
                "__name__=b,instance=h:8000,job=vllm 3 @99",
                "meta a 2 \"\" \"\"",
            ]
        );
        let mut out = Batches::expecting(0);
        let honor = EncodeOptions {
            honor_labels: true,
            honor_timestamps: false,
        };
        t.encode_scrape(
            b"a{job=\"x\"} 2 5\n",
            Format::Text004,
            2000,
            honor,
            &mut out,
        )
        .unwrap();
        assert_eq!(decode(&out)[0], "__name__=a,instance=h:8000,job=x 2 @2000");
    }

    #[test]
    fn vanished_series_and_failures_and_removal_go_stale() {
        let mut t = target();
        let mut out = Batches::expecting(0);
        t.encode_scrape(b"a 1\nb 2\nc 3 77\n", Format::Text004, 1000, OPTS, &mut out)
            .unwrap();
        t.encode_report(
            &Report {
                up: true,
                duration_seconds: 0.5,
            },
            3,
            1000,
            &mut out,
        );
        let mut out = Batches::expecting(0);
        let c = t
            .encode_scrape(b"a 1\n", Format::Text004, 2000, OPTS, &mut out)
            .unwrap();
        assert_eq!(c.stale, 1, "b vanished; c had its own timestamp");
        assert_eq!(
            decode(&out),
            vec![
                "__name__=a,instance=h:8000,job=vllm 1 @2000",
                "__name__=b,instance=h:8000,job=vllm STALE @2000",
            ]
        );
        let mut out = Batches::expecting(0);
        assert_eq!(t.encode_failure(3000, &mut out), 1);
        t.encode_report(
            &Report {
                up: false,
                duration_seconds: 0.1,
            },
            0,
            3000,
            &mut out,
        );
        let got = decode(&out);
        assert_eq!(got[0], "__name__=a,instance=h:8000,job=vllm STALE @3000");
        assert_eq!(got[1], "__name__=up,instance=h:8000,job=vllm 0 @3000");
        let mut out = Batches::expecting(0);
        assert_eq!(t.encode_removal(4000, &mut out), 3);
        assert!(decode(&out).iter().all(|l| l.contains("STALE")));
    }

    #[test]
    fn duplicates_are_left_out_and_bad_label_sets_fail_the_scrape() {
        let mut t = target();
        let mut out = Batches::expecting(0);
        let c = t
            .encode_scrape(
                b"a{x=\"1\"} 1\na{x=\"\"} 3\n",
                Format::Text004,
                1,
                OPTS,
                &mut out,
            )
            .unwrap();
        assert_eq!(
            c.duplicates, 0,
            "an empty value is no label: a{{}} is another series"
        );
        assert_eq!(decode(&out).len(), 2);
        let mut out = Batches::expecting(0);
        let c = t
            .encode_scrape(b"a 1\na 2\n", Format::Text004, 1, OPTS, &mut out)
            .unwrap();
        assert_eq!(c.duplicates, 1);
        let mut out = Batches::expecting(0);
        assert!(
            t.encode_scrape(
                b"a{x=\"1\",x=\"2\"} 1\n",
                Format::Text004,
                1,
                OPTS,
                &mut out
            )
            .is_err()
        );
        assert!(out.bodies.is_empty());
    }
}
