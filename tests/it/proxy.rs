//! In-process integration tests: promnorm between a test sender and recording fake
//! backends; the status mapping of docs/wire.md.

use crate::common;

use std::time::Duration;

use common::*;
use promnorm::wire::proto::prometheus as pb;

fn small_request() -> Vec<u8> {
    compress(&small_request_raw())
}

fn small_request_raw() -> Vec<u8> {
    use prost::Message;
    pb::WriteRequest {
        timeseries: vec![series(
            &[("__name__", "up"), ("job", "x")],
            &[(1.0, 1000), (0.0, 2000)],
        )],
        metadata: vec![],
    }
    .encode_to_vec()
}

#[tokio::test]
async fn delivers_and_sets_protocol_headers() {
    let (b, rec) = fake_backend(Reply::ok()).await;
    let p = start_proxy(&[b], "").await;
    let r = post(&p.url(), small_request(), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let reqs = rec.requests();
    assert_eq!(reqs.len(), 1);
    let (h, body) = &reqs[0];
    assert_eq!(h["content-encoding"], "snappy");
    assert_eq!(h["content-type"], "application/x-protobuf");
    assert_eq!(h["x-prometheus-remote-write-version"], "0.1.0");
    assert!(h["user-agent"].to_str().unwrap().starts_with("promnorm/"));
    let got = decode(body);
    assert_eq!(got.timeseries.len(), 1);
    assert_eq!(got.timeseries[0].samples.len(), 2);
    // Also reachable on Mimir's path.
    let push = p.url().replace("/api/v1/write", "/api/v1/push");
    assert_eq!(post(&push, small_request(), RW_HEADERS).await.status, 204);
}

#[tokio::test]
async fn backend_errors_map_to_retryable_or_permanent() {
    // Data errors are final (400); promnorm's own credentials or URL being wrong
    // (401/403/404/405/407) is not the data's fault: the sender must keep it and retry.
    let cases = [
        (500u16, 503u16),
        (503, 503),
        (400, 400),
        (409, 400),
        (422, 400),
        (401, 503),
        (403, 503),
        (404, 503),
        (405, 503),
        (407, 503),
        (408, 502),
    ];
    for (code, want) in cases {
        let (b, _) = fake_backend(Reply::status(code, "backend says no")).await;
        let p = start_proxy(&[b], "").await;
        let r = post(&p.url(), small_request(), RW_HEADERS).await;
        assert_eq!(r.status.as_u16(), want, "backend {code}: {}", r.body);
        assert!(r.body.contains("backend default"), "{}", r.body);
        if want == 400 {
            assert!(
                r.body.contains("backend says no"),
                "reason passed: {}",
                r.body
            );
        }
    }
}

#[tokio::test]
async fn throttling_passes_retry_after() {
    let mut reply = Reply::status(429, "slow down");
    reply.headers = vec![("Retry-After", "7")];
    let (b, _) = fake_backend(reply).await;
    let p = start_proxy(&[b], "").await;
    let r = post(&p.url(), small_request(), RW_HEADERS).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["retry-after"], "7");
}

#[tokio::test]
async fn backend_down_or_slow_is_retryable() {
    // A port nobody listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/api/v1/write", l.local_addr().unwrap());
    drop(l);
    let p = start_proxy(&[dead], "").await;
    let r = post(&p.url(), small_request(), RW_HEADERS).await;
    assert!(r.status.is_server_error(), "{} {}", r.status, r.body);

    let mut slow = Reply::ok();
    slow.delay = Duration::from_secs(5);
    let (b, _) = fake_backend(slow).await;
    let p = start_proxy(&[b], "").await; // backend timeout 2s
    let r = post(&p.url(), small_request(), RW_HEADERS).await;
    assert_eq!(r.status, 504, "{}", r.body);
}

#[tokio::test]
async fn two_backends_one_failing_is_retryable() {
    let (good, good_rec) = fake_backend(Reply::ok()).await;
    let (bad, _) = fake_backend(Reply::status(500, "boom")).await;
    let p = start_proxy(&[good, bad], "").await;
    let r = post(&p.url(), small_request(), RW_HEADERS).await;
    assert!(r.status.is_server_error());
    assert_eq!(
        good_rec.requests().len(),
        1,
        "the healthy backend still got the data"
    );
}

