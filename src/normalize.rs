//! `promnorm normalize`: runs the proxy's pipeline on text-exposition files (docs/rules.md).

use std::fmt::Write as _;

use prost::Message;

use crate::exposition::{self, Scrape};
use crate::mapping::number::{FloatStyle, write_float};
use crate::pipeline::{InputProtocol, Pipeline, Workspace};
use crate::wire::encode_v2::V2Encoder;
use crate::wire::proto::prometheus as pb;
use crate::wire::proto::write_v2;

pub const BASE_TIMESTAMP_MS: i64 = 1_700_000_000_000;

#[derive(Debug, thiserror::Error)]
pub enum NormalizeError {
    #[error("{file}: {source}")]
    Parse {
        file: String,
        #[source]
        source: exposition::ParseError,
    },
    #[error("{file}: {message}")]
    Pipeline { file: String, message: String },
}

fn metric_type(t: &str) -> i32 {
    use pb::metric_metadata::MetricType as T;
    (match t {
        "counter" => T::Counter,
        "gauge" => T::Gauge,
        "histogram" => T::Histogram,
        "gaugehistogram" => T::Gaugehistogram,
        "summary" => T::Summary,
        "info" => T::Info,
        "stateset" => T::Stateset,
        _ => T::Unknown,
    }) as i32
}

/// Builds the `WriteRequest` a Prometheus server would send for one scrape.
pub fn scrape_to_request(scrape: &Scrape, default_ts: i64) -> pb::WriteRequest {
    let mut req = pb::WriteRequest::default();
    for s in &scrape.samples {
        let mut labels: Vec<pb::Label> = Vec::with_capacity(s.labels.len() + 1);
        labels.push(pb::Label {
            name: "__name__".into(),
            value: s.name.clone(),
        });
        for (n, v) in &s.labels {
            labels.push(pb::Label {
                name: n.clone(),
                value: v.clone(),
            });
        }
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        req.timeseries.push(pb::TimeSeries {
            labels,
            samples: vec![pb::Sample {
                value: s.value,
                timestamp: s.timestamp_ms.unwrap_or(default_ts),
            }],
            ..Default::default()
        });
    }
    for m in &scrape.metadata {
        req.metadata.push(pb::MetricMetadata {
            r#type: metric_type(&m.metric_type),
            metric_family_name: m.family.clone(),
            help: m.help.clone(),
            unit: String::new(),
        });
    }
    req
}

/// One output sample line's sort key and text.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Line {
    name: String,
    labels: Vec<(String, String)>,
    timestamp: i64,
    text: String,
}

