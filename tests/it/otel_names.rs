//! `otel_names.strategy` (issue 22): an OpenTelemetry instrument arriving under any of
//! the four spellings Prometheus' translation strategies produce is written under the
//! configured one, names and attribute label names, through remote-write 1.0 and 2.0.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use promnorm::app::Assemble;
use promnorm::config::Config;
use promnorm::pipeline::{InputProtocol, Pipeline, PipelineLimits};
use promnorm::wire::proto::prometheus as pb;
use promnorm::wire::proto::write_v2;
use prost::Message;

const STRATEGIES: [&str; 4] = [
    "underscore_with_suffixes",
    "underscore_without_suffixes",
    "utf8_with_suffixes",
    "utf8_without_suffixes",
];

/// `gen_ai.server.request.duration` (unit s, a histogram) and `lmcache_mp.lookup_hit`
/// (unit tokens, a counter) under `strategy`: (histogram family, counter name, label
/// name of `gen_ai.operation.name`).
fn spelling(strategy: &str) -> (&'static str, &'static str, &'static str) {
    match strategy {
        "underscore_with_suffixes" => (
            "gen_ai_server_request_duration_seconds",
            "lmcache_mp_lookup_hit_tokens_total",
            "gen_ai_operation_name",
        ),
        "underscore_without_suffixes" => (
            "gen_ai_server_request_duration",
            "lmcache_mp_lookup_hit",
            "gen_ai_operation_name",
        ),
        "utf8_with_suffixes" => (
            "gen_ai.server.request.duration_seconds",
            "lmcache_mp.lookup_hit_tokens_total",
            "gen_ai.operation.name",
        ),
        _ => (
            "gen_ai.server.request.duration",
            "lmcache_mp.lookup_hit",
            "gen_ai.operation.name",
        ),
    }
}

fn pipeline(strategy: &str) -> Pipeline {
    let text = format!(
        "listen: 127.0.0.1:0\npacks:\n  builtin: {{genai: true}}\notel_names: {{strategy: {strategy}}}\n"
    );
    let cfg = Config::parse(&text, "t.yaml").unwrap();
    Pipeline::new(
        Arc::new(cfg.compile_rules().unwrap_or_else(|e| panic!("{e}"))),
        PipelineLimits::default(),
    )
}

/// Every spelling of both instruments, one series each (the `from` label says which).
fn input() -> pb::WriteRequest {
    let mut timeseries = Vec::new();
    for (i, s) in STRATEGIES.iter().enumerate() {
        let (hist, counter, op) = spelling(s);
        let provider = if s.starts_with("utf8") {
            "gen_ai.provider.name"
        } else {
            "gen_ai_provider_name"
        };
        let t = 1_700_000_000_000 + i as i64;
        timeseries.push(series(
            &[
                ("__name__", &format!("{hist}_count")),
                (op, "chat"),
                (provider, "vllm"),
                ("from", s),
            ],
            &[(2.0, t)],
        ));
        timeseries.push(series(&[("__name__", counter), ("from", s)], &[(5.0, t)]));
    }
    pb::WriteRequest {
        timeseries,
        metadata: vec![],
    }
}

/// The output series as `name{label=value,...}` sets, through 1.0 or 2.0 both ways.
fn output(p: &Pipeline, v2: bool) -> Vec<Vec<(String, String)>> {
    let raw = input().encode_to_vec();
    let mut ws = p.take_workspace();
    if v2 {
        let mut body = Vec::new();
        promnorm::wire::encode_v2::V2Encoder::new()
            .encode(&raw, None, &mut body)
            .unwrap();
        p.process_raw_as(&mut ws, &body, InputProtocol::V2).unwrap();
        p.encode_v2(&mut ws).unwrap();
        let req = write_v2::Request::decode(ws.encoded_v2()).unwrap();
        req.timeseries
            .iter()
            .map(|ts| {
                ts.labels_refs
                    .chunks(2)
                    .map(|c| {
                        (
                            req.symbols[c[0] as usize].clone(),
                            req.symbols[c[1] as usize].clone(),
                        )
                    })
                    .collect()
            })
            .collect()
    } else {
        p.process_raw_as(&mut ws, &raw, InputProtocol::V1).unwrap();
        decode(ws.compressed())
            .timeseries
            .iter()
            .map(|ts| {
                ts.labels
                    .iter()
                    .map(|l| (l.name.clone(), l.value.clone()))
                    .collect()
            })
            .collect()
    }
}

