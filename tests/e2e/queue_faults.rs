//! The fault-injection suite (docs/queues.md): Debian's Prometheus 2.42 scrapes a target
//! of `SERIES` counters every `SCRAPE`, remote-writes through a real `promnorm serve`
//! process into real receivers (Prometheus with its remote-write receiver, and
//! VictoriaMetrics single-node for one case), while the test kills, stops and restarts
//! them. Every check is series by series: each timestamp the sender scraped in the
//! checked window must be at the receiver (the receiver's `count_over_time` equals the
//! number of scrapes), and the sender's `prometheus_remote_storage_samples_failed_total`
//! and `..._dropped_total` stay 0.
//!
//! Needs `PROMETHEUS_BIN` (and `VICTORIA_METRICS_BIN` for the VictoriaMetrics case);
//! scripts/test.sh fetches both. With `PROMNORM_E2E=1` a missing binary is a failure.
//! `PROMNORM_OUTAGE_SECONDS` sets the outages (20 s by default; the ignored
//! `long_outage_*` test uses 600).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::procs::*;
use common::*;

const SERIES: usize = 200;
const SCRAPE: Duration = Duration::from_secs(1);

/// One scenario at a time: they share two cores and must not skew each other's timing.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("PROMNORM_OUTAGE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    )
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("promnorm-qf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A scrape target: `SERIES` counters `qf_total{i}` with a padding label (so a queue
/// fills in seconds, not hours, when a test wants it to).
async fn target(pad: usize) -> std::net::SocketAddr {
    let text = {
        let mut t = String::from("# TYPE qf_total counter\n");
        for i in 0..SERIES {
            let mut x = i as u64 * 0x9e37_79b9 + 1;
            let p: String = (0..pad)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (b'a' + (x % 26) as u8) as char
                })
                .collect();
            t.push_str(&format!("qf_total{{i=\"{i}\",pad=\"{p}\"}} {i}\n"));
        }
        t
    };
    serve_exposition(text).await
}

fn victoria_receiver(vm: &Path, dir: &Path) -> Proc {
    let port = free_port();
    Proc::new(
        vm,
        vec![
            format!("-storageDataPath={}", dir.join("vm").display()),
            format!("-httpListenAddr=127.0.0.1:{port}"),
            "-search.latencyOffset=0s".into(),
            "-search.disableCache".into(),
            "-loggerLevel=ERROR".into(),
        ],
        port,
    )
}

/// The sender: scrapes `target` every `SCRAPE` and remote-writes to `url`.
fn sender(prom: &Path, dir: &Path, target: std::net::SocketAddr, url: &str) -> Proc {
    prometheus_sender(
        prom,
        dir,
        &format!(
            "global:\n  scrape_interval: {s}s\n  scrape_timeout: {s}s\nscrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {url}\n    remote_timeout: 5s\n    queue_config:\n      batch_send_deadline: 250ms\n      min_backoff: 100ms\n      max_backoff: 2s\n",
            s = SCRAPE.as_secs()
        ),
    )
}

/// Starts a sender scraping a target with `pad` bytes of padding per series into
/// `proxy`; `queue_extra` adds lines to its `queue_config` (e.g. `retry_on_http_429`).
async fn start_sender(
    prom: &Path,
    dir: &Path,
    pad: usize,
    proxy: &Proc,
    queue_extra: &str,
) -> Proc {
    let mut snd = sender(
        prom,
        dir,
        target(pad).await,
        &format!("{}/api/v1/write", proxy.base),
    );
    if !queue_extra.is_empty() {
        let cfg = dir.join("sender.yml");
        let text = std::fs::read_to_string(&cfg).unwrap();
        let extra = format!("      {queue_extra}\n      min_backoff:");
        std::fs::write(&cfg, text.replace("      min_backoff:", &extra)).unwrap();
    }
    snd.start("/-/ready").await;
    snd
}

/// A real `promnorm serve` with `backends_yaml` (a YAML list).
fn promnorm(dir: &Path, backends_yaml: &str) -> Proc {
    promnorm_serve(dir, |port| {
        format!("listen: 127.0.0.1:{port}\nshutdown_timeout: 2s\nbackends:\n{backends_yaml}")
    })
}

type Samples = SamplesByLabel;

/// Every sample of `qf_total` a server holds for the last 15 minutes: `i` → timestamps.
async fn samples_at(base: &str) -> Samples {
    samples_by_label(base, "qf_total%5B15m%5D", "i").await
}

