//! Native histograms through real Prometheus 2.42 processes (docs/rules.md, "Native
//! histograms"; docs/wire.md):
//!
//! - A sender Prometheus with `--enable-feature=native-histograms` scrapes a target that
//!   serves the protobuf exposition format with two exponential histograms, one in
//!   milliseconds (sglang's KV transfer latency, ÷1000: re-bucketed) and one in MiB
//!   (sglang's transfer size, ×2^20: shifted exactly), and remote-writes them to
//!   `promnorm serve`, which forwards to a receiver Prometheus (feature on).
//!   `histogram_quantile(q, rate(G[1m]))` on the receiver equals the sender's quantile
//!   ×2^20 (to 1e-12) and ÷1000 within one bucket width (schema 3: a factor 2^(1/8)), for
//!   q in 0.5, 0.9, 0.99; `histogram_count` is equal, `histogram_sum` scaled.
//! - An NHCB sent as 2.0 by the test reaches the same receiver (1.0) as classic series
//!   whose `histogram_quantile` equals the NHCB's (computed here) to 1e-12.
//!
//! Needs `PROMETHEUS_BIN`; with `PROMNORM_E2E=1` a missing binary fails the test.

use crate::common;
use crate::common::rw2_support as rw2;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::procs::{binary, prometheus_receiver, prometheus_sender, promnorm_serve};
use common::{get, label, post};
use promnorm::wire::pb::{WIRE_I64, WIRE_VARINT, put_bytes_field, put_key, put_varint};
use promnorm::wire::proto::prometheus as pb;

const PROTO_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// One `io.prometheus.client.MetricFamily` of type HISTOGRAM with one native histogram
/// (schema 3, integer buckets from `offset`), length-delimited.
fn family(out: &mut Vec<u8>, name: &str, offset: i32, counts: &[u64], sum: f64) {
    let mut h = Vec::new();
    put_key(&mut h, 1, WIRE_VARINT); // sample_count
    put_varint(&mut h, counts.iter().sum::<u64>());
    put_key(&mut h, 2, WIRE_I64); // sample_sum
    h.extend_from_slice(&sum.to_le_bytes());
    put_key(&mut h, 5, WIRE_VARINT); // schema (sint32)
    put_varint(&mut h, zigzag(3));
    put_key(&mut h, 6, WIRE_I64); // zero_threshold
    h.extend_from_slice(&1e-128f64.to_le_bytes());
    put_key(&mut h, 7, WIRE_VARINT); // zero_count
    put_varint(&mut h, 0);
    let mut span = Vec::new();
    put_key(&mut span, 1, WIRE_VARINT);
    put_varint(&mut span, zigzag(offset as i64));
    put_key(&mut span, 2, WIRE_VARINT);
    put_varint(&mut span, counts.len() as u64);
    put_bytes_field(&mut h, 12, &span); // positive_span
    let mut deltas = Vec::new();
    let mut prev = 0i64;
    for &c in counts {
        put_varint(&mut deltas, zigzag(c as i64 - prev));
        prev = c as i64;
    }
    put_bytes_field(&mut h, 13, &deltas); // positive_delta
    let mut metric = Vec::new();
    put_bytes_field(&mut metric, 7, &h);
    let mut fam = Vec::new();
    put_bytes_field(&mut fam, 1, name.as_bytes());
    put_bytes_field(&mut fam, 2, b"Test histogram.");
    put_key(&mut fam, 3, WIRE_VARINT);
    put_varint(&mut fam, 4); // HISTOGRAM
    put_bytes_field(&mut fam, 4, &metric);
    put_varint(out, fam.len() as u64);
    out.extend_from_slice(&fam);
}

