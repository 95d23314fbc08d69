//! Fuzzing on stable Rust: a deterministic, seedable driver over
//! (a) the remote-write decoder (`wire::DecodedRequest::decode`, `wire::snappy`),
//! (b) the whole pipeline (snappy → decode → every built-in pack → derive → encode →
//!     snappy, plus the derived writer's encoder), and
//! (c) the text-exposition parser (`exposition::parse`, then `normalize`'s request
//!     builder and the pipeline on what it accepts).
//!
//! Inputs are structure-aware (`arbitrary`-driven `WriteRequest`s with the metric and
//! label names of the real payloads, stale markers, NaNs, native histograms, exemplars
//! and metadata, encoded with the prost types, some with fields 1.0 does not define
//! added to their messages) and byte-level mutations (bit flips,
//! truncation, splices, varint corruption, length-field inflation, insertions) of real
//! payloads: the synthetic fleet of `promnorm::testkit::fleet` and the dumps in
//! `tests/golden/`. Input `i` of seed `s` is a pure function of `(s, i)`: a failure
//! prints both, and `PROMNORM_FUZZ_SEED=s PROMNORM_FUZZ_ONLY=i` replays it alone.
//!
//! Checked for every input: no panic; errors are the typed `DecodeError` /
//! `exposition::ParseError` with a message; the pipeline's output is a valid
//! `WriteRequest`, and encoded as 2.0 the same series (`Worker::check_output`); the heap
//! grown while handling one input stays within a bound relative to the input's size (a
//! counting allocator measures the peak).
//!
//! `fuzz_campaign` runs 10^6 inputs on two threads (the count is printed, and asserted in
//! release builds; debug builds run 10^5 unless `PROMNORM_FUZZ_INPUTS` says otherwise);
//! `fuzz_campaign_long` (ignored) runs 10^7. docs/fuzzing.md has the timings.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arbitrary::Unstructured;
use promnorm::app::Assemble;
use promnorm::config::Config;
use promnorm::pipeline::{InputProtocol, Pipeline};
use promnorm::wire::encode_v2::V2Encoder;
use promnorm::wire::proto::prometheus as pb;
use promnorm::wire::proto::write_v2 as v2;
use promnorm::wire::{DecodeLimits, DecodedRequest, STALE_NAN_BITS, snappy};
use prost::Message;

use promnorm::testkit::fleet;

// ---------------------------------------------------------------------------------------
// Heap accounting: live bytes and their peak, per thread.

struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn note(bytes: i64) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + bytes;
        l.set(v);
        let _ = PEAK.try_with(|p| {
            if v > p.get() {
                p.set(v)
            }
        });
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as i64);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Starts measuring; returns the live bytes now.
fn mark() -> i64 {
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    live
}

/// Heap grown at the peak since `mark`.
fn grown_since(base: i64) -> i64 {
    PEAK.with(Cell::get) - base
}

// ---------------------------------------------------------------------------------------
// Randomness.

/// SplitMix64: small, fast, and every input is a pure function of (seed, index).
struct Rng(u64);

impl Rng {
    fn new(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        r.next();
        r
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

// ---------------------------------------------------------------------------------------
// The corpus: real payloads, cut into small requests so a million inputs stay fast.

struct Corpus {
    /// Uncompressed `WriteRequest`s of 1 to 40 series.
    raw: Vec<Vec<u8>>,
    /// One full 2,000-series fleet request (used rarely: it is slow).
    full: Vec<u8>,
    /// Exposition texts (windows of the golden dumps).
    texts: Vec<String>,
    names: Vec<String>,
    label_names: Vec<String>,
    label_values: Vec<String>,
}

fn split(req: &pb::WriteRequest, rng: &mut Rng, out: &mut Vec<Vec<u8>>) {
    let mut i = 0;
    while i < req.timeseries.len() {
        let n = 1 + rng.below(40);
        let end = (i + n).min(req.timeseries.len());
        let mut part = pb::WriteRequest {
            timeseries: req.timeseries[i..end].to_vec(),
            ..Default::default()
        };
        if rng.chance(4) {
            part.metadata = req.metadata.iter().take(5).cloned().collect();
        }
        out.push(part.encode_to_vec());
        i = end;
    }
}

fn corpus() -> Corpus {
    let mut rng = Rng::new(1, 1);
    let mut raw = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    let mut label_names = std::collections::BTreeSet::new();
    let mut label_values = std::collections::BTreeSet::new();
    let mut learn = |req: &pb::WriteRequest| {
        for ts in &req.timeseries {
            for l in &ts.labels {
                if l.name == "__name__" {
                    names.insert(l.value.clone());
                } else {
                    label_names.insert(l.name.clone());
                    if l.value.len() < 40 {
                        label_values.insert(l.value.clone());
                    }
                }
            }
        }
    };
    let bodies = fleet::request_bodies(fleet::Mode::Default, 20);
    let full = snap::raw::Decoder::new()
        .decompress_vec(&bodies[0])
        .unwrap();
    for b in &bodies {
        let req = pb::WriteRequest::decode(
            snap::raw::Decoder::new()
                .decompress_vec(b)
                .unwrap()
                .as_slice(),
        )
        .unwrap();
        learn(&req);
        split(&req, &mut rng, &mut raw);
    }
    let mut texts = Vec::new();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "prom"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "golden dumps missing");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let scrape = promnorm::exposition::parse(&text).unwrap();
        let req = promnorm::normalize::scrape_to_request(&scrape, 1_700_000_000_000);
        learn(&req);
        split(&req, &mut rng, &mut raw);
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let n = 5 + rng.below(60);
            texts.push(lines[i..(i + n).min(lines.len())].join("\n") + "\n");
            i += n;
        }
    }
    let names: Vec<String> = names.into_iter().collect();
    assert!(names.len() > 50, "{} names", names.len());
    Corpus {
        raw,
        full,
        texts,
        names,
        label_names: label_names.into_iter().collect(),
        label_values: label_values.into_iter().collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Structure-aware generation.

fn pick<'a>(u: &mut Unstructured, from: &'a [String]) -> arbitrary::Result<&'a str> {
    Ok(u.choose(from)?.as_str())
}

