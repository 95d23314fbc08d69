//! Rule behaviour through the remote-write path (what text exposition cannot carry):
//! stale markers through every rule kind, dotted OpenTelemetry names, exemplars under
//! rescale, keep_original, metadata renames, drop counting, config conflicts.

use crate::common;

use promnorm::app::Assemble;
use std::sync::Arc;

use common::*;
use promnorm::config::Config;
use promnorm::mapping::STALE_NAN_BITS;
use promnorm::pipeline::{Pipeline, PipelineLimits};
use promnorm::wire::proto::prometheus as pb;

fn pipeline(extra: &str) -> Pipeline {
    let cfg = Config::parse(&format!("listen: 127.0.0.1:0\n{extra}"), "t.yaml").unwrap();
    Pipeline::new(
        Arc::new(cfg.compile_rules().unwrap()),
        PipelineLimits::default(),
    )
}

fn run(p: &Pipeline, req: &pb::WriteRequest) -> pb::WriteRequest {
    let mut ws = p.take_workspace();
    p.process(&mut ws, &encode(req)).unwrap();
    decode(ws.compressed())
}

/// As [`run`], on the pipeline's pooled workspace: requests run one after another reuse
/// one mapper (and its caches).
fn run_pooled(p: &Pipeline, req: &pb::WriteRequest) -> pb::WriteRequest {
    let mut ws = p.workspace();
    p.process(&mut ws, &encode(req)).unwrap();
    decode(ws.compressed())
}

fn name_of(ts: &pb::TimeSeries) -> &str {
    ts.labels
        .iter()
        .find(|l| l.name == "__name__")
        .map(|l| l.value.as_str())
        .unwrap_or("")
}

fn find<'a>(r: &'a pb::WriteRequest, name: &str) -> Vec<&'a pb::TimeSeries> {
    r.timeseries.iter().filter(|t| name_of(t) == name).collect()
}

fn stale() -> f64 {
    f64::from_bits(STALE_NAN_BITS)
}

#[test]
fn stale_markers_pass_every_rule_kind_bit_for_bit() {
    let p = pipeline("");
    let inputs: Vec<(&[(&str, &str)], &str)> = vec![
        (
            &[("__name__", "vllm:gpu_cache_usage_perc"), ("engine", "0")],
            "vllm:kv_cache_usage_perc",
        ),
        (
            &[("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0")],
            "DCGM_FI_DEV_GPU_UTIL_ratio",
        ),
        (
            &[
                ("__name__", "sglang:kv_transfer_latency_ms_bucket"),
                ("le", "100.0"),
                ("tp_rank", "0"),
            ],
            "sglang:kv_transfer_latency_seconds_bucket",
        ),
        (
            &[
                ("__name__", "vllm:kv_offload_total_bytes_total"),
                ("transfer_type", "CPU_to_GPU"),
            ],
            "vllm:kv_offload_load_bytes_total",
        ),
        (
            &[("__name__", "sglang:prompt_tokens_total"), ("tp_rank", "0")],
            "sglang:prompt_tokens_total",
        ),
        (
            &[("__name__", "mooncake_transfer_read_bytes")],
            "mooncake_transfer_read_bytes_total",
        ),
        (
            &[("__name__", "DCGM_FI_DEV_GPU_TEMP"), ("Hostname", "h")],
            "DCGM_FI_DEV_GPU_TEMP",
        ),
    ];
    let req = pb::WriteRequest {
        timeseries: inputs
            .iter()
            .map(|(l, _)| series(l, &[(50.0, 1000), (stale(), 2000), (100.0, 3000)]))
            .collect(),
        metadata: vec![],
    };
    let out = run(&p, &req);
    for (_, want) in &inputs {
        let got = find(&out, want);
        assert_eq!(got.len(), 1, "{want} present once: {out:?}");
        let s = &got[0].samples;
        assert_eq!(s.len(), 3, "{want}");
        assert_eq!(
            s[1].value.to_bits(),
            STALE_NAN_BITS,
            "{want}: stale marker bits"
        );
        assert_eq!(
            s.iter().map(|x| x.timestamp).collect::<Vec<_>>(),
            [1000, 2000, 3000],
            "{want}: order"
        );
    }
    let util = &find(&out, "DCGM_FI_DEV_GPU_UTIL_ratio")[0].samples;
    assert_eq!((util[0].value, util[2].value), (0.5, 1.0));
    let bucket = find(&out, "sglang:kv_transfer_latency_seconds_bucket")[0];
    assert!(bucket.labels.contains(&label("le", "0.1")));
    assert_eq!(
        bucket.samples[0].value, 50.0,
        "bucket counts are not rescaled"
    );
}

#[test]
fn dotted_otel_names_land_on_the_exporter_name() {
    let p = pipeline("");
    let shapes = [
        "lmcache_mp.lookup_hit",
        "lmcache_mp.lookup_hit_tokens",
        "lmcache_mp_lookup_hit",
        "lmcache_mp_lookup_hit_total",
        "lmcache_mp_lookup_hit_tokens",
        "lmcache_mp_lookup_hit_tokens_total",
    ];
    for (i, shape) in shapes.iter().enumerate() {
        let req = pb::WriteRequest {
            timeseries: vec![series(
                &[("__name__", shape), ("model_name", "m")],
                &[(i as f64, 1000)],
            )],
            metadata: vec![],
        };
        let out = run(&p, &req);
        assert_eq!(
            name_of(&out.timeseries[0]),
            "lmcache_mp_lookup_hit_tokens_total",
            "{shape}"
        );
        assert_eq!(out.timeseries[0].samples[0].value, i as f64);
    }
}

#[test]
fn exemplars_are_rescaled_with_their_histogram() {
    let p = pipeline("");
    let mut ts = series(
        &[
            ("__name__", "dynamo_frontend_tokenizer_latency_ms_bucket"),
            ("le", "5"),
        ],
        &[(3.0, 1000)],
    );
    ts.exemplars.push(pb::Exemplar {
        labels: vec![label("trace_id", "t1")],
        value: 2.5,
        timestamp: 999,
    });
    let out = run(
        &p,
        &pb::WriteRequest {
            timeseries: vec![ts],
            metadata: vec![],
        },
    );
    let got = &out.timeseries[0];
    assert_eq!(
        name_of(got),
        "dynamo_frontend_tokenizer_latency_seconds_bucket"
    );
    assert!(got.labels.contains(&label("le", "0.005")));
    assert_eq!(got.samples[0].value, 3.0);
    assert_eq!(got.exemplars[0].value, 0.0025);
    assert_eq!(got.exemplars[0].labels, vec![label("trace_id", "t1")]);
}