#[tokio::test]
async fn bad_input_gets_clear_4xx() {
    let (b, rec) = fake_backend(Reply::ok()).await;
    let p = start_proxy(
        &[b],
        "limits:\n  max_body_bytes: 100000\n  max_decoded_bytes: 1000000\n",
    )
    .await;
    // Not snappy.
    let r = post(
        &p.url(),
        b"\xff\xff\xff\xff\xff\xffgarbage".to_vec(),
        RW_HEADERS,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body.lines().count(), 1);
    // Snappy, but not protobuf.
    let r = post(&p.url(), compress(b"\x0a\xff\xff\xff\x0f"), RW_HEADERS).await;
    assert_eq!(r.status, 400, "{}", r.body);
    // A declared length no body of this size can produce: 400 before allocating.
    let r = post(
        &p.url(),
        vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x00],
        RW_HEADERS,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    // Declared decoded length over the limit (and producible): 413 before allocating.
    let mut body = vec![0xc0, 0x88, 0x3d]; // declares 1,000,512 bytes
    body.resize(60_000, 0);
    let r = post(&p.url(), body, RW_HEADERS).await;
    assert_eq!(r.status, 413, "{}", r.body);
    // A label value or a label count over the limits: 400 with the reason.
    let huge_value = "x".repeat(70_000);
    let req = pb::WriteRequest {
        timeseries: vec![series(
            &[("__name__", "up"), ("big", &huge_value)],
            &[(1.0, 1)],
        )],
        ..Default::default()
    };
    let r = post(&p.url(), encode(&req), RW_HEADERS).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("max_label_value_bytes"), "{}", r.body);
    let names: Vec<String> = (0..1001).map(|i| format!("l{i:04}")).collect();
    let mut labels: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    labels.push(("__name__", "up"));
    let req = pb::WriteRequest {
        timeseries: vec![series(&labels, &[(1.0, 1)])],
        ..Default::default()
    };
    let r = post(&p.url(), encode(&req), RW_HEADERS).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("max_labels_per_series"), "{}", r.body);
    // Compressed body over the limit.
    let r = post(&p.url(), vec![0u8; 200_000], RW_HEADERS).await;
    assert_eq!(r.status, 413, "{}", r.body);
    // Wrong encodings and types.
    let r = post(
        &p.url(),
        small_request(),
        &[
            ("Content-Encoding", "gzip"),
            ("Content-Type", "application/x-protobuf"),
        ],
    )
    .await;
    assert_eq!(r.status, 415);
    let r = post(
        &p.url(),
        small_request(),
        &[
            ("Content-Encoding", "snappy"),
            ("Content-Type", "application/json"),
        ],
    )
    .await;
    assert_eq!(r.status, 415);
    let r = post(
        &p.url(),
        small_request(),
        &[
            ("Content-Encoding", "snappy"),
            (
                "Content-Type",
                "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            ),
        ],
    )
    .await;
    // A 1.0 body sent as 2.0: its fields are reserved in 2.0, so it is refused, never
    // taken for an empty 2.0 request (tests/it/rw2.rs covers 2.0 itself).
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("reserved"), "{}", r.body);
    // Invalid labels: duplicate names, missing metric name.
    let dup = encode(&pb::WriteRequest {
        timeseries: vec![series(
            &[("__name__", "x"), ("a", "1"), ("a", "2")],
            &[(1.0, 1)],
        )],
        metadata: vec![],
    });
    assert_eq!(post(&p.url(), dup, RW_HEADERS).await.status, 400);
    let noname = encode(&pb::WriteRequest {
        timeseries: vec![series(&[("a", "1")], &[(1.0, 1)])],
        metadata: vec![],
    });
    assert_eq!(post(&p.url(), noname, RW_HEADERS).await.status, 400);
    assert!(rec.requests().is_empty(), "nothing invalid was forwarded");
}