fn text(u: &mut Unstructured, c: &Corpus, known: &[String]) -> arbitrary::Result<String> {
    Ok(match u.int_in_range(0..=79u8)? {
        0..=72 => pick(u, known)?.to_string(),
        73 => String::new(),
        74..=76 => {
            // A known name with a suffix or a prefix changed.
            let base = pick(u, known)?;
            let suffix = *u.choose(&[
                "_total", "_bucket", "_sum", "_count", "_created", "_seconds", "_ms", ":", "\u{e9}",
            ])?;
            format!("{base}{suffix}")
        }
        77 => pick(u, &c.label_values)?.to_string(),
        _ => {
            let s: &str = u.arbitrary()?;
            s.chars().take(24).collect()
        }
    })
}

fn value(u: &mut Unstructured) -> arbitrary::Result<f64> {
    Ok(match u.int_in_range(0..=9u8)? {
        0 => f64::from_bits(STALE_NAN_BITS),
        1 => f64::NAN,
        2 => *u.choose(&[
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            f64::MAX,
            f64::MIN_POSITIVE,
        ])?,
        3 => f64::from_bits(u.arbitrary()?),
        _ => u.int_in_range(0..=1_000_000u32)? as f64 / 8.0,
    })
}

fn labels(u: &mut Unstructured, c: &Corpus) -> arbitrary::Result<Vec<pb::Label>> {
    let mut out = Vec::new();
    if !u.ratio(1, 100)? {
        out.push(pb::Label {
            name: "__name__".into(),
            value: text(u, c, &c.names)?,
        });
    }
    for _ in 0..u.int_in_range(0..=6u8)? {
        let name = text(u, c, &c.label_names)?;
        let value = if name == "le" {
            pick(
                u,
                &["0.5", "1", "2.5", "+Inf", "1e3", "0.001", "x"].map(String::from),
            )?
            .to_string()
        } else {
            text(u, c, &c.label_values)?
        };
        out.push(pb::Label { name, value });
    }
    if !u.ratio(1, 10)? {
        out.sort_by(|a, b| a.name.cmp(&b.name));
        if !u.ratio(1, 10)? {
            out.dedup_by(|a, b| a.name == b.name);
        }
    }
    Ok(out)
}

fn histogram(u: &mut Unstructured) -> arbitrary::Result<pb::Histogram> {
    use pb::histogram::{Count, ZeroCount};
    let spans = |u: &mut Unstructured| -> arbitrary::Result<Vec<pb::BucketSpan>> {
        (0..u.int_in_range(0..=3u8)?)
            .map(|_| {
                Ok(pb::BucketSpan {
                    offset: u.int_in_range(-5..=5)?,
                    length: u.int_in_range(0..=4)?,
                })
            })
            .collect()
    };
    let float = u.arbitrary::<bool>()?;
    Ok(pb::Histogram {
        count: Some(if float {
            Count::CountFloat(value(u)?)
        } else {
            Count::CountInt(u.arbitrary()?)
        }),
        sum: value(u)?,
        // NHCB (-53) too: rescaled and unrolled like the exponential ones.
        schema: if u.ratio(1, 4)? {
            -53
        } else {
            u.int_in_range(-5..=9)?
        },
        zero_threshold: value(u)?,
        zero_count: Some(if float {
            ZeroCount::ZeroCountFloat(value(u)?)
        } else {
            ZeroCount::ZeroCountInt(u.arbitrary()?)
        }),
        negative_spans: spans(u)?,
        negative_deltas: (0..u.int_in_range(0..=4u8)?)
            .map(|_| u.arbitrary())
            .collect::<Result<_, _>>()?,
        negative_counts: (0..u.int_in_range(0..=2u8)?)
            .map(|_| value(u))
            .collect::<Result<_, _>>()?,
        positive_spans: spans(u)?,
        positive_deltas: (0..u.int_in_range(0..=4u8)?)
            .map(|_| u.arbitrary())
            .collect::<Result<_, _>>()?,
        positive_counts: (0..u.int_in_range(0..=2u8)?)
            .map(|_| value(u))
            .collect::<Result<_, _>>()?,
        reset_hint: u.int_in_range(0..=4)?,
        timestamp: u.arbitrary()?,
        custom_values: (0..u.int_in_range(0..=2u8)?)
            .map(|_| value(u))
            .collect::<Result<_, _>>()?,
    })
}

