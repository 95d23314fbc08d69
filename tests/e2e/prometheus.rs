//! End to end with real components: Debian's Prometheus 2.42 scrapes the real dumps in
//! `tests/golden/dump-*.prom` and remote-writes through promnorm (in-process) into a
//! second Prometheus started with `--web.enable-remote-write-receiver`.
//!
//! The expected result is computed by `promnorm normalize` on the same dumps (the same
//! pipeline code), so the test checks that the network path and the file path agree on
//! every series and value, and that the sender counted zero failed samples.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh fetches it). With `PROMNORM_E2E=1` a missing
//! binary is a failure; otherwise the test says it was skipped.

use crate::common;

use promnorm::app::Assemble;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use promnorm::config::Config;
use promnorm::pipeline::{Pipeline, PipelineLimits};

type SeriesKey = (String, Vec<(String, String)>);

/// Parses `normalize` output lines into series → value.
fn parse_lines(text: &str) -> BTreeMap<SeriesKey, f64> {
    let mut out = BTreeMap::new();
    let parsed = promnorm::exposition::parse(text).expect("normalize output parses as exposition");
    for s in parsed.samples {
        let mut labels = s.labels.clone();
        labels.sort();
        out.insert((s.name.clone(), labels), s.value);
    }
    out
}

const GENERATED: &[&str] = &[
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

async fn query_all(receiver: &str) -> BTreeMap<SeriesKey, f64> {
    let url = format!("{receiver}/api/v1/query?query=%7B__name__%3D~%22.%2B%22%7D");
    let r = get(&url).await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    let mut out = BTreeMap::new();
    for item in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let metric = item["metric"].as_object().cloned().unwrap_or_default();
        let mut name = String::new();
        let mut labels = Vec::new();
        for (k, val) in metric {
            let val = val.as_str().unwrap_or_default().to_string();
            match k.as_str() {
                "__name__" => name = val,
                "job" | "instance" => {}
                _ => labels.push((k, val)),
            }
        }
        if GENERATED.contains(&name.as_str()) {
            continue;
        }
        labels.sort();
        let value = item["value"][1]
            .as_str()
            .and_then(promnorm::mapping::number::parse_float)
            .unwrap_or(f64::NAN);
        out.insert((name, labels), value);
    }
    out
}

