//! Per-backend queues (`backends[].queue`, docs/queues.md) through the HTTP path, against
//! in-process backends whose answers the tests switch: a dead backend holds up neither
//! the sender nor another backend, each series keeps its order across shards, a full
//! queue answers 429 and loses nothing, a data error is dropped and counted, a disk
//! queue replays after a restart.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use common::*;
use tokio::net::TcpListener;

/// A backend whose answer the test changes while it runs; it records every sample it
/// accepted as (series, timestamp) in arrival order.
#[derive(Clone)]
struct Backend {
    url: String,
    status: Arc<Mutex<u16>>,
    /// Requests holding a series named this are answered 400.
    poison: Arc<Mutex<Option<String>>>,
    accepted: Arc<Mutex<Vec<(String, i64)>>>,
    headers: Arc<Mutex<Vec<HeaderMap>>>,
    delay: Duration,
}

impl Backend {
    async fn start(status: u16, delay: Duration) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let b = Backend {
            url: format!("http://{addr}/api/v1/write"),
            status: Arc::new(Mutex::new(status)),
            poison: Arc::new(Mutex::new(None)),
            accepted: Arc::default(),
            headers: Arc::default(),
            delay,
        };
        let b2 = b.clone();
        let app = axum::Router::new().route(
            "/api/v1/write",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let b = b2.clone();
                async move {
                    tokio::time::sleep(b.delay).await;
                    let status = *b.status.lock().unwrap();
                    if status != 204 {
                        return StatusCode::from_u16(status).unwrap();
                    }
                    let req = decode(&body);
                    let poison = b.poison.lock().unwrap().clone();
                    let name = |t: &promnorm::wire::proto::prometheus::TimeSeries| {
                        t.labels
                            .iter()
                            .map(|l| format!("{}={}", l.name, l.value))
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    if let Some(p) = poison
                        && req.timeseries.iter().any(|t| name(t).contains(&p))
                    {
                        return StatusCode::BAD_REQUEST;
                    }
                    let mut acc = b.accepted.lock().unwrap();
                    for t in &req.timeseries {
                        for s in &t.samples {
                            acc.push((name(t), s.timestamp));
                        }
                    }
                    b.headers.lock().unwrap().push(headers);
                    StatusCode::NO_CONTENT
                }
            }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        b
    }

    fn set(&self, status: u16) {
        *self.status.lock().unwrap() = status;
    }

