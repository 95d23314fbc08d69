//! Golden tests as data. Two shapes under `tests/golden/`:
//! - `NAME.prom`: one scrape of text exposition, normalised with the embedded default
//!   configuration, must equal `NAME.out` (the `dump-*` cases are real exporter dumps,
//!   also scraped by the end-to-end test);
//! - `NAME/`: several scrapes `1.prom`, `2.prom`, ... taken 15 s apart, with an optional
//!   `config.yaml`, must equal `NAME/expected.out` (derived series need several scrapes).
//! - `NAME/` with a `dumps` file instead of scrapes: the single-scrape cases it lists (one
//!   file name of `tests/golden/` a line), each normalised on its own with
//!   `NAME/config.yaml`; `NAME/expected.out` holds their outputs, each after a line
//!   `# FILE`. The same dumps under another configuration, without copying them.
//!
//! - `metadata/NAME.prom`: one scrape whose `# HELP`/`# TYPE` lines become remote-write
//!   metadata; the metadata forwarded must equal `metadata/NAME.out` (`# TYPE`, `# UNIT`
//!   when set, `# HELP` per family, in output order).
//!
//! `UPDATE_GOLDEN=1` rewrites the expected files; review the diff before committing.

use promnorm::app::Assemble;
use std::path::{Path, PathBuf};

use promnorm::config::Config;
use promnorm::normalize::Protocols;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn run_case(config: &Config, scrapes: &[PathBuf]) -> String {
    run_case_with(config, scrapes, Protocols::default())
}

/// A case through the given remote-write versions (sender's and backend's).
fn run_case_with(config: &Config, scrapes: &[PathBuf], protocols: Protocols) -> String {
    let pipeline = config.pipeline().expect("configuration is valid");
    let inputs: Vec<(String, String)> = scrapes
        .iter()
        .map(|p| (p.display().to_string(), std::fs::read_to_string(p).unwrap()))
        .collect();
    promnorm::normalize::normalize_with(&pipeline, &inputs, 15_000, protocols)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The dumps listed in `list` (names in `tests/golden/`), each normalised on its own.
fn dump_list(list: &Path) -> Vec<String> {
    std::fs::read_to_string(list)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

fn run_dumps(config: &Config, list: &Path, protocols: Protocols) -> String {
    let mut out = String::new();
    for f in dump_list(list) {
        out += &format!("# {f}\n");
        out += &run_case_with(config, &[golden_dir().join(&f)], protocols);
    }
    out
}

/// One sample per series and timestamp: what a backend accepts (renames that land two
/// inputs on one series must merge them, e.g. llm-d's deprecated twins).
fn no_duplicate_samples(case: &Path, got: &str, failures: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    for l in got.lines().filter(|l| !l.starts_with('#')) {
        let (series, rest) = l.rsplit_once(' ').map_or((l, ""), |(a, ts)| (a, ts));
        let key = (series.rsplit_once(' ').map_or(series, |(s, _)| s), rest);
        if !seen.insert(key) {
            failures.push(format!("{}: two samples for {key:?}", case.display()));
        }
    }
}

fn check(expected: &Path, got: &str, failures: &mut Vec<String>) {
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(expected, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(expected)
        .unwrap_or_else(|_| panic!("{} missing", expected.display()));
    if got != want {
        failures.push(format!(
            "{}:\n--- want\n{want}--- got\n{got}",
            expected.display()
        ));
    }
}

#[test]
fn golden_files() {
    golden_files_with(Protocols::default());
}

/// Every golden case sent as 2.0 and read at a 1.0 backend, sent as 1.0 and read at a
/// 2.0 backend, and 2.0 end to end: the same expected output, derived series included.
#[test]
fn golden_files_through_remote_write_2_0() {
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        return; // the expected files are written from 1.0 only
    }
    for (input_v2, output_v2) in [(true, false), (false, true), (true, true)] {
        golden_files_with(Protocols {
            input_v2,
            output_v2,
        });
    }
}

fn golden_files_with(protocols: Protocols) {
    let mut entries: Vec<_> = std::fs::read_dir(golden_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut failures = Vec::new();
    let (mut single, mut multi) = (0, 0);
    for path in &entries {
        if path.ends_with("metadata") {
            continue; // golden_metadata
        }
        if path.is_dir() && path.join("dumps").exists() {
            let config = Config::load(&path.join("config.yaml")).unwrap_or_else(|e| panic!("{e}"));
            let got = run_dumps(&config, &path.join("dumps"), protocols);
            check(&path.join("expected.out"), &got, &mut failures);
            multi += 1;
        } else if path.is_dir() {
            let cfg_path = path.join("config.yaml");
            let config = if cfg_path.exists() {
                Config::load(&cfg_path).unwrap_or_else(|e| panic!("{e}"))
            } else {
                Config::embedded_default()
            };
            let mut scrapes: Vec<PathBuf> = std::fs::read_dir(path)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "prom"))
                .collect();
            scrapes.sort_by_key(|p| {
                p.file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.parse::<u32>().ok())
                    .unwrap_or(u32::MAX)
            });
            assert!(
                scrapes.len() >= 2,
                "{}: needs 1.prom, 2.prom, ...",
                path.display()
            );
            let got = run_case_with(&config, &scrapes, protocols);
            no_duplicate_samples(path, &got, &mut failures);
            check(&path.join("expected.out"), &got, &mut failures);
            multi += 1;
        } else if path.extension().is_some_and(|x| x == "prom") {
            let got = run_case_with(
                &Config::embedded_default(),
                std::slice::from_ref(path),
                protocols,
            );
            no_duplicate_samples(path, &got, &mut failures);
            check(&path.with_extension("out"), &got, &mut failures);
            single += 1;
        }
    }
    assert!(single >= 12 && multi >= 4, "golden cases present");
    assert!(
        failures.is_empty(),
        "{protocols:?}: {}",
        failures.join("\n")
    );
    println!("{single} single-scrape and {multi} multi-scrape golden cases ({protocols:?})");
}

