//! Tenant routing end to end (docs/tenancy.md): Debian's Prometheus 2.42 scrapes series
//! of three teams and remote-writes through a real `promnorm serve` routing by the `team`
//! label. Its backend is a tenant gateway (in the test, as Mimir's would be) that logs
//! each request's `X-Scope-OrgID` and passes the request to one real Prometheus per
//! tenant. Checked series by series: each receiver holds exactly its tenant's series,
//! and every sample the sender scraped up to the check point.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh fetches it).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use common::procs::*;
use common::*;
use http_body_util::{BodyExt, Full};

const SERIES: usize = 60;
const TENANTS: [&str; 3] = ["team-a", "team-b", "anonymous"];

/// The team of series `i`: a, b, or none (the default tenant).
fn team(i: usize) -> Option<&'static str> {
    match i % 3 {
        0 => Some("team-a"),
        1 => Some("team-b"),
        _ => None,
    }
}

fn tenant_of(i: usize) -> &'static str {
    team(i).unwrap_or("anonymous")
}

async fn target() -> std::net::SocketAddr {
    let mut text = String::from("# TYPE tq_total counter\n");
    for i in 0..SERIES {
        match team(i) {
            Some(t) => text.push_str(&format!("tq_total{{i=\"{i}\",team=\"{t}\"}} {i}\n")),
            None => text.push_str(&format!("tq_total{{i=\"{i}\"}} {i}\n")),
        }
    }
    serve_exposition(text).await
}

