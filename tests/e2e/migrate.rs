//! Rename migrations, proven on two real Prometheus servers (docs/migrations.md).
//!
//! The same 25 scrapes (counters increasing, histograms filling, gauges moving; 15 s
//! apart) of every family the built-in packs rename or rescale are written once directly
//! into Prometheus A and once through `promnorm serve` (the embedded default
//! configuration: every pack) into Prometheus B, both Debian's 2.42 with
//! `--web.enable-remote-write-receiver`. For every query of a corpus (dashboard shapes
//! of vLLM, SGLang, DCGM, LMCache, Mooncake and Dynamo, plus queries generated for every
//! renamed or rescaled input name):
//!
//! - `--keep-values`: the original on A and the rewritten query on B return the same
//!   series (label names mapped by the packs' label renames) with the same values,
//!   relative 1e-9;
//! - without it (dashboard mode): the value on B, brought back by the unit change the
//!   rewriter reported, equals the value on A.
//!
//! A query the rewriter reports as needing a human is not compared (it is counted). The
//! migrated rule file passes `promtool check rules`; `migrate grafana --check` exits 1
//! on the old dashboard and 0 on its migrated output.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh fetches it); with `PROMNORM_E2E=1` a missing
//! binary is a failure.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use common::procs::{binary, prometheus_receiver, promnorm_serve};
use common::*;
use promnorm::app::Assemble;
use promnorm::config::Config;
use promnorm::explain::rescale_le;
use promnorm::mapping::Rules;
use promnorm::mapping::compile::Resolution;
use promnorm::mapping::number::Factor;
use promnorm::migrate::QueryRewriter;
use promnorm::wire::proto::prometheus as pb;

const SCRAPES: i64 = 25;
const STEP_MS: i64 = 15_000;
const TOLERANCE: f64 = 1e-9;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "promnorm-e2e-migrate-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub(crate) fn default_rules() -> Rules {
    Config::parse("", "default")
        .expect("the default configuration parses")
        .compile_rules()
        .expect("the built-in packs compile")
}

/// Input names the exact rules know and the queries to try for each: the names a query
/// of which the rewriter changes.
pub(crate) fn renamed_inputs(rules: &Rules) -> Vec<String> {
    let rw = QueryRewriter::new(rules, false);
    let mut names: Vec<String> = rules
        .known_names()
        .map(str::to_string)
        .chain(PATTERN_NAMES.iter().map(|s| s.to_string()))
        .filter(|n| rw.rewrite(n).changed)
        // A histogram family's own name holds native histograms, which these float
        // scrapes do not make (tests/e2e/native_histograms.rs covers them).
        .filter(|n| {
            let native_only = match rules.lookup(n) {
                Some(Resolution::Plan(p)) => p.native_only,
                Some(Resolution::OutputName) => false,
                None => rules.plan_for(n).is_some_and(|p| p.native_only),
            };
            !native_only
        })
        .collect();
    // Names the hand-written corpus uses first, so that they are the ones kept below.
    let in_corpus = |n: &str| {
        CORPUS.iter().any(|q| {
            q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .any(|t| t == n)
        })
    };
    names.sort_by_key(|n| (!in_corpus(n), n.clone()));
    names.dedup();
    // One input per output name: `F` and `F_total` of one counter both become `G_total`,
    // and an exporter sends one of them.
    let mut outputs = std::collections::BTreeSet::new();
    names.retain(|n| outputs.insert(rw.rewrite(n).query));
    names
}

/// Names that only prefix or regex rules match (not among the exact names).
const PATTERN_NAMES: &[&str] = &[
    "mooncake_transfer_get_latency_bucket",
    "mooncake_transfer_get_latency_sum",
    "mooncake_transfer_get_latency_count",
    "mooncake_ssd_read_latency_us",
    "lmcache_blend_retrieve_duration_milliseconds_bucket",
    "lmcache_blend_retrieve_duration_milliseconds_sum",
    "lmcache_blend_retrieve_duration_milliseconds_count",
    "lmcache_mp_store_throughput_GB_per_second",
    "dynamo_router_overhead_decode_ms",
    "port_rcv_data",
    "node_port_xmit_data",
];

const LE: &[&str] = &["1", "5", "10", "50", "100", "500", "1000", "5000", "+Inf"];

