//! The benchmark harness (`promnorm-bench`, BENCHMARKS.md) end to end but short: its load
//! generator against `promnorm serve` (pass-through) with its null sink, in remote-write
//! 1.0 and 2.0, checking that what the load counted as accepted reached the sink.

use std::path::PathBuf;
use std::process::Command;

/// The proxy's binary: `PROMNORM_BIN`, else the one beside this test's profile directory
/// (`cargo test --workspace` builds it there; it belongs to the `promnorm` package, so
/// Cargo gives this package no `CARGO_BIN_EXE_` for it).
fn promnorm_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PROMNORM_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile.join(format!("promnorm{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with --workspace (or build promnorm first, \
         or set PROMNORM_BIN)",
        bin.display()
    );
    bin
}

fn bench_run(proto: &str, seconds: &str, results: &std::path::Path) -> String {
    let sut = format!(
        "{} serve --config {}/bench/passthrough.yaml --listen 127.0.0.1:{{port}} --backend {{sink_url}}",
        promnorm_bin().display(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/..")
    );
    let out = Command::new(env!("CARGO_BIN_EXE_promnorm-bench"))
        .args([
            "run",
            "--case",
            &format!("smoke-rw{proto}"),
            "--sut-cmd",
            &sut,
        ])
        .args(["--ingest-metric", "promnorm_samples_received_total"])
        .args(["--sent-metric", "promnorm_samples_forwarded_total"])
        .args(["--proto", proto, "--count", "4", "--connections", "2"])
        .args(["--duration", seconds, "--warmup", "0.2", "--runs", "1"])
        // Not pinned: the test machine's CPUs are whatever CI has.
        .args(["--sut-cpu", "", "--load-cpu", ""])
        .arg("--results")
        .arg(results)
        .output()
        .expect("run promnorm-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promnorm-bench failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut v = v;
    for k in path {
        v = &v[*k];
    }
    v.as_f64()
        .unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

#[test]
fn harness_loads_promnorm_and_the_sink_counts_every_sample() {
    let dir = std::env::temp_dir().join(format!("promnorm-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let results = dir.join("results.jsonl");
    let _ = std::fs::remove_file(&results);
    for (proto, seconds) in [("1", "2"), ("2", "1")] {
        let line = bench_run(proto, seconds, &results);
        let r: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
        let ok = num(&r, &["requests_ok"]);
        let per = num(&r, &["samples_per_request"]);
        assert!(ok > 0.0, "no request accepted: {r}");
        assert_eq!(per, 2000.0, "{r}");
        assert_eq!(num(&r, &["non2xx"]) + num(&r, &["errors"]), 0.0, "{r}");
        // Pass-through forwards every sample: promnorm's own ingest counter, its forward
        // counter and the sink agree exactly (requests answered after the window ends
        // are in promnorm's counters and the sink's, not in requests_ok).
        let sink = num(&r, &["sink", "samples"]);
        assert_eq!(num(&r, &["sink", "undecodable"]), 0.0, "{r}");
        assert_eq!(sink, num(&r, &["sut_samples_in"]), "{r}");
        assert_eq!(sink, num(&r, &["sut_samples_sent"]), "{r}");
        assert!(sink >= ok * per, "{r}");
        assert!(num(&r, &["lat_p99_ms"]) > 0.0, "{r}");
        assert!(num(&r, &["sut_cpu_s"]) > 0.0, "{r}");
        assert_eq!(r["proto"], if proto == "1" { "1.0" } else { "2.0" }, "{r}");
        assert_eq!(r["sink_count"], "samples", "{r}");
        // Per second: requests answered by the second they were sent in (every one
        // counted), and the SUT's CPU for each whole second of the window.
        let by_second = r["ok_by_second"].as_array().expect("ok_by_second");
        let counted: f64 = by_second.iter().filter_map(|v| v.as_f64()).sum();
        assert_eq!(counted, ok, "{r}");
        let cpu = r["sut_cpu_cores_by_second"]
            .as_array()
            .expect("sut_cpu_cores_by_second");
        // One entry per whole second of the window, which lasts at least the duration
        // (longer when a request in flight at its end is slow to come back).
        assert!(cpu.len() >= seconds.parse::<usize>().unwrap(), "{r}");
        assert!(
            cpu.iter().all(|c| c.as_f64().is_some_and(|c| c >= 0.0)),
            "{r}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_promnorm-bench"))
        .arg("report")
        .arg(&results)
        .output()
        .expect("run promnorm-bench report");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains("| smoke-rw1 | 2 | 1 |"), "{table}");
    assert!(table.contains("| smoke-rw2 | 2 | 1 |"), "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}
