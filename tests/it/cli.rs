//! The command line as users run it: `explain`, `normalize` over several scrapes,
//! `check-config` errors.

use std::process::Command;

fn promnorm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(args)
        .output()
        .expect("run promnorm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tmp(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("promnorm-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn explain_names_the_rule_and_the_derived_series_it_feeds() {
    let (ok, out, err) = promnorm(&["explain", "vllm:gpu_prefix_cache_hits_total"]);
    assert!(ok, "{err}");
    assert!(out.contains("→ vllm:prefix_cache_hits_total"), "{out}");
    assert!(
        out.contains("feeds derived series vllm:prefix_cache_hit_ratio (numerator)"),
        "{out}"
    );
}

#[test]
fn explain_a_histogram_family_name_shows_its_series() {
    let (ok, out, err) = promnorm(&["explain", "vllm:model_forward_time_milliseconds"]);
    assert!(ok, "{err}");
    assert!(!out.contains("no rule applies"), "{out}");
    for want in [
        "vllm:model_forward_time_milliseconds_bucket:",
        "le values ÷1000 (bucket counts unchanged) → vllm:model_forward_time_seconds_bucket",
        "values ÷1000 → vllm:model_forward_time_seconds_sum",
        "a count: not rescaled → vllm:model_forward_time_seconds_count",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
}

#[test]
fn explain_shows_exact_factors_and_le_values() {
    for (query, want) in [
        (
            "DCGM_FI_DEV_FB_USED",
            "values ×2^20 → DCGM_FI_DEV_FB_USED_bytes",
        ),
        ("port_rcv_data", "values ×4 → port_rcv_data_bytes_total"),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "values ÷100 → DCGM_FI_DEV_GPU_UTIL_ratio",
        ),
        (
            "mooncake_transfer_get_latency_sum",
            "values ÷10^6 → mooncake_transfer_get_latency_seconds_sum",
        ),
        (
            r#"vllm:model_forward_time_milliseconds_bucket{le="2.5"}"#,
            r#"result: vllm:model_forward_time_seconds_bucket{le="0.0025"} (le values ÷1000)"#,
        ),
    ] {
        let (ok, out, err) = promnorm(&["explain", query]);
        assert!(ok, "{err}");
        assert!(out.contains(want), "{query}: {want:?} in {out}");
    }
}

/// The new engines' packs through `explain`: a split value's own factor and type, a
/// deprecated llm-d name, Ray's prefix and missing `_total`, a TGI histogram family.
#[test]
fn explain_covers_the_new_engine_packs() {
    for (query, want) in [
        (
            r#"nv_trt_llm_general_metrics{general_type="timestamp",model="m"}"#,
            r#"result: nv_trt_llm_timestamp_seconds{model="m"} (values ÷10^6)"#,
        ),
        (
            r#"nv_trt_llm_general_metrics{general_type="iteration_counter"}"#,
            "result: nv_trt_llm_iterations_total",
        ),
        (
            r#"nv_trt_llm_disaggregated_serving_metrics{disaggregated_serving_type="kv_cache_transfer_ms"}"#,
            "result: nv_trt_llm_kv_cache_transfer_seconds_total (values ÷1000)",
        ),
        (
            "nv_inference_request_duration_us",
            "values ÷10^6 → nv_inference_request_duration_seconds_total",
        ),
        ("inference_pool_ready_pods", "→ llm_d_epp_ready_endpoints"),
        ("inference_model_request_total", "→ llm_d_epp_request_total"),
        ("ray_vllm:prompt_tokens", "→ vllm:prompt_tokens_total"),
        (
            "ray_vllm_num_requests_running",
            "→ vllm:num_requests_running",
        ),
        (
            "trtllm:e2e_request_latency_seconds_bucket",
            "→ trtllm_e2e_request_latency_seconds_bucket",
        ),
        (
            "tgi_request_duration",
            "→ tgi_request_duration_seconds_bucket",
        ),
        ("tgi_request_count", "→ tgi_request_count_total"),
        (
            "llamacpp:prompt_tokens_seconds",
            "→ llamacpp:prompt_tokens_per_second",
        ),
        (
            "lmdeploy:gpu_cache_usage_perc",
            "→ lmdeploy:kv_cache_usage_ratio",
        ),
        (
            "sglang:prefetch_bandwidth_sum",
            "values ×2^30 → sglang:prefetch_bandwidth_bytes_per_second_sum",
        ),
    ] {
        let (ok, out, err) = promnorm(&["explain", query]);
        assert!(ok, "{err}");
        assert!(out.contains(want), "{query}: {want:?} in {out}");
    }
}

#[test]
fn explain_decides_label_dependent_rules_with_the_selector_labels() {
    let mine = tmp(
        "mine.yaml",
        "pack: mine\nrules:\n  - match: {family: old_queue_depth, labels: {env: prod}}\n    rename: queue_depth\n",
    );
    let cfg = tmp(
        "explain.yaml",
        &format!("listen: 127.0.0.1:9201\npacks:\n  files: [{mine}]\n"),
    );
    for (query, want) in [
        (
            r#"sglang:num_running_reqs{tp_rank="1"}"#,
            "result: dropped (tp_rank_dedup)",
        ),
        (
            r#"sglang:num_running_reqs{tp_rank="0"}"#,
            r#"result: sglang:num_running_reqs{tp_rank="0"}"#,
        ),
        // has_labels: SGLang's per-priority breakdown leaves the totals' family.
        (
            r#"sglang:num_running_reqs{priority="1",tp_rank="0"}"#,
            r#"result: sglang:num_running_reqs_by_priority{priority="1",tp_rank="0"}"#,
        ),
        (
            r#"vllm:kv_offload_total_bytes_total{engine="0",transfer_type="GPU_to_CPU"}"#,
            r#"result: vllm:kv_offload_store_bytes_total{engine="0"}"#,
        ),
        (
            r#"DCGM_FI_DEV_GPU_UTIL{Hostname="h"}"#,
            r#"result: DCGM_FI_DEV_GPU_UTIL_ratio{hostname="h"} (values ÷100)"#,
        ),
        (
            r#"old_queue_depth{env="prod"}"#,
            r#"result: queue_depth{env="prod"}"#,
        ),
        (
            r#"old_queue_depth{env="dev"}"#,
            r#"result: old_queue_depth{env="dev"}"#,
        ),
    ] {
        let (ok, out, err) = promnorm(&["explain", "--config", &cfg, query]);
        assert!(ok, "{err}");
        assert!(out.contains(want), "{query}: {want:?} in {out}");
    }
    // Without labels, the label-dependent steps are described.
    let (_, out, _) = promnorm(&["explain", "--config", &cfg, "old_queue_depth"]);
    assert!(
        out.contains(r#"only series with env="prod" → queue_depth"#),
        "{out}"
    );
}

#[test]
fn explain_shows_the_series_and_its_genai_copy() {
    let cfg = tmp(
        "genai.yaml",
        "listen: 127.0.0.1:9201\npacks:\n  builtin: {genai: true}\n",
    );
    // An old vLLM's name: migrated by the vllm pack, then copied by genai.
    let (ok, out, err) = promnorm(&[
        "explain",
        "--config",
        &cfg,
        r#"vllm:time_per_output_token_seconds_bucket{engine="0",model_name="m",le="0.1"}"#,
    ]);
    assert!(ok, "{err}");
    for want in [
        "pack vllm rule 4 (renamed to inter_token_latency (0.11)) → vllm:inter_token_latency_seconds_bucket",
        "→ gen_ai_server_time_per_output_token_seconds_bucket (a copy, beside the series)",
        r#"result: vllm:inter_token_latency_seconds_bucket{engine="0",le="0.1",model_name="m"}"#,
        r#"copy: gen_ai_server_time_per_output_token_seconds_bucket{engine="0",gen_ai_operation_name="chat",gen_ai_provider_name="vllm",gen_ai_request_model="m",inference_engine="vllm",le="0.1"}"#,
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    // A family name: each member series with its copy.
    let (ok, out, err) = promnorm(&[
        "explain",
        "--config",
        &cfg,
        "dynamo_frontend_request_duration_seconds",
    ]);
    assert!(ok, "{err}");
    for want in [
        "dynamo_frontend_request_duration_seconds_bucket:",
        "label model → gen_ai_request_model; sets gen_ai_operation_name=\"chat\"; sets gen_ai_provider_name=\"dynamo\"; sets inference_engine=\"dynamo\" → gen_ai_server_request_duration_seconds_bucket (a copy, beside the series)",
        "→ gen_ai_server_request_duration_seconds_count (a copy, beside the series)",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    // The configured values of the required attributes (packs.genai).
    let cfg = tmp(
        "genai-options.yaml",
        "listen: 127.0.0.1:9201\npacks:\n  builtin: {genai: true}\n  genai:\n    operation_name: text_completion\n    provider_names: {dynamo: edge}\n",
    );
    let (ok, out, err) = promnorm(&[
        "explain",
        "--config",
        &cfg,
        r#"dynamo_frontend_request_duration_seconds_count{model="m"}"#,
    ]);
    assert!(ok, "{err}");
    let want = r#"copy: gen_ai_server_request_duration_seconds_count{gen_ai_operation_name="text_completion",gen_ai_provider_name="edge",gen_ai_request_model="m",inference_engine="dynamo"}"#;
    assert!(out.contains(want), "{want:?} in {out}");
    // Off by default: no copy.
    let (ok, out, _) = promnorm(&["explain", "dynamo_frontend_request_duration_seconds_count"]);
    assert!(ok);
    assert!(out.contains("no rule applies"), "{out}");
}

#[test]
fn explain_rejects_empty_and_invalid_names() {
    for query in [
        "",
        "9lives",
        "a-b",
        "x{",
        "x}",
        "x{a=1}",
        r#"x{a="1" b="2"}"#,
        r#"x{a!="1"}"#,
        r#"{a="1"}"#,
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_promnorm"))
            .args(["explain", query])
            .output()
            .expect("run promnorm");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{query:?}: {err}");
        assert!(out.stdout.is_empty(), "{query:?}");
        assert!(
            err.contains("invalid series name or selector"),
            "{query:?}: {err}"
        );
    }
}

#[test]
fn normalize_prints_derived_series_across_scrapes() {
    let l = r#"{engine="0",model_name="m"}"#;
    let a = tmp(
        "a.prom",
        &format!("vllm:prefix_cache_hits_total{l} 10\nvllm:prefix_cache_queries_total{l} 100\n"),
    );
    let b = tmp(
        "b.prom",
        &format!("vllm:prefix_cache_hits_total{l} 40\nvllm:prefix_cache_queries_total{l} 200\n"),
    );
    let (ok, out, err) = promnorm(&["normalize", "--interval", "30s", &a, &b]);
    assert!(ok, "{err}");
    assert!(
        out.lines().any(|line| line
            == r#"vllm:prefix_cache_hit_ratio{engine="0",model_name="m"} 0.3 1700000030000"#),
        "{out}"
    );
}

#[test]
fn check_config_rejects_an_unknown_gpu() {
    let cfg = tmp(
        "c.yaml",
        "listen: 127.0.0.1:9201\nderived:\n  peaks:\n    - match: {model_name: x}\n      gpu: A10G\n",
    );
    let (ok, _, err) = promnorm(&["check-config", &cfg]);
    assert!(!ok);
    assert!(err.contains("unknown gpu \"A10G\""), "{err}");
    assert!(err.contains("H100-SXM"), "lists the known models: {err}");
}

#[test]
fn rules_prints_recording_rules_for_the_configured_peaks_and_refuses_bad_input() {
    let cfg = tmp(
        "rules.yaml",
        "derived:\n  enabled: false\n  window: 2m\n  peaks:\n    - match: {model_name: x}\n      gpu: H100\n",
    );
    let (ok, out, err) = promnorm(&["rules", "--config", &cfg, "--interval", "30s"]);
    assert!(ok, "{err}");
    assert!(out.contains("- name: promnorm-derived"), "{out}");
    assert!(out.contains("interval: 30s"), "{out}");
    assert!(
        out.contains(
            "expr: rate(vllm:estimated_flops_per_gpu_total{model_name=\"x\"}[2m]) / 9.89e14"
        ),
        "derived.window is the default window, the peak a selector and a constant: {out}"
    );
    for bad in [
        &["rules", "--window", "soon"][..],
        &["rules", "--window", "0s"],
        &["rules", "--sum-family", "sglang:num_running_reqs"],
    ] {
        let (ok, _, err) = promnorm(bad);
        assert!(!ok && !err.is_empty(), "{bad:?} must fail");
    }
}

/// Issue 26: `promnorm man` is one page that stands alone: every command with its
/// options and the configuration keys, and no reference to pages that do not exist
/// (clap_mangen's default lists `promnorm-serve(1)` and friends).
#[test]
fn the_man_page_has_every_command_and_the_configuration_and_no_missing_pages() {
    let (ok, page, err) = promnorm(&["man"]);
    assert!(ok, "{err}");
    assert!(
        !page.contains("promnorm\\-"),
        "a reference to another page: {page}"
    );
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH COMMANDS",
        ".SH CONFIGURATION",
    ] {
        assert!(page.contains(section), "{section} missing");
    }
    for cmd in [
        "serve",
        "check-config",
        "normalize",
        "explain",
        "rules",
        "healthcheck",
    ] {
        assert!(
            page.contains(&format!(".SS {cmd}\n")),
            "command {cmd} missing"
        );
    }
    for text in [
        "--web.enable-lifecycle",
        "limits.max_inflight_bytes",
        "backends[].url",
    ] {
        assert!(page.contains(text), "{text} missing");
    }
    // No line of text may be taken for a roff request.
    for line in page.lines() {
        assert!(
            !line.starts_with(". ") && !line.starts_with("'"),
            "{line:?}"
        );
    }
}

/// Issue 26: a backend that cannot be connected is said at start (one warning naming
/// the address and the cause, the proxy keeps running), and a request's answer names
/// them too instead of `client error (Connect)`.
#[test]
fn an_unreachable_backend_is_named_at_start_and_in_the_answer() {
    use std::io::{Read, Write};
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (listen, dead) = (free(), free());
    let log = tmp(&format!("unreachable-{listen}.log"), "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{listen}"),
            "--backend",
            &format!("http://127.0.0.1:{dead}/api/v1/write"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut warned = String::new();
    while std::time::Instant::now() < deadline {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text
            .lines()
            .find(|l| l.contains("cannot be connected at start"))
        {
            warned = l.to_string();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // One series, `up 1`, as a 1.0 request.
    let req = {
        use promnorm::wire::proto::prometheus as pb;
        use prost::Message;
        let wr = pb::WriteRequest {
            timeseries: vec![pb::TimeSeries {
                labels: vec![pb::Label {
                    name: "__name__".into(),
                    value: "up".into(),
                }],
                samples: vec![pb::Sample {
                    value: 1.0,
                    timestamp: 1,
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        snap::raw::Encoder::new()
            .compress_vec(&wr.encode_to_vec())
            .unwrap()
    };
    let mut s = std::net::TcpStream::connect(("127.0.0.1", listen)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        s,
        "POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Encoding: snappy\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        req.len()
    )
    .unwrap();
    s.write_all(&req).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let _ = child.kill();
    let _ = child.wait();
    let address = format!("127.0.0.1:{dead}");
    assert!(
        warned.contains(&address),
        "no start-up warning naming {address}: {warned:?}"
    );
    assert!(warned.contains("refused"), "the cause is named: {warned:?}");
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(
        answer.contains(&format!("connecting to {address}")) && answer.contains("refused"),
        "{answer}"
    );
}

#[test]
fn explain_says_what_happens_to_native_histogram_series() {
    let cfg = tmp(
        "native.yaml",
        "backends:\n  - {name: old, url: http://127.0.0.1:1/w}\n  - {name: new, url: http://127.0.0.1:1/w, protocol: v2}\n  - {name: raw, url: http://127.0.0.1:1/w, native_histograms: as_is}\n",
    );
    let (ok, out, err) = promnorm(&[
        "explain",
        "--config",
        &cfg,
        "vllm:model_forward_time_milliseconds",
    ]);
    assert!(ok, "{err}");
    for want in [
        "vllm:model_forward_time_milliseconds (native histogram series; a float series of this name: forwarded unchanged):",
        "native histograms: custom bounds (NHCB) and sum ÷1000 (exact); exponential schemas: re-bucketed",
        "→ vllm:model_forward_time_seconds\n",
        "native histograms with custom buckets (NHCB) of vllm:model_forward_time_seconds, per backend:",
        "old (protocol v1, native_histograms auto): unrolled into vllm:model_forward_time_seconds_bucket{le}",
        "new (protocol v2, native_histograms auto): forwarded as NHCB (2.0)",
        "raw (protocol v1, native_histograms as_is): forwarded as NHCB",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    // A power of two shifts exponential buckets exactly.
    let (ok, out, err) = promnorm(&["explain", "sglang:kv_transfer_total_mb"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("exponential schemas: bucket indices shift by 20·2^schema (exact)"),
        "{out}"
    );
}
