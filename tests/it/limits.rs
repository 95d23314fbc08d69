//! The cardinality guard through `serve` (docs/limits.md): a metric or tenant over its
//! active-series limit keeps its first series and loses only the new ones, every
//! left-out sample counted; a series over the per-series label limits leaves the rest of
//! its batch flowing; the tracker stays flat under a flood of new series; limits ×
//! tenancy × queues × reload; the cardinality view.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use promnorm::config::Config;
use promnorm::wire::proto::prometheus as pb;

const TS: i64 = 1_700_000_000_000;

/// `n` series of metric `name`, `pod` labels `p00000`…, extra labels on each.
fn many(name: &str, n: usize, from: usize, extra: &[(&str, &str)]) -> Vec<pb::TimeSeries> {
    (from..from + n)
        .map(|i| {
            let pod = format!("p{i:06}");
            let mut labels = vec![("__name__", name), ("pod", pod.as_str())];
            labels.extend_from_slice(extra);
            series(&labels, &[(1.0, TS)])
        })
        .collect()
}

fn body(series: Vec<pb::TimeSeries>) -> Vec<u8> {
    encode(&pb::WriteRequest {
        timeseries: series,
        ..Default::default()
    })
}

fn label<'a>(s: &'a pb::TimeSeries, name: &str) -> Option<&'a str> {
    s.labels
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.value.as_str())
}