#[test]
fn keep_original_dual_writes() {
    let p = pipeline("keep_original: true\n");
    let req = pb::WriteRequest {
        timeseries: vec![series(
            &[("__name__", "DCGM_FI_DEV_FB_USED"), ("gpu", "0")],
            &[(2.0, 1000)],
        )],
        metadata: vec![],
    };
    let out = run(&p, &req);
    assert_eq!(find(&out, "DCGM_FI_DEV_FB_USED")[0].samples[0].value, 2.0);
    assert_eq!(
        find(&out, "DCGM_FI_DEV_FB_USED_bytes")[0].samples[0].value,
        2.0 * 1_048_576.0
    );
    // Per pack override.
    let p = pipeline("keep_original: true\npacks:\n  keep_original: {dcgm: false}\n");
    let out = run(&p, &req);
    assert!(find(&out, "DCGM_FI_DEV_FB_USED").is_empty());
}

#[test]
fn metadata_follows_its_family_and_is_reunited() {
    let p = pipeline("");
    let md = |name: &str, t: i32| pb::MetricMetadata {
        r#type: t,
        metric_family_name: name.into(),
        help: "h".into(),
        unit: String::new(),
    };
    let req = pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![
            md("sglang:kv_transfer_latency_ms", 3),
            md("vllm:gpu_prefix_cache_hits_total", 1),
            md("vllm:prefix_cache_hits_total", 1),
            md("vllm:prompt_tokens_created", 2),
            md("unrelated_metric", 2),
        ],
    };
    let out = run(&p, &req);
    let names: Vec<_> = out
        .metadata
        .iter()
        .map(|m| m.metric_family_name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "sglang:kv_transfer_latency_seconds",
            "vllm:prefix_cache_hits_total",
            "unrelated_metric"
        ]
    );
    assert_eq!(out.metadata[0].unit, "seconds");
}

fn metadata(
    name: &str,
    t: pb::metric_metadata::MetricType,
    help: &str,
    unit: &str,
) -> pb::MetricMetadata {
    pb::MetricMetadata {
        r#type: t as i32,
        metric_family_name: name.into(),
        help: help.into(),
        unit: unit.into(),
    }
}

fn metadata_of<'a>(r: &'a pb::WriteRequest, name: &str) -> Vec<&'a pb::MetricMetadata> {
    r.metadata
        .iter()
        .filter(|m| m.metric_family_name == name)
        .collect()
}

#[test]
fn rescaled_metadata_states_the_new_unit() {
    use pb::metric_metadata::MetricType as T;
    let p = pipeline("");
    let req = pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![
            metadata(
                "sglang:kv_transfer_latency_ms",
                T::Histogram,
                "The transfer latency of the KV cache in ms.",
                "milliseconds",
            ),
            metadata(
                "DCGM_FI_DEV_FB_USED",
                T::Gauge,
                "Framebuffer memory used (in MiB).",
                "mebibytes",
            ),
            metadata(
                "DCGM_FI_DEV_GPU_UTIL",
                T::Gauge,
                "GPU utilization (in %).",
                "",
            ),
            metadata(
                "sglang:kv_transfer_total_mb",
                T::Gauge,
                "The total number of tokens transferred in the KV cache.",
                "",
            ),
            // Renamed, not rescaled: HELP and unit stay.
            metadata(
                "vllm:gpu_prefix_cache_hits_total",
                T::Counter,
                "GPU prefix cache hits (in tokens).",
                "tokens",
            ),
        ],
    };
    let out = run(&p, &req);
    let one = |name: &str| {
        let m = metadata_of(&out, name);
        assert_eq!(m.len(), 1, "{name} once: {:?}", out.metadata);
        (m[0].help.clone(), m[0].unit.clone(), m[0].r#type)
    };
    assert_eq!(
        one("sglang:kv_transfer_latency_seconds"),
        (
            "The transfer latency of the KV cache in seconds.".into(),
            "seconds".into(),
            T::Histogram as i32
        )
    );
    assert_eq!(
        one("DCGM_FI_DEV_FB_USED_bytes"),
        (
            "Framebuffer memory used (in bytes).".into(),
            "bytes".into(),
            T::Gauge as i32
        )
    );
    assert_eq!(
        one("DCGM_FI_DEV_GPU_UTIL_ratio").0,
        "GPU utilization (as a ratio 0-1)."
    );
    assert_eq!(
        one("sglang:kv_transfer_total_bytes").0,
        "The total number of tokens transferred in the KV cache. \
         (promnorm: rescaled ×2^20 to bytes)"
    );
    assert_eq!(
        one("vllm:prefix_cache_hits_total"),
        (
            "GPU prefix cache hits (in tokens).".into(),
            "tokens".into(),
            T::Counter as i32
        )
    );
}