fn escape(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Formats every float sample of an encoded `WriteRequest` as output lines.
fn collect_lines(encoded: &[u8], lines: &mut Vec<Line>) -> Result<(), String> {
    let req = pb::WriteRequest::decode(encoded).map_err(|e| format!("re-decoding output: {e}"))?;
    for ts in req.timeseries {
        let mut name = String::new();
        let mut labels = Vec::new();
        for l in ts.labels {
            if l.name == "__name__" {
                name = l.value;
            } else {
                labels.push((l.name, l.value));
            }
        }
        labels.sort();
        for s in &ts.samples {
            let mut text = String::new();
            text.push_str(&name);
            if !labels.is_empty() {
                text.push('{');
                for (i, (n, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        text.push(',');
                    }
                    let _ = write!(text, "{n}=\"");
                    escape(v, &mut text);
                    text.push('"');
                }
                text.push('}');
            }
            text.push(' ');
            let mut num = Vec::new();
            write_float(&mut num, s.value, FloatStyle::Go);
            text.push_str(&String::from_utf8_lossy(&num));
            let _ = write!(text, " {}", s.timestamp);
            lines.push(Line {
                name: name.clone(),
                labels: labels.clone(),
                timestamp: s.timestamp,
                text,
            });
        }
    }
    Ok(())
}

/// Formats every float sample of an encoded 2.0 `Request` as output lines, as
/// [`collect_lines`] does for 1.0 (start timestamps are not shown).
fn collect_lines_v2(encoded: &[u8], lines: &mut Vec<Line>) -> Result<(), String> {
    let req =
        write_v2::Request::decode(encoded).map_err(|e| format!("re-decoding 2.0 output: {e}"))?;
    let sym = |r: u32| -> Result<String, String> {
        req.symbols
            .get(r as usize)
            .cloned()
            .ok_or_else(|| format!("2.0 output: symbol {r} out of range"))
    };
    // Through the 1.0 formatter: one code path for the text.
    let mut v1 = pb::WriteRequest::default();
    for ts in &req.timeseries {
        let mut labels = Vec::new();
        for pair in ts.labels_refs.chunks(2) {
            let [n, v] = pair else {
                return Err("2.0 output: odd label references".into());
            };
            labels.push(pb::Label {
                name: sym(*n)?,
                value: sym(*v)?,
            });
        }
        v1.timeseries.push(pb::TimeSeries {
            labels,
            samples: ts
                .samples
                .iter()
                .map(|s| pb::Sample {
                    value: s.value,
                    timestamp: s.timestamp,
                })
                .collect(),
            ..Default::default()
        });
    }
    collect_lines(&v1.encode_to_vec(), lines)
}

/// The remote-write versions `normalize` runs through: the input a sender sends and the
/// output a backend gets (`promnorm normalize` itself uses 1.0 for both; the tests run
/// every golden case through 2.0 too).
#[derive(Clone, Copy, Debug, Default)]
pub struct Protocols {
    pub input_v2: bool,
    pub output_v2: bool,
}

/// Normalises scrapes (name, text) taken `interval_ms` apart; returns the output lines.
pub fn normalize(
    pipeline: &Pipeline,
    inputs: &[(String, String)],
    interval_ms: i64,
) -> Result<String, NormalizeError> {
    normalize_with(pipeline, inputs, interval_ms, Protocols::default())
}

/// [`normalize`] through the given remote-write versions. A scrape becomes the 1.0
/// request Prometheus would send, or the 2.0 request (metadata attached to each series of
/// its family) a 2.0 sender would send; output lines are read from the 1.0 or 2.0 body a
/// backend of that version would get, derived series included.
pub fn normalize_with(
    pipeline: &Pipeline,
    inputs: &[(String, String)],
    interval_ms: i64,
    protocols: Protocols,
) -> Result<String, NormalizeError> {
    let mut ws: Box<Workspace> = pipeline.take_workspace();
    let mut lines = Vec::new();
    let (mut derived, mut encoded, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    let mut v2 = V2Encoder::new();
    let mut v2_body = Vec::new();
    for (i, (file, text)) in inputs.iter().enumerate() {
        let scrape = exposition::parse(text).map_err(|source| NormalizeError::Parse {
            file: file.clone(),
            source,
        })?;
        let ts = BASE_TIMESTAMP_MS + i as i64 * interval_ms;
        let err = |message: String| NormalizeError::Pipeline {
            file: file.clone(),
            message,
        };
        let raw = scrape_to_request(&scrape, ts).encode_to_vec();
        let input = if protocols.input_v2 {
            v2.encode(&raw, None, &mut v2_body)
                .map_err(|e| err(e.to_string()))?;
            InputProtocol::V2
        } else {
            v2_body.clear();
            v2_body.extend_from_slice(&raw);
            InputProtocol::V1
        };
        pipeline
            .process_raw_as(&mut ws, &v2_body, input)
            .map_err(|e| err(e.to_string()))?;
        if protocols.output_v2 {
            pipeline
                .encode_v2(&mut ws)
                .map_err(|e| err(e.to_string()))?;
            collect_lines_v2(ws.encoded_v2(), &mut lines).map_err(err)?;
        } else {
            let v1 = snap::raw::Decoder::new()
                .decompress_vec(ws.compressed())
                .map_err(|e| err(e.to_string()))?;
            collect_lines(&v1, &mut lines).map_err(err)?;
        }
        if let Some(d) = pipeline.deriver() {
            derived.clear();
            d.drain(&mut derived);
            encoded.clear();
            d.encode(&mut derived, &mut encoded, &mut scratch);
            if protocols.output_v2 {
                v2.encode(&encoded, None, &mut v2_body)
                    .map_err(|e| err(e.to_string()))?;
                collect_lines_v2(&v2_body, &mut lines).map_err(err)?;
            } else {
                collect_lines(&encoded, &mut lines).map_err(err)?;
            }
        }
    }
    lines.sort();
    let mut out = String::new();
    for l in lines {
        out.push_str(&l.text);
        out.push('\n');
    }
    Ok(out)
}
