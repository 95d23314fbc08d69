//! Golden tests as data. Two shapes under `tests/golden/`:
//! - `NAME.prom`: one scrape of text exposition, normalised with the embedded default
//!   configuration, must equal `NAME.out` (the `dump-*` cases are real exporter dumps,
//!   also scraped by the end-to-end test);
//! - `NAME/`: several scrapes `1.prom`, `2.prom`, ... taken 15 s apart, with an optional
//!   `config.yaml`, must equal `NAME/expected.out` (derived series need several scrapes).
//!
//! - `metadata/NAME.prom`: one scrape whose `# HELP`/`# TYPE` lines become remote-write
//!   metadata; the metadata forwarded must equal `metadata/NAME.out` (`# TYPE`, `# UNIT`
//!   when set, `# HELP` per family, in output order).
//!
//! `UPDATE_GOLDEN=1` rewrites the expected files; review the diff before committing.

use promnorm::app::Assemble;
use std::path::{Path, PathBuf};

use promnorm::config::Config;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn run_case(config: &Config, scrapes: &[PathBuf]) -> String {
    let pipeline = config.pipeline().expect("configuration is valid");
    let inputs: Vec<(String, String)> = scrapes
        .iter()
        .map(|p| (p.display().to_string(), std::fs::read_to_string(p).unwrap()))
        .collect();
    promnorm::normalize::normalize(&pipeline, &inputs, 15_000).unwrap_or_else(|e| panic!("{e}"))
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
        if path.is_dir() {
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
            let got = run_case(&config, &scrapes);
            check(&path.join("expected.out"), &got, &mut failures);
            multi += 1;
        } else if path.extension().is_some_and(|x| x == "prom") {
            let got = run_case(&Config::embedded_default(), std::slice::from_ref(path));
            check(&path.with_extension("out"), &got, &mut failures);
            single += 1;
        }
    }
    assert!(single >= 12 && multi >= 4, "golden cases present");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("{single} single-scrape and {multi} multi-scrape golden cases");
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
    let out = pb::WriteRequest::decode(&ws.encoded[..]).unwrap();
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