/// (metric, pod) of every series the backend got, in order, and the tenant header each
/// request carried.
fn received(rec: &Recorded) -> Vec<(Option<String>, String, String)> {
    rec.requests()
        .iter()
        .flat_map(|(h, b)| {
            let tenant = h
                .get("x-scope-orgid")
                .map(|v| v.to_str().unwrap().to_string());
            decode(b)
                .timeseries
                .into_iter()
                .map(move |s| {
                    (
                        tenant.clone(),
                        label(&s, "__name__").unwrap_or_default().to_string(),
                        label(&s, "pod").unwrap_or_default().to_string(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The value of the `/metrics` line `series` exactly (`name{labels}`), 0 when absent:
/// the counters are the process' (tests share them), so each test names its own series.
async fn exact(proxy: &Proxy, series: &str) -> f64 {
    get(&format!("http://{}/metrics", proxy.addr))
        .await
        .body
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn count_of(got: &[(Option<String>, String, String)], name: &str) -> usize {
    got.iter().filter(|(_, n, _)| n == name).count()
}

#[tokio::test]
async fn a_metric_over_its_limit_sends_the_same_first_1000_series_every_time() {
    let (url, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(&[url], "limits:\n  max_series_per_metric: 1000\n").await;
    let mut all = many("llm_bad_metric", 3000, 0, &[]);
    all.extend(many("llm_good_metric", 50, 0, &[]));
    let before = exact(
        &proxy,
        r#"promnorm_samples_dropped_total{reason="max_series_per_metric"}"#,
    )
    .await;
    for round in 0..2 {
        let r = post(&proxy.url(), body(all.clone()), RW_HEADERS).await;
        assert_eq!(r.status, 204, "round {round}: {}", r.body);
    }
    let requests = rec.requests();
    assert_eq!(requests.len(), 2);
    let got = received(&rec);
    let first: Vec<_> = got.iter().take(1050).cloned().collect();
    let second: Vec<_> = got.iter().skip(1050).cloned().collect();
    assert_eq!(count_of(&first, "llm_bad_metric"), 1000);
    assert_eq!(
        count_of(&first, "llm_good_metric"),
        50,
        "other metrics untouched"
    );
    assert_eq!(first, second, "the next request carries the same 1,000");
    let pods: BTreeSet<&str> = first
        .iter()
        .filter(|(_, n, _)| n == "llm_bad_metric")
        .map(|(_, _, p)| p.as_str())
        .collect();
    assert_eq!(pods.first(), Some(&"p000000"));
    assert_eq!(
        pods.last(),
        Some(&"p000999"),
        "the first 1,000 in the request"
    );
    let dropped = r#"promnorm_samples_dropped_total{reason="max_series_per_metric"}"#;
    assert_eq!(
        exact(&proxy, dropped).await - before,
        4000.0,
        "every left-out sample counted"
    );
    // The view: the metric at its limit, first.
    let view = get(&format!("http://{}/api/v1/cardinality?limit=1", proxy.addr)).await;
    assert_eq!(view.status, 200);
    let v: serde_json::Value = serde_json::from_str(&view.body).unwrap();
    let t = &v["data"]["tenants"][0];
    assert_eq!(t["active_series"], 1050);
    assert_eq!(t["metrics_total"], 2);
    assert_eq!(t["metrics"][0]["name"], "llm_bad_metric");
    assert_eq!(t["metrics"][0]["active_series"], 1000);
    assert_eq!(t["metrics"][0]["limit"], 1000);
    assert_eq!(t["metrics"].as_array().unwrap().len(), 1);
    proxy.shut_down().await;
}

#[tokio::test]
async fn a_wide_or_long_series_leaves_the_rest_of_its_batch_flowing() {
    let (url, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[url],
        "limits:\n  series_max_labels: 30\n  series_max_label_value_bytes: 2048\n",
    )
    .await;
    let names: Vec<String> = (0..39).map(|i| format!("l{i:02}")).collect();
    let mut wide: Vec<(&str, &str)> = vec![("__name__", "llm_wide"), ("pod", "w")];
    wide.extend(names.iter().map(|n| (n.as_str(), "v")));
    let long = "x".repeat(5000);
    let mut all = many("llm_ok", 100, 0, &[]);
    all.insert(50, series(&wide, &[(1.0, TS)]));
    all.insert(
        10,
        series(&[("__name__", "llm_long"), ("pod", &long)], &[(1.0, TS)]),
    );
    let r = post(&proxy.url(), body(all), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let got = received(&rec);
    assert_eq!(got.len(), 100);
    assert_eq!(count_of(&got, "llm_ok"), 100);
    for reason in ["series_max_labels", "series_max_label_value_bytes"] {
        let n = proxy
            .metric(
                "promnorm_samples_dropped_total",
                &[&format!("reason=\"{reason}\"")],
            )
            .await;
        assert_eq!(n, 1.0, "{reason}");
    }
    proxy.shut_down().await;
}

#[tokio::test]
async fn a_flood_of_new_series_keeps_the_tracker_flat() {
    let (url, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(&[url], "limits:\n  max_series_per_tenant: 1000\n").await;
    let tracked = || async {
        (
            proxy
                .metric("promnorm_cardinality_tracked_series", &[])
                .await,
            proxy
                .metric("promnorm_cardinality_tracker_bytes", &[])
                .await,
        )
    };
    let before = exact(
        &proxy,
        r#"promnorm_samples_dropped_total{reason="max_series_per_tenant"}"#,
    )
    .await;
    let mut after_first = (0.0, 0.0);
    for i in 0..40 {
        let r = post(
            &proxy.url(),
            body(many("llm_flood", 10_000, i * 10_000, &[])),
            RW_HEADERS,
        )
        .await;
        assert_eq!(r.status, 204);
        if i == 0 {
            after_first = tracked().await;
        }
    }
    let after_all = tracked().await;
    assert_eq!(after_first.0, 1000.0);
    assert_eq!(
        after_all, after_first,
        "400,000 new series: the tables did not grow"
    );
    assert!(after_all.1 < 200_000.0, "{after_all:?}");
    assert_eq!(received(&rec).len(), 1000);
    let dropped = r#"promnorm_samples_dropped_total{reason="max_series_per_tenant"}"#;
    assert_eq!(exact(&proxy, dropped).await - before, 399_000.0);
    proxy.shut_down().await;
}

/// Per-tenant limits (and an override) with tenant routing, behind each kind of queue.
#[tokio::test]
async fn tenants_get_their_own_limits_behind_every_queue() {
    let dir = std::env::temp_dir().join(format!("promnorm-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (kind, queue) in ["{type: none}", "{type: memory}", "disk"]
        .into_iter()
        .enumerate()
    {
        let (small, big) = (format!("small{kind}"), format!("big{kind}"));
        let anon = format!("anon{kind}");
        let queue = if queue == "disk" {
            format!("{{type: disk, dir: {}}}", dir.join("q").display())
        } else {
            queue.to_string()
        };
        let (url, rec) = fake_backend(Reply::ok()).await;
        let yaml = format!(
            "listen: 127.0.0.1:0\nbackends:\n  - url: {url}\n    timeout: 2s\n    queue: {queue}\n\
             tenancy: {{label: tenant, default: {anon}}}\n\
             limits:\n  max_series_per_tenant: 100\n  tenant_overrides:\n    {big}: {{max_series_per_tenant: 200}}\n"
        );
        let proxy = start_proxy_yaml(&yaml, Duration::from_secs(5)).await;
        let mut all = many("llm_t", 300, 0, &[("tenant", &small)]);
        all.extend(many("llm_t", 300, 0, &[("tenant", &big)]));
        all.extend(many("llm_t", 300, 0, &[]));
        let r = post(&proxy.url(), body(all), RW_HEADERS).await;
        assert_eq!(r.status, 204, "{queue}: {}", r.body);
        // Queued deliveries arrive on their own.
        let want = 100 + 200 + 100;
        for _ in 0..100 {
            if received(&rec).len() >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let got = received(&rec);
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for (t, _, _) in &got {
            *by.entry(t.clone().unwrap_or_default()).or_default() += 1;
        }
        assert_eq!(
            by,
            BTreeMap::from([
                (anon.clone(), 100),
                (big.clone(), 200),
                (small.clone(), 100)
            ]),
            "{queue}"
        );
        for (tenant, n) in [(&small, 200.0), (&big, 100.0), (&anon, 200.0)] {
            let line = format!(
                "promnorm_samples_dropped_total{{reason=\"max_series_per_tenant\",tenant=\"{tenant}\"}}"
            );
            let dropped = exact(&proxy, &line).await;
            assert_eq!(dropped, n, "{queue}: {tenant}");
        }
        let view = get(&format!(
            "http://{}/api/v1/cardinality?tenant={big}",
            proxy.addr
        ))
        .await;
        let v: serde_json::Value = serde_json::from_str(&view.body).unwrap();
        let tenants = v["data"]["tenants"].as_array().unwrap();
        assert_eq!(tenants.len(), 1);
        assert_eq!(tenants[0]["active_series"], 200);
        assert_eq!(tenants[0]["limit"], 200);
        proxy.shut_down().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Mapped names: a rule's output name is what counts (and what the view shows).
#[tokio::test]
async fn limits_count_the_names_the_backend_sees() {
    let (url, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(
        &[url],
        "limits:\n  max_series_per_metric: 3\n# Its drop counts carry a tenant: apart from the other tests'.\ntenancy: {label: tenant, default: names}\n",
    )
    .await;
    // SGLang's gauge in milliseconds is rescaled and renamed to seconds by the pack.
    let all = many("sglang:kv_transfer_latency_ms", 5, 0, &[]);
    let r = post(&proxy.url(), body(all), RW_HEADERS).await;
    assert_eq!(r.status, 204);
    let got = received(&rec);
    assert_eq!(got.len(), 3);
    let names: BTreeSet<&str> = got.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 1);
    let name = *names.first().unwrap();
    assert_ne!(name, "sglang:kv_transfer_latency_ms", "renamed by the pack");
    let view = get(&format!("http://{}/api/v1/cardinality", proxy.addr)).await;
    assert!(view.body.contains(name), "{}", view.body);
    proxy.shut_down().await;
}

#[tokio::test]
async fn the_view_shows_a_metrics_labels_and_refuses_bad_parameters() {
    let (url, _rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(&[url], "").await;
    let all: Vec<pb::TimeSeries> = (0..40)
        .map(|i| {
            let pod = format!("pod-{i}");
            let model = if i % 4 == 0 { "llama" } else { "qwen" };
            series(
                &[
                    ("__name__", "llm_view"),
                    ("model", model),
                    ("pod", pod.as_str()),
                ],
                &[(1.0, TS)],
            )
        })
        .collect();
    assert_eq!(post(&proxy.url(), body(all), RW_HEADERS).await.status, 204);
    let r = get(&format!(
        "http://{}/api/v1/cardinality?metric=llm_view",
        proxy.addr
    ))
    .await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let m = &v["data"][0];
    assert_eq!(m["active_series"], 40);
    assert_eq!(m["limit"], serde_json::Value::Null);
    let labels: Vec<(String, u64)> = m["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["distinct_values"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(labels[0].0, "pod");
    assert!((34..=46).contains(&labels[0].1), "{labels:?}");
    assert_eq!(labels[1], ("model".to_string(), 2));
    let bad = get(&format!(
        "http://{}/api/v1/cardinality?limit=many",
        proxy.addr
    ))
    .await;
    assert_eq!(bad.status, 400);
    proxy.shut_down().await;
}

/// A reload keeps the guard and its counts, and the new limits apply to new series.
#[test]
fn a_reload_keeps_the_counts_and_applies_the_new_limits() {
    let cfg = |limit: usize| {
        Config::parse(
            &format!("limits:\n  max_series_per_metric: {limit}\n"),
            "t.yaml",
        )
        .unwrap()
    };
    let forwarded = |p: &promnorm::pipeline::Pipeline, series: Vec<pb::TimeSeries>| {
        let mut ws = p.workspace();
        p.process(&mut ws, &body(series)).unwrap();
        <pb::WriteRequest as prost::Message>::decode(ws.mapped())
            .unwrap()
            .timeseries
            .len()
    };
    let first = promnorm::app::build(&cfg(5), None).unwrap();
    assert_eq!(forwarded(&first.state.pipeline, many("m", 8, 0, &[])), 5);
    let second = promnorm::app::build(&cfg(3), Some(&first)).unwrap();
    let (a, b) = (
        first.state.pipeline.guard().unwrap(),
        second.state.pipeline.guard().unwrap(),
    );
    assert!(std::sync::Arc::ptr_eq(a, b), "the guard is kept");
    // The 5 active series keep flowing under the lower limit; the new ones do not.
    assert_eq!(forwarded(&second.state.pipeline, many("m", 8, 0, &[])), 5);
    let third = promnorm::app::build(&cfg(10), Some(&second)).unwrap();
    assert_eq!(forwarded(&third.state.pipeline, many("m", 12, 0, &[])), 10);
}

#[test]
fn the_memory_bound_covers_the_guards_tables() {
    for n in [50_000usize, 134_816, 1_000_000] {
        assert!(
            promnorm::guard::tracker::max_bytes(n)
                <= promnorm::config::memory::cardinality_bytes(n),
            "{n}"
        );
    }
    assert_eq!(
        promnorm::guard::tracker::SERIES_BYTES as u64,
        promnorm::config::memory::TRACKED_SERIES_BYTES
    );
}

#[test]
fn check_config_refuses_overrides_without_tenancy() {
    let err = Config::parse(
        "limits:\n  tenant_overrides:\n    a: {max_series_per_tenant: 5}\n",
        "t.yaml",
    )
    .and_then(|c| c.check().map(|_| c))
    .expect_err("refused");
    assert!(err.to_string().contains("needs tenancy"), "{err}");
    let err = Config::parse("limits:\n  active_series_window: 0s\n", "t.yaml")
        .and_then(|c| c.check().map(|_| c))
        .expect_err("refused");
    assert!(err.to_string().contains("active_series_window"), "{err}");
}