/// The labels of a synthetic series of `name` on `instance`.
fn labels_of(name: &str, instance: &str) -> Vec<(String, String)> {
    let mut l = vec![
        ("instance".to_string(), instance.to_string()),
        ("job".to_string(), "engine".to_string()),
        ("model_name".to_string(), "m1".to_string()),
    ];
    if name.starts_with("DCGM_") {
        l.push(("Hostname".into(), format!("h-{instance}")));
        l.push(("gpu".into(), "0".into()));
    }
    if name.starts_with("sglang:") {
        l.push(("tp_rank".into(), "0".into()));
    }
    if name.starts_with("sglang:per_stage_req_latency_seconds") {
        l.push(("stage".into(), "dispatch".into()));
    }
    l
}

/// One scrape of every input name, at `ts`: counters grow, histograms fill, gauges move.
pub(crate) fn scrape(names: &[String], i: i64, ts: i64) -> pb::WriteRequest {
    let mut req = pb::WriteRequest::default();
    let fi = i as f64;
    for (k, inst) in ["a", "b"].iter().enumerate() {
        let kf = k as f64;
        for name in names {
            let mut push = |name: &str, extra: Option<(&str, &str)>, v: f64| {
                let mut l = labels_of(name, inst);
                l.push(("__name__".into(), name.to_string()));
                if let Some((n, val)) = extra {
                    l.push((n.into(), val.into()));
                }
                l.sort();
                let refs: Vec<(&str, &str)> =
                    l.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                req.timeseries.push(series(&refs, &[(v, ts)]));
            };
            if let Some(base) = name.strip_suffix("_bucket") {
                for (j, le) in LE.iter().enumerate() {
                    let jf = j.min(LE.len() - 1) as f64;
                    let v = (fi + 1.0) * (jf + 1.0) * (7.0 + kf) + fi * fi;
                    push(name, Some(("le", le)), v);
                }
                // _sum and _count come with their own names when renamed; otherwise here.
                if !names.iter().any(|n| n == &format!("{base}_sum")) {
                    push(&format!("{base}_sum"), None, (fi + 1.0) * 1234.5);
                }
                if !names.iter().any(|n| n == &format!("{base}_count")) {
                    let n = LE.len() as f64;
                    push(
                        &format!("{base}_count"),
                        None,
                        (fi + 1.0) * n * (7.0 + kf) + fi * fi,
                    );
                }
            } else if name.ends_with("_count")
                && names
                    .iter()
                    .any(|n| *n == name.replace("_count", "_bucket"))
            {
                let n = LE.len() as f64;
                push(name, None, (fi + 1.0) * n * (7.0 + kf) + fi * fi);
            } else if name.ends_with("_sum") || name.ends_with("_total") || name.ends_with("_count")
            {
                push(
                    name,
                    None,
                    (fi + 1.0) * (1234.5 + 10.0 * kf) + fi * fi * 3.0,
                );
            } else {
                push(name, None, 40.0 + 3.0 * fi + 5.0 * kf + (fi * 0.7).sin());
            }
        }
    }
    req
}