#[test]
fn user_rescales_without_a_unit_get_one_from_the_name_or_none() {
    use pb::metric_metadata::MetricType as T;
    let dir = std::env::temp_dir().join(format!("promnorm-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("mine.yaml"),
        "pack: mine\nrules:\n  - match: {family: wait_ms}\n    rename: wait_seconds\n    scale: 1/1000\n  - match: {family: depth}\n    rename: depth_scaled\n    scale: 3/2\n  - match: {family: lat}\n    rename: lat_new\n    scale: 1/1000\n    unit: seconds\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("cfg.yaml"),
        "listen: 127.0.0.1:0\npacks:\n  builtin: none\n  files: [mine.yaml]\n",
    )
    .unwrap();
    let cfg = Config::load(&dir.join("cfg.yaml")).unwrap();
    let p = Pipeline::new(Arc::new(cfg.validate().unwrap()), PipelineLimits::default());
    let out = run(
        &p,
        &pb::WriteRequest {
            timeseries: vec![],
            metadata: vec![
                metadata(
                    "wait_ms",
                    T::Gauge,
                    "Wait (in milliseconds)",
                    "milliseconds",
                ),
                metadata("depth", T::Gauge, "Queue depth", "items"),
                metadata("lat", T::Gauge, "Latency in ms", ""),
            ],
        },
    );
    let m = metadata_of(&out, "wait_seconds");
    assert_eq!(
        (m[0].help.as_str(), m[0].unit.as_str()),
        ("Wait (in seconds)", "seconds")
    );
    let m = metadata_of(&out, "depth_scaled");
    assert_eq!(
        (m[0].help.as_str(), m[0].unit.as_str()),
        ("Queue depth (promnorm: rescaled ×3/2)", ""),
        "a unit the name does not state is no longer known"
    );
    let m = metadata_of(&out, "lat_new");
    assert_eq!(
        (m[0].help.as_str(), m[0].unit.as_str()),
        ("Latency in seconds", "seconds"),
        "the rule's unit when the name states none"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn split_families_get_metadata_and_the_replaced_one_goes() {
    use pb::metric_metadata::MetricType as T;
    let help = "Number of bytes transferred by KV offloading";
    let req = pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![metadata(
            "vllm:kv_offload_total_bytes_total",
            T::Counter,
            help,
            "bytes",
        )],
    };
    for extra in ["", "keep_original: true\n"] {
        let out = run(&pipeline(extra), &req);
        let got: Vec<_> = out
            .metadata
            .iter()
            .map(|m| {
                (
                    m.metric_family_name.as_str(),
                    m.r#type,
                    m.help.as_str(),
                    m.unit.as_str(),
                )
            })
            .collect();
        // keep_original keeps renamed series only: a split's inputs are not forwarded.
        assert_eq!(
            got,
            [
                (
                    "vllm:kv_offload_load_bytes_total",
                    T::Counter as i32,
                    help,
                    "bytes"
                ),
                (
                    "vllm:kv_offload_store_bytes_total",
                    T::Counter as i32,
                    help,
                    "bytes"
                ),
            ],
            "{extra}"
        );
    }
    // The series agree: nothing is left under the old name.
    let out = run(
        &pipeline(""),
        &pb::WriteRequest {
            timeseries: ["CPU_to_GPU", "GPU_to_CPU"]
                .iter()
                .map(|t| {
                    series(
                        &[
                            ("__name__", "vllm:kv_offload_total_bytes_total"),
                            ("transfer_type", t),
                        ],
                        &[(1.0, 1)],
                    )
                })
                .collect(),
            metadata: req.metadata.clone(),
        },
    );
    assert!(find(&out, "vllm:kv_offload_total_bytes_total").is_empty());
    assert!(metadata_of(&out, "vllm:kv_offload_total_bytes_total").is_empty());
    assert_eq!(
        metadata_of(&out, "vllm:kv_offload_load_bytes_total").len(),
        1
    );
}

#[test]
fn keep_original_keeps_the_original_metadata_too() {
    use pb::metric_metadata::MetricType as T;
    let req = pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![metadata(
            "DCGM_FI_DEV_FB_USED",
            T::Gauge,
            "Framebuffer memory used (in MiB).",
            "",
        )],
    };
    let out = run(&pipeline("keep_original: true\n"), &req);
    let got: Vec<_> = out
        .metadata
        .iter()
        .map(|m| (m.metric_family_name.as_str(), m.help.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
            (
                "DCGM_FI_DEV_FB_USED_bytes",
                "Framebuffer memory used (in bytes)."
            ),
        ]
    );
}

#[test]
fn collisions_merge_in_timestamp_order_without_duplicates() {
    let p = pipeline("");
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[
                    ("__name__", "vllm:gpu_prefix_cache_hits_total"),
                    ("engine", "0"),
                ],
                &[(1.0, 1000), (3.0, 3000)],
            ),
            series(
                &[
                    ("__name__", "vllm:prefix_cache_hits_total"),
                    ("engine", "0"),
                ],
                &[(9.0, 1000), (2.0, 2000)],
            ),
        ],
        metadata: vec![],
    };
    let mut ws = p.take_workspace();
    p.process(&mut ws, &encode(&req)).unwrap();
    let stats = p.stats(&ws).clone();
    let out = decode(ws.compressed());
    let got = find(&out, "vllm:prefix_cache_hits_total");
    assert_eq!(got.len(), 1);
    let s: Vec<_> = got[0]
        .samples
        .iter()
        .map(|x| (x.timestamp, x.value))
        .collect();
    assert_eq!(
        s,
        [(1000, 1.0), (2000, 2.0), (3000, 3.0)],
        "first sample kept for a repeated timestamp"
    );
    assert_eq!(stats.collisions, 1);
    assert_eq!(stats.dropped_total(), 1, "the duplicate is counted");
}

#[test]
fn drops_are_counted_by_reason() {
    let p = pipeline("");
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[("__name__", "sglang:prompt_tokens_total"), ("tp_rank", "1")],
                &[(1.0, 1), (2.0, 2)],
            ),
            series(&[("__name__", "vllm:prompt_tokens_created")], &[(1.0, 1)]),
        ],
        metadata: vec![],
    };
    let mut ws = p.take_workspace();
    let r = p.process(&mut ws, &encode(&req)).unwrap();
    assert!(r.empty, "nothing left to forward");
    let stats = p.stats(&ws);
    let reasons = p.rules().reasons();
    let by = |name: &str| stats.dropped[reasons.iter().position(|r| r == name).unwrap()];
    assert_eq!(by("tp_rank_dedup"), 2);
    assert_eq!(by("created_series"), 1);
}

#[test]
fn user_mapping_files_and_conflicts() {
    let dir = std::env::temp_dir().join(format!("promnorm-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("mine.yaml"),
        "pack: mine\nrules:\n  - match: {family: old_queue_depth, labels: {env: prod}}\n    rename: queue_depth\n    rename_labels: {svc: service}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("cfg.yaml"),
        "listen: 127.0.0.1:0\npacks:\n  builtin: none\n  files: [mine.yaml]\n",
    )
    .unwrap();
    let cfg = Config::load(&dir.join("cfg.yaml")).unwrap();
    let p = Pipeline::new(Arc::new(cfg.validate().unwrap()), PipelineLimits::default());
    let out = run(
        &p,
        &pb::WriteRequest {
            timeseries: vec![
                series(
                    &[
                        ("__name__", "old_queue_depth"),
                        ("env", "prod"),
                        ("svc", "a"),
                    ],
                    &[(1.0, 1)],
                ),
                series(
                    &[
                        ("__name__", "old_queue_depth"),
                        ("env", "dev"),
                        ("svc", "a"),
                    ],
                    &[(1.0, 1)],
                ),
            ],
            metadata: vec![],
        },
    );
    assert_eq!(
        find(&out, "queue_depth")[0].labels,
        vec![
            label("__name__", "queue_depth"),
            label("env", "prod"),
            label("service", "a")
        ]
    );
    assert_eq!(
        find(&out, "old_queue_depth").len(),
        1,
        "matcher-limited rule leaves dev alone"
    );

    // Two packs renaming different families onto one name without matchers: rejected.
    std::fs::write(
        dir.join("a.yaml"),
        "pack: a\nrules:\n  - match: {family: x1}\n    rename: y\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        "pack: b\nrules:\n  - match: {family: x2}\n    rename: y\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("bad.yaml"),
        "listen: 127.0.0.1:0\npacks:\n  builtin: none\n  files: [a.yaml, b.yaml]\n",
    )
    .unwrap();
    let err = Config::load(&dir.join("bad.yaml"))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("conflict"), "{err}");
    // Errors name the file and position.
    std::fs::write(
        dir.join("c.yaml"),
        "pack: c\nrules:\n  - match: {family: x}\n    renam: y\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("bad2.yaml"),
        "listen: 127.0.0.1:0\npacks:\n  files: [c.yaml]\n",
    )
    .unwrap();
    let err = Config::load(&dir.join("bad2.yaml"))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("c.yaml:4:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn counter_metadata(family: &str) -> pb::MetricMetadata {
    pb::MetricMetadata {
        r#type: pb::metric_metadata::MetricType::Counter as i32,
        metric_family_name: family.into(),
        help: "h".into(),
        unit: String::new(),
    }
}

#[test]
fn counter_metadata_gives_unknown_families_total_across_requests() {
    let cfg = Config::parse("listen: 127.0.0.1:0\nmetadata_total_fix: true\n", "t.yaml").unwrap();
    let p = cfg.pipeline().unwrap();
    let samples = |ts| pb::WriteRequest {
        timeseries: vec![
            series(&[("__name__", "acme_requests"), ("job", "x")], &[(5.0, ts)]),
            series(
                &[("__name__", "acme_temperature"), ("job", "x")],
                &[(20.0, ts)],
            ),
            // A family a pack knows is left to the pack (Mooncake adds its own _total).
            series(
                &[("__name__", "mooncake_transfer_read_bytes"), ("job", "x")],
                &[(1.0, ts)],
            ),
        ],
        metadata: vec![],
    };
    // Before any metadata: unknown families pass unchanged.
    let out = run(&p, &samples(1000));
    assert_eq!(find(&out, "acme_requests").len(), 1);
    // Prometheus sends metadata in requests of its own.
    let md = pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![
            counter_metadata("acme_requests"),
            pb::MetricMetadata {
                r#type: pb::metric_metadata::MetricType::Gauge as i32,
                ..counter_metadata("acme_temperature")
            },
            counter_metadata("mooncake_transfer_read_bytes"),
        ],
    };
    let out = run(&p, &md);
    assert_eq!(out.metadata.len(), 3, "metadata itself forwarded");
    assert_eq!(
        p.counter_families().unwrap().len(),
        1,
        "only the unknown counter learnt"
    );
    let out = run(&p, &samples(2000));
    let fixed = find(&out, "acme_requests_total");
    assert_eq!(fixed.len(), 1, "{out:?}");
    assert_eq!(fixed[0].samples[0].value, 5.0);
    assert!(find(&out, "acme_requests").is_empty());
    assert_eq!(find(&out, "acme_temperature").len(), 1, "gauges untouched");
    assert_eq!(find(&out, "mooncake_transfer_read_bytes_total").len(), 1);

    // Off by default: the same metadata changes nothing.
    let p = pipeline("");
    run(&p, &md);
    assert!(p.counter_families().is_none());
    assert_eq!(find(&run(&p, &samples(3000)), "acme_requests").len(), 1);
}