fn request(u: &mut Unstructured, c: &Corpus) -> arbitrary::Result<pb::WriteRequest> {
    let mut req = pb::WriteRequest::default();
    let t0: i64 = 1_700_000_000_000 + u.int_in_range(0..=1_000_000i64)?;
    for _ in 0..u.int_in_range(0..=8u8)? {
        let labels = labels(u, c)?;
        let mut samples = Vec::new();
        for k in 0..u.int_in_range(0..=4u8)? {
            let timestamp = if u.ratio(1, 10)? {
                u.arbitrary()?
            } else {
                t0 + i64::from(k) * 15_000 - i64::from(u.int_in_range(0..=1u8)?) * 30_000
            };
            samples.push(pb::Sample {
                value: value(u)?,
                timestamp,
            });
        }
        let mut labels = labels;
        let histograms: Vec<pb::Histogram> = if u.ratio(1, 6)? {
            (0..u.int_in_range(1..=2u8)?)
                .map(|_| histogram(u))
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        // Native histograms under the packs' rescale rules (÷1000, ×2^20, ÷10^6).
        if !histograms.is_empty() && u.ratio(1, 2)? {
            let family = pick(
                u,
                &[
                    "sglang:kv_transfer_latency_ms",
                    "sglang:kv_transfer_total_mb",
                    "vllm:model_forward_time_milliseconds",
                    "dynamo_frontend_tokenizer_latency_ms",
                    "mooncake_transfer_get_latency",
                ]
                .map(String::from),
            )?
            .to_string();
            if let Some(l) = labels.iter_mut().find(|l| l.name == "__name__") {
                l.value = family;
            }
        }
        let exemplars = if u.ratio(1, 8)? {
            vec![pb::Exemplar {
                labels: labels_small(u)?,
                value: value(u)?,
                timestamp: t0,
            }]
        } else {
            Vec::new()
        };
        req.timeseries.push(pb::TimeSeries {
            labels,
            samples,
            exemplars,
            histograms,
        });
    }
    for _ in 0..u.int_in_range(0..=2u8)? {
        req.metadata.push(pb::MetricMetadata {
            r#type: u.int_in_range(0..=8)?,
            metric_family_name: text(u, c, &c.names)?,
            help: text(u, c, &c.label_values)?,
            unit: pick(
                u,
                &["", "seconds", "bytes", "ms", "tokens"].map(String::from),
            )?
            .to_string(),
        });
    }
    Ok(req)
}

fn labels_small(u: &mut Unstructured) -> arbitrary::Result<Vec<pb::Label>> {
    Ok(vec![pb::Label {
        name: "trace_id".into(),
        value: format!("{:x}", u.arbitrary::<u64>()?),
    }])
}

fn generated_request(rng: &mut Rng, c: &Corpus) -> pb::WriteRequest {
    let n = 256 + rng.below(768);
    let seed_bytes = rng.bytes(n);
    let mut u = Unstructured::new(&seed_bytes);
    // Running out of bytes ends the request early: still a valid request.
    request(&mut u, c).unwrap_or_default()
}

fn generated(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    generated_request(rng, c).encode_to_vec()
}

/// The fields of the message `msg`: (number, wire type, payload: a varint's bytes, a
/// fixed-size value, or what a length-delimited field holds); `None` when it does not
/// parse.
fn fields_of(msg: &[u8]) -> Option<Vec<(u64, u64, &[u8])>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < msg.len() {
        let (key, n) = varint_at(msg, at)?;
        at += n;
        let payload_len = match key & 7 {
            0 => varint_at(msg, at)?.1,
            1 => 8,
            5 => 4,
            2 => {
                let (len, n) = varint_at(msg, at)?;
                at += n;
                usize::try_from(len).ok()?
            }
            _ => return None,
        };
        let payload = msg.get(at..at.checked_add(payload_len)?)?;
        out.push((key >> 3, key & 7, payload));
        at += payload_len;
    }
    Some(out)
}

/// The length-delimited fields numbered `field` of `msg`.
fn sub_messages(msg: &[u8], field: u64) -> Vec<&[u8]> {
    fields_of(msg)
        .unwrap_or_default()
        .into_iter()
        .filter(|&(f, w, _)| f == field && w == 2)
        .map(|(_, _, p)| p)
        .collect()
}

/// Whether the 1.0 body `raw` has a sample with a field 3 or a native histogram with a
/// field 17 (2.0's start timestamps).
fn has_start_timestamp_fields(raw: &[u8]) -> bool {
    let has = |msg: &[u8], field: u64| {
        fields_of(msg)
            .unwrap_or_default()
            .iter()
            .any(|&(f, _, _)| f == field)
    };
    sub_messages(raw, 1).into_iter().any(|series| {
        sub_messages(series, 2).into_iter().any(|s| has(s, 3))
            || sub_messages(series, 4).into_iter().any(|h| has(h, 17))
    })
}

/// A 2.0 symbols table under construction ("" first).
#[derive(Default)]
struct Symbols {
    list: Vec<String>,
    index: std::collections::HashMap<String, u32>,
}

impl Symbols {
    fn r(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }

    fn refs(&mut self, labels: &[pb::Label]) -> Vec<u32> {
        labels
            .iter()
            .flat_map(|l| [self.r(&l.name), self.r(&l.value)])
            .collect()
    }
}