/// The hand-written corpus: the shapes of the engines' published dashboards and alerts.
pub(crate) const CORPUS: &[&str] = &[
    // vLLM
    "histogram_quantile(0.99, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket[2m])))",
    "histogram_quantile(0.9, sum by (le, model_name) (rate(vllm:model_forward_time_milliseconds_bucket[2m])))",
    "rate(vllm:model_execute_time_milliseconds_sum[2m]) / rate(vllm:model_execute_time_milliseconds_count[2m])",
    "vllm:gpu_cache_usage_perc{model_name=\"m1\"} * 100",
    "sum by (model_name) (rate(vllm:gpu_prefix_cache_hits_total[2m])) / sum by (model_name) (rate(vllm:gpu_prefix_cache_queries_total[2m]))",
    "sum by (le) (increase(vllm:model_forward_time_milliseconds_bucket[2m]))",
    "vllm:gpu_cache_usage_perc > 45",
    "avg_over_time(vllm:gpu_cache_usage_perc[2m])",
    // SGLang
    "histogram_quantile(0.95, sum by (le) (rate(sglang:kv_transfer_latency_ms_bucket[2m]))) > 100",
    "sum by (instance) (rate(sglang:kv_transfer_latency_ms_sum[2m]))",
    "rate(sglang:kv_transfer_latency_ms_bucket{le=\"100\"}[2m]) / ignoring (le) rate(sglang:kv_transfer_latency_ms_count[2m])",
    "sum(rate(sglang:kv_transfer_total_mb_total[2m])) by (instance)",
    "max by (instance) (sglang:kv_transfer_speed_gb_s)",
    "sum by (stage) (rate(sglang:per_stage_req_latency_seconds_count{stage=\"dispatch\"}[2m]))",
    "rate(sglang:gpu_execution_seconds_total[2m]) * 100",
    // DCGM exporter
    "sum by (Hostname) (DCGM_FI_DEV_FB_USED)",
    "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
    "avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)",
    "DCGM_FI_DEV_GPU_UTIL{Hostname=\"h-a\"} > 43",
    "label_replace(DCGM_FI_DEV_FB_USED, \"host\", \"$1\", \"Hostname\", \"(.*)\")",
    "DCGM_FI_DEV_FB_USED * on (Hostname, gpu) group_left () DCGM_FI_DEV_GPU_UTIL",
    "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2m])",
    "max_over_time(DCGM_FI_DEV_SM_CLOCK[2m])",
    "sum(DCGM_FI_DEV_FB_USED) by (Hostname) / 1024",
    "DCGM_FI_DEV_FB_USED - DCGM_FI_DEV_GPU_UTIL",
    "topk(1, DCGM_FI_DEV_FB_USED)",
    "count_values(\"mib\", DCGM_FI_DEV_FB_USED)",
    "sqrt(DCGM_FI_DEV_FB_USED)",
    "DCGM_FI_DEV_FB_USED > bool 45",
    // LMCache, Mooncake, Dynamo
    "rate(lmcache:remote_time_to_get_sum[2m]) / rate(lmcache:remote_time_to_get_count[2m])",
    "histogram_quantile(0.5, sum by (le) (rate(lmcache_blend_retrieve_duration_milliseconds_bucket[2m])))",
    "histogram_quantile(0.99, sum by (le) (rate(mooncake_transfer_get_latency_bucket[2m])))",
    "dynamo_component_kvstats_gpu_cache_usage_percent / 100",
    "histogram_quantile(0.9, sum by (le) (rate(dynamo_frontend_tokenizer_latency_ms_bucket[2m])))",
    // Subqueries and offsets
    "max_over_time(rate(sglang:kv_transfer_latency_ms_sum[1m])[3m:30s])",
    "DCGM_FI_DEV_FB_USED offset 1m",
];

/// Queries for one input name, by what it holds.
pub(crate) fn generated(name: &str) -> Vec<String> {
    if name.ends_with("_bucket") {
        vec![
            format!("histogram_quantile(0.9, sum by (le) (rate({name}[2m])))"),
            format!("sum by (le) (increase({name}[2m]))"),
        ]
    } else if name.ends_with("_sum") || name.ends_with("_total") || name.ends_with("_count") {
        vec![format!("sum by (instance) (rate({name}[2m]))")]
    } else {
        vec![name.to_string(), format!("avg({name})")]
    }
}

type Vector = BTreeMap<Vec<(String, String)>, f64>;