#[test]
fn lmcache_worker_dedup_example_is_a_working_user_rule() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lmcache-worker-dedup.yaml");
    let cfg = Config::parse(
        &format!(
            "listen: 127.0.0.1:0\npacks:\n  files: [{}]\n",
            example.display()
        ),
        "t.yaml",
    )
    .unwrap();
    let p = cfg.pipeline().unwrap();
    let mut timeseries = Vec::new();
    for worker in ["0", "1", "2", "3"] {
        for name in [
            "lmcache:num_hit_tokens_total",
            "lmcache:num_remote_read_bytes_total",
        ] {
            timeseries.push(series(
                &[
                    ("__name__", name),
                    ("model_name", "m"),
                    ("worker_id", worker),
                ],
                &[(100.0, 1000)],
            ));
        }
    }
    let mut ws = p.take_workspace();
    p.process(
        &mut ws,
        &encode(&pb::WriteRequest {
            timeseries,
            metadata: vec![],
        }),
    )
    .unwrap();
    let out = decode(ws.compressed());
    let hits = find(&out, "lmcache:num_hit_tokens_total");
    assert_eq!(hits.len(), 1, "logical counter kept once");
    assert!(
        hits[0]
            .labels
            .iter()
            .any(|l| l.name == "worker_id" && l.value == "0")
    );
    assert_eq!(
        find(&out, "lmcache:num_remote_read_bytes_total").len(),
        4,
        "physical kept per worker"
    );
    let stats = p.stats(&ws);
    let reason = p
        .rules()
        .reasons()
        .iter()
        .position(|r| r == "tp_rank_dedup")
        .unwrap();
    assert_eq!(stats.dropped[reason], 3);
}

fn user_pack_pipeline(tag: &str, pack: &str, builtin: &str) -> Result<Pipeline, String> {
    let dir = std::env::temp_dir().join(format!("promnorm-rules-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mine.yaml"), pack).unwrap();
    std::fs::write(
        dir.join("cfg.yaml"),
        format!("listen: 127.0.0.1:0\npacks:\n  builtin: {builtin}\n  files: [mine.yaml]\n"),
    )
    .unwrap();
    let rules = Config::load(&dir.join("cfg.yaml"))
        .map_err(|e| e.to_string())
        .and_then(|c| c.validate().map_err(|e| e.to_string()));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Pipeline::new(Arc::new(rules?), PipelineLimits::default()))
}

/// A rule's `help:` replaces the forwarded HELP of the family it writes (and of a copy,
/// the copy's only), rescaled or not; without it the input's HELP goes on.
#[test]
fn rule_help_replaces_the_forwarded_help() {
    use pb::metric_metadata::MetricType as T;
    let pack = "pack: mine
rules:
  - match: {family: q_ms}
    type: gauge
    rename: q_seconds
    scale: 1/1000
    help: Queue wait.
  - match: {family: depth}
    type: gauge
    rename: depth_items
    help: Items queued.
  - match: {family: depth_items}
    type: gauge
    copy: true
    rename: backlog_items
    help: Backlog.
  - match: {family: plain}
    type: gauge
    rename: plain2
";
    let p = user_pack_pipeline("help", pack, "none").unwrap_or_else(|e| panic!("{e}"));
    let out = run(
        &p,
        &pb::WriteRequest {
            timeseries: vec![],
            metadata: vec![
                metadata("q_ms", T::Gauge, "Queue wait in ms", ""),
                metadata("depth", T::Gauge, "d", ""),
                metadata("plain", T::Gauge, "p", ""),
            ],
        },
    );
    let help = |n: &str| metadata_of(&out, n).first().map(|m| m.help.clone());
    assert_eq!(help("q_seconds").as_deref(), Some("Queue wait."));
    assert_eq!(help("depth_items").as_deref(), Some("Items queued."));
    assert_eq!(help("backlog_items").as_deref(), Some("Backlog."));
    assert_eq!(help("plain2").as_deref(), Some("p"));
}