#[tokio::test]
async fn metadata_only_requests_are_forwarded() {
    let (b, rec) = fake_backend(Reply::ok()).await;
    let p = start_proxy(&[b], "").await;
    let req = pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![pb::MetricMetadata {
            r#type: 1,
            metric_family_name: "http_requests_total".into(),
            help: "h".into(),
            unit: String::new(),
        }],
    };
    assert_eq!(post(&p.url(), encode(&req), RW_HEADERS).await.status, 204);
    let got = decode(&rec.requests()[0].1);
    assert_eq!(got.metadata, req.metadata);
}

#[tokio::test]
async fn ingest_auth_and_header_pass_through() {
    unsafe { std::env::set_var("PROMNORM_TEST_TOKEN", "s3cret") };
    let (b, rec) = fake_backend(Reply::ok()).await;
    let extra = "ingest_auth:\n  bearer_token: {env: PROMNORM_TEST_TOKEN}\n".to_string();
    let mut yaml_backends = String::new();
    yaml_backends.push_str(&extra);
    let p = start_proxy(&[], &format!(
        "{yaml_backends}backends:\n  - url: {b}\n    headers: {{X-Scope-OrgID: tenant-a}}\n    pass_headers: [X-Trace]\n"
    ))
    .await;
    assert_eq!(
        post(&p.url(), small_request(), RW_HEADERS).await.status,
        401
    );
    let mut h = RW_HEADERS.to_vec();
    h.push(("Authorization", "Bearer wrong"));
    assert_eq!(post(&p.url(), small_request(), &h).await.status, 403);
    // The scheme name is case-insensitive (RFC 7235).
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let auth = format!("{scheme} s3cret");
        let mut h = RW_HEADERS.to_vec();
        h.push(("Authorization", &auth));
        assert_eq!(
            post(&p.url(), small_request(), &h).await.status,
            204,
            "{scheme}"
        );
    }
    let mut h = RW_HEADERS.to_vec();
    h.push(("Authorization", "Bearer s3cret"));
    h.push(("X-Trace", "abc"));
    h.push(("X-Scope-OrgID", "sender-tenant"));
    assert_eq!(post(&p.url(), small_request(), &h).await.status, 204);
    let reqs = rec.requests();
    let (hdrs, _) = reqs.last().unwrap();
    assert_eq!(
        hdrs["x-scope-orgid"], "tenant-a",
        "configured header wins, sender's is not passed"
    );
    assert_eq!(hdrs["x-trace"], "abc");
    assert!(
        hdrs.get("authorization").is_none(),
        "sender's credentials are not forwarded unless configured"
    );
}