/// The structure-aware request `req` as a 2.0 sender could send it: its labels as
/// references (as drawn: unsorted, duplicate or empty ones included), some series with
/// the metadata of the request's entry for their name, some samples and histograms with
/// a start timestamp.
fn as_v2(rng: &mut Rng, req: &pb::WriteRequest) -> v2::Request {
    let mut sym = Symbols::default();
    sym.r("");
    let start = |rng: &mut Rng, ts: i64| match rng.below(4) {
        0 => ts.wrapping_sub(60_000),
        1 => rng.next() as i64,
        _ => 0,
    };
    let mut out = v2::Request::default();
    for ts in &req.timeseries {
        let name = ts
            .labels
            .iter()
            .find(|l| l.name == "__name__")
            .map_or("", |l| l.value.as_str());
        let metadata = req
            .metadata
            .iter()
            .find(|m| m.metric_family_name == name && rng.chance(2))
            .map(|m| v2::Metadata {
                r#type: m.r#type,
                help_ref: sym.r(&m.help),
                unit_ref: sym.r(&m.unit),
            });
        out.timeseries.push(v2::TimeSeries {
            labels_refs: sym.refs(&ts.labels),
            samples: ts
                .samples
                .iter()
                .map(|s| v2::Sample {
                    value: s.value,
                    timestamp: s.timestamp,
                    start_timestamp: start(rng, s.timestamp),
                })
                .collect(),
            histograms: ts
                .histograms
                .iter()
                .map(|h| {
                    let mut h2 = v2::Histogram::decode(h.encode_to_vec().as_slice())
                        .expect("1.0 histograms read as 2.0");
                    h2.start_timestamp = start(rng, h.timestamp);
                    h2
                })
                .collect(),
            exemplars: ts
                .exemplars
                .iter()
                .map(|e| v2::Exemplar {
                    labels_refs: sym.refs(&e.labels),
                    value: e.value,
                    timestamp: e.timestamp,
                })
                .collect(),
            metadata,
            created_timestamp: 0,
        });
    }
    out.symbols = sym.list;
    out
}

/// The message types of the 1.0 schema, for [`with_unknown_fields`].
#[derive(Clone, Copy)]
enum Msg {
    Request,
    Series,
    Label,
    Sample,
    Exemplar,
    Histogram,
    Span,
    Metadata,
}

impl Msg {
    /// The type of a length-delimited field that holds a message.
    fn child(self, field: u64) -> Option<Msg> {
        match (self, field) {
            (Msg::Request, 1) => Some(Msg::Series),
            (Msg::Request, 3) => Some(Msg::Metadata),
            (Msg::Series, 1) | (Msg::Exemplar, 1) => Some(Msg::Label),
            (Msg::Series, 2) => Some(Msg::Sample),
            (Msg::Series, 3) => Some(Msg::Exemplar),
            (Msg::Series, 4) => Some(Msg::Histogram),
            (Msg::Histogram, 8 | 11) => Some(Msg::Span),
            _ => None,
        }
    }

    /// Field numbers 1.0 does not define in this message, first those 2.0 gives a
    /// meaning to (where a field passed on as bytes would change meaning): 2.0's
    /// `Request` symbols and series (4, 5), `TimeSeries` metadata and created timestamp
    /// (5, 6), `Sample` and `Histogram` start timestamps (3, 17).
    fn unknown_fields(self) -> &'static [u64] {
        match self {
            Msg::Request => &[4, 5, 2, 9],
            Msg::Series => &[5, 6, 7],
            Msg::Label | Msg::Span => &[3, 4],
            Msg::Sample => &[3, 4],
            Msg::Exemplar => &[4, 5],
            Msg::Histogram => &[17, 18],
            Msg::Metadata => &[3, 6],
        }
    }
}

/// Copies the 1.0 message `msg` of type `kind` into `out`, adding to each message (one in
/// three) a field its type does not define, of any wire type. `None`: `msg` does not
/// parse (the caller keeps it as it is).
fn with_unknown_fields(rng: &mut Rng, msg: &[u8], kind: Msg, out: &mut Vec<u8>) -> Option<()> {
    for (field, wire, payload) in fields_of(msg)? {
        put_varint((field << 3) | wire, out);
        match (wire, kind.child(field)) {
            (2, Some(child)) => {
                let mut inner = Vec::new();
                with_unknown_fields(rng, payload, child, &mut inner)?;
                put_varint(inner.len() as u64, out);
                out.extend_from_slice(&inner);
            }
            (2, None) => {
                put_varint(payload.len() as u64, out);
                out.extend_from_slice(payload);
            }
            // A varint's own bytes, or a fixed-size value.
            _ => out.extend_from_slice(payload),
        }
    }
    if rng.chance(3) {
        let fields = kind.unknown_fields();
        let field = fields[rng.below(fields.len())];
        let wire = [0u64, 1, 2, 5][rng.below(4)];
        put_varint((field << 3) | wire, out);
        match wire {
            0 => {
                let shift = rng.below(64);
                put_varint(rng.next() >> shift, out);
            }
            1 => out.extend_from_slice(&rng.bytes(8)),
            5 => out.extend_from_slice(&rng.bytes(4)),
            _ => {
                let len = rng.below(12);
                let bytes = rng.bytes(len);
                put_varint(bytes.len() as u64, out);
                out.extend_from_slice(&bytes);
            }
        }
    }
    Some(())
}

/// `raw` with fields unknown to 1.0 added ([`with_unknown_fields`]), or as it is when it
/// does not parse.
fn unknown_fields_added(rng: &mut Rng, raw: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + raw.len() / 4);
    match with_unknown_fields(rng, &raw, Msg::Request, &mut out) {
        Some(()) => out,
        None => raw,
    }
}

// ---------------------------------------------------------------------------------------
// Byte-level mutations.