#[test]
fn every_spelling_is_written_under_the_configured_one_in_1_0_and_2_0() {
    for strategy in STRATEGIES {
        let p = pipeline(strategy);
        let (hist, counter, op) = spelling(strategy);
        for v2 in [false, true] {
            let out = output(&p, v2);
            let mut names = BTreeSet::new();
            let mut froms = BTreeSet::new();
            for labels in &out {
                let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                let name = get("__name__").unwrap();
                names.insert(name.to_string());
                if name.ends_with("_count") {
                    assert_eq!(get(op), Some("chat"), "{strategy} v2={v2}: {labels:?}");
                    let other = if op.contains('.') {
                        "gen_ai_operation_name"
                    } else {
                        "gen_ai.operation.name"
                    };
                    assert_eq!(get(other), None, "{strategy} v2={v2}: {labels:?}");
                    froms.insert(get("from").unwrap().to_string());
                }
            }
            assert_eq!(
                names,
                BTreeSet::from([format!("{hist}_count"), counter.to_string()]),
                "{strategy} v2={v2}"
            );
            assert_eq!(froms.len(), 4, "{strategy} v2={v2}: every spelling arrived");
            assert_eq!(out.len(), 8, "{strategy} v2={v2}: none dropped");
        }
        // Counted as renamed series of the packs declaring the instruments.
        let mut ws = p.take_workspace();
        p.process_raw_as(&mut ws, &input().encode_to_vec(), InputProtocol::V1)
            .unwrap();
        let renamed: u64 = p.stats(&ws).renamed.iter().sum();
        assert!(renamed >= 6, "{strategy}: {renamed} renamed");
    }
}

/// The genai pack's copies are spelt like the instruments they stand for.
#[test]
fn genai_copies_follow_the_strategy() {
    for strategy in STRATEGIES {
        let p = pipeline(strategy);
        let (hist, _, op) = spelling(strategy);
        let req = pb::WriteRequest {
            timeseries: vec![series(
                &[
                    ("__name__", "vllm:e2e_request_latency_seconds_count"),
                    ("model_name", "m"),
                ],
                &[(1.0, 1_700_000_000_000)],
            )],
            metadata: vec![],
        };
        let mut ws = p.take_workspace();
        p.process(&mut ws, &encode(&req)).unwrap();
        let out = decode(ws.compressed());
        let copy = out
            .timeseries
            .iter()
            .find(|ts| ts.labels.iter().any(|l| l.value == format!("{hist}_count")))
            .unwrap_or_else(|| panic!("{strategy}: no copy in {out:?}"));
        let model = op
            .replace("operation.name", "request.model")
            .replace("operation_name", "request_model");
        for want in [op, model.as_str()] {
            assert!(
                copy.labels.iter().any(|l| l.name == want),
                "{strategy}: {want} in {copy:?}"
            );
        }
    }
}

#[test]
fn explain_shows_the_otel_spelling() {
    let dir = std::env::temp_dir().join(format!("promnorm-otel-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("c.yaml");
    std::fs::write(
        &cfg,
        "listen: 127.0.0.1:0\notel_names: {strategy: utf8_with_suffixes}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(["explain", "--config"])
        .arg(&cfg)
        .arg("lmcache_mp_lookup_hit_tokens_total")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("otel instrument lmcache_mp.lookup_hit (otel_names: utf8_with_suffixes)"),
        "{text}"
    );
    assert!(
        text.contains("lmcache_mp.lookup_hit_tokens_total"),
        "{text}"
    );
}

/// The derived `lmcache_mp_lookup_hit_ratio` reads its OpenTelemetry inputs under the
/// spelling the strategy writes them in (regression: it read only the default
/// `…_tokens_total` spelling, so any other strategy left it empty).
#[test]
fn derived_series_read_the_spelling_the_strategy_writes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/derived_ratios");
    let scrapes: Vec<(String, String)> = (1..=4)
        .map(|i| {
            let p = dir.join(format!("{i}.prom"));
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    let ratio_lines = |strategy: &str| -> Vec<String> {
        let text = format!("listen: 127.0.0.1:0\notel_names: {{strategy: {strategy}}}\n");
        let cfg = Config::parse(&text, "t.yaml").unwrap();
        let p = cfg.pipeline().unwrap_or_else(|e| panic!("{e}"));
        promnorm::normalize::normalize(&p, &scrapes, 15_000)
            .unwrap_or_else(|e| panic!("{e}"))
            .lines()
            .filter(|l| l.starts_with("lmcache_mp_lookup_hit_ratio{"))
            .map(str::to_string)
            .collect()
    };
    let want = ratio_lines("underscore_with_suffixes");
    assert_eq!(
        want,
        [
            "lmcache_mp_lookup_hit_ratio{instance_id=\"a\"} 0.25 1700000015000",
            "lmcache_mp_lookup_hit_ratio{instance_id=\"a\"} 0.5 1700000045000",
        ],
        "the default spelling"
    );
    for strategy in STRATEGIES {
        let (_, counter, _) = spelling(strategy);
        assert_eq!(
            ratio_lines(strategy),
            want,
            "{strategy}: inputs written as {counter}"
        );
    }
}