#[test]
fn copy_rules_add_a_series_beside_the_original() {
    let pack = "pack: mine
rules:
  - match: {family: q_ms}
    type: gauge
    rename: q_seconds
    scale: 1/1000
  - match: {family: q_seconds, labels: {env: prod}}
    type: gauge
    copy: true
    rename: queue_seconds
    unit: seconds
    rename_labels: {svc: service}
    set_labels: {view: neutral}
";
    let p = user_pack_pipeline("copy", pack, "none").unwrap();
    let out = run(
        &p,
        &pb::WriteRequest {
            timeseries: vec![
                series(
                    &[("__name__", "q_ms"), ("env", "prod"), ("svc", "a")],
                    &[(1500.0, 1), (stale(), 2)],
                ),
                series(
                    &[("__name__", "q_ms"), ("env", "dev"), ("svc", "a")],
                    &[(500.0, 1)],
                ),
            ],
            metadata: vec![metadata(
                "q_ms",
                pb::metric_metadata::MetricType::Gauge,
                "queue in ms",
                "",
            )],
        },
    );
    // The series goes on as the other rules leave it (rescaled), both label sets.
    let own = find(&out, "q_seconds");
    assert_eq!(own.len(), 2);
    assert!(find(&out, "q_ms").is_empty());
    // The copy is made from the rescaled series, only where the labels match.
    let copy = find(&out, "queue_seconds");
    assert_eq!(copy.len(), 1, "env=dev is not copied");
    assert_eq!(
        copy[0].labels,
        vec![
            label("__name__", "queue_seconds"),
            label("env", "prod"),
            label("service", "a"),
            label("view", "neutral"),
        ]
    );
    assert_eq!(copy[0].samples[0].value, 1.5);
    assert_eq!(
        copy[0].samples[1].value.to_bits(),
        STALE_NAN_BITS,
        "stale markers are copied bit for bit"
    );
    // Metadata: the series' own (rescaled) and the copy's, with the copy rule's unit.
    assert_eq!(metadata_of(&out, "q_seconds").len(), 1);
    let m = metadata_of(&out, "queue_seconds");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].unit, "seconds");
    assert_eq!(m[0].help, "queue in seconds");
}

#[test]
fn copy_rules_are_checked() {
    for (pack, why) in [
        (
            "pack: m\nrules:\n  - match: {family: x}\n    copy: true\n    set_labels: {a: b}\n",
            "needs rename",
        ),
        (
            "pack: m\nrules:\n  - match: {family: x}\n    copy: true\n    rename: y\n    drop: no\n",
            "cannot drop",
        ),
        (
            "pack: m\nrules:\n  - match: {family: x}\n    copy: true\n    rename: y\n    split_by_label: {label: l, names: {a: z}}\n",
            "split_by_label",
        ),
        ("pack: m\ndefault: maybe\n", "on or off"),
    ] {
        let err = user_pack_pipeline("copycheck", pack, "none")
            .err()
            .unwrap_or_else(|| panic!("accepted: {pack}"));
        assert!(err.contains(why), "{pack}: {err}");
    }
    // A copy landing on a name another pack writes is a conflict like any rename.
    let clash = "pack: m\nrules:\n  - match: {family: my_latency_seconds}\n    type: histogram\n    rename: gen_ai_server_request_duration_seconds\n";
    let err = user_pack_pipeline("copyclash", clash, "{genai: true}")
        .err()
        .expect("conflict");
    assert!(err.contains("conflict"), "{err}");
    assert!(user_pack_pipeline("copyclash2", clash, "all").is_ok());
}

#[test]
fn genai_copies_carry_metadata_beside_the_engine_family() {
    let p = pipeline("packs:\n  builtin: {genai: true}\n");
    use pb::metric_metadata::MetricType;
    let out = run(
        &p,
        &pb::WriteRequest {
            timeseries: vec![],
            metadata: vec![
                metadata(
                    "vllm:e2e_request_latency_seconds",
                    MetricType::Histogram,
                    "e2e",
                    "",
                ),
                metadata(
                    "vllm:time_per_output_token_seconds",
                    MetricType::Histogram,
                    "tpot",
                    "",
                ),
                metadata("vllm:prompt_tokens", MetricType::Counter, "prompt", ""),
                metadata(
                    "vllm:generation_tokens",
                    MetricType::Counter,
                    "generation",
                    "",
                ),
            ],
        },
    );
    let names: Vec<_> = out
        .metadata
        .iter()
        .map(|m| m.metric_family_name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "vllm:e2e_request_latency_seconds",
            "gen_ai_server_request_duration_seconds",
            "vllm:inter_token_latency_seconds",
            "gen_ai_server_time_per_output_token_seconds",
            "vllm:prompt_tokens",
            "gen_ai_server_tokens_total",
            // The input and output token copies share one family: its metadata once.
            "vllm:generation_tokens",
        ]
    );
    assert_eq!(out.metadata[1].unit, "seconds");
    // The conventions' description, not the engine's HELP; the token counter, not in
    // the conventions, says it is promnorm's.
    assert_eq!(
        out.metadata[1].help,
        "Generative AI server request duration such as time-to-last byte or last output token."
    );
    assert_eq!(
        out.metadata[2].help, "tpot",
        "the engine family's own, untouched"
    );
    assert!(
        out.metadata[5]
            .help
            .starts_with("promnorm extension, not an OpenTelemetry GenAI"),
        "{}",
        out.metadata[5].help
    );
}

