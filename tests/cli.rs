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
