//! Remote-write 2.0 test helpers: the upstream proto's prost types as the oracle.
//! Converts 1.0 requests to 2.0 (symbols table, per-series metadata), and both versions
//! to one canonical, comparable form.
#![allow(dead_code)]

use std::collections::HashMap;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use promnorm::wire::proto::prometheus as pb;
use promnorm::wire::proto::write_v2 as v2;
use prost::Message;

pub const RW2_HEADERS: &[(&str, &str)] = &[
    ("Content-Encoding", "snappy"),
    (
        "Content-Type",
        "application/x-protobuf;proto=io.prometheus.write.v2.Request",
    ),
    ("X-Prometheus-Remote-Write-Version", "2.0.0"),
];

/// A symbols table under construction: `symbols[0]` is "".
pub struct Symbols {
    pub list: Vec<String>,
    index: HashMap<String, u32>,
}

impl Default for Symbols {
    fn default() -> Self {
        let mut s = Symbols {
            list: Vec::new(),
            index: HashMap::new(),
        };
        s.r("");
        s
    }
}

impl Symbols {
    pub fn r(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }

    pub fn refs(&mut self, labels: &[(&str, &str)]) -> Vec<u32> {
        labels
            .iter()
            .flat_map(|(n, v)| [self.r(n), self.r(v)])
            .collect()
    }
}

/// The family of a series name for a metadata type (what a 2.0 sender attaches).
fn family_candidates(name: &str) -> Vec<(&str, &'static [i32])> {
    let mut out = vec![(name, &[][..])];
    for (suffix, types) in [
        ("_total", &[1][..]),
        ("_bucket", &[3, 4][..]),
        ("_count", &[3, 4, 5][..]),
        ("_sum", &[3, 4, 5][..]),
    ] {
        if let Some(f) = name.strip_suffix(suffix) {
            out.push((f, types));
        }
    }
    out
}