/// A split value with its own `type`, `scale` and `unit` (the TensorRT-LLM Triton
/// backend packs sub-metrics and their units into one label): each value's series get
/// that value's factor and name, its metadata that type and unit; plain-name values and
/// unlisted values are as before.
#[test]
fn split_values_carry_their_own_scale_type_and_unit() {
    use pb::metric_metadata::MetricType as T;
    let pack = r#"pack: mine
rules:
  - match: {family: packed}
    type: gauge
    split_by_label:
      label: kind
      names:
        fraction: {name: packed_usage, unit: ratio}
        counter: {name: packed_iterations, type: counter}
        stamp_us: {name: packed_timestamp_seconds, scale: 1/1000000, unit: seconds}
        plain: packed_plain
  - match: {family: packed_c}
    type: counter
    split_by_label:
      label: kind
      names:
        a: c_a
        ms: {name: c_seconds, scale: 1/1000}
"#;
    let p = user_pack_pipeline("split-extras", pack, "none").unwrap();
    let req = pb::WriteRequest {
        timeseries: ["fraction", "counter", "stamp_us", "plain", "other"]
            .iter()
            .map(|k| series(&[("__name__", "packed"), ("kind", k)], &[(1500.0, 1)]))
            .collect(),
        metadata: vec![metadata("packed", T::Gauge, "Packed metrics", "")],
    };
    let mut req = req;
    // A counter family written without `_total`: the split names win over the `_total` fix.
    for k in ["a", "ms", "other"] {
        req.timeseries.push(series(
            &[("__name__", "packed_c"), ("kind", k)],
            &[(1500.0, 1)],
        ));
    }
    let out = run(&p, &req);
    let value = |name: &str| {
        let s = find(&out, name);
        assert_eq!(s.len(), 1, "{name}: {:?}", out.timeseries);
        assert!(s[0].labels.iter().all(|l| l.name != "kind"), "{name}");
        s[0].samples[0].value
    };
    assert_eq!(value("packed_usage"), 1500.0);
    assert_eq!(value("packed_iterations_total"), 1500.0);
    assert_eq!(value("packed_timestamp_seconds"), 0.0015);
    assert_eq!(value("packed_plain"), 1500.0);
    assert_eq!(
        find(&out, "packed").len(),
        1,
        "an unlisted value keeps the name"
    );
    assert_eq!(value("c_a_total"), 1500.0);
    assert_eq!(value("c_seconds_total"), 1.5);
    assert_eq!(
        find(&out, "packed_c_total").len(),
        1,
        "unlisted: the _total fix"
    );
    let md = |name: &str| {
        let m = metadata_of(&out, name);
        assert_eq!(m.len(), 1, "{name}: {:?}", out.metadata);
        (m[0].r#type, m[0].unit.clone())
    };
    assert_eq!(md("packed_usage"), (T::Gauge as i32, "ratio".into()));
    assert_eq!(
        md("packed_iterations_total"),
        (T::Counter as i32, "".into())
    );
    assert_eq!(
        md("packed_timestamp_seconds"),
        (T::Gauge as i32, "seconds".into())
    );
    assert_eq!(md("packed_plain"), (T::Gauge as i32, "".into()));
    // A bad factor on one value is an error naming it.
    let bad = pack.replace("1/1000000", "\"0.5\"");
    let err = user_pack_pipeline("split-bad", &bad, "none").err().unwrap();
    assert!(err.contains("stamp_us"), "{err}");
}

/// A series arriving under a name that an exact rule writes gets the prefix and regex
/// rules that match that name too (before: only the collision merge): dcgm's Hostname
/// rename on an already-rescaled name, SGLang's rank dedup on a migration's target name.
#[test]
fn names_rules_write_still_get_pattern_rules() {
    let p = pipeline("");
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[
                    ("__name__", "DCGM_FI_DEV_FB_USED_bytes"),
                    ("Hostname", "h1"),
                ],
                &[(1.0, 1)],
            ),
            series(
                &[
                    ("__name__", "sglang:num_prefill_inflight_queue_reqs"),
                    ("tp_rank", "1"),
                ],
                &[(1.0, 1)],
            ),
        ],
        metadata: vec![],
    };
    let out = run(&p, &req);
    let dcgm = find(&out, "DCGM_FI_DEV_FB_USED_bytes");
    assert_eq!(dcgm.len(), 1);
    assert!(
        dcgm[0].labels.iter().any(|l| l.name == "hostname"),
        "{:?}",
        dcgm[0].labels
    );
    assert!(
        find(&out, "sglang:num_prefill_inflight_queue_reqs").is_empty(),
        "a logical family's tp_rank=1 is deduplicated"
    );
}

/// A name too long for the mapper's caches (over 1 KiB) gets its prefix rules all the
/// same, request after request on one mapper: it is resolved each time, not cached.
#[test]
fn names_too_long_to_cache_still_get_their_rules() {
    let p = pipeline("");
    let long = format!("DCGM_FI_CUSTOM_{}", "x".repeat(2_000));
    for round in 0..3 {
        let req = pb::WriteRequest {
            timeseries: vec![series(
                &[("__name__", &long), ("Hostname", "h1")],
                &[(1.0, 1 + round)],
            )],
            metadata: vec![],
        };
        let out = run_pooled(&p, &req);
        let got = find(&out, &long);
        assert_eq!(got.len(), 1, "round {round}");
        assert!(
            got[0].labels.iter().any(|l| l.name == "hostname"),
            "round {round}: {:?}",
            got[0].labels.iter().map(|l| &l.name).collect::<Vec<_>>()
        );
    }
    // Long names beside cached ones in one request: each series gets its own name's
    // resolution, whichever came before it.
    let long2 = format!("DCGM_FI_OTHER_{}", "y".repeat(2_000));
    let names = [
        &long,
        &long,
        "DCGM_FI_DEV_FB_USED",
        &long2,
        "unrelated_metric",
        &long,
    ];
    let req = pb::WriteRequest {
        timeseries: names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                series(
                    &[("__name__", n), ("Hostname", &format!("h{i}"))],
                    &[(1.0, 9)],
                )
            })
            .collect(),
        metadata: vec![],
    };
    let out = run_pooled(&p, &req);
    assert_eq!(find(&out, &long).len(), 3);
    assert_eq!(find(&out, &long2).len(), 1);
    assert_eq!(find(&out, "DCGM_FI_DEV_FB_USED_bytes").len(), 1);
    for t in &out.timeseries {
        let renamed = name_of(t) != "unrelated_metric";
        assert_eq!(
            t.labels.iter().any(|l| l.name == "hostname"),
            renamed,
            "{}",
            name_of(t).chars().take(30).collect::<String>()
        );
    }
}

/// Every rename and family of the built-in packs gets a slot of its own: the byte bound
/// on a slot's texts (names of 64 KiB share `other`) is far above what they need.
#[test]
fn built_in_packs_fit_the_cut_over_slots() {
    use promnorm::mapping::renames::{OTHER, SLOT_TEXT_BYTES};
    let p = pipeline("packs:\n  builtin: all\n");
    for tracker in [p.rules().renames(), p.rules().families()] {
        let snap = tracker.snapshot();
        assert!(!snap.is_empty());
        for s in snap {
            assert_ne!(s.from, OTHER);
            let len = s.from.len() + s.to.len() + s.rule.len();
            assert!(len * 4 < SLOT_TEXT_BYTES, "{len}: {}", s.rule);
        }
    }
}