async fn instant(base: &str, query: &str, time: f64) -> Result<Vector, String> {
    let url = format!("{base}/api/v1/query?query={}&time={time}", urlencode(query));
    let reply = get(&url).await;
    let doc: serde_json::Value =
        serde_json::from_str(&reply.body).map_err(|e| format!("{e}: {}", reply.body))?;
    if doc["status"] != "success" {
        return Err(reply.body);
    }
    let mut out = Vector::new();
    let data = &doc["data"];
    let items: Vec<serde_json::Value> = match data["resultType"].as_str() {
        Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
        Some("scalar") => vec![serde_json::json!({"metric": {}, "value": data["result"]})],
        other => return Err(format!("result type {other:?}")),
    };
    for item in items {
        let mut labels: Vec<(String, String)> = item["metric"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k != "__name__")
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default();
        labels.sort();
        let v: f64 = item["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(f64::NAN);
        out.insert(labels, v);
    }
    Ok(out)
}

pub(crate) fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A's label sets written as B's: label renames and label-value maps of the packs, and
/// `le` bounds rescaled as the rewriter reported.
fn as_migrated(rules: &Rules, v: &Vector, le: Option<Factor>) -> Vector {
    let renames = rules.label_renames();
    let maps = rules.label_value_maps();
    v.iter()
        .map(|(labels, val)| {
            let mut l: Vec<(String, String)> = labels
                .iter()
                .map(|(k, v)| {
                    let k = renames
                        .iter()
                        .find(|(f, _)| f == k)
                        .map(|(_, t)| t.clone())
                        .unwrap_or_else(|| k.clone());
                    let v = maps
                        .iter()
                        .find(|(ml, f, _)| *ml == k && f == v)
                        .map(|(_, _, t)| t.clone())
                        .unwrap_or_else(|| v.clone());
                    let v = match le {
                        Some(f) if k == "le" => rescale_le(&v, f),
                        _ => v,
                    };
                    (k, v)
                })
                .collect();
            l.sort();
            (l, *val)
        })
        .collect()
}

/// Relative [`TOLERANCE`], with a floor of 1 for results near zero (a difference of two
/// equal values may come out as 1e-14 after a unit change).
pub(crate) fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan())
        || a == b
        || (a - b).abs() <= TOLERANCE * a.abs().max(b.abs()).max(1.0)
}

/// The largest relative difference, or why the vectors differ.
fn compare(a: &Vector, b: &Vector) -> Result<f64, String> {
    if a.keys().collect::<Vec<_>>() != b.keys().collect::<Vec<_>>() {
        return Err(format!(
            "label sets differ: A {:?} / B {:?}",
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>()
        ));
    }
    let mut worst: f64 = 0.0;
    for (k, va) in a {
        let vb = b[k];
        if !close(*va, vb) {
            return Err(format!("{k:?}: A {va} / B {vb}"));
        }
        if va.is_finite() && *va != 0.0 {
            worst = worst.max(((va - vb) / va).abs());
        }
    }
    Ok(worst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_queries_return_the_old_values_on_a_prometheus_fed_through_promnorm() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let (dir_a, dir_b, dir_p) = (scratch("a"), scratch("b"), scratch("p"));
    let mut a = prometheus_receiver(&prom, &dir_a);
    let mut b = prometheus_receiver(&prom, &dir_b);
    a.start("/-/ready").await;
    b.start("/-/ready").await;
    let b_write = format!("{}/api/v1/write", b.base);
    let mut proxy = promnorm_serve(&dir_p, |port| {
        format!("listen: 127.0.0.1:{port}\nbackends:\n  - name: b\n    url: {b_write}\n")
    });
    proxy.start("/-/ready").await;

    let rules = default_rules();
    let names = renamed_inputs(&rules);
    assert!(names.len() > 40, "renamed inputs: {names:?}");
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let t0 = now_ms - (SCRAPES + 2) * STEP_MS;
    for i in 0..SCRAPES {
        let body = encode(&scrape(&names, i, t0 + i * STEP_MS));
        let ra = post(
            &format!("{}/api/v1/write", a.base),
            body.clone(),
            RW_HEADERS,
        )
        .await;
        assert!(ra.status.is_success(), "A: {} {}", ra.status, ra.body);
        let rp = post(&format!("{}/api/v1/write", proxy.base), body, RW_HEADERS).await;
        assert_eq!(rp.status.as_u16(), 204, "promnorm: {}", rp.body);
    }
    let at = (t0 + (SCRAPES - 1) * STEP_MS) as f64 / 1000.0;

    let keep = QueryRewriter::new(&rules, true);
    let new_units = QueryRewriter::new(&rules, false);
    let mut corpus: Vec<(String, bool)> = CORPUS.iter().map(|q| (q.to_string(), true)).collect();
    for n in &names {
        corpus.extend(generated(n).into_iter().map(|q| (q, false)));
    }
    let (mut compared, mut rewritten, mut reported, mut unchanged, mut empty) = (0, 0, 0, 0, 0);
    let mut worst: f64 = 0.0;
    let mut failures = Vec::new();
    for (q, must_have_data) in &corpus {
        let kr = keep.rewrite(q);
        if kr.needs_human() {
            reported += 1;
            eprintln!("reported: {q}\n  {:?}", kr.findings);
            continue;
        }
        if kr.changed {
            rewritten += 1;
        } else {
            unchanged += 1;
        }
        let va = match instant(&a.base, q, at).await {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{q}: A refused it: {e}"));
                continue;
            }
        };
        if va.is_empty() {
            empty += 1;
            if *must_have_data {
                failures.push(format!("{q}: no data on A (the corpus must select data)"));
            }
            continue;
        }
        let expected = as_migrated(&rules, &va, kr.le_factor);
        match instant(&b.base, &kr.query, at).await {
            Ok(vb) => match compare(&expected, &vb) {
                Ok(w) => {
                    worst = worst.max(w);
                    compared += 1;
                }
                Err(e) => failures.push(format!("--keep-values {q}\n  → {}\n  {e}", kr.query)),
            },
            Err(e) => failures.push(format!("{q} → {}: B refused it: {e}", kr.query)),
        }
        // Dashboard mode: new units, brought back by the reported factor.
        let nr = new_units.rewrite(q);
        if let Ok(vb) = instant(&b.base, &nr.query, at).await {
            let back: Vector = vb
                .into_iter()
                .map(|(k, v)| {
                    let v = match nr.value_factor {
                        Some(f) => v * f.den as f64 / f.num as f64,
                        None => v,
                    };
                    (k, v)
                })
                .collect();
            if let Err(e) = compare(&expected, &back) {
                failures.push(format!("new units {q}\n  → {}\n  {e}", nr.query));
            }
        }
    }
    eprintln!(
        "corpus: {} queries ({} hand-written, {} generated for {} renamed or rescaled input \
         names); {compared} compared equal on A and B (largest relative difference {worst:e}), \
         {rewritten} rewritten, {unchanged} unchanged, {reported} reported as needing a human, \
         {empty} without data on A",
        corpus.len(),
        CORPUS.len(),
        corpus.len() - CORPUS.len(),
        names.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        compared >= CORPUS.len() / 2,
        "too few queries compared: {compared}"
    );

    cut_over_tracking(&proxy.base, SCRAPES as u64 * 2).await;
    rule_file_passes_promtool(&prom, &dir_p);
    check_mode_exit_codes(&dir_p);
    drop(proxy);
}

