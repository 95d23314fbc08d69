//! `promnorm-payloads` writes the folder the side-by-side benchmark scripts read.

use promnorm::wire::proto::prometheus as pb;
use prost::Message;

fn decode(body: &[u8]) -> pb::WriteRequest {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .expect("snappy block format");
    pb::WriteRequest::decode(raw.as_slice()).expect("a prometheus.WriteRequest")
}

/// `promnorm-payloads` writes the folder the side-by-side scripts read: the bodies, a
/// manifest of absolute paths (wrk's rw.lua) and meta.json (bench_rw.py, latency.sh).
#[test]
fn payload_tool_writes_the_benchmark_folder() {
    let out = std::env::temp_dir().join(format!("promnorm-payloads-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_promnorm-payloads"))
        .args([
            "--count",
            "3",
            "--start-ms",
            "1700000000000",
            "--verify",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("promnorm-payloads runs");
    assert!(status.success());

    let manifest = std::fs::read_to_string(out.join("manifest.txt")).expect("manifest.txt");
    let bodies: Vec<&str> = manifest.lines().collect();
    assert_eq!(bodies.len(), 3);
    for path in &bodies {
        assert!(std::path::Path::new(path).is_absolute(), "{path}");
        let request = decode(&std::fs::read(path).expect("listed body exists"));
        assert_eq!(request.timeseries.len(), 2_000);
    }
    assert!(bodies[0].ends_with("/req-00000.pb.sz"), "{}", bodies[0]);

    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).expect("meta.json"))
            .expect("meta.json is JSON");
    assert_eq!(meta["mode"], "default");
    assert_eq!(meta["count"], 3);
    assert_eq!(meta["samples_per_request"], 2_000);
    assert_eq!(meta["first_ts_ms"], 1_700_000_000_000i64);
    // Every key gen_payloads.py wrote, so readers of either folder work unchanged.
    for key in [
        "mode",
        "count",
        "series_per_request",
        "samples_per_request",
        "fleet_series",
        "fleet_targets",
        "metric_families",
        "rounds",
        "interval_ms",
        "first_ts_ms",
        "last_ts_ms",
        "avg_raw_bytes",
        "avg_snappy_bytes",
        "total_snappy_bytes",
        "seed",
        "vllm_nodes",
        "sglang_nodes",
        "generated_at",
        "gen_seconds",
    ] {
        assert!(meta.get(key).is_some(), "meta.json lacks {key}");
    }
    std::fs::remove_dir_all(&out).expect("clean up");
}