/// The target: both histograms, growing by one base observation set per scrape.
async fn serve_native_target() -> std::net::SocketAddr {
    let scrapes = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = scrapes.fetch_add(1, Ordering::Relaxed) + 1;
            async move {
                let mut body = Vec::new();
                // ms: buckets 2^(i/8) for i in 40..52 (about 32 ms to 90 ms).
                let ms: Vec<u64> = [3u64, 7, 12, 20, 31, 25, 18, 11, 6, 4, 2, 1]
                    .iter()
                    .map(|c| c * n)
                    .collect();
                family(
                    &mut body,
                    "sglang:kv_transfer_latency_ms",
                    41,
                    &ms,
                    57.5 * 140.0 * n as f64,
                );
                // MiB: buckets around 1 to 16 MiB.
                let mb: Vec<u64> = [5u64, 9, 14, 8, 4, 2, 1].iter().map(|c| c * n).collect();
                family(
                    &mut body,
                    "sglang:kv_transfer_total_mb",
                    2,
                    &mb,
                    3.25 * 43.0 * n as f64,
                );
                (
                    [(axum::http::header::CONTENT_TYPE, PROTO_CONTENT_TYPE)],
                    body,
                )
            }
        }),
    );
    common::serve(app).await
}

fn encode_query(q: &str) -> String {
    let mut enc = String::new();
    for b in q.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    enc
}

