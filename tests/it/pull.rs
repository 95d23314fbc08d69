//! The pull side (docs/scrape.md, docs/federate.md): promnorm scrapes a golden dump over
//! HTTP and the backend gets what `promnorm normalize` prints for it, with the target's
//! labels and `up`; a target that fails gives `up 0` and staleness markers; `/federate`
//! serves what was forwarded, with match[], filtered by `match[]`.

use crate::common::*;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::common::procs::serve_exposition;
use promnorm::wire::STALE_NAN_BITS;
use promnorm::wire::proto::prometheus as pb;

/// Every sample the backend got: `name{labels}` (sorted, `__name__` apart) → values.
fn received(rec: &Recorded) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (_, body) in rec.requests() {
        for ts in decode(&body).timeseries {
            let name = ts
                .labels
                .iter()
                .find(|l| l.name == "__name__")
                .map(|l| l.value.clone())
                .unwrap_or_default();
            let labels: Vec<String> = ts
                .labels
                .iter()
                .filter(|l| l.name != "__name__")
                .map(|l| format!("{}=\"{}\"", l.name, l.value))
                .collect();
            let key = format!("{name}{{{}}}", labels.join(","));
            out.entry(key)
                .or_default()
                .extend(ts.samples.iter().map(|s| s.value));
        }
    }
    out
}

fn expected_lines(dump: &str) -> usize {
    dump.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count()
}

