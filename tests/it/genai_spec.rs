//! The `genai` pack against the OpenTelemetry GenAI conventions' own tables, transcribed
//! into `tests/golden/genai/spec.yaml`: names as Prometheus translates them, instrument
//! types, units, descriptions as HELP, and the required attributes set on every series.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use promnorm::app::Assemble;
use promnorm::config::{Config, yaml};
use promnorm::pipeline::{Pipeline, PipelineLimits};
use promnorm::wire::proto::prometheus as pb;
use serde_json::Value;

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// One metric of the conventions, with its Prometheus family name.
struct SpecMetric {
    prom_name: String,
    instrument: String,
    unit: String,
    description: String,
    required: Vec<String>,
}

struct Spec {
    metrics: Vec<SpecMetric>,
    extensions: Vec<String>,
}

/// Prometheus' escaping of an OpenTelemetry name or attribute key.
fn escape(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn spec() -> Spec {
    let text = std::fs::read_to_string(golden().join("genai/spec.yaml")).unwrap();
    let v: Value = yaml::from_str(&text).unwrap();
    let s = |v: &Value| v.as_str().expect("a string").to_string();
    let list = |v: &Value| -> Vec<String> { v.as_array().expect("a list").iter().map(s).collect() };
    for key in ["repo", "path", "commit", "semconv_version", "status"] {
        assert!(v["source"][key].is_string(), "spec.yaml names its {key}");
    }
    let units = &v["prometheus_units"];
    let metrics = v["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .map(|m| {
            let unit = s(&m["unit"]);
            let word = units[&unit]
                .as_str()
                .expect("a Prometheus word for the unit");
            let instrument = s(&m["instrument"]);
            let mut prom_name = format!("{}_{word}", escape(&s(&m["name"])));
            if instrument == "Counter" {
                prom_name += "_total";
            }
            SpecMetric {
                prom_name,
                instrument,
                unit: word.to_string(),
                description: s(&m["description"]),
                required: list(&m["required"]).iter().map(|a| escape(a)).collect(),
            }
        })
        .collect();
    Spec {
        metrics,
        extensions: list(&v["promnorm_extensions"]),
    }
}

fn pipeline(extra: &str) -> Pipeline {
    let cfg = Config::parse(&format!("listen: 127.0.0.1:0\n{extra}"), "t.yaml").unwrap();
    Pipeline::new(
        Arc::new(cfg.compile_rules().unwrap_or_else(|e| panic!("{e}"))),
        PipelineLimits::default(),
    )
}

/// Every engine dump of the genai golden case, each one scrape with its metadata,
/// through `p`.
fn outputs(p: &Pipeline) -> Vec<(String, pb::WriteRequest)> {
    let list = std::fs::read_to_string(golden().join("genai/dumps")).unwrap();
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .chain(ENGINE_SCRAPES.iter().copied())
        .map(|f| {
            let text = std::fs::read_to_string(golden().join(f)).unwrap();
            let parsed = promnorm::exposition::parse(&text).unwrap_or_else(|e| panic!("{e}"));
            let req = promnorm::normalize::scrape_to_request(&parsed, 1_700_000_000_000);
            let mut ws = p.take_workspace();
            p.process(&mut ws, &encode(&req)).unwrap();
            (f.to_string(), decode(ws.compressed()))
        })
        .collect()
}

/// The newer engines' golden scrapes (their packs' cases), each with genai copies.
const ENGINE_SCRAPES: [&str; 4] = [
    "trtllm/1.prom",
    "lmdeploy/1.prom",
    "triton/1.prom",
    "tgi/1.prom",
];

fn labels(ts: &pb::TimeSeries) -> BTreeMap<&str, &str> {
    ts.labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect()
}

/// The family a series belongs to (histogram members to their family).
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