/// The gateway: tenant header → that tenant's receiver; logs every header it saw.
async fn gateway(receivers: BTreeMap<String, String>) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen2 = seen.clone();
    let receivers = Arc::new(receivers);
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let app = axum::Router::new().route(
        "/api/v1/push",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let seen = seen2.clone();
            let receivers = receivers.clone();
            let client = client.clone();
            async move {
                let tenant = headers
                    .get("x-scope-orgid")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                seen.lock().unwrap().push(tenant.clone());
                let Some(url) = receivers.get(&tenant) else {
                    return (StatusCode::UNAUTHORIZED, "no org id".to_string());
                };
                let mut req = axum::http::Request::post(url.as_str());
                for (k, v) in &headers {
                    if k != "host" && k != "content-length" {
                        req = req.header(k, v);
                    }
                }
                match client.request(req.body(Full::new(body)).unwrap()).await {
                    Ok(r) => {
                        let status = r.status();
                        let text = r
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        (status, String::from_utf8_lossy(&text).into_owned())
                    }
                    Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
                }
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/push"), seen)
}

fn scratch() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("promnorm-e2e-tenancy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn samples(base: &str) -> SamplesByLabel {
    samples_by_label(base, "tq_total%5B15m%5D", "i").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_series_reach_its_own_receiver_through_the_tenant_header() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let dir = scratch();
    let mut receivers = Vec::new();
    let mut urls = BTreeMap::new();
    for t in TENANTS {
        let d = dir.join(t);
        std::fs::create_dir_all(&d).unwrap();
        let mut r = prometheus_receiver(&prom, &d);
        r.start("/-/ready").await;
        urls.insert(t.to_string(), format!("{}/api/v1/write", r.base));
        receivers.push(r);
    }
    let (gateway_url, seen) = gateway(urls).await;

    let mut proxy = promnorm_serve(&dir, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nshutdown_timeout: 2s\ntenancy:\n  label: team\n  default: anonymous\nbackends:\n  - name: mimir\n    url: {gateway_url}\n"
        )
    });
    proxy.start("/-/ready").await;

    let target = target().await;
    let mut sender = prometheus_sender(
        &prom,
        &dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {}/api/v1/write\n    queue_config:\n      batch_send_deadline: 250ms\n      min_backoff: 100ms\n      max_backoff: 2s\n",
            proxy.base
        ),
    );
    sender.start("/-/ready").await;
    // At least six scrapes of every series at the sender.
    let scrapes = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = samples(&sender.base).await;
        let fewest = sent.values().map(|t| t.len()).min().unwrap_or(0);
        if (sent.len() == SERIES && fewest >= 6) || Instant::now() > scrapes {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 1500;

    // Every sample the sender scraped up to `until`, at its tenant's receiver only.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (scraped, missing, misplaced) = loop {
        let sent = samples(&sender.base).await;
        let mut got = BTreeMap::new();
        for (t, r) in TENANTS.iter().zip(&receivers) {
            got.insert(*t, samples(&r.base).await);
        }
        let (mut scraped, mut missing, mut misplaced) = (0, 0, 0);
        for (i, ts) in &sent {
            let i: usize = i.parse().unwrap();
            for t in ts.range(..=until) {
                scraped += 1;
                if !got[tenant_of(i)]
                    .get(&i.to_string())
                    .is_some_and(|g| g.contains(t))
                {
                    missing += 1;
                }
            }
        }
        for (tenant, series) in &got {
            for i in series.keys() {
                let i: usize = i.parse().unwrap();
                if tenant_of(i) != *tenant {
                    misplaced += 1;
                }
            }
        }
        if (sent.len() == SERIES && missing == 0) || Instant::now() > deadline {
            break (scraped, missing, misplaced);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "e2e tenancy: {scraped} samples scraped, {missing} missing at their tenant's receiver, {misplaced} series at another tenant's"
    );
    assert!(
        scraped >= SERIES * 3,
        "the sender scraped too little: {scraped}"
    );
    assert_eq!(missing, 0, "samples missing at their tenant's receiver");
    assert_eq!(misplaced, 0, "series at another tenant's receiver");
    // The team label was removed on the way.
    for r in &receivers {
        let body = get(&format!("{}/api/v1/series?match%5B%5D=tq_total", r.base))
            .await
            .body;
        assert!(!body.contains("\"team\""), "{body}");
    }
    let headers: BTreeSet<String> = seen.lock().unwrap().iter().cloned().collect();
    assert_eq!(
        headers,
        TENANTS.iter().map(|t| t.to_string()).collect(),
        "the gateway saw exactly the three tenants"
    );
    let failed = get(&format!("{}/metrics", sender.base))
        .await
        .body
        .lines()
        .filter(|l| {
            l.starts_with("prometheus_remote_storage_samples_failed_total")
                || l.starts_with("prometheus_remote_storage_samples_dropped_total")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert_eq!(failed, 0.0, "the sender failed or dropped samples");
    drop(sender);
    drop(proxy);
    drop(receivers);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Prometheus sends metadata in requests of their own, without a tenant. With tenancy
/// and no `default`, behind a gateway requiring `X-Scope-OrgID` (401 without), those
/// requests used to be answered 503: Prometheus retried them forever
/// (`metadata_retried_total` 7,728, `metadata_total` 0 in the field). Now they go to the
/// tenants whose series of each family promnorm routed, never without a tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_from_prometheus_reaches_the_tenants_without_a_default_or_a_retry_loop() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    // Not scratch(): the other test of this file may be using it.
    let dir = std::env::temp_dir().join(format!(
        "promnorm-e2e-tenancy-metadata-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from("# HELP tm_total Metadata test.\n# TYPE tm_total counter\n");
    for i in 0..6 {
        let t = ["team-a", "team-b"][i % 2];
        text.push_str(&format!("tm_total{{i=\"{i}\",team=\"{t}\"}} {i}\n"));
    }
    let target = serve_exposition(text).await;
    // Only tm_total is written (not `up` and the other series Prometheus adds, which
    // have no team: without `default` they go with no tenant, as documented).
    // (tenant, series, metadata families) of each accepted request; refusals counted.
    type Seen = Arc<Mutex<Vec<(String, usize, Vec<String>)>>>;
    let seen: Seen = Arc::default();
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (seen2, refused2) = (seen.clone(), refused.clone());
    let app = axum::Router::new().route(
        "/api/v1/push",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (seen, refused) = (seen2.clone(), refused2.clone());
            async move {
                let Some(tenant) = headers.get("x-scope-orgid").and_then(|v| v.to_str().ok())
                else {
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return StatusCode::UNAUTHORIZED;
                };
                let req = decode(&body);
                seen.lock().unwrap().push((
                    tenant.to_string(),
                    req.timeseries.len(),
                    req.metadata
                        .into_iter()
                        .map(|m| m.metric_family_name)
                        .collect(),
                ));
                StatusCode::OK
            }
        }),
    );
    let gateway_url = format!("http://{}/api/v1/push", common::serve(app).await);
    let mut proxy = promnorm_serve(&dir, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nshutdown_timeout: 2s\ntenancy:\n  label: team\nbackends:\n  - name: gateway\n    url: {gateway_url}\n"
        )
    });
    proxy.start("/-/ready").await;
    let mut sender = prometheus_sender(
        &prom,
        &dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {}/api/v1/write\n    write_relabel_configs:\n      - source_labels: [__name__]\n        regex: tm_total\n        action: keep\n    metadata_config:\n      send_interval: 1s\n    queue_config:\n      batch_send_deadline: 250ms\n      min_backoff: 100ms\n      max_backoff: 1s\n",
            proxy.base
        ),
    );
    sender.start("/-/ready").await;
    let metadata_at = |tenant: &str| {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|(t, series, families)| {
                t == tenant && *series == 0 && families.iter().any(|f| f.starts_with("tm"))
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    while (metadata_at("team-a") < 2 || metadata_at("team-b") < 2) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let sender_metric = |body: &str, name: &str| {
        body.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let m = get(&format!("{}/metrics", sender.base)).await.body;
    let (sent, retried, failed) = (
        sender_metric(&m, "prometheus_remote_storage_metadata_total"),
        sender_metric(&m, "prometheus_remote_storage_metadata_retried_total"),
        sender_metric(&m, "prometheus_remote_storage_metadata_failed_total"),
    );
    eprintln!(
        "e2e tenancy metadata: sender metadata_total {sent}, retried {retried}, failed {failed}; gateway: {} metadata requests at team-a, {} at team-b, {} refused without a tenant",
        metadata_at("team-a"),
        metadata_at("team-b"),
        refused.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(metadata_at("team-a") >= 2 && metadata_at("team-b") >= 2);
    assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(sent > 0.0);
    assert_eq!(retried, 0.0, "the sender retried metadata");
    assert_eq!(failed, 0.0);
    let p = get(&format!("{}/metrics", proxy.base)).await.body;
    assert_eq!(
        sender_metric(&p, "promnorm_backend_misconfigured{backend=\"gateway\"}"),
        0.0
    );
    drop(sender);
    drop(proxy);
    let _ = std::fs::remove_dir_all(&dir);
}