/// The 2.0 request a 2.0 sender would send for `req`: series metadata from the request's
/// `MetricMetadata` of the series' family.
pub fn v1_to_v2(req: &pb::WriteRequest) -> v2::Request {
    let mut sym = Symbols::default();
    let md: HashMap<&str, &pb::MetricMetadata> = req
        .metadata
        .iter()
        .map(|m| (m.metric_family_name.as_str(), m))
        .collect();
    let mut out = v2::Request::default();
    for ts in &req.timeseries {
        let labels: Vec<(&str, &str)> = ts
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        let name = labels
            .iter()
            .find(|(n, _)| *n == "__name__")
            .map(|(_, v)| *v)
            .unwrap_or("");
        let metadata = family_candidates(name).into_iter().find_map(|(f, types)| {
            md.get(f)
                .filter(|m| types.is_empty() || types.contains(&m.r#type))
                .map(|m| v2::Metadata {
                    r#type: m.r#type,
                    help_ref: if m.help.is_empty() { 0 } else { sym.r(&m.help) },
                    unit_ref: if m.unit.is_empty() { 0 } else { sym.r(&m.unit) },
                })
        });
        out.timeseries.push(v2::TimeSeries {
            labels_refs: sym.refs(&labels),
            samples: ts
                .samples
                .iter()
                .map(|s| v2::Sample {
                    value: s.value,
                    timestamp: s.timestamp,
                    start_timestamp: 0,
                })
                .collect(),
            histograms: ts
                .histograms
                .iter()
                .map(|h| v2::Histogram::decode(h.encode_to_vec().as_slice()).unwrap())
                .collect(),
            exemplars: ts
                .exemplars
                .iter()
                .map(|e| {
                    let l: Vec<(&str, &str)> = e
                        .labels
                        .iter()
                        .map(|l| (l.name.as_str(), l.value.as_str()))
                        .collect();
                    v2::Exemplar {
                        labels_refs: sym.refs(&l),
                        value: e.value,
                        timestamp: e.timestamp,
                    }
                })
                .collect(),
            metadata,
            created_timestamp: 0,
        });
    }
    out.symbols = sym.list;
    out
}

pub fn compress(raw: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(raw).unwrap()
}

pub fn encode_v2(req: &v2::Request) -> Vec<u8> {
    compress(&req.encode_to_vec())
}

pub fn decode_v2(body: &[u8]) -> v2::Request {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .expect("snappy");
    v2::Request::decode(raw.as_slice()).expect("2.0 protobuf")
}

pub type Labels = Vec<(String, String)>;

/// One series in a form both versions share: labels sorted, samples as (bits, ts, start),
/// histograms as their 1.0 bytes (start timestamp separate), exemplars with labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Canon {
    pub labels: Vec<(String, String)>,
    pub samples: Vec<(u64, i64, i64)>,
    pub histograms: Vec<(Vec<u8>, i64)>,
    pub exemplars: Vec<(Labels, u64, i64)>,
}

impl Canon {
    /// Without 2.0-only data (start timestamps), as a 1.0 receiver sees it.
    pub fn without_start(mut self) -> Canon {
        for s in &mut self.samples {
            s.2 = 0;
        }
        for h in &mut self.histograms {
            h.1 = 0;
        }
        self
    }
}

fn sorted(mut l: Vec<(String, String)>) -> Vec<(String, String)> {
    l.sort();
    l
}

pub fn canon_v1(req: &pb::WriteRequest) -> Vec<Canon> {
    let mut out: Vec<Canon> = req
        .timeseries
        .iter()
        .map(|ts| Canon {
            labels: sorted(
                ts.labels
                    .iter()
                    .map(|l| (l.name.clone(), l.value.clone()))
                    .collect(),
            ),
            samples: ts
                .samples
                .iter()
                .map(|s| (s.value.to_bits(), s.timestamp, 0))
                .collect(),
            histograms: ts
                .histograms
                .iter()
                .map(|h| (h.encode_to_vec(), 0))
                .collect(),
            exemplars: ts
                .exemplars
                .iter()
                .map(|e| {
                    (
                        sorted(
                            e.labels
                                .iter()
                                .map(|l| (l.name.clone(), l.value.clone()))
                                .collect(),
                        ),
                        e.value.to_bits(),
                        e.timestamp,
                    )
                })
                .collect(),
        })
        .collect();
    out.sort();
    out
}

fn resolve(symbols: &[String], refs: &[u32]) -> Vec<(String, String)> {
    sorted(
        refs.chunks(2)
            .map(|p| {
                (
                    symbols[p[0] as usize].clone(),
                    symbols[p[1] as usize].clone(),
                )
            })
            .collect(),
    )
}

pub fn canon_v2(req: &v2::Request) -> Vec<Canon> {
    let mut out: Vec<Canon> = req
        .timeseries
        .iter()
        .map(|ts| Canon {
            labels: resolve(&req.symbols, &ts.labels_refs),
            samples: ts
                .samples
                .iter()
                .map(|s| {
                    let st = if s.start_timestamp != 0 {
                        s.start_timestamp
                    } else {
                        ts.created_timestamp
                    };
                    (s.value.to_bits(), s.timestamp, st)
                })
                .collect(),
            histograms: ts
                .histograms
                .iter()
                .map(|h| {
                    let mut plain = h.clone();
                    plain.start_timestamp = 0;
                    let bytes = plain.encode_to_vec();
                    // The same bytes as a 1.0 histogram (field numbers are shared).
                    let v1 = pb::Histogram::decode(bytes.as_slice()).unwrap();
                    (v1.encode_to_vec(), h.start_timestamp)
                })
                .collect(),
            exemplars: ts
                .exemplars
                .iter()
                .map(|e| {
                    (
                        resolve(&req.symbols, &e.labels_refs),
                        e.value.to_bits(),
                        e.timestamp,
                    )
                })
                .collect(),
        })
        .collect();
    out.sort();
    out
}

/// Metadata of a 2.0 request by series name: (type, help, unit).
pub fn v2_metadata(req: &v2::Request) -> Vec<(String, i32, String, String)> {
    let mut out: Vec<_> = req
        .timeseries
        .iter()
        .filter_map(|ts| {
            let m = ts.metadata.as_ref()?;
            let name = resolve(&req.symbols, &ts.labels_refs)
                .into_iter()
                .find(|(n, _)| n == "__name__")?
                .1;
            Some((
                name,
                m.r#type,
                req.symbols[m.help_ref as usize].clone(),
                req.symbols[m.unit_ref as usize].clone(),
            ))
        })
        .collect();
    out.sort();
    out
}

/// A small deterministic generator (xorshift), for property-style tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A native histogram with integer counts.
pub fn native_histogram(ts: i64, start: i64, count: u64) -> v2::Histogram {
    v2::Histogram {
        count: Some(v2::histogram::Count::CountInt(count)),
        sum: count as f64 * 1.5,
        schema: 3,
        zero_threshold: 1e-128,
        zero_count: Some(v2::histogram::ZeroCount::ZeroCountInt(1)),
        positive_spans: vec![v2::BucketSpan {
            offset: 0,
            length: 2,
        }],
        positive_deltas: vec![count as i64 / 2, 0],
        timestamp: ts,
        start_timestamp: start,
        ..Default::default()
    }
}

/// A native histogram with float counts.
pub fn float_histogram(ts: i64) -> v2::Histogram {
    v2::Histogram {
        count: Some(v2::histogram::Count::CountFloat(7.5)),
        sum: 12.25,
        schema: 1,
        zero_count: Some(v2::histogram::ZeroCount::ZeroCountFloat(0.5)),
        positive_spans: vec![v2::BucketSpan {
            offset: -1,
            length: 1,
        }],
        positive_counts: vec![7.0],
        reset_hint: 3,
        timestamp: ts,
        ..Default::default()
    }
}

/// What a test backend received: each request's headers and body.
pub type V2Recorded = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// A backend answering 2.0 requests with `v2_status` (and the written headers when
/// `confirm`), 1.0 requests with 204.
pub async fn versioned_backend(v2_status: StatusCode, confirm: bool) -> (String, V2Recorded) {
    let rec: V2Recorded = Arc::default();
    let rec2 = rec.clone();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let rec = rec2.clone();
            async move {
                let is_v2 = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("io.prometheus.write.v2.Request"));
                rec.lock().unwrap().push((headers, body.to_vec()));
                let mut resp = axum::response::Response::new(axum::body::Body::empty());
                if is_v2 {
                    *resp.status_mut() = v2_status;
                    if confirm {
                        let req = decode_v2(&body);
                        let n: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
                        let h = resp.headers_mut();
                        h.insert(
                            "x-prometheus-remote-write-samples-written",
                            n.to_string().parse().unwrap(),
                        );
                        h.insert("x-prometheus-remote-write-histograms-written", 0.into());
                        h.insert("x-prometheus-remote-write-exemplars-written", 0.into());
                    }
                } else {
                    *resp.status_mut() = StatusCode::NO_CONTENT;
                }
                resp
            }
        }),
    );
    let addr = super::serve(app).await;
    (format!("http://{addr}/api/v1/write"), rec)
}