/// promnorm's own account of the old names it renamed: every scrape carried
/// `DCGM_FI_DEV_FB_USED` on two instances.
async fn cut_over_tracking(proxy: &str, samples: u64) {
    let metrics = get(&format!("{proxy}/metrics")).await.body;
    let line = format!(
        "promnorm_rename_input_samples_total{{pack=\"dcgm\",from=\"DCGM_FI_DEV_FB_USED\"}} {samples}"
    );
    assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    assert!(
        metrics.contains(
            "promnorm_rename_input_last_seen_timestamp_seconds{pack=\"vllm\",from=\"vllm:gpu_cache_usage_perc\"}"
        ),
        "{metrics}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&get(&format!("{proxy}/api/v1/renames")).await.body).unwrap();
    let entry = doc["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["from"] == "DCGM_FI_DEV_FB_USED")
        .cloned()
        .expect("DCGM_FI_DEV_FB_USED tracked");
    assert_eq!(entry["to"], "DCGM_FI_DEV_FB_USED_bytes");
    assert_eq!(entry["pack"], "dcgm");
    assert_eq!(entry["samples"], samples);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last = entry["last_seen"].as_f64().expect("seen");
    assert!((now - last).abs() < 120.0, "last seen {last}, now {now}");
    // An old name that never arrived is listed, never seen.
    assert!(
        doc["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["samples"].as_u64() > Some(0) || e["last_seen"].is_null()),
        "{doc}"
    );
}

const RULES: &str = r#"groups:
  - name: inference
    rules:
      - alert: KvTransferSlow
        expr: histogram_quantile(0.99, sum by (le) (rate(sglang:kv_transfer_latency_ms_bucket[5m]))) > 500
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "KV transfer p99 above 500 ms"
      - alert: GpuMemoryHigh
        expr: sum by (Hostname) (DCGM_FI_DEV_FB_USED) / sum by (Hostname) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0.9
        annotations:
          summary: "{{ $labels.Hostname }} uses {{ $value | humanizePercentage }} of its GPU memory"
      - record: vllm:gpu_cache_usage_perc
        expr: avg by (model_name, instance) (vllm:gpu_cache_usage_perc)
      - record: job:vllm_forward_ms:avg
        expr: rate(vllm:model_forward_time_milliseconds_sum[5m]) / rate(vllm:model_forward_time_milliseconds_count[5m])
"#;

const DASHBOARD: &str = r#"{
  "title": "Inference",
  "panels": [
    {"type": "row", "title": "GPU", "panels": [
      {"type": "timeseries", "title": "Framebuffer", "fieldConfig": {"defaults": {"unit": "mbytes"}, "overrides": []},
       "targets": [{"expr": "sum by (Hostname) (DCGM_FI_DEV_FB_USED{Hostname=~\"$host\"})", "legendFormat": "{{Hostname}}", "refId": "A"}]}
    ]},
    {"type": "timeseries", "title": "KV transfer p99", "fieldConfig": {"defaults": {"unit": "ms"}},
     "targets": [{"expr": "histogram_quantile(0.99, sum by (le) (rate(sglang:kv_transfer_latency_ms_bucket[$__rate_interval])))", "refId": "A"}]}
  ],
  "templating": {"list": [
    {"name": "host", "type": "query", "query": {"query": "label_values(DCGM_FI_DEV_FB_USED, Hostname)", "refId": "V"}, "definition": "label_values(DCGM_FI_DEV_FB_USED, Hostname)"}
  ]}
}
"#;

fn promnorm(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promnorm runs");
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rule_file_passes_promtool(prom: &Path, dir: &Path) {
    let input = dir.join("rules.yml");
    std::fs::write(&input, RULES).unwrap();
    let output = dir.join("rules.migrated.yml");
    let (code, _, err) = promnorm(
        &[
            "migrate",
            "rules",
            input.to_str().unwrap(),
            "-o",
            output.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let migrated = std::fs::read_to_string(&output).unwrap();
    assert!(
        migrated.contains("sglang:kv_transfer_latency_seconds_bucket"),
        "{migrated}"
    );
    assert!(
        migrated.contains("* 1000 > 500"),
        "the threshold keeps its meaning: {migrated}"
    );
    assert!(migrated.contains("$labels.hostname"), "{migrated}");
    assert!(
        err.contains("NEEDS A HUMAN record_renamed: this rule records vllm:gpu_cache_usage_perc"),
        "{err}"
    );
    let promtool = prom.with_file_name("promtool");
    if promtool.exists() {
        let out = Command::new(&promtool)
            .args(["check", "rules", output.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        panic!("promtool is not beside {}", prom.display());
    }
    let (code, out, _) = promnorm(
        &["migrate", "rules", "--check", input.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 1, "old rule file: {out}");
    let (code, out, _) = promnorm(
        &["migrate", "rules", "--check", output.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 0, "migrated rule file: {out}");
}

fn check_mode_exit_codes(dir: &Path) {
    let input = dir.join("dash.json");
    std::fs::write(&input, DASHBOARD).unwrap();
    let (code, out, _) = promnorm(
        &["migrate", "grafana", "--check", input.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("DCGM_FI_DEV_FB_USED") && out.contains("label Hostname"),
        "{out}"
    );
    let (code, migrated, err) = promnorm(&["migrate", "grafana", "-"], Some(DASHBOARD));
    assert_eq!(code, 0, "{err}");
    assert!(migrated.contains("\"unit\": \"bytes\""), "{migrated}");
    assert!(migrated.contains("\"unit\": \"s\""), "{migrated}");
    assert!(migrated.contains("{{hostname}}"), "{migrated}");
    assert!(
        migrated.contains("label_values(DCGM_FI_DEV_FB_USED_bytes, hostname)"),
        "{migrated}"
    );
    assert!(migrated.contains("[$__rate_interval]"), "{migrated}");
    assert!(migrated.contains("=~\\\"$host\\\""), "{migrated}");
    let report = dir.join("report.json");
    let (code, _, err) = promnorm(
        &[
            "migrate",
            "grafana",
            "--report",
            report.to_str().unwrap(),
            input.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(doc["summary"]["changed"].as_u64() >= Some(4), "{doc}");
    assert!(
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["reason"] == "unit_changed")),
        "{doc}"
    );
    let out_path = dir.join("dash.migrated.json");
    std::fs::write(&out_path, &migrated).unwrap();
    let (code, out, _) = promnorm(
        &["migrate", "grafana", "--check", out_path.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 0, "migrated dashboard: {out}");
}

/// The public corpus (`tests/corpus`) through `migrate rules DIR -o OUT` (directory mode,
/// every form): the rule groups of every rule file and PrometheusRule, and every
/// dashboard expression (Grafana variables masked as the engine masks them) as recording
/// rules, pass a real `promtool check rules`: every migrated expression parses in
/// Prometheus' own parser, and the extracted PrometheusRule groups are valid rules.
#[test]
fn the_migrated_public_corpus_passes_promtool() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let promtool = prom.with_file_name("promtool");
    assert!(
        promtool.exists(),
        "promtool is not beside {}",
        prom.display()
    );
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let dir = scratch("corpus");
    let out = dir.join("out");
    for (what, sub) in [("grafana", "dashboards"), ("rules", "rules")] {
        let (code, _, err) = promnorm(
            &[
                "migrate",
                what,
                corpus.join(sub).to_str().unwrap(),
                "-o",
                out.join(sub).to_str().unwrap(),
            ],
            None,
        );
        assert_eq!(code, 0, "migrate {what} {sub}: {err}");
        assert!(err.contains(" failed; "), "the summary line: {err}");
    }
    // Every rule group of the migrated rule files and PrometheusRules, and every
    // dashboard expression, dashboards embedded in YAML included.
    let mut groups: Vec<serde_json::Value> = Vec::new();
    let mut exprs: Vec<String> = Vec::new();
    fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr", serde_json::Value::String(e)) if !e.trim().is_empty() => {
                            out.push(e.clone())
                        }
                        _ => dashboard_exprs(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
            _ => {}
        }
    }
    let mut files = 0;
    for sub in ["dashboards", "rules"] {
        for e in std::fs::read_dir(out.join(sub)).unwrap() {
            let path = e.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            files += 1;
            if path.extension().is_some_and(|x| x == "json") {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                dashboard_exprs(&v, &mut exprs);
                continue;
            }
            for range in promnorm::migrate::files::documents(&text) {
                let v: serde_json::Value = promnorm::config::yaml::from_str(&text[range]).unwrap();
                let spec_groups = v.pointer("/spec/groups").cloned();
                if let Some(serde_json::Value::Array(gs)) = v.get("groups").cloned().or(spec_groups)
                {
                    groups.extend(gs);
                }
                // Embedded dashboards (ConfigMap data, GrafanaDashboard spec.json).
                for holder in ["data", "spec"] {
                    if let Some(serde_json::Value::Object(m)) = v.get(holder) {
                        for s in m.values().filter_map(|s| s.as_str()) {
                            if let Ok(d) = serde_json::from_str::<serde_json::Value>(s) {
                                dashboard_exprs(&d, &mut exprs);
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(files >= 55, "{files} files written");
    assert!(groups.len() >= 10, "{} rule groups", groups.len());
    assert!(exprs.len() >= 500, "{} dashboard expressions", exprs.len());
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let masked = promnorm::migrate::template::Template::mask(e);
            serde_json::json!({"record": format!("corpus:expr_{i}"), "expr": masked.masked()})
        })
        .collect();
    groups.push(serde_json::json!({"name": "corpus-dashboards", "rules": rules}));
    // Group names must be unique in one file.
    for (i, g) in groups.iter_mut().enumerate() {
        if let Some(n) = g.get("name").and_then(|n| n.as_str()).map(str::to_string) {
            g["name"] = serde_json::Value::String(format!("{i}-{n}"));
        }
    }
    let file = dir.join("corpus-rules.yml");
    std::fs::write(
        &file,
        promnorm::config::yaml::to_string(&serde_json::json!({ "groups": groups })).unwrap(),
    )
    .unwrap();
    let check = Command::new(&promtool)
        .args(["check", "rules", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check rules {}: {}{}",
        file.display(),
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!(
        "e2e corpus: {files} files migrated; {} rule groups and {} dashboard expressions pass \
         promtool check rules",
        groups.len() - 1,
        exprs.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