/// Reads a varint at `at`: (value, length).
fn varint_at(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(at + i)?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(3) {
        let len = data.len();
        match rng.below(9) {
            // Bit flips.
            0 if len > 0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(len);
                    data[i] ^= 1 << rng.below(8);
                }
            }
            // Truncation.
            1 => data.truncate(rng.below(len + 1)),
            // Splice: a prefix of this with a suffix of another payload.
            2 => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            // Varint corruption: an over-long or unterminated varint.
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below(11);
                let fill = if rng.chance(2) { 0xff } else { 0x80 };
                let end = (i + n).min(len);
                data[i..end].fill(fill);
            }
            // Length-field inflation: find a length-delimited field, declare more.
            4 => {
                let start = rng.below(len.max(1));
                let mut at = start;
                while at < len {
                    if let Some((key, klen)) = varint_at(data, at)
                        && key & 7 == 2
                        && key >> 3 != 0
                        && let Some((l, llen)) = varint_at(data, at + klen)
                    {
                        let bigger = match rng.below(4) {
                            0 => l.saturating_add(1),
                            1 => l.saturating_add(1 + rng.below(1000) as u64),
                            2 => u64::from(u32::MAX),
                            _ => u64::MAX >> rng.below(8),
                        };
                        let mut v = Vec::new();
                        put_varint(bigger, &mut v);
                        data.splice(at + klen..at + klen + llen, v);
                        break;
                    }
                    at += 1;
                }
            }
            // Interesting bytes.
            5 if len > 0 => {
                let i = rng.below(len);
                data[i] = [0x00, 0x01, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x1a][rng.below(8)];
            }
            // Insertion of random bytes.
            6 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let ins = rng.bytes(n);
                data.splice(i..i, ins);
            }
            // Duplicate a chunk (repeated fields, repeated labels).
            7 if len > 1 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                let chunk = data[a..b].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, chunk);
            }
            // Remove a chunk.
            _ if len > 1 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(32)).min(len);
                data.drain(a..b);
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// Targets.

struct Harness {
    pipeline: Pipeline,
}

impl Harness {
    fn new() -> Harness {
        let mut cfg = Config::parse(
            "packs:\n  builtin: {genai: true}\nmetadata_total_fix: true\nderived:\n  max_series: 20000\n  max_pending_samples: 20000\n",
            "fuzz.yaml",
        )
        .unwrap();
        cfg.derived.peaks = vec![promnorm::config::PeakConfig {
            matchers: Default::default(),
            gpu: Some("H100-SXM".into()),
            flops: None,
            bandwidth: None,
        }];
        Harness {
            pipeline: cfg.pipeline().expect("fuzz configuration"),
        }
    }
}

/// Per-thread reused state.
struct Worker<'a> {
    h: &'a Harness,
    ws: Box<promnorm::pipeline::Workspace>,
    decoded: DecodedRequest,
    drained: Vec<promnorm::derive::Emitted>,
    derived_out: Vec<u8>,
    derived_scratch: Vec<u8>,
    snappy_out: Vec<u8>,
    decoder: snap::raw::Decoder,
    v2: V2Encoder,
    v2_out: Vec<u8>,
}

/// Differential check of the decoder (its fast paths included) against prost: when both
/// accept an input, they read the same series, labels (sorted by name, as the view keeps
/// them), samples (by bits) and histograms.
fn agrees_with_prost(raw: &[u8], d: &DecodedRequest) {
    let Ok(oracle) = pb::WriteRequest::decode(raw) else {
        return;
    };
    assert_eq!(d.series.len(), oracle.timeseries.len(), "series count");
    for (s, ts) in d.series.iter().zip(&oracle.timeseries) {
        let ours: Vec<(&[u8], &[u8])> = d.labels[s.labels.usize()]
            .iter()
            .map(|l| (l.name.bytes(raw), l.value.bytes(raw)))
            .collect();
        let mut theirs: Vec<(&[u8], &[u8])> = ts
            .labels
            .iter()
            .map(|l| (l.name.as_bytes(), l.value.as_bytes()))
            .collect();
        theirs.sort();
        assert_eq!(ours, theirs, "labels");
        let ours: Vec<(u64, i64)> = d.samples[s.samples.usize()]
            .iter()
            .map(|x| (x.value_bits, x.timestamp))
            .collect();
        let theirs: Vec<(u64, i64)> = ts
            .samples
            .iter()
            .map(|x| (x.value.to_bits(), x.timestamp))
            .collect();
        assert_eq!(ours, theirs, "samples");
        assert_eq!(s.histograms.len(), ts.histograms.len(), "histograms");
        if s.canonical {
            // The bytes of a canonical series are forwarded as they are: sorted, no
            // empty value, as its labels say.
            assert!(
                ours_sorted_unique(d, s, raw),
                "canonical series out of order"
            );
        }
    }
}

fn ours_sorted_unique(
    d: &DecodedRequest,
    s: &promnorm::wire::decode::SeriesView,
    raw: &[u8],
) -> bool {
    // In wire order: a canonical series is never re-sorted, so its view is its bytes' order.
    let labels = &d.labels[s.labels.usize()];
    labels
        .windows(2)
        .all(|w| w[0].name.bytes(raw) < w[1].name.bytes(raw))
        && labels.iter().all(|l| !l.value.is_empty())
}

/// What one input exercised (for the summary).
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    decode_errors: AtomicU64,
    parse_errors: AtomicU64,
    /// Of `ok` and `decode_errors`: the 2.0 bodies.
    v2_ok: AtomicU64,
    v2_decode_errors: AtomicU64,
}

const TIGHT: DecodeLimits = DecodeLimits {
    max_series: 3,
    max_labels_per_series: 4,
    max_label_value_bytes: 16,
    max_expanded_bytes: 4096,
};