#[test]
fn genai_series_are_the_conventions_names_with_their_required_attributes() {
    let spec = spec();
    assert_eq!(spec.metrics.len(), 3, "the three model-server histograms");
    let p = pipeline("packs:\n  builtin: {genai: true}\n");
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, out) in outputs(&p) {
        for ts in &out.timeseries {
            let l = labels(ts);
            let name = l["__name__"];
            if !name.starts_with("gen_ai_") {
                continue;
            }
            let fam = family(name);
            if spec.extensions.iter().any(|e| e == name) {
                seen.entry(name.into()).or_default().insert(file.clone());
                for a in ["gen_ai_operation_name", "gen_ai_provider_name"] {
                    assert!(l.get(a).is_some_and(|v| !v.is_empty()), "{file}: {l:?}");
                }
                continue;
            }
            let m = spec
                .metrics
                .iter()
                .find(|m| m.prom_name == fam)
                .unwrap_or_else(|| {
                    panic!("{file}: {name} is neither a spec name nor an extension")
                });
            if m.instrument == "Histogram" {
                assert_ne!(
                    fam, name,
                    "{file}: {name}: a histogram's series are its members"
                );
            }
            for a in &m.required {
                assert!(
                    l.get(a.as_str()).is_some_and(|v| !v.is_empty()),
                    "{file}: {name} lacks the required {a}: {l:?}"
                );
            }
            // Conditionally required "if available": every engine here but TGI labels
            // its model.
            assert_eq!(
                l.contains_key("gen_ai_request_model"),
                l["inference_engine"] != "tgi",
                "{file}: {l:?}"
            );
            assert_eq!(l["gen_ai_operation_name"], "chat", "the default");
            assert_eq!(l["gen_ai_provider_name"], l["inference_engine"]);
            seen.entry(m.prom_name.clone())
                .or_default()
                .insert(file.clone());
        }
    }
    for m in &spec.metrics {
        let files = seen.get(&m.prom_name).map_or(0, BTreeSet::len);
        assert!(files >= 3, "{}: from {files} engine dumps", m.prom_name);
    }
    // Native TensorRT-LLM writes all three histograms (tensorrt_llm/metrics/collector.py):
    // each gets its copy, time per output token included.
    for m in &spec.metrics {
        assert!(
            seen.get(&m.prom_name)
                .is_some_and(|files| files.contains("trtllm/1.prom")),
            "trtllm/1.prom: no {}",
            m.prom_name
        );
    }
    // Every engine scrape gives at least one spec family.
    for f in ENGINE_SCRAPES {
        assert!(
            seen.values().any(|files| files.contains(f)),
            "{f}: no gen_ai_* series"
        );
    }
}

#[test]
fn genai_metadata_is_the_conventions_type_unit_and_description() {
    let spec = spec();
    let p = pipeline("packs:\n  builtin: {genai: true}\n");
    let mut checked = BTreeSet::new();
    for (file, out) in outputs(&p) {
        for md in out
            .metadata
            .iter()
            .filter(|m| m.metric_family_name.starts_with("gen_ai_"))
        {
            let name = md.metric_family_name.as_str();
            if let Some(m) = spec.metrics.iter().find(|m| m.prom_name == name) {
                assert_eq!(m.instrument, "Histogram");
                assert_eq!(md.r#type, pb::metric_metadata::MetricType::Histogram as i32);
                assert_eq!(md.unit, m.unit, "{file}: {name}");
                assert_eq!(md.help, m.description, "{file}: {name}");
            } else {
                let base = format!("{name}_total");
                assert!(
                    spec.extensions.iter().any(|e| *e == base || e == name),
                    "{file}: metadata of {name}, not a spec name"
                );
                assert!(
                    md.help
                        .starts_with("promnorm extension, not an OpenTelemetry GenAI"),
                    "{file}: {name}: {:?}",
                    md.help
                );
            }
            checked.insert(name.to_string());
        }
    }
    for m in &spec.metrics {
        assert!(
            checked.contains(&m.prom_name),
            "no metadata for {}",
            m.prom_name
        );
    }
}

/// `packs.genai` sets the required attributes' values: the operation for every copy, the
/// provider per engine (unlisted engines keep their own name).
#[test]
fn genai_operation_and_provider_names_are_configurable() {
    let p = pipeline(
        "packs:\n  builtin: {genai: true}\n  genai:\n    operation_name: text_completion\n    provider_names: {vllm: my-vllm}\n",
    );
    let mut providers = BTreeSet::new();
    for (file, out) in outputs(&p) {
        for ts in &out.timeseries {
            let l = labels(ts);
            if !l["__name__"].starts_with("gen_ai_") {
                continue;
            }
            assert_eq!(l["gen_ai_operation_name"], "text_completion", "{file}");
            let want = match l["inference_engine"] {
                "vllm" => "my-vllm",
                e => e,
            };
            assert_eq!(l["gen_ai_provider_name"], want, "{file}");
            providers.insert(l["gen_ai_provider_name"].to_string());
        }
    }
    assert_eq!(
        providers.into_iter().collect::<Vec<_>>(),
        [
            "dynamo", "lmdeploy", "my-vllm", "sglang", "tgi", "triton", "trtllm"
        ]
    );
}

/// A misspelt engine, or an empty value (no label: the attribute is required), is refused.
#[test]
fn genai_options_refuse_unknown_engines_and_empty_values() {
    for (extra, why) in [
        ("provider_names: {vlm: x}", "unknown engine \"vlm\""),
        ("provider_names: {vllm: \"\"}", "provider_names.vllm: empty"),
        ("operation_name: \"\"", "operation_name: empty"),
    ] {
        let text = format!(
            "listen: 127.0.0.1:0\npacks:\n  builtin: {{genai: true}}\n  genai:\n    {extra}\n"
        );
        let cfg = Config::parse(&text, "t.yaml").unwrap();
        let err = cfg.compile_rules().err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains(why)),
            "{extra}: {err:?}"
        );
    }
}