async fn metric(base: &str, name: &str, filter: &str) -> f64 {
    get(&format!("{base}/metrics"))
        .await
        .body
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Scraped (at the sender) up to `until_ms`, and of those missing at the receiver.
fn missing(sent: &Samples, got: &Samples, until_ms: i64) -> (usize, usize) {
    let mut scraped = 0;
    let mut lost = 0;
    for (i, ts) in sent {
        for t in ts.range(..=until_ms) {
            scraped += 1;
            if !got.get(i).is_some_and(|g| g.contains(t)) {
                lost += 1;
            }
        }
    }
    (scraped, lost)
}

/// Waits until every sample the sender scraped up to `until_ms` is at `receiver`;
/// returns (scraped, missing) at the end.
async fn wait_delivered(
    sender: &str,
    receiver: &str,
    until_ms: i64,
    within: Duration,
) -> (usize, usize) {
    let deadline = Instant::now() + within;
    loop {
        let sent = samples_at(sender).await;
        let got = samples_at(receiver).await;
        let (scraped, lost) = missing(&sent, &got, until_ms);
        if (sent.len() == SERIES && lost == 0) || Instant::now() > deadline {
            return (scraped, lost);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn assert_sender_clean(sender: &str) {
    let failed = metric(sender, "prometheus_remote_storage_samples_failed_total", "").await;
    let dropped = metric(
        sender,
        "prometheus_remote_storage_samples_dropped_total",
        "",
    )
    .await;
    assert_eq!(failed, 0.0, "the sender gave up on samples");
    assert_eq!(dropped, 0.0, "the sender dropped samples");
}

/// The newest `qf_total{i="0"}` sample a server holds, as an age in seconds.
async fn lag_at(base: &str) -> f64 {
    let newest = samples_at(base)
        .await
        .get("0")
        .and_then(|s| s.last().copied())
        .unwrap_or(0);
    (now_ms() - newest) as f64 / 1000.0
}

/// Case 1: the receiver is down for an outage, then back; `queue` is `none` or `disk`.
async fn receiver_down_then_back(queue: &str, vm: bool) {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let vm_bin = if vm {
        match binary("VICTORIA_METRICS_BIN") {
            Some(b) => Some(b),
            None => return,
        }
    } else {
        None
    };
    let _serial = SERIAL.lock().await;
    let dir = scratch(&format!("down-{}{}", queue.len(), vm));
    let mut receiver = match &vm_bin {
        Some(b) => victoria_receiver(b, &dir),
        None => prometheus_receiver(&prom, &dir),
    };
    let ready = if vm { "/health" } else { "/-/ready" };
    receiver.start(ready).await;
    let queue_yaml = queue.replace("DIR", &dir.join("queue").display().to_string());
    let mut proxy = promnorm(
        &dir,
        &format!(
            "  - name: r\n    url: {}/api/v1/write\n    queue: {queue_yaml}\n",
            receiver.base
        ),
    );
    proxy.start("/-/ready").await;
    let snd = start_sender(&prom, &dir, 0, &proxy, "").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    receiver.kill();
    tokio::time::sleep(outage()).await;
    receiver.start(ready).await;
    let until = now_ms();
    let (scraped, lost) =
        wait_delivered(&snd.base, &receiver.base, until, Duration::from_secs(60)).await;
    let queued = metric(&proxy.base, "promnorm_queue_retries_total", "").await;
    println!(
        "receiver ({}) down {:?}, queue {queue}: {scraped} samples scraped, {lost} missing at the receiver; promnorm queue retries {queued}",
        if vm { "VictoriaMetrics" } else { "Prometheus" },
        outage()
    );
    assert_eq!(lost, 0, "samples lost");
    // The check covers the outage's scrapes (Prometheus may skip or delay a few while
    // the machine is busy: half of one per second is the floor).
    assert!(
        scraped >= SERIES * (outage().as_secs() as usize) / 2,
        "{scraped} checked"
    );
    assert_sender_clean(&snd.base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_down_then_back_without_a_queue() {
    receiver_down_then_back("{type: none}", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_down_then_back_with_a_disk_queue() {
    receiver_down_then_back("{type: disk, dir: DIR}", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn victoria_metrics_down_then_back_with_a_disk_queue() {
    receiver_down_then_back("{type: disk, dir: DIR, shards: 2}", true).await;
}

/// Case 2: promnorm is SIGKILLed while its backend is down and its disk queue holds
/// data it answered 204 for; after a restart everything arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promnorm_killed_with_a_disk_queue_loses_nothing() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let dir = scratch("kill");
    let mut receiver = prometheus_receiver(&prom, &dir);
    receiver.start("/-/ready").await;
    let mut proxy = promnorm(
        &dir,
        &format!(
            "  - name: r\n    url: {}/api/v1/write\n    queue: {{type: disk, dir: {}, fsync_interval: 0s, shards: 2}}\n",
            receiver.base,
            dir.join("queue").display()
        ),
    );
    proxy.start("/-/ready").await;
    let snd = start_sender(&prom, &dir, 0, &proxy, "").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    receiver.kill();
    tokio::time::sleep(outage() / 2).await;
    let queued = metric(&proxy.base, "promnorm_queue_requests", "").await;
    assert!(
        queued > 0.0,
        "the disk queue holds what the sender was answered 204 for"
    );
    proxy.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.start("/-/ready").await;
    tokio::time::sleep(outage() / 2).await;
    receiver.start("/-/ready").await;
    let until = now_ms();
    let (scraped, lost) =
        wait_delivered(&snd.base, &receiver.base, until, Duration::from_secs(60)).await;
    println!(
        "promnorm SIGKILLed with {queued} requests in its disk queue, receiver down {:?}: {scraped} samples scraped, {lost} missing",
        outage()
    );
    assert_eq!(lost, 0, "samples lost");
    assert_sender_clean(&snd.base).await;
}

/// Case 3: two backends, one unreachable for the outage: with queues the healthy one
/// stays current and the other catches up; without queues both wait (documented).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dead_backend_of_two() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    for queue in ["{type: memory, shards: 2}", "{type: none}"] {
        let dir = scratch(&format!("two-{}", queue.len()));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::create_dir_all(dir.join("b")).unwrap();
        let mut healthy = prometheus_receiver(&prom, &dir.join("a"));
        let mut dead = prometheus_receiver(&prom, &dir.join("b"));
        healthy.start("/-/ready").await;
        dead.start("/-/ready").await;
        let mut proxy = promnorm(
            &dir,
            &format!(
                "  - name: healthy\n    url: {}/api/v1/write\n    queue: {queue}\n  - name: dead\n    url: {}/api/v1/write\n    queue: {queue}\n",
                healthy.base, dead.base
            ),
        );
        proxy.start("/-/ready").await;
        let snd = start_sender(&prom, &dir, 0, &proxy, "").await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        dead.kill();
        let end = Instant::now() + outage();
        let mut lags = Vec::new();
        tokio::time::sleep(Duration::from_secs(3)).await;
        while Instant::now() < end {
            lags.push(lag_at(&healthy.base).await);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        dead.start("/-/ready").await;
        let until = now_ms();
        let (scraped, lost) =
            wait_delivered(&snd.base, &dead.base, until, Duration::from_secs(60)).await;
        let (_, lost_healthy) =
            wait_delivered(&snd.base, &healthy.base, until, Duration::from_secs(30)).await;
        lags.sort_by(f64::total_cmp);
        let worst = lags.last().copied().unwrap_or(f64::MAX);
        println!(
            "two backends, queue {queue}, one down {:?}: healthy backend's lag during the outage: median {:.1} s, worst {worst:.1} s; afterwards {lost} of {scraped} missing at the recovered one, {lost_healthy} at the healthy one",
            outage(),
            lags.get(lags.len() / 2).copied().unwrap_or(f64::MAX)
        );
        assert_eq!(lost, 0, "the recovered backend caught up");
        assert_eq!(lost_healthy, 0);
        if queue.contains("memory") {
            assert!(
                worst < 2.0 * SCRAPE.as_secs_f64() + 1.0,
                "the healthy backend fell behind: {lags:?}"
            );
        } else {
            assert!(
                worst > 3.0 * SCRAPE.as_secs_f64(),
                "without queues both wait: {lags:?}"
            );
        }
        assert_sender_clean(&snd.base).await;
    }
}

/// Case 4: the queue fills while its backend is down: the sender is refused, retries,
/// and nothing is lost once the backend drains the queue. Prometheus drops a batch
/// answered 429 unless `retry_on_http_429: true` (its default is false, in 2.x and 3.x):
/// so once with that set and promnorm's default `429`, once with the sender's defaults
/// and `server.throttle_status: 503`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_makes_the_sender_retry_and_loses_nothing() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    for (status, sender_429) in [(429, true), (503, false)] {
        let dir = scratch(&format!("full-{status}"));
        let mut receiver = prometheus_receiver(&prom, &dir);
        receiver.start("/-/ready").await;
        let mut proxy = promnorm(
            &dir,
            &format!(
                "  - name: r\n    url: {}/api/v1/write\n    queue: {{type: memory, max_bytes: 1048576}}\nserver:\n  throttle_status: {status}\n",
                receiver.base
            ),
        );
        proxy.start("/-/ready").await;
        // ~1 KB of incompressible label per series: the 1 MiB queue fills in seconds.
        let extra = if sender_429 {
            "retry_on_http_429: true"
        } else {
            ""
        };
        let snd = start_sender(&prom, &dir, 1000, &proxy, extra).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        receiver.kill();
        tokio::time::sleep(outage()).await;
        let refused = metric(
            &proxy.base,
            "promnorm_queue_refused_requests_total",
            "reason=\"full\"",
        )
        .await;
        let answered = metric(
            &proxy.base,
            "promnorm_requests_total",
            &format!("code=\"{status}\""),
        )
        .await;
        receiver.start("/-/ready").await;
        let until = now_ms();
        let (scraped, lost) =
            wait_delivered(&snd.base, &receiver.base, until, Duration::from_secs(90)).await;
        println!(
            "queue full while the receiver was down {:?}, answered {status} (sender retry_on_http_429: {sender_429}): {answered} requests answered {status} ({refused} refused by the queue); {scraped} samples scraped, {lost} missing",
            outage()
        );
        assert!(answered > 0.0, "the sender was refused");
        assert_eq!(lost, 0, "samples lost");
        assert_sender_clean(&snd.base).await;
    }
}

/// Case 5: the backend answers 400 to one request holding a chosen series: that
/// request's samples are dropped and counted, the rest keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_request_is_dropped_and_counted_and_the_rest_flow() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let dir = scratch("reject");
    let received: Arc<Mutex<Samples>> = Arc::default();
    let rejected: Arc<Mutex<Samples>> = Arc::default();
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Every sample of the rejected request, `up` and the other scrape series included.
    let rejected_all = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (r2, j2, a2, all2) = (
        received.clone(),
        rejected.clone(),
        armed.clone(),
        rejected_all.clone(),
    );
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |body: Bytes| {
            let (received, rejected, armed, all) =
                (r2.clone(), j2.clone(), a2.clone(), all2.clone());
            async move {
                let req = decode(&body);
                let mut batch = Samples::new();
                for ts in &req.timeseries {
                    if let Some(i) = ts.labels.iter().find(|l| l.name == "i") {
                        batch
                            .entry(i.value.clone())
                            .or_default()
                            .extend(ts.samples.iter().map(|s| s.timestamp));
                    }
                }
                let poisoned = batch.contains_key("7")
                    && armed.swap(false, std::sync::atomic::Ordering::SeqCst);
                let into = if poisoned { rejected } else { received };
                let mut into = into.lock().unwrap();
                for (i, ts) in batch {
                    into.entry(i).or_default().extend(ts);
                }
                if poisoned {
                    let n: usize = req.timeseries.iter().map(|t| t.samples.len()).sum();
                    all.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                    axum::http::StatusCode::BAD_REQUEST
                } else {
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let backend = common::serve(app).await;
    let mut proxy = promnorm(
        &dir,
        &format!(
            "  - name: picky\n    url: http://{backend}/api/v1/write\n    queue: {{type: memory}}\n"
        ),
    );
    proxy.start("/-/ready").await;
    let snd = start_sender(&prom, &dir, 0, &proxy, "").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let until = now_ms() - 2000;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = samples_at(&snd.base).await;
    let got = received.lock().unwrap().clone();
    let bad = rejected.lock().unwrap().clone();
    let rejected_samples: usize = bad.values().map(|s| s.len()).sum();
    let mut both = got.clone();
    for (i, ts) in &bad {
        both.entry(i.clone()).or_default().extend(ts);
    }
    let (scraped, lost) = missing(&sent, &both, until);
    let (_, not_delivered) = missing(&sent, &got, until);
    let counted = metric(
        &proxy.base,
        "promnorm_samples_dropped_total",
        "reason=\"backend_rejected\"",
    )
    .await;
    let in_request = rejected_all.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "one request rejected with 400: {in_request} samples in it ({rejected_samples} of qf_total, the rest `up` and the scrape series), promnorm counted {counted} dropped; {scraped} qf_total samples scraped, {not_delivered} not delivered, {lost} unaccounted"
    );
    assert!(rejected_samples > 0, "the backend rejected a request");
    assert_eq!(counted as usize, in_request, "the drop is counted exactly");
    assert_eq!(
        not_delivered, rejected_samples,
        "only the rejected request's samples are missing"
    );
    assert_eq!(lost, 0);
    assert_sender_clean(&snd.base).await;
}

/// The long variant: a 10-minute outage of the receiver with a disk queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "10-minute outage; run with PROMNORM_OUTAGE_SECONDS=600 cargo test --release --test e2e queue_faults:: -- --ignored"]
async fn long_outage_with_a_disk_queue() {
    receiver_down_then_back("{type: disk, dir: DIR}", false).await;
}