impl Worker<'_> {
    /// `v2_input`: the request came as 2.0, so samples and histograms may carry start
    /// timestamps (kept in the mapped body, removed from the compressed 1.0 output).
    fn check_output(&mut self, v2_input: bool) {
        let out = self.ws.mapped();
        let v1 = match pb::WriteRequest::decode(out) {
            Ok(v1) => v1,
            Err(e) => panic!("pipeline output is not a valid WriteRequest: {e}"),
        };
        // The same output as 2.0 (what a `protocol: v2` backend gets): the same series.
        if let Err(e) = self.v2.encode(out, None, &mut self.v2_out) {
            panic!("the 2.0 encoder refused the pipeline's output: {e}");
        }
        let v2 = match v2::Request::decode(self.v2_out.as_slice()) {
            Ok(v2) => v2,
            Err(e) => panic!("2.0 output is not a valid Request: {e}"),
        };
        assert_eq!(v2.timeseries.len(), v1.timeseries.len(), "2.0 series");
        let symbol = |r: &u32| v2.symbols.get(*r as usize).map(String::as_str);
        for (a, b) in v1.timeseries.iter().zip(&v2.timeseries) {
            let labels: Vec<_> = a
                .labels
                .iter()
                .flat_map(|l| [Some(l.name.as_str()), Some(l.value.as_str())])
                .collect();
            let refs: Vec<_> = b.labels_refs.iter().map(symbol).collect();
            assert_eq!(refs, labels, "2.0 labels");
            let a_samples = a.samples.iter().map(|s| (s.value.to_bits(), s.timestamp));
            let b_samples = b.samples.iter().map(|s| (s.value.to_bits(), s.timestamp));
            assert!(a_samples.eq(b_samples), "2.0 samples");
            // Field by field: 2.0 numbers a histogram like 1.0, plus `start_timestamp`
            // (17), which no 1.0 input has (an unknown 1.0 field 17 must not become one).
            assert_eq!(b.histograms.len(), a.histograms.len(), "2.0 histograms");
            for (ha, hb) in a.histograms.iter().zip(&b.histograms) {
                assert!(
                    v2_input || hb.start_timestamp == 0,
                    "2.0 histogram start timestamp"
                );
                let hb = pb::Histogram::decode(hb.encode_to_vec().as_slice())
                    .expect("a 2.0 histogram reads as 1.0");
                assert_eq!(hb.encode_to_vec(), ha.encode_to_vec(), "2.0 histogram");
            }
            assert!(
                v2_input || b.samples.iter().all(|s| s.start_timestamp == 0),
                "2.0 start timestamps"
            );
            assert_eq!(b.exemplars.len(), a.exemplars.len(), "2.0 exemplars");
        }
        let out = self.ws.mapped();
        let compressed = self.ws.compressed();
        let back = snap::raw::Decoder::new()
            .decompress_vec(compressed)
            .expect("compressed output decompresses");
        if v2_input {
            // The same request to 1.0 readers, without the start timestamps that 1.0
            // has no field for (as bytes they would stay, unknown, in histograms).
            let back_v1 = pb::WriteRequest::decode(back.as_slice())
                .expect("compressed output is a valid WriteRequest");
            assert_eq!(
                back_v1.encode_to_vec(),
                v1.encode_to_vec(),
                "compressed output differs from the encoded output"
            );
            assert!(
                !has_start_timestamp_fields(&back),
                "start timestamps in the 1.0 output"
            );
        } else {
            assert_eq!(
                &back, out,
                "compressed output differs from the encoded output"
            );
        }
        // NHCB unrolled for 1.0 backends: a valid request too.
        if let Some((classic, _)) = self.ws.route_input().classic
            && let Err(e) = pb::WriteRequest::decode(classic)
        {
            panic!("unrolled output is not a valid WriteRequest: {e}");
        }
    }

    /// (a) the decoder alone, default and tight limits; (b) the pipeline.
    fn protobuf(&mut self, raw: &[u8], rng: &mut Rng, t: &Tally) {
        for limits in [DecodeLimits::default(), TIGHT] {
            match self.decoded.decode(raw, limits) {
                Err(e) => assert!(!e.to_string().is_empty()),
                Ok(()) => agrees_with_prost(raw, &self.decoded),
            }
        }
        let compressed = snap::raw::Encoder::new().compress_vec(raw).unwrap();
        let r = self.h.pipeline.process(&mut self.ws, &compressed);
        match r {
            Ok(_) => {
                t.ok.fetch_add(1, Ordering::Relaxed);
                self.check_output(false);
                if rng.chance(8) {
                    self.derived();
                }
            }
            Err(e) => {
                t.decode_errors.fetch_add(1, Ordering::Relaxed);
                assert!(!e.to_string().is_empty());
            }
        }
    }

    /// A 2.0 body: (a) the 2.0 decoder alone, default and tight limits; (b) the
    /// pipeline, its output checked as for 1.0 input.
    fn protobuf_v2(&mut self, raw: &[u8], t: &Tally) {
        for limits in [DecodeLimits::default(), TIGHT] {
            if let Err(e) = self.decoded.decode_v2(raw, limits) {
                assert!(!e.to_string().is_empty());
            }
        }
        let compressed = snap::raw::Encoder::new().compress_vec(raw).unwrap();
        match self
            .h
            .pipeline
            .process_as(&mut self.ws, &compressed, InputProtocol::V2)
        {
            Ok(_) => {
                t.ok.fetch_add(1, Ordering::Relaxed);
                t.v2_ok.fetch_add(1, Ordering::Relaxed);
                self.check_output(true);
            }
            Err(e) => {
                t.decode_errors.fetch_add(1, Ordering::Relaxed);
                t.v2_decode_errors.fetch_add(1, Ordering::Relaxed);
                assert!(!e.to_string().is_empty());
            }
        }
    }

    fn derived(&mut self) {
        let Some(d) = self.h.pipeline.deriver() else {
            return;
        };
        self.drained.clear();
        d.drain(&mut self.drained);
        self.derived_out.clear();
        d.encode(
            &mut self.drained,
            &mut self.derived_out,
            &mut self.derived_scratch,
        );
        if let Err(e) = pb::WriteRequest::decode(self.derived_out.as_slice()) {
            panic!("derived output is not a valid WriteRequest: {e}");
        }
    }

    /// Snappy-level input: the decompressor, then the pipeline.
    fn compressed(&mut self, body: &[u8], t: &Tally) {
        let _ = snappy::decompress_into(&mut self.decoder, body, 1 << 20, &mut self.snappy_out);
        match self.h.pipeline.process(&mut self.ws, body) {
            Ok(_) => {
                t.ok.fetch_add(1, Ordering::Relaxed);
                self.check_output(false);
            }
            Err(e) => {
                t.decode_errors.fetch_add(1, Ordering::Relaxed);
                assert!(!e.to_string().is_empty());
            }
        }
    }

    /// (c) the exposition parser; what it accepts goes through the pipeline.
    fn exposition(&mut self, text: &str, rng: &mut Rng, t: &Tally) {
        match promnorm::exposition::parse(text) {
            Ok(scrape) => {
                let req = promnorm::normalize::scrape_to_request(&scrape, 1_700_000_000_000);
                let raw = req.encode_to_vec();
                self.protobuf(&raw, rng, t);
            }
            Err(e) => {
                t.parse_errors.fetch_add(1, Ordering::Relaxed);
                assert!(e.line >= 1 && !e.message.is_empty(), "{e}");
            }
        }
    }
}