async fn until(mut ok: impl FnMut() -> bool, what: &str) {
    for _ in 0..100 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scraped_golden_dump_reaches_the_backend_as_normalize_prints_it() {
    let dump = std::fs::read_to_string("tests/golden/dcgm.prom").unwrap();
    let expected = std::fs::read_to_string("tests/golden/dcgm.out").unwrap();
    let target = serve_exposition(dump).await;
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[backend],
        &format!(
            "scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{target}/metrics\n      labels: {{job: dcgm, instance: gpu-node-1}}\n"
        ),
    )
    .await;
    until(|| received(&rec).keys().any(|k| k.starts_with("up{")), "up").await;
    let got = received(&rec);
    assert_eq!(
        got.get("up{instance=\"gpu-node-1\",job=\"dcgm\"}")
            .map(|v| v[0]),
        Some(1.0)
    );
    let samples = got
        .get("scrape_samples_scraped{instance=\"gpu-node-1\",job=\"dcgm\"}")
        .map(|v| v[0]);
    let lines = expected_lines(&std::fs::read_to_string("tests/golden/dcgm.prom").unwrap());
    assert_eq!(
        samples,
        Some(lines as f64),
        "one per sample line of the dump"
    );
    // Every line normalize prints for the dump, with the target's labels added.
    for line in expected
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, rest) = line.rsplit_once('}').expect("a labelled line");
        let value: f64 =
            promnorm::mapping::number::parse_float(rest.split_whitespace().next().unwrap())
                .unwrap();
        let (name, labels) = series.split_once('{').unwrap();
        let mut labels: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
        labels.push("instance=\"gpu-node-1\"");
        labels.push("job=\"dcgm\"");
        labels.sort_by_key(|l| l.split('=').next().unwrap().to_string());
        let key = format!("{name}{{{}}}", labels.join(","));
        let values = got
            .get(&key)
            .unwrap_or_else(|| panic!("{key} not received: {got:#?}"));
        assert_eq!(values[0], value, "{key}");
    }
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_target_gives_up_0_and_staleness_markers() {
    let failing = Arc::new(AtomicBool::new(false));
    let f = failing.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let f = f.clone();
            async move {
                if f.load(Ordering::SeqCst) {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, String::new())
                } else {
                    (
                        axum::http::StatusCode::OK,
                        "a_gauge 1\nb_gauge{x=\"y\"} 2\n".to_string(),
                    )
                }
            }
        }),
    );
    let target = serve(app).await;
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[backend],
        &format!("scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{target}/metrics\n"),
    )
    .await;
    let inst = target.to_string();
    let up_key = format!("up{{instance=\"{inst}\",job=\"scrape\"}}");
    until(|| received(&rec).contains_key(&up_key), "the first scrape").await;
    failing.store(true, Ordering::SeqCst);
    until(
        || {
            received(&rec)
                .get(&up_key)
                .is_some_and(|v| v.contains(&0.0))
        },
        "up 0",
    )
    .await;
    let got = received(&rec);
    for series in ["a_gauge", "b_gauge"] {
        let key = got
            .keys()
            .find(|k| k.starts_with(&format!("{series}{{")))
            .unwrap()
            .clone();
        assert!(
            got[&key].iter().any(|v| v.to_bits() == STALE_NAN_BITS),
            "{key} gets a staleness marker, bit for bit: {:?}",
            got[&key]
        );
    }
    assert!(
        proxy
            .metric("promnorm_scrapes_total", &["result=\"failed\""])
            .await
            >= 1.0
    );
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federate_serves_what_was_forwarded_filtered_by_match() {
    let (backend, _rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(&[backend], "exposition: {ttl: 5m, max_series: 1000}\n").await;
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[
                    ("__name__", "DCGM_FI_DEV_FB_USED"),
                    ("Hostname", "h1"),
                    ("gpu", "0"),
                ],
                &[(1024.0, 1_700_000_000_000)],
            ),
            series(
                &[("__name__", "other_gauge"), ("a", "b")],
                &[(3.0, 1_700_000_000_500)],
            ),
        ],
        ..Default::default()
    };
    let r = post(&proxy.url(), encode(&req), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let text = get(&format!("http://{}/federate", proxy.addr)).await;
    assert_eq!(text.status, 200);
    let body = text.body.clone();
    assert!(
        body.contains(
            "DCGM_FI_DEV_FB_USED_bytes{gpu=\"0\",hostname=\"h1\"} 1.073741824e+09 1700000000000\n"
        ),
        "{body}"
    );
    assert!(
        body.contains("other_gauge{a=\"b\"} 3 1700000000500\n"),
        "{body}"
    );
    let only = get(&format!(
        "http://{}/federate?match[]=%7B__name__%3D~%22other.*%22%7D",
        proxy.addr
    ))
    .await;
    let only = only.body.clone();
    assert!(
        only.contains("other_gauge") && !only.contains("DCGM"),
        "{only}"
    );
    let bad = get(&format!("http://{}/federate?match[]=%7B", proxy.addr)).await;
    assert_eq!(bad.status, 400);
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federate_with_tenancy_serves_the_scrapes_tenant_only() {
    let (backend, _rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[backend],
        "tenancy: {label: namespace, default: shared}\nexposition: {ttl: 5m, max_series: 1000}\n",
    )
    .await;
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[("__name__", "load"), ("namespace", "team-a"), ("pod", "a0")],
                &[(1.0, 1_700_000_000_000)],
            ),
            series(
                &[("__name__", "load"), ("namespace", "team-b"), ("pod", "b0")],
                &[(2.0, 1_700_000_000_000)],
            ),
            series(
                &[("__name__", "load"), ("pod", "s0")],
                &[(3.0, 1_700_000_000_000)],
            ),
        ],
        ..Default::default()
    };
    let r = post(&proxy.url(), encode(&req), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let url = format!("http://{}/federate", proxy.addr);
    let a = get_with(&url, &[("X-Scope-OrgID", "team-a")]).await;
    assert_eq!(a.status, 200);
    // The tenant's series only, its tenant label hidden (tenancy.keep_label: false).
    assert!(
        a.body.contains("load{pod=\"a0\"} 1 1700000000000\n"),
        "{}",
        a.body
    );
    assert!(
        !a.body.contains("b0") && !a.body.contains("s0"),
        "{}",
        a.body
    );
    // Series without the label belong to tenancy.default.
    let shared = get_with(&url, &[("X-Scope-OrgID", "shared")]).await;
    assert!(
        shared.body.contains("load{pod=\"s0\"} 3"),
        "{}",
        shared.body
    );
    assert!(
        !shared.body.contains("a0") && !shared.body.contains("b0"),
        "{}",
        shared.body
    );
    let none = get_with(&url, &[("X-Scope-OrgID", "team-c")]).await;
    assert!(!none.body.contains("load{"), "{}", none.body);
    // Without the header: every tenant's, as they were forwarded.
    let all = get(&url).await;
    for pod in ["a0", "b0", "s0"] {
        assert!(all.body.contains(&format!("pod=\"{pod}\"")), "{}", all.body);
    }
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_sd_change_is_picked_up_without_a_restart() {
    let a = serve_exposition("a_gauge 1\n".into()).await;
    let b = serve_exposition("b_gauge 2\n".into()).await;
    let dir = std::env::temp_dir().join(format!("promnorm-it-file-sd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("targets.json");
    let group = |addr: std::net::SocketAddr| {
        format!("[{{\"targets\": [\"{addr}\"], \"labels\": {{\"job\": \"sd\"}}}}]")
    };
    std::fs::write(&file, group(a)).unwrap();
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[backend],
        &format!(
            "scrape:\n  interval: 1s\n  timeout: 1s\n  file_sd_refresh: 1s\n  file_sd: ['{}/*.json']\n",
            dir.display()
        ),
    )
    .await;
    let up_a = format!("up{{instance=\"{a}\",job=\"sd\"}}");
    let up_b = format!("up{{instance=\"{b}\",job=\"sd\"}}");
    until(|| received(&rec).contains_key(&up_a), "target a").await;
    // A rewrite with another size or time: b replaces a.
    std::fs::write(&file, group(b)).unwrap();
    until(|| received(&rec).contains_key(&up_b), "target b").await;
    until(
        || {
            let got = received(&rec);
            let stale = |k: &str| {
                got.get(k)
                    .is_some_and(|v| v.iter().any(|x| x.to_bits() == STALE_NAN_BITS))
            };
            stale(&up_a) && stale(&format!("a_gauge{{instance=\"{a}\",job=\"sd\"}}"))
        },
        "a's staleness markers",
    )
    .await;
    proxy.shut_down().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `params` (`scrape.params`, a target's own, a `file_sd` group's `__param_<name>`)
/// reach the target as its URL's query, and `/api/v1/targets` and `/targets` show every
/// target with its scrape URL, labels and health, as Prometheus' agent would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_reach_the_target_and_the_targets_api_shows_each_target() {
    // The exporter answers by `module` (as the blackbox and SNMP exporters do); a
    // query without one is refused, so a lost parameter shows as `up 0`.
    let app = axum::Router::new().route(
        "/probe",
        axum::routing::get(|uri: axum::http::Uri| async move {
            let query = uri.query().unwrap_or("").to_string();
            let modules: Vec<&str> = query
                .split('&')
                .filter_map(|kv| kv.strip_prefix("module="))
                .collect();
            if modules.is_empty() {
                return (axum::http::StatusCode::BAD_REQUEST, String::new());
            }
            let region = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("region="))
                .unwrap_or("none");
            (
                axum::http::StatusCode::OK,
                format!(
                    "probe_ok{{module=\"{}\",region=\"{region}\"}} 1\n",
                    modules.join("+")
                ),
            )
        }),
    );
    let target = serve(app).await;
    let dir = std::env::temp_dir().join(format!("promnorm-it-params-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("t.json"),
        format!(
            "[{{\"targets\": [\"{target}\"], \"labels\": {{\"job\": \"sd\", \"__metrics_path__\": \"/probe\", \"__param_module\": \"nic\"}}}}]"
        ),
    )
    .unwrap();
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[backend],
        &format!(
            "scrape:\n  interval: 1s\n  timeout: 1s\n  file_sd_refresh: 1s\n  params: {{region: [eu]}}\n  \
             file_sd: ['{}/*.json']\n  targets:\n    - url: http://{target}/probe\n      \
             labels: {{job: static}}\n      params: {{module: [gpu, cpu]}}\n",
            dir.display()
        ),
    )
    .await;
    let static_key = format!(
        "probe_ok{{instance=\"{target}\",job=\"static\",module=\"gpu+cpu\",region=\"eu\"}}"
    );
    let sd_key =
        format!("probe_ok{{instance=\"{target}\",job=\"sd\",module=\"nic\",region=\"eu\"}}");
    until(
        || {
            let got = received(&rec);
            got.contains_key(&static_key) && got.contains_key(&sd_key)
        },
        "both targets' probes, with their parameters",
    )
    .await;
    let got = received(&rec);
    for job in ["static", "sd"] {
        let up = format!("up{{instance=\"{target}\",job=\"{job}\"}}");
        assert_eq!(got.get(&up).map(|v| v[0]), Some(1.0), "{up}: {got:#?}");
    }
    // Both are listed, up, with the URL they were scraped at.
    let api = format!("http://{}/api/v1/targets", proxy.addr);
    let mut doc = serde_json::Value::Null;
    for _ in 0..50 {
        doc = serde_json::from_str(&get(&api).await.body).unwrap();
        let healthy = doc["data"]["activeTargets"]
            .as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|t| t["health"] == "up"));
        if healthy {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(doc["status"], "success");
    assert_eq!(
        doc["data"]["activeTargets"].as_array().map(Vec::len),
        Some(2),
        "{doc}"
    );
    let urls: Vec<String> = doc["data"]["activeTargets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["scrapeUrl"].as_str().unwrap().to_string())
        .collect();
    assert!(
        urls.contains(&format!(
            "http://{target}/probe?module=gpu&module=cpu&region=eu"
        )),
        "{urls:?}"
    );
    assert!(
        urls.contains(&format!("http://{target}/probe?module=nic&region=eu")),
        "{urls:?}"
    );
    let sd = doc["data"]["activeTargets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["scrapePool"] == "sd")
        .unwrap();
    assert_eq!(sd["discoveredLabels"]["__param_module"], "nic");
    assert_eq!(sd["labels"]["instance"], target.to_string());
    assert!(sd["lastScrapeDuration"].as_f64().unwrap() > 0.0);
    let page = get(&format!("http://{}/targets", proxy.addr)).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("2 targets, 2 up"), "{}", page.body);
    assert!(page.body.contains("module=nic"), "{}", page.body);
    proxy.shut_down().await;
    let _ = std::fs::remove_dir_all(&dir);
}