/// The metadata the pipeline forwards for one scrape, as text.
fn metadata_out(config: &Config, scrape: &Path) -> String {
    use promnorm::wire::proto::prometheus as pb;
    use prost::Message;
    let pipeline = config.pipeline().expect("configuration is valid");
    let text = std::fs::read_to_string(scrape).unwrap();
    let parsed = promnorm::exposition::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let raw = promnorm::normalize::scrape_to_request(&parsed, 0).encode_to_vec();
    let mut ws = pipeline.take_workspace();
    pipeline.process_raw(&mut ws, &raw).unwrap();
    let out = pb::WriteRequest::decode(ws.mapped()).unwrap();
    let mut s = String::new();
    for m in &out.metadata {
        let t = pb::metric_metadata::MetricType::try_from(m.r#type)
            .map_or("?".into(), |t| t.as_str_name().to_lowercase());
        let name = &m.metric_family_name;
        s += &format!("# TYPE {name} {t}\n");
        if !m.unit.is_empty() {
            s += &format!("# UNIT {name} {}\n", m.unit);
        }
        s += &format!("# HELP {name} {}\n", m.help);
    }
    s
}

/// Metadata of renamed, rescaled and split families under the embedded default.
#[test]
fn golden_metadata() {
    let dir = golden_dir().join("metadata");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "prom"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 3, "metadata golden cases present");
    let mut failures = Vec::new();
    for case in &cases {
        let got = metadata_out(&Config::embedded_default(), case);
        check(&case.with_extension("out"), &got, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The value of the first output line named `name` whose labels contain `fragment`.
fn value_of(out: &str, name: &str, fragment: &str) -> f64 {
    out.lines()
        .find(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(fragment))
        .and_then(|l| l.rsplit(' ').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} with {fragment} in output"))
}

fn names(out: &str) -> std::collections::BTreeSet<&str> {
    out.lines()
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect()
}

/// The renames, factors and drops of docs/rules.md on the families of the real dumps.
#[test]
fn real_dumps_get_the_spec_treatment() {
    let dir = golden_dir();
    let run = |f: &str| run_case(&Config::embedded_default(), &[dir.join(f)]);

    let dcgm = run("dump-dcgm-exporter-datadog-fixture-2931c10.prom");
    let host = r#"hostname="424773df46e0""#;
    assert_eq!(
        value_of(&dcgm, "DCGM_FI_DEV_FB_FREE_bytes", host),
        15109.0 * 1048576.0
    );
    assert_eq!(
        value_of(
            &dcgm,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_joules_total",
            host
        ),
        128996.013
    );
    assert_eq!(value_of(&dcgm, "DCGM_FI_DEV_SM_CLOCK_hertz", host), 300e6);
    assert_eq!(value_of(&dcgm, "DCGM_FI_DEV_POWER_USAGE", host), 8.969);
    assert!(!dcgm.contains("Hostname="), "Hostname renamed to hostname");
    let n = names(&dcgm);
    for gone in [
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_SM_CLOCK",
    ] {
        assert!(!n.contains(gone), "{gone} left under its old name");
    }

    let sglang = run("dump-sglang-0.5.7to0.5.9-dynamo-a7b23c0.prom");
    let n = names(&sglang);
    for want in [
        "sglang:kv_transfer_latency_seconds",
        "sglang:kv_transfer_speed_bytes_per_second",
        "dynamo_component_kvstats_gpu_cache_usage_ratio",
    ] {
        assert!(n.contains(want), "{want} missing");
    }
    for gone in [
        "sglang:kv_transfer_latency_ms",
        "sglang:kv_transfer_speed_gb_s",
        "dynamo_component_kvstats_gpu_cache_usage_percent",
    ] {
        assert!(!n.contains(gone), "{gone} left under its old name");
    }

    let vllm = run("dump-vllm-0.13to0.17-lmcache-dynamo-a7b23c0.prom");
    let input =
        std::fs::read_to_string(dir.join("dump-vllm-0.13to0.17-lmcache-dynamo-a7b23c0.prom"))
            .unwrap();
    assert!(input.contains("_created"), "the dump has _created series");
    assert!(!vllm.contains("_created"), "_created series dropped");
    assert!(names(&vllm).contains("vllm:kv_cache_usage_perc"));
}

fn genai_config() -> Config {
    Config::load(&golden_dir().join("genai/config.yaml")).unwrap_or_else(|e| panic!("{e}"))
}

/// With `genai` on, every engine series comes out exactly as without it (the `.out` of
/// each dump), and the `gen_ai_*` copies come beside them with the labels of the pack.
#[test]
fn genai_adds_copies_and_leaves_the_engine_series_alone() {
    let dir = golden_dir();
    let cfg = genai_config();
    let dumps = dump_list(&dir.join("genai/dumps"));
    assert!(dumps.len() >= 4, "genai/dumps lists the engine dumps");
    for f in &dumps {
        let with = run_case(&cfg, &[dir.join(f)]);
        let engine: String = with
            .lines()
            .filter(|l| !l.starts_with("gen_ai_"))
            .map(|l| format!("{l}\n"))
            .collect();
        let without = std::fs::read_to_string(dir.join(f).with_extension("out")).unwrap();
        assert_eq!(engine, without, "{f}: engine series changed by genai");
        let copies: Vec<&str> = with.lines().filter(|l| l.starts_with("gen_ai_")).collect();
        assert!(!copies.is_empty(), "{f}: no gen_ai_* series");
        for l in &copies {
            assert!(l.contains("gen_ai_request_model=\""), "{f}: {l}");
            assert!(l.contains("inference_engine=\""), "{f}: {l}");
            assert!(
                !l.contains("model_name=") && !l.contains(",model="),
                "{f}: {l}"
            );
        }
    }

    let run = |f: &str| run_case(&cfg, &[dir.join(f)]);
    let vllm = run("dump-vllm-0.13to0.17-lmcache-dynamo-a7b23c0.prom");
    let model = r#"gen_ai_request_model="Qwen/Qwen3-0.6B""#;
    let vllm_e = r#"engine="0","#;
    assert_eq!(
        value_of(
            &vllm,
            "gen_ai_server_tokens_total",
            r#"gen_ai_token_type="input""#
        ),
        66.0
    );
    assert_eq!(
        value_of(
            &vllm,
            "gen_ai_server_tokens_total",
            r#"gen_ai_token_type="output""#
        ),
        600.0
    );
    assert_eq!(
        value_of(
            &vllm,
            "vllm:inter_token_latency_seconds_count",
            "model_name="
        ),
        value_of(
            &vllm,
            "gen_ai_server_time_per_output_token_seconds_count",
            model
        )
    );
    // The conventions' required attributes on every copy (tests/it/genai_spec.rs checks all).
    let vllm_attrs = r#"gen_ai_operation_name="chat",gen_ai_provider_name="vllm","#;
    assert!(vllm.contains(&format!(
        "gen_ai_server_request_duration_seconds_count{{{vllm_e}{vllm_attrs}{model},inference_engine=\"vllm\"}}"
    )));

    let sglang = run("dump-sglang-0.5.7to0.5.9-dynamo-a7b23c0.prom");
    assert_eq!(
        value_of(
            &sglang,
            "gen_ai_server_tokens_total",
            r#"gen_ai_token_type="output""#
        ),
        300.0
    );
    assert!(sglang.contains(r#"gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name="chat",gen_ai_provider_name="sglang",gen_ai_request_model="Qwen/Qwen3-0.6B",inference_engine="sglang"} 1 "#));

    let dynamo = run("dump-dynamo-frontend-ce30a76.prom");
    assert!(dynamo.contains(r#"gen_ai_server_tokens_total{gen_ai_operation_name="chat",gen_ai_provider_name="dynamo",gen_ai_request_model="qwen/qwen3-0.6b",gen_ai_token_type="output",inference_engine="dynamo"} 300 "#));
    assert!(
        !dynamo.contains(r#"gen_ai_token_type="input",inference_engine="dynamo""#),
        "the Dynamo frontend has no input token counter"
    );
    assert_eq!(
        value_of(
            &dynamo,
            "gen_ai_server_request_duration_seconds_sum",
            "dynamo"
        ),
        2.177646729
    );

    // An old vLLM: time_per_output_token is migrated by the vllm pack, then copied.
    let old = run("vllm.prom");
    let n = names(&old);
    assert!(n.contains("vllm:inter_token_latency_seconds_bucket"));
    assert!(!n.contains("vllm:time_per_output_token_seconds_bucket"));
    assert!(n.contains("gen_ai_server_time_per_output_token_seconds_bucket"));
}

/// `genai` is off by default, under `builtin: all` and in a map that does not name it.
#[test]
fn builtin_all_leaves_genai_off() {
    let dump = golden_dir().join("dump-vllm-0.13to0.17-lmcache-dynamo-a7b23c0.prom");
    for text in [
        "",
        "packs:\n  builtin: all\n",
        "packs:\n  builtin: {vllm: true, dcgm: false}\n",
        "packs:\n  builtin: {genai: false}\n",
    ] {
        let cfg = Config::parse(text, "t.yaml").unwrap();
        let out = run_case(&cfg, std::slice::from_ref(&dump));
        assert!(!out.contains("gen_ai_"), "{text:?}: genai is on");
        assert!(out.contains("vllm:e2e_request_latency_seconds_count"));
    }
    let cfg = Config::parse("packs:\n  builtin: {genai: true}\n", "t.yaml").unwrap();
    assert!(run_case(&cfg, &[dump]).contains("gen_ai_server_request_duration_seconds_count"));
}

/// Drops of one scrape of `case` (its `N.prom`) under `config`, by reason.
fn drops(config: &Config, scrape: &Path) -> std::collections::BTreeMap<String, u64> {
    use prost::Message;
    let pipeline = config.pipeline().expect("configuration is valid");
    let text = std::fs::read_to_string(scrape).unwrap();
    let parsed = promnorm::exposition::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let raw = promnorm::normalize::scrape_to_request(&parsed, 0).encode_to_vec();
    let mut ws = pipeline.take_workspace();
    pipeline.process_raw(&mut ws, &raw).unwrap();
    let stats = pipeline.stats(&ws);
    pipeline
        .rules()
        .reasons()
        .iter()
        .zip(stats.dropped.iter())
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| (r.clone(), *n))
        .collect()
}

/// An llm-d EPP that writes every metric twice: by default the twins whose labels agree
/// are merged and the second sample counted as `duplicate_timestamp`; with `llmd_twins`
/// on, every deprecated twin is dropped before migration, counted under its own reason.
/// An old EPP (deprecated names only) loses nothing by default.
#[test]
fn llmd_twins_are_merged_or_dropped_and_counted() {
    let dir = golden_dir();
    let both = dir.join("llmd/3.prom");
    let legacy_only = dir.join("llmd/2.prom");
    let default = Config::embedded_default();
    let twins = Config::load(&dir.join("llmd_twins/config.yaml")).unwrap();
    // Same-label twins in 3.prom: average_kv_cache_utilization, per_endpoint_queue_size,
    // ready_endpoints and scheduler_attempts_total.
    assert_eq!(
        drops(&default, &both),
        [("duplicate_timestamp".to_string(), 4)].into()
    );
    assert!(drops(&default, &legacy_only).is_empty());
    let text = std::fs::read_to_string(&both).unwrap();
    let legacy_samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("llm_d_epp_") && !l.is_empty())
        .count() as u64;
    assert_eq!(
        drops(&twins, &both),
        [("llmd_deprecated_twin".to_string(), legacy_samples)].into()
    );
    let out = run_case(&twins, &[both]);
    assert!(out.lines().all(|l| l.starts_with("llm_d_epp_")), "{out}");
    assert!(!out.contains("fairness_id=\"\"") && !out.contains("{model_name=\"food-review\"}"));
}
