//! `promnorm normalize`: runs the proxy's pipeline on text-exposition files (docs/rules.md).

use std::fmt::Write as _;

use prost::Message;

use crate::exposition::{self, Scrape};
use crate::mapping::number::{FloatStyle, write_float};
use crate::pipeline::{Pipeline, Workspace};
use crate::wire::proto::prometheus as pb;

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

/// Normalises scrapes (name, text) taken `interval_ms` apart; returns the output lines.
pub fn normalize(
    pipeline: &Pipeline,
    inputs: &[(String, String)],
    interval_ms: i64,
) -> Result<String, NormalizeError> {
    let mut ws: Box<Workspace> = pipeline.take_workspace();
    let mut lines = Vec::new();
    let (mut derived, mut encoded, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (file, text)) in inputs.iter().enumerate() {
        let scrape = exposition::parse(text).map_err(|source| NormalizeError::Parse {
            file: file.clone(),
            source,
        })?;
        let ts = BASE_TIMESTAMP_MS + i as i64 * interval_ms;
        let raw = scrape_to_request(&scrape, ts).encode_to_vec();
        pipeline
            .process_raw(&mut ws, &raw)
            .map_err(|e| NormalizeError::Pipeline {
                file: file.clone(),
                message: e.to_string(),
            })?;
        collect_lines(&ws.encoded, &mut lines).map_err(|message| NormalizeError::Pipeline {
            file: file.clone(),
            message,
        })?;
        if let Some(d) = pipeline.deriver() {
            derived.clear();
            d.drain(&mut derived);
            encoded.clear();
            d.encode(&mut derived, &mut encoded, &mut scratch);
            collect_lines(&encoded, &mut lines).map_err(|message| NormalizeError::Pipeline {
                file: file.clone(),
                message,
            })?;
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