/// `has_labels` (SGLang's priority breakdown): the rule applies to the series carrying
/// the label with a value, in the pipeline and in the migrate rewriter; the totals,
/// without it (or with it empty), stay in the family.
#[test]
fn has_labels_rules_apply_to_series_that_carry_the_label() {
    let p = pipeline("");
    let t = 1_700_000_000_000;
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[("__name__", "sglang:num_running_reqs"), ("tp_rank", "0")],
                &[(6.0, t)],
            ),
            series(
                &[
                    ("__name__", "sglang:num_running_reqs"),
                    ("priority", "2"),
                    ("tp_rank", "0"),
                ],
                &[(4.0, t)],
            ),
            series(
                &[
                    ("__name__", "sglang:num_queue_reqs"),
                    ("priority", ""),
                    ("tp_rank", "0"),
                ],
                &[(1.0, t)],
            ),
        ],
        metadata: vec![],
    };
    let out = run(&p, &req);
    let totals = find(&out, "sglang:num_running_reqs");
    assert_eq!(totals.len(), 1, "{out:?}");
    assert_eq!(totals[0].samples[0].value, 6.0);
    let by = find(&out, "sglang:num_running_reqs_by_priority");
    assert_eq!(by.len(), 1, "{out:?}");
    assert_eq!(by[0].samples[0].value, 4.0);
    assert!(
        by[0]
            .labels
            .iter()
            .any(|l| l.name == "priority" && l.value == "2")
    );
    // An empty label is no label: a total.
    assert_eq!(find(&out, "sglang:num_queue_reqs").len(), 1, "{out:?}");
    assert!(find(&out, "sglang:num_queue_reqs_by_priority").is_empty());

    let rules = Config::parse("", "default")
        .unwrap()
        .compile_rules()
        .unwrap();
    let rw = promnorm::migrate::QueryRewriter::new(&rules, false);
    for (query, want) in [
        (
            r#"sglang:num_running_reqs{priority="2"}"#,
            Some(r#"sglang:num_running_reqs_by_priority{priority="2"}"#),
        ),
        (
            r#"sglang:num_running_reqs{priority!=""}"#,
            Some(r#"sglang:num_running_reqs_by_priority{priority!=""}"#),
        ),
        (r#"sglang:num_running_reqs{priority=""}"#, None),
    ] {
        let r = rw.rewrite(query);
        let label_dependent = |r: &promnorm::migrate::Rewritten| {
            r.findings
                .iter()
                .any(|f| f.reason == promnorm::migrate::Reason::LabelDependent)
        };
        assert!(!label_dependent(&r), "{query}: {:?}", r.findings);
        match want {
            Some(w) => assert_eq!(r.query, w, "{query}"),
            None => assert!(!r.changed, "{query}: {}", r.query),
        }
    }
    // Without a priority matcher the query reads both cases, each as the rules write it.
    let r = rw.rewrite("sglang:num_running_reqs");
    assert_eq!(
        r.query,
        r#"(sglang:num_running_reqs_by_priority{priority!=""} or sglang:num_running_reqs{priority=""})"#
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.reason == promnorm::migrate::Reason::CasesJoined),
        "{r:?}"
    );
}

/// A series a plan only filters (SGLang's rank dedup keeps `tp_rank="0"`) leaves as its
/// own bytes; series whose labels a rule rewrites (DCGM's `Hostname` → `hostname`) still
/// merge with a series already carrying the new label set, as before.
#[test]
fn filtered_series_pass_as_they_came_and_relabelled_ones_still_merge() {
    let p = pipeline("");
    let kept = series(
        &[
            ("__name__", "sglang:num_running_reqs"),
            ("model_name", "m"),
            ("tp_rank", "0"),
        ],
        &[(7.0, 1000)],
    );
    let req = pb::WriteRequest {
        timeseries: vec![
            kept.clone(),
            series(
                &[
                    ("__name__", "sglang:num_running_reqs"),
                    ("model_name", "m"),
                    ("tp_rank", "1"),
                ],
                &[(7.0, 1000)],
            ),
            series(
                &[
                    ("Hostname", "h"),
                    ("__name__", "DCGM_FI_DEV_GPU_TEMP"),
                    ("gpu", "0"),
                ],
                &[(40.0, 1000), (41.0, 3000)],
            ),
            series(
                &[
                    ("__name__", "DCGM_FI_DEV_GPU_TEMP"),
                    ("gpu", "0"),
                    ("hostname", "h"),
                ],
                &[(40.0, 1000), (42.0, 2000)],
            ),
        ],
        metadata: vec![],
    };
    let mut ws = p.take_workspace();
    p.process(&mut ws, &encode(&req)).unwrap();
    let stats = p.stats(&ws).clone();
    let out = decode(ws.compressed());
    assert_eq!(
        find(&out, "sglang:num_running_reqs"),
        [&kept],
        "rank 0 as it came"
    );
    let temp = find(&out, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temp.len(), 1, "one label set, one series: {out:?}");
    let names: Vec<_> = temp[0].labels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["__name__", "gpu", "hostname"]);
    let s: Vec<_> = temp[0]
        .samples
        .iter()
        .map(|x| (x.timestamp, x.value))
        .collect();
    assert_eq!(s, [(1000, 40.0), (2000, 42.0), (3000, 41.0)]);
    assert_eq!(stats.collisions, 1);
}

/// Label renames and added labels are sorted into place, a renamed label loses to one
/// already carrying its new name, and labels the rules left alone are copied as they came
/// (the output is checked by decoding, whatever path wrote it).
#[test]
fn relabelled_series_come_out_sorted_and_unique() {
    let p = user_pack_pipeline(
        "relabel-sort",
        r#"
pack: mine
rules:
  - match: {family: m_seconds}
    rename_labels: {Zone: a_zone, Old: keep}
    set_labels: {b_added: "1"}
"#,
        "none",
    )
    .unwrap();
    let req = pb::WriteRequest {
        timeseries: vec![series(
            &[
                ("Old", "loser"),
                ("Zone", "z"),
                ("__name__", "m_seconds"),
                ("c", "3"),
                ("keep", "winner"),
            ],
            &[(1.0, 1000)],
        )],
        metadata: vec![],
    };
    let out = run(&p, &req);
    let got = find(&out, "m_seconds");
    assert_eq!(got.len(), 1, "{out:?}");
    let labels: Vec<_> = got[0]
        .labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            ("__name__", "m_seconds"),
            ("a_zone", "z"),
            ("b_added", "1"),
            ("c", "3"),
            ("keep", "winner"),
        ]
    );
}

/// A name another rule renames onto merges with the renamed series even when its own
/// plan only filters (it is never written as its own bytes beside them).
#[test]
fn a_filtered_name_that_a_rename_writes_still_merges() {
    let p = user_pack_pipeline(
        "filtered-output",
        r#"
pack: mine
rules:
  - match: {family: old_depth}
    rename: new_depth
  - match: {family: new_depth, labels: {env: dev}}
    drop: dev_series
"#,
        "none",
    )
    .unwrap();
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[("__name__", "new_depth"), ("env", "prod")],
                &[(1.0, 1000)],
            ),
            series(
                &[("__name__", "old_depth"), ("env", "prod")],
                &[(2.0, 2000)],
            ),
            series(&[("__name__", "new_depth"), ("env", "dev")], &[(3.0, 1000)]),
        ],
        metadata: vec![],
    };
    let out = run(&p, &req);
    let got = find(&out, "new_depth");
    assert_eq!(got.len(), 1, "{out:?}");
    let s: Vec<_> = got[0]
        .samples
        .iter()
        .map(|x| (x.timestamp, x.value))
        .collect();
    assert_eq!(s, [(1000, 1.0), (2000, 2.0)]);
}