/// The single value of an instant query at `time` (seconds), if there is one.
async fn value(base: &str, q: &str, time: f64) -> Option<f64> {
    let r = get(&format!(
        "{base}/api/v1/query?query={}&time={time:.3}",
        encode_query(q)
    ))
    .await;
    let v: serde_json::Value = serde_json::from_str(&r.body).ok()?;
    let result = v["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1]
        .as_str()
        .and_then(promnorm::mapping::number::parse_float)
}

/// Prometheus' `histogram_quantile` over classic buckets `(upper bound, cumulative)`.
fn classic_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let total = buckets.last().unwrap().1;
    let rank = q * total;
    let i = buckets.iter().position(|b| b.1 >= rank).unwrap();
    if i == buckets.len() - 1 {
        return buckets[i - 1].0;
    }
    let (start, below) = if i == 0 {
        (0.0, 0.0)
    } else {
        (buckets[i - 1].0, buckets[i - 1].1)
    };
    let end = buckets[i].0;
    start + (end - start) * ((rank - below) / (buckets[i].1 - below))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_histograms_through_real_prometheus() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let tmp = std::env::temp_dir().join(format!("promnorm-e2e-native-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut receiver = prometheus_receiver(&prom, &tmp);
    receiver
        .args
        .push("--enable-feature=native-histograms".into());
    receiver.start("/-/ready").await;
    let rbase = receiver.base.clone();
    let mut promnorm = promnorm_serve(&tmp, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nbackends:\n  - name: receiver\n    url: {rbase}/api/v1/write\n    timeout: 5s\n"
        )
    });
    promnorm.start("/-/ready").await;
    let target = serve_native_target().await;
    let sender_cfg = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: target\n    static_configs: [{{targets: ['{target}']}}]\nremote_write:\n  - url: {}/api/v1/write\n    send_native_histograms: true\n    queue_config: {{batch_send_deadline: 500ms}}\n",
        promnorm.base
    );
    let mut sender = prometheus_sender(&prom, &tmp, &sender_cfg);
    sender
        .args
        .push("--enable-feature=native-histograms".into());
    sender.start("/-/ready").await;

    // NHCB as a 2.0 sender sends it, to the same (1.0) receiver: unrolled.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let counts = [3i64, 10, 6, 1];
    let mut prev = 0;
    let nhcb = pb::Histogram {
        count: Some(pb::histogram::Count::CountInt(20)),
        sum: 1234.0,
        schema: -53,
        zero_count: Some(pb::histogram::ZeroCount::ZeroCountInt(0)),
        positive_spans: vec![pb::BucketSpan {
            offset: 0,
            length: 4,
        }],
        positive_deltas: counts
            .iter()
            .map(|c| {
                let d = c - prev;
                prev = *c;
                d
            })
            .collect(),
        custom_values: vec![5.0, 50.0, 500.0],
        timestamp: now_ms,
        ..Default::default()
    };
    let req = pb::WriteRequest {
        timeseries: vec![pb::TimeSeries {
            labels: vec![
                label("__name__", "sglang:kv_transfer_latency_ms"),
                label("job", "nhcb"),
            ],
            histograms: vec![nhcb],
            ..Default::default()
        }],
        metadata: vec![],
    };
    let r = post(
        &format!("{}/api/v1/write", promnorm.base),
        rw2::encode_v2(&rw2::v1_to_v2(&req)),
        rw2::RW2_HEADERS,
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.body);
    let buckets = [
        (0.005, 3.0),
        (0.05, 13.0),
        (0.5, 19.0),
        (f64::INFINITY, 20.0),
    ];
    let t = now_ms as f64 / 1000.0;
    for q in [0.5, 0.9, 0.99] {
        let want = classic_quantile(q, &buckets);
        let query = format!(
            "histogram_quantile({q}, sglang:kv_transfer_latency_seconds_bucket{{job=\"nhcb\"}})"
        );
        let mut got = None;
        for _ in 0..50 {
            got = value(&receiver.base, &query, t).await;
            if got.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let got = got.unwrap_or_else(|| panic!("{query}: no result"));
        assert!(
            ((got - want) / want).abs() <= 1e-12,
            "NHCB q={q}: receiver {got}, NHCB {want}"
        );
        eprintln!("e2e native: NHCB unrolled q={q}: {got} (computed {want})");
    }

    // Exponential histograms scraped by the sender (its first scrape comes up to 5s
    // after start-up): once its rate has three scrapes, compare at one evaluation time.
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mut eval = unix_now();
    for _ in 0..300 {
        eval = unix_now() - 0.5;
        let n = value(
            &sender.base,
            "histogram_count(sglang:kv_transfer_total_mb) / 43",
            eval,
        )
        .await;
        if n.is_some_and(|n| n >= 4.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (from, to, factor, exact) in [
        (
            "sglang:kv_transfer_latency_ms",
            "sglang:kv_transfer_latency_seconds",
            1e-3,
            false,
        ),
        (
            "sglang:kv_transfer_total_mb",
            "sglang:kv_transfer_total_bytes",
            1_048_576.0,
            true,
        ),
    ] {
        let count_q = |n: &str| format!("histogram_count(rate({n}[1m]))");
        let Some(want_count) = value(&sender.base, &count_q(from), eval).await else {
            let targets = get(&format!("{}/api/v1/targets", sender.base)).await.body;
            let raw = get(&format!(
                "{}/api/v1/query?query={}",
                sender.base,
                encode_query(from)
            ))
            .await
            .body;
            panic!("the sender has no {from}: targets {targets}; {raw}");
        };
        // The receiver has everything up to `eval` once its count agrees.
        let mut got_count = None;
        for _ in 0..100 {
            got_count = value(&receiver.base, &count_q(to), eval).await;
            if got_count == Some(want_count) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(got_count, Some(want_count), "{to}: histogram_count");
        let sum_q = |n: &str| format!("histogram_sum(rate({n}[1m]))");
        let want_sum = value(&sender.base, &sum_q(from), eval).await.unwrap() * factor;
        let got_sum = value(&receiver.base, &sum_q(to), eval).await.unwrap();
        assert!(
            ((got_sum - want_sum) / want_sum).abs() <= 1e-12,
            "{to}: histogram_sum {got_sum} vs {want_sum}"
        );
        for q in [0.5, 0.9, 0.99] {
            let qq = |n: &str| format!("histogram_quantile({q}, rate({n}[1m]))");
            let want = value(&sender.base, &qq(from), eval).await.unwrap() * factor;
            let got = value(&receiver.base, &qq(to), eval).await.unwrap();
            let ratio = got / want;
            if exact {
                assert!((ratio - 1.0).abs() <= 1e-12, "{to} q={q}: {got} vs {want}");
            } else {
                let width = 2f64.powf(1.0 / 8.0);
                assert!(
                    ratio <= width && ratio >= 1.0 / width,
                    "{to} q={q}: {got} vs {want}: more than one bucket width apart"
                );
            }
            eprintln!(
                "e2e native: {to} q={q}: receiver {got}, sender×factor {want} (ratio {ratio})"
            );
        }
    }
    let metrics = get(&format!("{}/metrics", promnorm.base)).await.body;
    for want in [
        "promnorm_native_histograms_rebucketed_total{pack=\"sglang\"}",
        "promnorm_native_histograms_unrolled_total{backend=\"receiver\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} in promnorm's /metrics");
    }
    drop(sender);
    drop(promnorm);
    drop(receiver);
    let _ = std::fs::remove_dir_all(&tmp);
}