#[tokio::test]
async fn telemetry_health_and_readiness() {
    let (b, _) = fake_backend(Reply::ok()).await;
    let p = start_proxy(&[b], "").await;
    assert_eq!(
        post(&p.url(), small_request(), RW_HEADERS).await.status,
        204
    );
    let base = format!("http://{}", p.addr);
    assert_eq!(get(&format!("{base}/-/healthy")).await.status, 200);
    assert_eq!(get(&format!("{base}/-/ready")).await.status, 200);
    let m = get(&format!("{base}/metrics")).await.body;
    for name in [
        "promnorm_requests_total{code=\"204\"}",
        "promnorm_samples_received_total",
        "promnorm_samples_forwarded_total{backend=\"default\"}",
        "promnorm_backend_requests_total",
        "promnorm_backend_request_duration_seconds_bucket",
        // Exist from start-up, at 0 if nothing happened yet.
        "promnorm_series_collisions_total",
        "promnorm_native_histograms_unscaled_total",
        "promnorm_derived_samples_total{series=\"vllm:prefix_cache_hit_ratio\"}",
        "promnorm_series_rescaled_total{pack=\"dcgm\"}",
        "promnorm_build_info{",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics:\n{m}");
    }
    assert!(
        m.contains("# TYPE process_cpu_seconds_total counter"),
        "{m}"
    );
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let mut slow = Reply::ok();
    slow.delay = Duration::from_millis(800);
    let (b, rec) = fake_backend(slow).await;
    let mut p = start_proxy(&[b], "").await;
    let url = p.url();
    let inflight = tokio::spawn(async move { post(&url, small_request(), RW_HEADERS).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.stop.take().unwrap().send(()).unwrap();
    let r = inflight.await.unwrap();
    assert_eq!(
        r.status, 204,
        "the in-flight request completed during the drain"
    );
    let done = tokio::time::timeout(Duration::from_secs(5), p.done).await;
    assert!(done.is_ok(), "server stopped after draining");
    assert_eq!(rec.requests().len(), 1);
}

/// The bad-input classes of README's wire table that `bad_input_gets_clear_4xx` does not
/// cover, each through the HTTP path: nothing invalid reaches the backend.
#[tokio::test]
async fn every_bad_input_class_of_the_wire_table_is_answered_over_http() {
    let (b, rec) = fake_backend(Reply::ok()).await;
    let p = start_proxy(&[b], "limits:\n  max_series_per_request: 3\n").await;
    let raw_series = |labels: &[(&[u8], &[u8])]| {
        // Built by hand: prost cannot write invalid UTF-8.
        let mut ts = Vec::new();
        for (n, v) in labels {
            let mut l = vec![0x0a, n.len() as u8];
            l.extend_from_slice(n);
            l.extend_from_slice(&[0x12, v.len() as u8]);
            l.extend_from_slice(v);
            ts.push(0x0a);
            ts.push(l.len() as u8);
            ts.extend_from_slice(&l);
        }
        let mut req = vec![0x0a, ts.len() as u8];
        req.extend_from_slice(&ts);
        compress(&req)
    };
    type Case<'a> = (&'a str, Vec<u8>, &'a [(&'a str, &'a str)], u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "empty label name",
            raw_series(&[(b"__name__", b"up"), (b"", b"v")]),
            RW_HEADERS,
            400,
            "empty label name",
        ),
        (
            "non-UTF-8 label value",
            raw_series(&[(b"__name__", b"up"), (b"a", b"\xff\xfe")]),
            RW_HEADERS,
            400,
            "UTF-8",
        ),
        (
            "truncated protobuf",
            compress(&small_request_raw()[..10]),
            RW_HEADERS,
            400,
            "truncated",
        ),
        (
            "malformed native histogram",
            compress(&[
                0x0a, 0x14, 0x0a, 0x0d, 0x0a, 0x08, b'_', b'_', b'n', b'a', b'm', b'e', b'_', b'_',
                0x12, 0x01, b'x', 0x22, 0x03, 0x62, 0x01, 0x80,
            ]),
            RW_HEADERS,
            400,
            "protobuf",
        ),
        (
            "more series than limits.max_series_per_request",
            encode(&pb::WriteRequest {
                timeseries: (0..4)
                    .map(|i| series(&[("__name__", "up"), ("i", &i.to_string())], &[(1.0, 1)]))
                    .collect(),
                metadata: vec![],
            }),
            RW_HEADERS,
            413,
            "more than 3 series",
        ),
        (
            "missing Content-Encoding",
            small_request(),
            &[("Content-Type", "application/x-protobuf")],
            415,
            "missing Content-Encoding",
        ),
        (
            "missing Content-Type",
            small_request(),
            &[("Content-Encoding", "snappy")],
            415,
            "Content-Type",
        ),
    ];
    for (what, body, headers, want, reason) in cases {
        let r = post(&p.url(), body, headers).await;
        assert_eq!(r.status.as_u16(), want, "{what}: {}", r.body);
        assert!(r.body.contains(reason), "{what}: {}", r.body);
        assert_eq!(r.body.lines().count(), 1, "{what}: one-line reason");
    }
    assert!(rec.requests().is_empty(), "nothing invalid was forwarded");
}

