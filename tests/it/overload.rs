//! The overload budget (`limits.max_inflight_bytes`, `limits.max_concurrent_requests`):
//! beyond it senders get `429` + `Retry-After` at once, counted, and the real `promnorm
//! serve` process stays under README's memory bound while hundreds of senders push
//! multi-MB bodies at a backend that answers after seconds.

use crate::common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use promnorm::wire::proto::prometheus as pb;

/// A request of `series` series whose label values are random hex (so snappy gains
/// little: the compressed body is multi-MB too).
fn big_request(series: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut hex = |n: usize| {
        let mut s = String::with_capacity(n);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.push(char::from_digit((x & 15) as u32, 16).unwrap());
        }
        s
    };
    let mut req = pb::WriteRequest::default();
    for i in 0..series {
        let pod = hex(32);
        let id = hex(24);
        req.timeseries.push(common::series(
            &[
                ("__name__", "vllm:num_requests_running"),
                ("instance", &format!("10.0.{}.{}:8000", i / 250, i % 250)),
                ("pod", &pod),
                ("request_id", &id),
            ],
            &[(i as f64, 1_700_000_000_000 + i as i64)],
        ));
    }
    encode(&req)
}

/// One POST on a fresh connection.
async fn try_post(url: &str, body: Vec<u8>) -> Result<HttpReply, String> {
    use http_body_util::{BodyExt, Full};
    let client: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let mut req = axum::http::Request::post(url);
    for (k, v) in RW_HEADERS {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(bytes::Bytes::from(body))).unwrap())
        .await
        .map_err(|e| format!("{e:?}"))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{e:?}"))?
        .to_bytes();
    Ok(HttpReply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A backend that reads each body, answers `204` after `delay`, and counts requests.
async fn slow_backend(delay: Duration) -> (String, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let app = axum::Router::new()
        .route(
            "/api/v1/write",
            axum::routing::post(move |body: bytes::Bytes| {
                let n = n2.clone();
                async move {
                    assert!(!body.is_empty());
                    n.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::disable());
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/write"), n)
}

struct Served {
    child: Killed,
    addr: SocketAddr,
}

fn serve(config_yaml: &str) -> Served {
    serve_in(config_yaml, &[], None)
}

/// `promnorm serve` with `env`, optionally inside the cgroup directory `cgroup` (its
/// `cgroup.procs` written before the binary starts, so the kernel's limit applies).
fn serve_in(config_yaml: &str, env: &[(&str, String)], cgroup: Option<&str>) -> Served {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("promnorm-ovl-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("promnorm.yaml");
    std::fs::write(&cfg, format!("listen: 127.0.0.1:{port}\n{config_yaml}")).unwrap();
    let bin = std::env::var("PROMNORM_TEST_BIN").unwrap_or(env!("CARGO_BIN_EXE_promnorm").into());
    let mut cmd = match cgroup {
        Some(cg) => {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"",
                cg,
                &bin,
            ]);
            c
        }
        None => Command::new(&bin),
    };
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = Killed(cmd.spawn().expect("spawn promnorm"));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "promnorm did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Served { child, addr }
}

/// `VmHWM` (peak RSS) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// README's bound: `64 MiB + 4 × max_inflight_bytes + worker threads × 64 MiB`.
fn memory_bound(max_inflight_bytes: u64) -> u64 {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    (64 << 20) + 4 * max_inflight_bytes + workers * (64 << 20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_senders_with_multi_mb_bodies_stay_under_the_memory_bound() {
    const SENDERS: usize = 300;
    const INFLIGHT: u64 = 48 << 20;
    let (backend, received) = slow_backend(Duration::from_secs(3)).await;
    let served = serve(&format!(
        "limits:\n  max_body_bytes: 8388608\n  max_decoded_bytes: 16777216\n  max_inflight_bytes: {INFLIGHT}\n  max_concurrent_requests: 200\nderived:\n  enabled: false\nbackends:\n  - url: {backend}\n    timeout: 30s\n"
    ));
    let body = big_request(30_000, 7);
    let decoded = snap::raw::decompress_len(&body).unwrap();
    assert!(body.len() > 2 << 20, "compressed body {} bytes", body.len());
    let url = format!("http://{}/api/v1/write", served.addr);
    let started = Instant::now();
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let url = url.clone();
            let body = body.clone();
            tokio::spawn(async move {
                // Each sender retries a refused request after its Retry-After, a few times.
                let mut codes = Vec::new();
                for _ in 0..5 {
                    let r = match try_post(&url, body.clone()).await {
                        Ok(r) => r,
                        Err(e) => {
                            codes.push(format!("error: {e}"));
                            break;
                        }
                    };
                    codes.push(if r.status.as_u16() == 400 {
                        format!("400 {}", r.body)
                    } else {
                        r.status.as_u16().to_string()
                    });
                    if r.status.as_u16() != 429 {
                        break;
                    }
                    let after: u64 = r
                        .headers
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                        .expect("429 carries Retry-After in seconds");
                    tokio::time::sleep(Duration::from_secs(after)).await;
                }
                codes
            })
        })
        .collect();
    let mut ok = 0;
    let mut throttled = 0;
    for s in senders {
        for code in s.await.unwrap() {
            match code.as_str() {
                "204" => ok += 1,
                "429" => throttled += 1,
                other => panic!("unexpected answer {other}"),
            }
        }
    }
    let elapsed = started.elapsed();
    let peak = peak_rss(served.child.0.id());
    let metrics = get(&format!("http://{}/metrics", served.addr)).await.body;
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("promnorm_requests_throttled_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let bound = memory_bound(INFLIGHT);
    println!(
        "{SENDERS} senders, body {} bytes ({decoded} decoded): {ok} x 204, {throttled} x 429 in {elapsed:?}; peak RSS {} MiB, bound {} MiB; offered {} MiB",
        body.len(),
        peak >> 20,
        bound >> 20,
        (SENDERS * (body.len() + decoded)) >> 20
    );
    assert!(ok > 0, "no request was accepted");
    assert!(throttled > 0, "no request was throttled");
    assert_eq!(counted as usize, throttled, "{metrics}");
    assert_eq!(received.load(Ordering::Relaxed), ok);
    assert!(
        peak < bound,
        "peak RSS {} MiB over the bound {} MiB",
        peak >> 20,
        bound >> 20
    );
}

/// Issue 25: the default configuration inside a 512 MiB container was OOM-killed in
/// 1.2 s by 300 senders of 3 MB bodies at a slow backend (1 GiB in flight allowed, a
/// bound of about 4.3 GiB). With the sizes derived from the limit, the process stays
/// under it: the excess gets the throttle status, nothing is killed or left unanswered.
/// The limit is given by `PROMNORM_MEMORY_LIMIT_BYTES`; with `PROMNORM_TEST_MEMORY_CGROUP`
/// naming a cgroup directory whose limit is set (root only), promnorm runs inside it and
/// detects the limit itself. `PROMNORM_TEST_BIN` runs another build (e.g. an older one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_configuration_stays_under_a_container_memory_limit() {
    const SENDERS: usize = 300;
    // 512 MiB, or more on a machine whose many cores make the bound's fixed part
    // (64 MiB a worker) leave less than 100 MiB of the 60% allowed.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let limit: u64 = (512u64 << 20).max(((64 + 64 * workers + 100) << 20) * 100 / 60);
    let cgroup = std::env::var("PROMNORM_TEST_MEMORY_CGROUP").ok();
    let env = match &cgroup {
        Some(_) => vec![],
        None => vec![("PROMNORM_MEMORY_LIMIT_BYTES", limit.to_string())],
    };
    let (backend, received) = slow_backend(Duration::from_secs(5)).await;
    let mut served = serve_in(
        &format!("backends:\n  - url: {backend}\n"),
        &env,
        cgroup.as_deref(),
    );
    let body = big_request(40_000, 11);
    let decoded = snap::raw::decompress_len(&body).unwrap();
    assert!(body.len() > 5 << 19, "compressed body {} bytes", body.len());
    let url = format!("http://{}/api/v1/write", served.addr);
    let started = Instant::now();
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            tokio::spawn(async move {
                let mut codes = Vec::new();
                for _ in 0..3 {
                    match try_post(&url, body.clone()).await {
                        Ok(r) => {
                            codes.push(r.status.as_u16().to_string());
                            if r.status.as_u16() != 429 {
                                break;
                            }
                        }
                        Err(e) => {
                            codes.push(format!("error: {e}"));
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                codes
            })
        })
        .collect();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for s in senders {
        for code in s.await.unwrap() {
            let key = if code.starts_with("error") {
                "error".to_string()
            } else {
                code
            };
            *counts.entry(key).or_default() += 1;
        }
    }
    let exited = served.child.0.try_wait().unwrap();
    let peak = if exited.is_none() {
        peak_rss(served.child.0.id())
    } else {
        0
    };
    println!(
        "limit {} MiB, {SENDERS} senders, body {} bytes ({decoded} decoded): {counts:?} in {:?}; peak RSS {} MiB; exited: {exited:?}",
        limit >> 20,
        body.len(),
        started.elapsed(),
        peak >> 20
    );
    assert!(exited.is_none(), "promnorm died: {exited:?}");
    let ok = counts.get("204").copied().unwrap_or(0);
    assert!(ok > 0, "no request was accepted: {counts:?}");
    assert!(counts.contains_key("429"), "nothing throttled: {counts:?}");
    assert_eq!(
        counts
            .keys()
            .filter(|k| !["204", "429"].contains(&k.as_str()))
            .count(),
        0,
        "{counts:?}"
    );
    assert_eq!(received.load(Ordering::Relaxed), ok);
    assert!(
        peak < limit,
        "peak RSS {} MiB over the limit {} MiB",
        peak >> 20,
        limit >> 20
    );
}

fn throttled_count(metrics: &str, reason: &str) -> f64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "promnorm_requests_throttled_total{{reason=\"{reason}\"}}"
            ))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A chunked POST (no `Content-Length`) of `body` in 64 KiB chunks on a raw connection;
/// returns the status line's code and the head.
async fn chunked_post(addr: SocketAddr, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /api/v1/write HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
    );
    for (k, v) in RW_HEADERS {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(64 << 10) {
        let mut c = format!("{:x}\r\n", chunk.len()).into_bytes();
        c.extend_from_slice(chunk);
        c.extend_from_slice(b"\r\n");
        if s.write_all(&c).await.is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_budget_senders_get_429_with_retry_after_at_once() {
    let (backend, _) = slow_backend(Duration::from_secs(1)).await;
    let proxy = start_proxy(
        &[backend],
        "limits:\n  max_body_bytes: 1048576\n  max_decoded_bytes: 4194304\n  max_inflight_bytes: 6291456\n  max_concurrent_requests: 1\n",
    )
    .await;
    let metrics_url = format!("http://{}/metrics", proxy.addr);
    let before = get(&metrics_url).await.body;
    let small = encode(&pb::WriteRequest {
        timeseries: vec![series(&[("__name__", "up"), ("job", "a")], &[(1.0, 1000)])],
        ..Default::default()
    });
    // One request waits on the backend; a second one is refused at once.
    let url = proxy.url();
    let first = {
        let (url, body) = (url.clone(), small.clone());
        tokio::spawn(async move { post(&url, body, RW_HEADERS).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let second = post(&url, small.clone(), RW_HEADERS).await;
    assert_eq!(second.status.as_u16(), 429, "{}", second.body);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(second.headers.get("retry-after").unwrap(), "1");
    assert!(
        second.body.contains("max_concurrent_requests"),
        "{}",
        second.body
    );
    assert_eq!(first.await.unwrap().status.as_u16(), 204);
    // Slot free again.
    assert_eq!(
        post(&url, small.clone(), RW_HEADERS).await.status.as_u16(),
        204
    );
    let after = get(&metrics_url).await.body;
    assert_eq!(
        throttled_count(&after, "concurrent_requests")
            - throttled_count(&before, "concurrent_requests"),
        1.0
    );
    proxy.stop.map(|s| s.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_without_content_length_are_reserved_as_they_stream() {
    let (backend, received) = slow_backend(Duration::from_secs(1)).await;
    // Budget 6 MiB: one body of about 1.1 MB (2.6 MB decoded) fits, a second does not.
    let proxy = start_proxy(
        &[backend],
        "limits:\n  max_body_bytes: 2097152\n  max_decoded_bytes: 4194304\n  max_inflight_bytes: 6291456\nderived:\n  enabled: false\n",
    )
    .await;
    let body = big_request(15_000, 3);
    let reserved = body.len() + snap::raw::decompress_len(&body).unwrap();
    assert!(reserved > 3 << 20 && body.len() < 2 << 20, "{reserved}");
    let metrics_url = format!("http://{}/metrics", proxy.addr);
    let before = get(&metrics_url).await.body;
    let addr = proxy.addr;
    let first = {
        let body = body.clone();
        tokio::spawn(async move { chunked_post(addr, &body).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, text) = chunked_post(addr, &body).await;
    assert_eq!(code, 429, "{text}");
    // A body whose snappy header declares more than it can produce reserves nothing for
    // it: the decoder's 400, not a 429, even with the budget nearly spent.
    let lying = vec![0xff, 0xff, 0xff, 0x01, 0x00]; // declares 4 MiB - 1 in 5 bytes
    let r = post(&proxy.url(), lying, RW_HEADERS).await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.body);
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    assert!(text.contains("max_inflight_bytes"), "{text}");
    let (code, text) = first.await.unwrap();
    assert_eq!(code, 204, "{text}");
    assert_eq!(received.load(Ordering::Relaxed), 1);
    let after = get(&metrics_url).await.body;
    assert_eq!(
        throttled_count(&after, "inflight_bytes") - throttled_count(&before, "inflight_bytes"),
        1.0
    );
    // Everything was given back: the same body fits again.
    let (code, text) = chunked_post(addr, &body).await;
    assert_eq!(code, 204, "{text}");
    proxy.stop.map(|s| s.send(()));
}

#[test]
fn a_budget_below_one_request_at_the_limits_is_refused_with_its_position() {
    let cfg = promnorm::config::Config::parse(
        "limits:\n  max_body_bytes: 1048576\n  max_decoded_bytes: 4194304\n  max_inflight_bytes: 4194304\n",
        "budget.yaml",
    )
    .unwrap();
    let err = cfg.check().unwrap_err().to_string();
    assert!(err.starts_with("budget.yaml:4:23: "), "{err}");
    assert!(err.contains("max_body_bytes + max_decoded_bytes"), "{err}");
    let cfg =
        promnorm::config::Config::parse("limits:\n  max_concurrent_requests: 0\n", "budget.yaml")
            .unwrap();
    assert!(
        cfg.check()
            .unwrap_err()
            .to_string()
            .starts_with("budget.yaml:2:28: ")
    );
}