    fn samples(&self) -> Vec<(String, i64)> {
        self.accepted.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize, within: Duration) -> Vec<(String, i64)> {
        let start = Instant::now();
        loop {
            let s = self.samples();
            if s.len() >= n || start.elapsed() > within {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A request of `series` series (`job=<tag>`, `instance=i<k>`), one sample each at `ts`.
fn request(tag: &str, series: usize, ts: i64, pad: usize) -> Vec<u8> {
    // Random-looking padding, different per series, so snappy cannot compress it away.
    let pad_for = |k: usize| -> String {
        let mut x = (ts as u64) << 20 ^ k as u64 ^ 0x9e37_79b9_7f4a_7c15;
        (0..pad)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (b'a' + (x % 26) as u8) as char
            })
            .collect()
    };
    let req = promnorm::wire::proto::prometheus::WriteRequest {
        timeseries: (0..series)
            .map(|k| {
                series_of(&[
                    ("__name__", "queue_test_metric"),
                    ("instance", &format!("i{k}")),
                    ("job", tag),
                    ("pad", &pad_for(k)),
                ])
                .with(ts)
            })
            .collect(),
        ..Default::default()
    };
    encode(&req)
}

trait With {
    fn with(self, ts: i64) -> promnorm::wire::proto::prometheus::TimeSeries;
}

impl With for promnorm::wire::proto::prometheus::TimeSeries {
    fn with(mut self, ts: i64) -> Self {
        self.samples
            .push(promnorm::wire::proto::prometheus::Sample {
                value: ts as f64,
                timestamp: ts,
            });
        self
    }
}

fn series_of(labels: &[(&str, &str)]) -> promnorm::wire::proto::prometheus::TimeSeries {
    series(labels, &[])
}

fn backend_yaml(name: &str, url: &str, queue: &str) -> String {
    format!("  - name: {name}\n    url: {url}\n    timeout: 2s\n    queue: {queue}\n")
}

/// Every series' timestamps in arrival order are strictly increasing, and each
/// (series, timestamp) arrived exactly once.
fn assert_in_order_exactly_once(samples: &[(String, i64)]) {
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for (s, t) in samples {
        if let Some(prev) = last.insert(s, *t) {
            assert!(*t > prev, "series {s}: {t} arrived after {prev}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_holds_up_neither_the_sender_nor_the_healthy_backend() {
    let healthy = Backend::start(204, Duration::ZERO).await;
    let dead = Backend::start(503, Duration::ZERO).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}{}",
        backend_yaml("healthy", &healthy.url, "{type: memory}"),
        backend_yaml("dead", &dead.url, "{type: memory}")
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(10)).await;
    let start = Instant::now();
    for ts in 1..=20 {
        let r = post(&proxy.url(), request("a", 10, ts, 0), RW_HEADERS).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    let sender_time = start.elapsed();
    assert!(
        sender_time < Duration::from_secs(3),
        "sender waited {sender_time:?}"
    );
    let got = healthy.wait_for(200, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 200, "the healthy backend is current");
    assert!(dead.samples().is_empty());
    let m = get(&format!("http://{}/metrics", proxy.addr)).await.body;
    assert!(
        m.lines().any(
            |l| l.starts_with("promnorm_queue_requests{backend=\"dead\"}") && !l.ends_with(" 0")
        ),
        "{m}"
    );
    // The dead backend comes back and catches up, in order, exactly once.
    dead.set(204);
    let caught_up = dead.wait_for(200, Duration::from_secs(10)).await;
    assert_eq!(caught_up.len(), 200);
    assert_in_order_exactly_once(&caught_up);
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_queues_keep_every_series_in_order() {
    let b = Backend::start(204, Duration::from_millis(3)).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}",
        // One request per part: what reaches the backend shows the split (batches of
        // a backlog are checked in forward::queue's tests and the e2e fault suite).
        backend_yaml(
            "sharded",
            &b.url,
            "{type: memory, shards: 4, max_samples_per_send: 1}"
        )
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(10)).await;
    for ts in 1..=40 {
        let r = post(&proxy.url(), request("s", 50, ts, 0), RW_HEADERS).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    let got = b.wait_for(2000, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2000);
    assert_in_order_exactly_once(&got);
    // Four shards really sent concurrently: not every request held every series.
    let requests = b.headers.lock().unwrap().len();
    assert!(requests > 40, "{requests} requests for 40 sent");
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_loses_nothing_once_it_drains() {
    let b = Backend::start(503, Duration::ZERO).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}",
        backend_yaml("small", &b.url, "{type: memory, max_bytes: 1048576}")
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(10)).await;
    let mut accepted = 0;
    let mut refused = Vec::new();
    for ts in 1..=40 {
        // ~100 KB compressed each (random-looking padding does not compress away).
        let body = request(&format!("f{ts}"), 20, ts, 4000);
        let r = post(&proxy.url(), body.clone(), RW_HEADERS).await;
        match r.status {
            StatusCode::NO_CONTENT => accepted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(
                    r.headers.contains_key("retry-after"),
                    "429 without Retry-After"
                );
                assert!(r.body.contains("full"), "{}", r.body);
                refused.push(body);
            }
            s => panic!("unexpected {s}: {}", r.body),
        }
    }
    assert!(
        accepted > 0 && !refused.is_empty(),
        "{accepted} accepted, {} refused",
        refused.len()
    );
    let ready = get(&format!("http://{}/-/ready", proxy.addr)).await;
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "every queue is full"
    );
    // The backend recovers; the sender retries what was refused.
    b.set(204);
    let start = Instant::now();
    while let Some(body) = refused.first().cloned() {
        let r = post(&proxy.url(), body, RW_HEADERS).await;
        if r.status == StatusCode::NO_CONTENT {
            refused.remove(0);
        } else {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still refused: {}",
                r.body
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let got = b.wait_for(40 * 20, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 800, "every sample of the 40 requests, once");
    assert_in_order_exactly_once(&got);
    assert_eq!(
        get(&format!("http://{}/-/ready", proxy.addr)).await.status,
        StatusCode::OK
    );
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_backend_rejects_is_dropped_and_counted_and_the_rest_flow() {
    let b = Backend::start(204, Duration::ZERO).await;
    *b.poison.lock().unwrap() = Some("job=poison".into());
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}",
        backend_yaml("picky", &b.url, "{type: memory}")
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(10)).await;
    for ts in 1..=10 {
        let tag = if ts == 5 { "poison" } else { "good" };
        let r = post(&proxy.url(), request(tag, 7, ts, 0), RW_HEADERS).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
    }
    let got = b.wait_for(63, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 63, "nine good requests of seven samples");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = get(&format!("http://{}/metrics", proxy.addr)).await.body;
    let line = m
        .lines()
        .find(|l| {
            l.starts_with("promnorm_samples_dropped_total")
                && l.contains("backend=\"picky\"")
                && l.contains("reason=\"backend_rejected\"")
        })
        .unwrap_or_else(|| panic!("no drop counter:\n{m}"));
    assert!(line.ends_with(" 7"), "{line}");
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_keeps_the_newest_data_and_counts_the_rest() {
    let b = Backend::start(503, Duration::ZERO).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}",
        backend_yaml(
            "fresh",
            &b.url,
            "{type: memory, max_bytes: 1048576, when_full: drop_oldest}"
        )
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(10)).await;
    for ts in 1..=40 {
        let r = post(
            &proxy.url(),
            request(&format!("d{ts}"), 20, ts, 4000),
            RW_HEADERS,
        )
        .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    b.set(204);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = b.samples();
    assert!(!got.is_empty() && got.len() < 800, "{} samples", got.len());
    assert!(
        got.iter().any(|(s, _)| s.contains("job=d40")),
        "the newest request survived"
    );
    let m = get(&format!("http://{}/metrics", proxy.addr)).await.body;
    let dropped: u64 = m
        .lines()
        .find(|l| l.contains("backend=\"fresh\"") && l.contains("reason=\"queue_full\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{m}"));
    assert_eq!(
        dropped as usize + got.len(),
        800,
        "delivered + dropped = sent"
    );
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_queue_delivers_after_a_restart_what_it_answered_204_for() {
    let dir = std::env::temp_dir().join(format!("promnorm-queue-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = Backend::start(503, Duration::ZERO).await;
    let queue = format!(
        "{{type: disk, dir: {}, fsync_interval: 0s, shards: 2}}",
        dir.display()
    );
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}",
        backend_yaml("durable", &b.url, &queue)
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_millis(200)).await;
    for ts in 1..=15 {
        let r = post(&proxy.url(), request("r", 10, ts, 0), RW_HEADERS).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    }
    proxy.shut_down().await;
    assert!(b.samples().is_empty());
    b.set(204);
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(5)).await;
    let got = b.wait_for(150, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 150, "all 15 requests replayed");
    assert_in_order_exactly_once(&got);
    proxy.shut_down().await;
    // Acknowledged: a third start replays nothing.
    let before = b.samples().len();
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.samples().len(), before);
    proxy.shut_down().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_keep_the_senders_pass_through_headers() {
    let b = Backend::start(204, Duration::ZERO).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n  - name: tenant\n    url: {}\n    pass_headers: [X-Scope-OrgID]\n    queue: {{type: memory}}\n",
        b.url
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(5)).await;
    let mut headers = RW_HEADERS.to_vec();
    headers.push(("X-Scope-OrgID", "team-7"));
    let r = post(&proxy.url(), request("h", 3, 1, 0), &headers).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    b.wait_for(3, Duration::from_secs(5)).await;
    let h = b.headers.lock().unwrap()[0].clone();
    assert_eq!(h["x-scope-orgid"], "team-7");
    proxy.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_full_queue_refuses_the_request_for_every_backend_alike() {
    let healthy = Backend::start(204, Duration::ZERO).await;
    let dead = Backend::start(503, Duration::ZERO).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n{}{}",
        backend_yaml("roomy", &healthy.url, "{type: memory}"),
        backend_yaml("tight", &dead.url, "{type: memory, max_bytes: 1048576}")
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(5)).await;
    let mut accepted = 0;
    let mut refused = 0;
    for ts in 1..=40 {
        let r = post(
            &proxy.url(),
            request(&format!("a{ts}"), 20, ts, 4000),
            RW_HEADERS,
        )
        .await;
        match r.status {
            StatusCode::NO_CONTENT => accepted += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            s => panic!("{s}: {}", r.body),
        }
    }
    assert!(
        accepted > 0 && refused > 0,
        "{accepted} accepted, {refused} refused"
    );
    // The healthy backend got exactly the accepted requests: a refused one reached no
    // queue, so the sender's retry will not duplicate it there.
    let got = healthy
        .wait_for(accepted * 20, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        healthy.samples().len(),
        accepted * 20,
        "{} samples",
        got.len()
    );
    proxy.shut_down().await;
}
