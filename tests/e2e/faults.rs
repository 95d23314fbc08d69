//! Faults with a real sender: Debian's Prometheus 2.42 scrapes a small target every
//! second and remote-writes through promnorm (in process) into a backend whose answers
//! the test switches. Losses are counted series by series against the sender's own
//! TSDB, and the sender's `prometheus_remote_storage_samples_failed_total` must stay 0.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh fetches it); with `PROMNORM_E2E=1` a missing
//! binary is a failure. `PROMNORM_FAULT_SECONDS` sets the length of the outage (20 s by
//! default; the closing measurement used 60).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::*;

const SERIES: usize = 50;

/// Received samples: series label `i` → timestamps.
type Received = Arc<Mutex<BTreeMap<String, BTreeSet<i64>>>>;

/// A backend that answers `status` (switchable) and records what it accepted.
async fn switchable_backend(status: Arc<AtomicU16>) -> (String, Received) {
    let received: Received = Arc::default();
    let rec = received.clone();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |body: Bytes| {
            let rec = rec.clone();
            let status = status.load(Ordering::Relaxed);
            async move {
                if status == 204 {
                    let req = decode(&body);
                    let mut rec = rec.lock().unwrap();
                    for ts in req.timeseries {
                        let is_ours = ts
                            .labels
                            .iter()
                            .any(|l| l.name == "__name__" && l.value == "fault_test_total");
                        let Some(i) = ts.labels.iter().find(|l| l.name == "i") else {
                            continue;
                        };
                        if is_ours {
                            rec.entry(i.value.clone())
                                .or_default()
                                .extend(ts.samples.iter().map(|s| s.timestamp));
                        }
                    }
                }
                let mut resp = axum::response::Response::new(axum::body::Body::from(
                    "backend says: token expired",
                ));
                *resp.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
                resp
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/write"), received)
}

/// A scrape target with `SERIES` counters.
async fn target() -> std::net::SocketAddr {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            let mut text = String::from("# TYPE fault_test_total counter\n");
            for i in 0..SERIES {
                text.push_str(&format!("fault_test_total{{i=\"{i}\"}} {i}\n"));
            }
            text
        }),
    );
    common::serve(app).await
}

async fn get_status(url: &str) -> u16 {
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    match client
        .request(
            axum::http::Request::get(url)
                .body(http_body_util::Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
    {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

async fn sender_metric(base: &str, name: &str) -> f64 {
    let body = get(&format!("{base}/metrics")).await.body;
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_refusing_our_credentials_loses_nothing() {
    let Some(prom) = prometheus_bin() else {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!("PROMNORM_E2E=1 but PROMETHEUS_BIN is not set to an existing binary");
        }
        eprintln!("SKIPPED: set PROMETHEUS_BIN (scripts/test.sh does) to run the fault tests");
        return;
    };
    let outage = Duration::from_secs(
        std::env::var("PROMNORM_FAULT_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let status = Arc::new(AtomicU16::new(401));
    let (backend, received) = switchable_backend(status.clone()).await;
    let proxy = start_proxy(&[backend], "").await;
    let target = target().await;

    let tmp = std::env::temp_dir().join(format!("promnorm-faults-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let port = free_port();
    std::fs::write(
        tmp.join("sender.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {}\n    remote_timeout: 5s\n    queue_config:\n      batch_send_deadline: 1s\n      min_backoff: 100ms\n      max_backoff: 2s\n",
            proxy.url()
        ),
    )
    .unwrap();
    let _sender = Killed(
        Command::new(&prom)
            .arg(format!(
                "--config.file={}",
                tmp.join("sender.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let base = format!("http://127.0.0.1:{port}");

    let up = Instant::now() + Duration::from_secs(30);
    while get_status(&format!("{base}/-/ready")).await != 200 {
        assert!(Instant::now() < up, "the sender did not start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The backend refuses our credentials for the whole outage, then accepts again.
    tokio::time::sleep(outage).await;
    let refused_sends =
        sender_metric(&base, "prometheus_remote_storage_samples_retried_total").await;
    status.store(204, Ordering::Relaxed);

    let switched_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;

    // Series by series: every scrape up to the switch must arrive.
    let missing_of = |sent: &BTreeMap<String, BTreeSet<i64>>,
                      got: &BTreeMap<String, BTreeSet<i64>>| {
        let mut scraped = 0usize;
        let mut missing = 0usize;
        for (i, ts) in sent {
            let g = got.get(i);
            for t in ts.range(..=switched_ms) {
                scraped += 1;
                if !g.is_some_and(|g| g.contains(t)) {
                    missing += 1;
                }
            }
        }
        (scraped, missing)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (sent, scraped, missing) = loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let sent = samples_by_label(&base, "fault_test_total%5B10m%5D", "i").await;
        let got = received.lock().unwrap().clone();
        let (scraped, missing) = missing_of(&sent, &got);
        if (sent.len() == SERIES && missing == 0) || Instant::now() > deadline {
            break (sent, scraped, missing);
        }
    };
    let failed = sender_metric(&base, "prometheus_remote_storage_samples_failed_total").await;
    let dropped = sender_metric(&base, "prometheus_remote_storage_samples_dropped_total").await;
    println!(
        "backend answered 401 for {outage:?}: sender retried {refused_sends} samples meanwhile; \
         {scraped} samples scraped of {} series, {missing} missing at the backend; sender failed {failed}, dropped {dropped}",
        sent.len()
    );
    assert_eq!(sent.len(), SERIES);
    assert!(refused_sends > 0.0, "the sender was asked to retry");
    assert_eq!(failed, 0.0, "the sender gave up on samples");
    assert_eq!(missing, 0, "samples lost");
    assert!(
        scraped >= SERIES * (outage.as_secs() as usize / 2),
        "the outage's scrapes are among those checked ({scraped})"
    );
}