/// Runs input `index` of `seed`; returns its size in bytes (for the memory bound).
fn run_one(w: &mut Worker, c: &Corpus, seed: u64, index: u64, t: &Tally) -> usize {
    let mut rng = Rng::new(seed, index);
    let other = &c.raw[rng.below(c.raw.len())];
    match index % 10 {
        // Structure-aware requests.
        0 => {
            let raw = generated(&mut rng, c);
            w.protobuf(&raw, &mut rng, t);
            raw.len()
        }
        // Structure-aware, with fields 1.0 does not define (2.0's among them).
        1 => {
            let raw = generated(&mut rng, c);
            let raw = unknown_fields_added(&mut rng, raw);
            w.protobuf(&raw, &mut rng, t);
            raw.len()
        }
        // Structure-aware, then mutated; or sent as 2.0, mutated one time in two.
        2 => {
            let req = generated_request(&mut rng, c);
            if rng.chance(2) {
                let mut raw = req.encode_to_vec();
                mutate(&mut rng, &mut raw, other);
                w.protobuf(&raw, &mut rng, t);
                return raw.len();
            }
            let mut raw = as_v2(&mut rng, &req).encode_to_vec();
            if rng.chance(2) {
                mutate(&mut rng, &mut raw, other);
            }
            w.protobuf_v2(&raw, t);
            raw.len()
        }
        // Mutated real payloads (the full fleet request once in a while).
        3..=6 => {
            let mut raw = if rng.chance(5000) {
                c.full.clone()
            } else {
                c.raw[rng.below(c.raw.len())].clone()
            };
            if rng.chance(8) {
                raw = unknown_fields_added(&mut rng, raw);
            }
            mutate(&mut rng, &mut raw, other);
            w.protobuf(&raw, &mut rng, t);
            raw.len()
        }
        // Mutated snappy bodies.
        7 | 8 => {
            let raw = &c.raw[rng.below(c.raw.len())];
            let mut body = snap::raw::Encoder::new().compress_vec(raw).unwrap();
            let other_body = snap::raw::Encoder::new().compress_vec(other).unwrap();
            mutate(&mut rng, &mut body, &other_body);
            w.compressed(&body, t);
            body.len()
        }
        // Mutated exposition text.
        _ => {
            let mut text = c.texts[rng.below(c.texts.len())].clone().into_bytes();
            let other_text = c.texts[rng.below(c.texts.len())].as_bytes();
            mutate(&mut rng, &mut text, other_text);
            let text = String::from_utf8_lossy(&text).into_owned();
            w.exposition(&text, &mut rng, t);
            text.len()
        }
    }
}

/// Heap one input may grow by at its peak: a multiple of its size (snappy bodies expand
/// up to 22x; the decoded index, output and derived state are proportional) plus slack
/// for first-use growth of pooled buffers and caches.
fn heap_bound(input_len: usize) -> i64 {
    (512 * input_len + (8 << 20)) as i64
}

struct Campaign {
    inputs: u64,
    elapsed: Duration,
    ok: u64,
    decode_errors: u64,
    parse_errors: u64,
    v2_ok: u64,
    v2_decode_errors: u64,
}