fn same_value(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || ((a - b).abs() <= 1e-12 * a.abs().max(b.abs()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_prometheus_to_real_prometheus_through_promnorm() {
    let Some(prom) = prometheus_bin() else {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!("PROMNORM_E2E=1 but PROMETHEUS_BIN is not set to an existing binary");
        }
        eprintln!("SKIPPED: set PROMETHEUS_BIN (scripts/test.sh does) to run the end-to-end test");
        return;
    };
    let dumps_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut dumps: Vec<PathBuf> = std::fs::read_dir(&dumps_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dumps_dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dump-") && n.ends_with(".prom"))
        })
        .collect();
    dumps.sort();
    assert!(
        dumps.len() >= 4,
        "expected the real dumps dump-*.prom in {}",
        dumps_dir.display()
    );

    // Expected: the same pipeline on the same files.
    let cfg = Config::embedded_default();
    let pipeline = Pipeline::new(
        Arc::new(cfg.compile_rules().unwrap()),
        PipelineLimits::default(),
    );
    let mut expected = BTreeMap::new();
    let mut router = axum::Router::new();
    for (i, d) in dumps.iter().enumerate() {
        let text = std::fs::read_to_string(d).unwrap();
        let out = promnorm::normalize::normalize(
            &pipeline,
            &[(d.display().to_string(), text.clone())],
            15_000,
        )
        .unwrap();
        expected.extend(parse_lines(&out));
        router = router.route(
            &format!("/{i}/metrics"),
            axum::routing::get(move || async move { text }),
        );
    }

    // A live engine whose counters move: every scrape adds 3 prefix-cache hits, 4
    // queries and 1e15 FLOP, so the derived hit ratio is exactly 0.75 and MFU (peak
    // 1e15 FLOP/s, 1 s scrapes) about 1.
    let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    router = router.route(
        "/engine/metrics",
        axum::routing::get(move || {
            let n = scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            async move {
                let l = r#"{engine="0",model_name="e2e-dynamic"}"#;
                format!(
                    "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{l} {}\n\
                     # TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{l} {}\n\
                     # TYPE vllm:estimated_flops_per_gpu counter\nvllm:estimated_flops_per_gpu_total{l} {}\n",
                    3 * n,
                    4 * n,
                    n as f64 * 1e15
                )
            }
        }),
    );

    // Fixture exporter.
    let fixture = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fixture_addr = fixture.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(fixture, router).await });

    let tmp = std::env::temp_dir().join(format!("promnorm-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();

    // Receiver.
    let recv_port = free_port();
    std::fs::write(tmp.join("receiver.yml"), "global:\n  scrape_interval: 1m\n").unwrap();
    let receiver_log = std::fs::File::create(tmp.join("receiver.log")).unwrap();
    let _receiver = Killed(
        Command::new(&prom)
            .arg(format!(
                "--config.file={}",
                tmp.join("receiver.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.join("receiver-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{recv_port}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(receiver_log)
            .spawn()
            .expect("start receiver prometheus"),
    );
    let receiver = format!("http://127.0.0.1:{recv_port}");

    // promnorm, in-process, forwarding to the receiver.
    let proxy = start_proxy(
        &[format!("{receiver}/api/v1/write")],
        "derived:\n  flush_interval: 200ms\n  peaks:\n    - match: {model_name: e2e-dynamic}\n      flops: 1.0e15\n",
    )
    .await;

    // Sender.
    let send_port = free_port();
    let mut scrape = format!(
        "  - job_name: engine\n    metrics_path: /engine/metrics\n    static_configs:\n      - targets: ['{fixture_addr}']\n"
    );
    for i in 0..dumps.len() {
        scrape.push_str(&format!(
            "  - job_name: dump{i}\n    metrics_path: /{i}/metrics\n    static_configs:\n      - targets: ['{fixture_addr}']\n"
        ));
    }
    let sender_cfg = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{scrape}remote_write:\n  - url: {}\n    remote_timeout: 5s\n    queue_config:\n      batch_send_deadline: 1s\n      max_samples_per_send: 2000\n    metadata_config:\n      send_interval: 2s\n",
        proxy.url()
    );
    std::fs::write(tmp.join("sender.yml"), sender_cfg).unwrap();
    let sender_log = std::fs::File::create(tmp.join("sender.log")).unwrap();
    let _sender = Killed(
        Command::new(&prom)
            .arg(format!(
                "--config.file={}",
                tmp.join("sender.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.join("sender-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{send_port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(sender_log)
            .spawn()
            .expect("start sender prometheus"),
    );

    // Wait until every expected series has arrived (bounded).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut got = BTreeMap::new();
    let mut live = BTreeMap::new();
    let ratio_key = |name: &str| -> SeriesKey {
        (
            name.to_string(),
            vec![
                ("engine".to_string(), "0".to_string()),
                ("model_name".to_string(), "e2e-dynamic".to_string()),
            ],
        )
    };
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        got = query_all(&receiver).await;
        // The live engine's series are checked on their own below.
        live = got
            .iter()
            .filter(|(k, _)| {
                k.1.iter()
                    .any(|(n, v)| n == "model_name" && v == "e2e-dynamic")
            })
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        got.retain(|k, _| !live.contains_key(k));
        if expected.keys().all(|k| got.contains_key(k))
            && live.contains_key(&ratio_key("vllm:prefix_cache_hit_ratio"))
            && live.contains_key(&ratio_key("vllm:mfu_ratio"))
        {
            break;
        }
    }
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(10)
        .collect();
    let unexpected: Vec<_> = got
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .take(10)
        .collect();
    let logs = || {
        format!(
            "\nsender log:\n{}\nreceiver log:\n{}",
            std::fs::read_to_string(tmp.join("sender.log")).unwrap_or_default(),
            std::fs::read_to_string(tmp.join("receiver.log")).unwrap_or_default()
        )
    };
    assert!(
        missing.is_empty(),
        "series missing at the receiver: {missing:?}{}",
        logs()
    );
    assert!(
        unexpected.is_empty(),
        "series the pipeline did not predict: {unexpected:?}"
    );
    let mut mismatched = Vec::new();
    for (k, want) in &expected {
        let have = got[k];
        if !same_value(*want, have) {
            mismatched.push((k.clone(), *want, have));
        }
    }
    assert!(
        mismatched.is_empty(),
        "values differ: {:?}",
        &mismatched[..mismatched.len().min(10)]
    );

    // Normalised names arrived; the raw ones did not.
    let names: BTreeSet<_> = got.keys().map(|k| k.0.clone()).collect();
    for want in [
        "sglang:kv_transfer_latency_seconds",
        "sglang:kv_transfer_total_bytes",
        "DCGM_FI_DEV_GPU_UTIL_ratio",
        "DCGM_FI_DEV_FB_USED_bytes",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_joules_total",
        "vllm:iteration_tokens_bucket",
        "dynamo_component_kvstats_gpu_cache_usage_ratio",
    ] {
        assert!(names.contains(want), "{want} missing at the receiver");
    }
    for gone in [
        "sglang:kv_transfer_latency_ms",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "vllm:iteration_tokens_total_bucket",
        "vllm:prompt_tokens_created",
    ] {
        assert!(
            !names.contains(gone),
            "{gone} should have been normalised away"
        );
    }
    assert!(
        got.keys()
            .all(|(n, l)| !n.starts_with("DCGM_") || !l.iter().any(|(k, _)| k == "Hostname")),
        "Hostname label renamed on every DCGM series"
    );

    // Derived series, computed across requests by promnorm and sent on their own.
    let hit_ratio = live.get(&ratio_key("vllm:prefix_cache_hit_ratio")).copied();
    assert_eq!(
        hit_ratio,
        Some(0.75),
        "derived hit ratio at the receiver: {live:?}"
    );
    let mfu = live
        .get(&ratio_key("vllm:mfu_ratio"))
        .copied()
        .unwrap_or(0.0);
    assert!(
        (0.9..=1.1).contains(&mfu),
        "derived MFU about 1 (1 s scrapes): {mfu}"
    );

    // The sender delivered everything: no failed or dropped samples.
    let sm = get(&format!("http://127.0.0.1:{send_port}/metrics"))
        .await
        .body;
    let metric = |name: &str| -> f64 {
        sm.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    let sent = metric("prometheus_remote_storage_samples_total");
    let failed = metric("prometheus_remote_storage_samples_failed_total");
    let retried = metric("prometheus_remote_storage_samples_retried_total");
    println!(
        "e2e: {} series ({} names) arrived with the predicted values; derived at the receiver: hit ratio {hit_ratio:?}, MFU {mfu}; sender sent {sent} samples, failed {failed}, retried {retried}",
        got.len(),
        names.len()
    );
    assert!(sent > 0.0, "sender reports samples sent");
    assert_eq!(failed, 0.0, "sender counted failed samples");
    let _ = std::fs::remove_dir_all(&tmp);
}
