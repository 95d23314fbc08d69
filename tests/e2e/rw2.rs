//! End to end with a remote-write 2.0 sender: the test encodes 2.0 requests with the
//! upstream proto (Prometheus 3 is not packaged here) from the real exporter dumps of
//! `tests/golden/`, sends them to promnorm, which forwards to Debian's Prometheus 2.42
//! (a 1.0-only receiver) with `protocol: auto`. Prometheus 2.42 reads a 2.0 body as an
//! empty 1.0 request and answers `204` without the written headers: promnorm must notice,
//! re-send as 1.0 and keep to 1.0; every normalised series must then be queryable with the
//! value the 1.0 path gives.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh sets it); with `PROMNORM_E2E=1` a missing
//! binary fails the test instead of skipping it.

use crate::common;
use crate::common::rw2_support as rw2;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Killed, decode, free_port, get, post, prometheus_bin, start_proxy};
use promnorm::app::Assemble;
use promnorm::config::Config;
use prost::Message;
use rw2::{RW2_HEADERS, encode_v2, v1_to_v2};

type Key = (String, Vec<(String, String)>);

async fn query(receiver: &str, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let q = format!("{{__name__=\"{name}\"}}");
    let mut enc = String::new();
    for b in q.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    let r = get(&format!("{receiver}/api/v1/query?query={enc}")).await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    let mut out = Vec::new();
    for item in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let mut labels: Vec<(String, String)> = item["metric"]
            .as_object()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k != "__name__")
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
            .collect();
        labels.sort();
        let value = item["value"][1]
            .as_str()
            .and_then(promnorm::mapping::number::parse_float)
            .unwrap_or(f64::NAN);
        out.push((labels, value));
    }
    out
}

#[tokio::test]
async fn remote_write_2_0_sender_to_a_1_0_prometheus_through_auto() {
    let Some(prom) = prometheus_bin() else {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!("PROMNORM_E2E=1 but PROMETHEUS_BIN is not set to an existing binary");
        }
        eprintln!("SKIPPED: set PROMETHEUS_BIN (scripts/test.sh does) to run the end-to-end test");
        return;
    };
    let tmp = std::env::temp_dir().join(format!("promnorm-e2e-rw2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let port = free_port();
    std::fs::write(tmp.join("receiver.yml"), "global:\n  scrape_interval: 1m\n").unwrap();
    let log = std::fs::File::create(tmp.join("receiver.log")).unwrap();
    let _receiver = Killed(
        Command::new(&prom)
            .arg(format!(
                "--config.file={}",
                tmp.join("receiver.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start receiver prometheus"),
    );
    let receiver = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && get(&format!("{receiver}/-/ready")).await.status == 200
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let proxy = start_proxy(
        &[],
        &format!(
            "backends:\n  - url: {receiver}/api/v1/write\n    timeout: 5s\n    protocol: auto\n"
        ),
    )
    .await;

    // The dumps as a 2.0 sender sends them, stamped now; the 1.0 path's output is the
    // expectation.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let pipeline = Config::embedded_default().pipeline().unwrap();
    let mut ws = pipeline.take_workspace();
    let mut expected: BTreeMap<Key, f64> = BTreeMap::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let mut sent = 0;
    for f in [
        "dump-vllm-0.13to0.17-lmcache-dynamo-a7b23c0.prom",
        "dcgm.prom",
        "sglang.prom",
    ] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        let mut scrape = promnorm::exposition::parse(&text).unwrap();
        for s in &mut scrape.samples {
            s.timestamp_ms = None;
        }
        let v1 = promnorm::normalize::scrape_to_request(&scrape, now);
        pipeline.process_raw(&mut ws, &v1.encode_to_vec()).unwrap();
        for ts in decode(ws.compressed()).timeseries {
            let mut name = String::new();
            let mut labels = Vec::new();
            for l in ts.labels {
                if l.name == "__name__" {
                    name = l.value;
                } else {
                    labels.push((l.name, l.value));
                }
            }
            labels.sort();
            if let Some(s) = ts.samples.last() {
                expected.insert((name, labels), s.value);
            }
        }
        let r = post(&proxy.url(), encode_v2(&v1_to_v2(&v1)), RW2_HEADERS).await;
        assert_eq!(r.status, 204, "{f}: {}", r.body);
        assert!(
            r.headers
                .contains_key("x-prometheus-remote-write-samples-written"),
            "promnorm confirms to its 2.0 sender"
        );
        sent += 1;
    }
    assert_eq!(sent, 3);
    assert!(expected.len() > 100, "{} series", expected.len());

    let metrics = get(&proxy.url().replace("/api/v1/write", "/metrics")).await;
    assert!(
        metrics
            .body
            .contains("promnorm_backend_remote_write_v1_fallback{backend=\"default\"} 1"),
        "auto noticed the 1.0-only receiver"
    );
    // Every expected series arrived, normalised, with its value.
    let names: std::collections::BTreeSet<&String> = expected.keys().map(|(n, _)| n).collect();
    let mut got: BTreeMap<Key, f64> = BTreeMap::new();
    for _ in 0..50 {
        got.clear();
        for n in &names {
            for (labels, v) in query(&receiver, n).await {
                got.insert(((*n).clone(), labels), v);
            }
        }
        if got.len() >= expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut missing = Vec::new();
    for (k, want) in &expected {
        match got.get(k) {
            Some(v) if v == want || (v.is_nan() && want.is_nan()) => {}
            other => missing.push(format!("{k:?}: want {want}, got {other:?}")),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} series differ:\n{}",
        missing.len(),
        expected.len(),
        missing[..missing.len().min(20)].join("\n")
    );
    eprintln!(
        "e2e_rw2: {} normalised series from 3 dumps sent as 2.0 arrived at Prometheus 2.42 as 1.0",
        expected.len()
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