fn campaign(seed: u64, inputs: u64, threads: u64, only: Option<u64>) -> Campaign {
    let c = corpus();
    let h = Harness::new();
    let t = Tally::default();
    let done = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            let (c, h, t, done) = (&c, &h, &t, &done);
            s.spawn(move || {
                let mut w = Worker {
                    h,
                    ws: h.pipeline.take_workspace(),
                    decoded: DecodedRequest::default(),
                    drained: Vec::new(),
                    derived_out: Vec::new(),
                    derived_scratch: Vec::new(),
                    snappy_out: Vec::new(),
                    decoder: snap::raw::Decoder::new(),
                    v2: V2Encoder::new(),
                    v2_out: Vec::new(),
                };
                let indices: Box<dyn Iterator<Item = u64>> = match only {
                    Some(i) if th == 0 => Box::new(std::iter::once(i)),
                    Some(_) => Box::new(std::iter::empty()),
                    None => Box::new((th..inputs).step_by(threads as usize)),
                };
                for index in indices {
                    let base = mark();
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        run_one(&mut w, c, seed, index, t)
                    }));
                    match r {
                        Ok(len) => {
                            let grown = grown_since(base);
                            assert!(
                                grown <= heap_bound(len),
                                "input {index} of seed {seed} ({len} bytes) grew the heap by {grown} bytes (replay: PROMNORM_FUZZ_SEED={seed} PROMNORM_FUZZ_ONLY={index})"
                            );
                        }
                        Err(p) => {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            panic!(
                                "input {index} of seed {seed} panicked: {msg} (replay: PROMNORM_FUZZ_SEED={seed} PROMNORM_FUZZ_ONLY={index})"
                            );
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    Campaign {
        inputs: done.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        ok: t.ok.load(Ordering::Relaxed),
        decode_errors: t.decode_errors.load(Ordering::Relaxed),
        parse_errors: t.parse_errors.load(Ordering::Relaxed),
        v2_ok: t.v2_ok.load(Ordering::Relaxed),
        v2_decode_errors: t.v2_decode_errors.load(Ordering::Relaxed),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn run_campaign(default_inputs: u64) {
    let seed = env_u64("PROMNORM_FUZZ_SEED").unwrap_or(0x5eed_2026);
    let only = env_u64("PROMNORM_FUZZ_ONLY");
    let inputs = env_u64("PROMNORM_FUZZ_INPUTS").unwrap_or(default_inputs);
    let r = campaign(seed, inputs, 2, only);
    println!(
        "fuzz: seed {seed:#x}: {} inputs in {:.1?} ({:.0}/s, 2 threads; {} build): {} pipeline runs ok ({} of 2.0 bodies), {} typed decode errors ({} of 2.0 bodies), {} typed parse errors",
        r.inputs,
        r.elapsed,
        r.inputs as f64 / r.elapsed.as_secs_f64(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        r.ok,
        r.v2_ok,
        r.decode_errors,
        r.v2_decode_errors,
        r.parse_errors
    );
    if only.is_none() {
        assert_eq!(r.inputs, inputs, "every input ran");
        assert!(r.ok > 0 && r.decode_errors > 0 && r.parse_errors > 0);
        assert!(
            r.v2_ok > 0 && r.v2_decode_errors > 0,
            "2.0 bodies both pass and fail"
        );
    }
}

/// The CI campaign: 10^6 inputs in release builds (the count is asserted there), 10^5
/// in debug builds.
#[test]
fn fuzz_campaign() {
    let inputs = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    run_campaign(inputs);
    if !cfg!(debug_assertions) && std::env::var_os("PROMNORM_FUZZ_INPUTS").is_none() {
        // Counted in run_campaign; restated so the contract is visible here.
        assert!(inputs >= 1_000_000);
    }
}

/// 10^7 inputs: `cargo test --release --test fuzz -- --ignored --nocapture`.
#[test]
#[ignore]
fn fuzz_campaign_long() {
    run_campaign(10_000_000);
}

// ---------------------------------------------------------------------------------------
// Regressions: each bug the campaign found, as the smallest input that showed it.

/// A `WriteRequest` of one series `{__name__="x"}` holding one histogram of raw bytes.
fn with_histogram(histogram: &[u8]) -> Vec<u8> {
    let mut label = vec![0x0a, 8];
    label.extend_from_slice(b"__name__");
    label.extend_from_slice(&[0x12, 1, b'x']);
    let mut ts = vec![0x0a, label.len() as u8];
    ts.extend_from_slice(&label);
    ts.push(0x22);
    put_varint(histogram.len() as u64, &mut ts);
    ts.extend_from_slice(histogram);
    let mut req = vec![0x0a];
    put_varint(ts.len() as u64, &mut req);
    req.extend_from_slice(&ts);
    req
}

/// Found by `fuzz_campaign` (seed 0x5eed2026, input 30382): a native histogram whose
/// packed `positive_deltas` ended in an unterminated varint was forwarded as its original
/// bytes, and the backend refused the whole request. Malformed histogram fields (packed
/// varints, packed doubles not a multiple of 8 bytes, wrong wire types, bucket spans)
/// are now a `DecodeError`: the sender gets `400` before anything is forwarded.
#[test]
fn regression_malformed_native_histogram_fields_are_decode_errors() {
    let h = Harness::new();
    let mut ws = h.pipeline.take_workspace();
    // Valid: positive_deltas [1, -1] packed, sum 1.0, a span {offset 0, length 2}.
    let mut valid = vec![0x62, 2, 0x02, 0x01, 0x19];
    valid.extend_from_slice(&1f64.to_le_bytes());
    valid.extend_from_slice(&[0x5a, 4, 0x08, 0x00, 0x10, 0x02]);
    let raw = with_histogram(&valid);
    pb::WriteRequest::decode(raw.as_slice()).expect("prost accepts the valid one");
    h.pipeline
        .process_raw(&mut ws, &raw)
        .expect("valid histogram");
    for (what, bad) in [
        ("unterminated packed varint", vec![0x62, 1, 0x80]),
        ("packed doubles not a multiple of 8", vec![0x6a, 3, 1, 2, 3]),
        ("sum with a varint wire type", vec![0x18, 0x01]),
        (
            "count_int with a fixed64 wire type",
            vec![0x09, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            "bucket span with a bad inner varint",
            vec![0x5a, 2, 0x08, 0x80],
        ),
        ("bucket span offset as bytes", vec![0x5a, 3, 0x0a, 1, 0]),
    ] {
        let raw = with_histogram(&bad);
        assert!(
            pb::WriteRequest::decode(raw.as_slice()).is_err(),
            "{what}: prost accepts it, so promnorm must too"
        );
        let err = h
            .pipeline
            .process_raw(&mut ws, &raw)
            .expect_err(what)
            .to_string();
        assert!(err.starts_with("protobuf:"), "{what}: {err}");
    }
}