/// Rescaled bucket bounds keep their family's float style and factor, and a bound met
/// again (the next series, the next request on the same mapper: its cache of rescaled
/// bounds) comes out the same: `0.5` MiB is `524288` beside Go's `1`, `524288.0` beside Python's `1.0` (and
/// 1 MiB is Go's `1.048576e+06`, as `strconv.FormatFloat(v, 'g', -1, 64)` writes it).
#[test]
fn rescaled_bounds_keep_their_familys_style_request_after_request() {
    let pack = "pack: mine
rules:
  - match: {family: go_mib}
    type: histogram
    rename: go_bytes
    scale: \"1048576\"
  - match: {family: py_mib}
    type: histogram
    rename: py_bytes
    scale: \"1048576\"
  - match: {family: go_kib}
    type: histogram
    rename: go_kib_bytes
    scale: \"1024\"
";
    let p = user_pack_pipeline("le-style", pack, "none").unwrap_or_else(|e| panic!("{e}"));
    let bucket = |family: &str, instance: &str, le: &str| {
        series(
            &[
                ("__name__", &format!("{family}_bucket")),
                ("instance", instance),
                ("le", le),
            ],
            &[(1.0, 1_000)],
        )
    };
    let request = pb::WriteRequest {
        timeseries: ["a", "b"]
            .iter()
            .flat_map(|i| {
                [
                    bucket("go_mib", i, "0.5"),
                    bucket("go_mib", i, "1"),
                    bucket("go_mib", i, "+Inf"),
                    bucket("py_mib", i, "0.5"),
                    bucket("py_mib", i, "1.0"),
                    bucket("py_mib", i, "+Inf"),
                    bucket("go_kib", i, "0.5"),
                    bucket("go_kib", i, "1"),
                    bucket("go_kib", i, "+Inf"),
                ]
            })
            .collect(),
        metadata: vec![],
    };
    let bounds = |out: &pb::WriteRequest, name: &str| -> Vec<String> {
        find(out, name)
            .iter()
            .map(|t| {
                t.labels
                    .iter()
                    .find(|l| l.name == "le")
                    .map(|l| l.value.clone())
                    .unwrap_or_default()
            })
            .collect()
    };
    for round in 0..2 {
        let out = run_pooled(&p, &request);
        assert_eq!(
            bounds(&out, "go_bytes_bucket"),
            [
                "524288",
                "1.048576e+06",
                "+Inf",
                "524288",
                "1.048576e+06",
                "+Inf"
            ],
            "round {round}"
        );
        assert_eq!(
            bounds(&out, "py_bytes_bucket"),
            [
                "524288.0",
                "1048576.0",
                "+Inf",
                "524288.0",
                "1048576.0",
                "+Inf"
            ],
            "round {round}"
        );
        assert_eq!(
            bounds(&out, "go_kib_bytes_bucket"),
            ["512", "1024", "+Inf", "512", "1024", "+Inf"],
            "round {round}"
        );
    }
}

/// `q_mib` rescaled to `q_bytes` (×2^20), by a user pack.
fn q_mib_pipeline(tag: &str) -> Pipeline {
    let pack = "pack: mine
rules:
  - match: {family: q_mib}
    type: histogram
    rename: q_bytes
    scale: \"1048576\"
";
    user_pack_pipeline(tag, pack, "none").unwrap_or_else(|e| panic!("{e}"))
}

/// `q_mib_bucket` series: every bound in `bounds` for each of `instances` instances.
fn q_mib_buckets(instances: usize, bounds: &[&str]) -> pb::WriteRequest {
    pb::WriteRequest {
        timeseries: (0..instances)
            .flat_map(|i| {
                bounds.iter().map(move |le| {
                    series(
                        &[
                            ("__name__", "q_mib_bucket"),
                            ("instance", &format!("i{i}")),
                            ("le", le),
                        ],
                        &[(1.0, 1_000)],
                    )
                })
            })
            .collect(),
        metadata: vec![],
    }
}

/// A family whose bounds show no style in a request (`0.5`, `+Inf`) is written Go's way
/// in that request, every series of it alike; a later request that shows Python's
/// (`1.0`) writes it Python's way.
#[test]
fn bounds_without_style_evidence_are_gos_until_a_request_shows_otherwise() {
    let p = q_mib_pipeline("le-unproven");
    let halves = |out: &pb::WriteRequest| -> Vec<String> {
        find(out, "q_bytes_bucket")
            .iter()
            .filter_map(|t| t.labels.iter().find(|l| l.name == "le"))
            .map(|l| l.value.clone())
            .filter(|v| v.starts_with("524288"))
            .collect()
    };
    // One mapper for both requests: what the first learnt must not decide the second.
    let out = run_pooled(&p, &q_mib_buckets(50, &["0.5", "+Inf"]));
    assert_eq!(halves(&out), vec!["524288".to_string(); 50]);
    let out = run_pooled(&p, &q_mib_buckets(50, &["0.5", "1.0", "+Inf"]));
    assert_eq!(halves(&out), vec!["524288.0".to_string(); 50]);
}

/// A request of one family whose bounds never show a style is scanned for evidence once,
/// not once per series: 20,000 such series took 18 s to map when each one scanned the
/// whole request, 64 ms now (a deadline that only the quadratic scan misses).
#[test]
fn a_family_without_style_evidence_is_scanned_once_per_request() {
    let p = q_mib_pipeline("le-once");
    let request = q_mib_buckets(20_000, &["0.5"]);
    let started = std::time::Instant::now();
    let out = run(&p, &request);
    let took = started.elapsed();
    assert_eq!(find(&out, "q_bytes_bucket").len(), 20_000);
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
}

/// The labels the rules may edit, which routing cannot read off the input: every label a
/// rule renames (from and to), maps a value of, splits on, sets or drops; `le` when a
/// rule rescales (bucket bounds); `__name__` always.
#[test]
fn the_labels_rules_edit_are_listed() {
    let dir = std::env::temp_dir().join(format!("promnorm-edited-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let compile = |pack: &str| {
        std::fs::write(dir.join("p.yaml"), pack).unwrap();
        std::fs::write(
            dir.join("cfg.yaml"),
            "listen: 127.0.0.1:0\npacks:\n  builtin: none\n  files: [p.yaml]\n",
        )
        .unwrap();
        let cfg = Config::load(&dir.join("cfg.yaml")).unwrap();
        let p = Pipeline::new(Arc::new(cfg.validate().unwrap()), PipelineLimits::default());
        p.rules()
            .edited_labels()
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        compile("pack: p\nrules:\n  - match: {family: a}\n    rename: b\n"),
        ["__name__"]
    );
    // `le` for a split value's own factor too.
    assert_eq!(
        compile(
            "pack: p\nrules:\n  - match: {family: lat}\n    split_by_label: {label: u, names: {ms: {name: lat_seconds, scale: 1/1000}}}\n"
        ),
        ["__name__", "le", "u"]
    );
    assert_eq!(
        compile(
            "pack: p\nrules:\n  - match: {family: a}\n    rename_labels: {svc: service}\n    label_values: {stage: {old: new}}\n    set_labels: {team: infra}\n    drop_labels: [pod_uid]\n  - match: {family: c}\n    split_by_label: {label: direction, names: {in: rx, out: tx}}\n  - match: {family: d_ms}\n    rename: d_seconds\n    scale: 1/1000\n"
        ),
        [
            "__name__",
            "__unit__",
            "direction",
            "le",
            "pod_uid",
            "service",
            "stage",
            "svc",
            "team"
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