#[tokio::test]
async fn a_redirecting_backend_is_misconfigured_queued_or_not() {
    // promnorm follows no redirect (a remote-write body is not re-sent to another URL):
    // a 3xx means the configured URL is wrong, like a 404. Before, it was "unavailable":
    // a queue retried it forever with promnorm_backend_misconfigured at 0.
    for code in [301u16, 302, 307, 308] {
        let mut reply = Reply::status(code, "moved");
        reply.headers = vec![("Location", "http://127.0.0.1:9/api/v1/write")];
        let (b, _) = fake_backend(reply.clone()).await;
        let (q, q_rec) = fake_backend(reply).await;
        let yaml = format!(
            "listen: 127.0.0.1:0\nbackends:\n  - name: redirect{code}\n    url: {b}\n  - name: redirect_queued{code}\n    url: {q}\n    queue: {{type: memory}}\n"
        );
        let p = start_proxy_yaml(&yaml, Duration::from_millis(200)).await;
        let r = post(&p.url(), small_request(), RW_HEADERS).await;
        assert_eq!(r.status, 503, "{code}: {}", r.body);
        assert!(
            r.body
                .contains(&format!("redirect{code} refused promnorm ({code})")),
            "{code}: {}",
            r.body
        );
        let gauge = |name: String| {
            let p = &p;
            async move {
                p.metric(
                    "promnorm_backend_misconfigured",
                    &[&format!("backend=\"{name}\"")],
                )
                .await
            }
        };
        assert_eq!(gauge(format!("redirect{code}")).await, 1.0, "{code}");
        // The queued backend: stored (204), its sender meets the redirect and says so.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while gauge(format!("redirect_queued{code}")).await != 1.0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{code}: a queue meeting a redirect did not set promnorm_backend_misconfigured ({} attempts)",
                q_rec.requests().len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        p.shut_down().await;
    }
}

/// A body of `len` bytes produced chunk by chunk; `pulled` counts what was taken.
struct CountedBody {
    left: usize,
    pulled: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl hyper::body::Body for CountedBody {
    type Data = axum::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        static CHUNK: [u8; 64 << 10] = [b'x'; 64 << 10];
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(CHUNK.len());
        self.left -= n;
        self.pulled
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(
            axum::body::Bytes::from_static(&CHUNK[..n]),
        ))))
    }
}

/// A backend answering `status` with a body of `len` bytes, counting the bytes promnorm
/// made it produce.
async fn big_body_backend(
    status: u16,
    len: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let pulled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let p2 = pulled.clone();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move || {
            let pulled = p2.clone();
            async move {
                let mut resp = axum::response::Response::new(axum::body::Body::new(CountedBody {
                    left: len,
                    pulled,
                }));
                *resp.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
                resp.headers_mut()
                    .insert("content-length", len.to_string().parse().unwrap());
                resp
            }
        }),
    );
    let addr = serve(app).await;
    (format!("http://{addr}/api/v1/write"), pulled)
}

#[tokio::test]
async fn a_large_backend_answer_is_not_read_whole() {
    // A backend answering 200 or 400 with 100 MB: promnorm needs a few hundred bytes of
    // it (the reason of a refusal) and must neither buffer nor wait for the rest. Before,
    // it read the whole body into memory (~200 MB per request).
    const LEN: usize = 100 << 20;
    for (status, want) in [(200u16, 204u16), (400, 400)] {
        let (b, pulled) = big_body_backend(status, LEN).await;
        let p = start_proxy(&[b], "").await;
        for _ in 0..3 {
            let r = post(&p.url(), small_request(), RW_HEADERS).await;
            assert_eq!(r.status.as_u16(), want, "{status}: {}", r.body);
            if want == 400 {
                // The reason: a bounded prefix of the backend's body.
                assert!(r.body.contains("xxxx"), "{}", r.body);
                assert!(r.body.len() < 2048, "{} bytes of reason", r.body.len());
            }
        }
        let pulled = pulled.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "backend {status} with {LEN} bytes: promnorm pulled {pulled} bytes over 3 requests"
        );
        // Loopback socket buffers let the backend write a few MB ahead of the reader.
        assert!(
            pulled < 3 * (16 << 20),
            "promnorm read {pulled} bytes of three {LEN}-byte answers"
        );
        p.shut_down().await;
    }
}
