//! The pull side with real components: `promnorm serve` scrapes a golden dump over HTTP
//! and remote-writes into a real Prometheus (remote-write receiver); a second real
//! Prometheus scrapes promnorm's `/federate` (`honor_labels`). Both must hold the same
//! series with the same values, and those are what `promnorm normalize` prints for the
//! dump, with the target's labels.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::procs::{
    binary, prometheus_receiver, prometheus_sender, promnorm_serve, serve_exposition,
};
use common::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("promnorm-e2e-pull-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `name{labels}` → value of every series of `job="dcgm"` a Prometheus holds now.
async fn dcgm_series(base: &str) -> BTreeMap<String, String> {
    let url = format!("{base}/api/v1/query?query=%7Bjob%3D%22dcgm%22%7D");
    let r = get(&url).await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    let mut out = BTreeMap::new();
    for item in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let metric = item["metric"].as_object().cloned().unwrap_or_default();
        let name = metric["__name__"].as_str().unwrap_or_default().to_string();
        let labels: Vec<String> = metric
            .iter()
            .filter(|(k, _)| *k != "__name__")
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        let value = item["value"][1].as_str().unwrap_or_default().to_string();
        out.insert(format!("{name}{{{}}}", labels.join(",")), value);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_federating_prometheus_holds_what_the_remote_write_backend_got() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let dump = std::fs::read_to_string("tests/golden/dcgm.prom").unwrap();
    let expected = std::fs::read_to_string("tests/golden/dcgm.out").unwrap();
    let target = serve_exposition(dump).await;
    let (dir_r, dir_p, dir_f) = (scratch("r"), scratch("p"), scratch("f"));
    let mut receiver = prometheus_receiver(&prom, &dir_r);
    receiver.start("/-/ready").await;
    let write = format!("{}/api/v1/write", receiver.base);
    let mut proxy = promnorm_serve(&dir_p, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nbackends:\n  - url: {write}\n\
             exposition: {{ttl: 5m}}\n\
             scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{target}/metrics\n      labels: {{job: dcgm, instance: gpu-node-1}}\n"
        )
    });
    proxy.start("/-/ready").await;
    let proxy_addr = proxy.base.trim_start_matches("http://").to_string();
    let mut federator = prometheus_sender(
        &prom,
        &dir_f,
        &format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: federate\n    honor_labels: true\n    metrics_path: /federate\n    params: {{'match[]': ['{{job=\"dcgm\"}}']}}\n    static_configs: [{{targets: ['{proxy_addr}']}}]\n"
        ),
    );
    federator.start("/-/ready").await;
    // The same series on both sides, once both have them all.
    let want = expected
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count()
        + 3; // up, scrape_duration_seconds, scrape_samples_scraped
    let deadline = Instant::now() + Duration::from_secs(40);
    let (pushed, pulled) = loop {
        let pushed = dcgm_series(&receiver.base).await;
        let pulled = dcgm_series(&federator.base).await;
        if pushed.len() >= want && pulled.len() >= want {
            break (pushed, pulled);
        }
        assert!(
            Instant::now() < deadline,
            "series did not arrive: pushed {} pulled {} of {want}\n{pushed:#?}\n{pulled:#?}",
            pushed.len(),
            pulled.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let keys = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&pushed), keys(&pulled), "the same series both ways");
    for (k, v) in &pushed {
        if k.starts_with("scrape_duration_seconds") {
            continue; // changes every scrape; both sides may hold different scrapes
        }
        assert_eq!(Some(v), pulled.get(k), "{k}");
    }
    // And the values are what normalize prints, with the target's labels.
    for line in expected
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, rest) = line.rsplit_once('}').unwrap();
        let (name, labels) = series.split_once('{').unwrap();
        let mut labels: Vec<String> = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| l.replace('"', ""))
            .collect();
        labels.push("instance=gpu-node-1".into());
        labels.push("job=dcgm".into());
        labels.sort();
        let key = format!("{name}{{{}}}", labels.join(","));
        let want: f64 =
            promnorm::mapping::number::parse_float(rest.split_whitespace().next().unwrap())
                .unwrap();
        let got: f64 = pushed
            .get(&key)
            .and_then(|v| promnorm::mapping::number::parse_float(v))
            .unwrap_or_else(|| panic!("{key} missing: {pushed:#?}"));
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{key}: {got} vs {want}"
        );
    }
    assert_eq!(
        pushed
            .get("up{instance=gpu-node-1,job=dcgm}")
            .map(String::as_str),
        Some("1")
    );
}
