//! Derived series through `serve`: numerator and denominator split over concurrent
//! connections, and a backend that rejects derived samples.

use crate::common;

use promnorm::app::Assemble;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use common::*;
use promnorm::wire::proto::prometheus as pb;

const BASE_TS: i64 = 1_700_000_000_000;
const HITS: &str = "vllm:prefix_cache_hits_total";
const QUERIES: &str = "vllm:prefix_cache_queries_total";
const RATIO: &str = "vllm:prefix_cache_hit_ratio";

/// xorshift64*: reproducible randomness without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn derived_samples(rec: &Recorded, name: &str) -> BTreeMap<String, Vec<(i64, f64)>> {
    let mut by_engine: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for (_, body) in rec.requests() {
        for ts in decode(&body).timeseries {
            if !ts
                .labels
                .iter()
                .any(|l| l.name == "__name__" && l.value == name)
            {
                continue;
            }
            let engine = ts
                .labels
                .iter()
                .find(|l| l.name == "engine")
                .map(|l| l.value.clone())
                .unwrap_or_default();
            let e = by_engine.entry(engine).or_default();
            e.extend(ts.samples.iter().map(|s| (s.timestamp, s.value)));
        }
    }
    by_engine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_shards_pair_numerator_and_denominator() {
    const ENGINES: usize = 200;
    const SCRAPES: usize = 30;
    const SHARDS: usize = 8;
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let proxy = start_proxy(&[backend], "derived:\n  flush_interval: 20ms\n").await;

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Cumulative counters per engine and scrape, with a counter reset at scrape 17.
    let mut values = vec![[[0f64; 2]; SCRAPES]; ENGINES];
    for v in values.iter_mut() {
        let (mut hits, mut queries) = (rng.below(1000) as f64, 1000.0 + rng.below(1000) as f64);
        for (k, point) in v.iter_mut().enumerate() {
            if k == 17 {
                (hits, queries) = (0.0, 0.0);
            }
            let q = 1 + rng.below(500);
            queries += q as f64;
            hits += rng.below(q + 1) as f64;
            *point = [hits, queries];
        }
    }
    // Each input series goes to one shard, as Prometheus hashes series over shards.
    let mut shard_series: Vec<Vec<(usize, usize)>> = vec![Vec::new(); SHARDS];
    for e in 0..ENGINES {
        for input in 0..2 {
            shard_series[rng.below(SHARDS as u64) as usize].push((e, input));
        }
    }
    let values = Arc::new(values);
    let url = proxy.url();
    // Prometheus starts its shards together; after their first request they drift
    // freely (here by up to the whole run). Before an input has been seen at all,
    // promnorm holds only 4 half points for it (ARCHITECTURE.md), hence the barrier.
    let started = Arc::new(tokio::sync::Barrier::new(SHARDS));
    let mut tasks = Vec::new();
    for (shard, members) in shard_series.into_iter().enumerate() {
        let values = values.clone();
        let url = url.clone();
        let mut rng = Rng(0x1234_5678 + shard as u64);
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            let mut k = 0;
            while k < SCRAPES {
                // A request carries 1 to 3 scrapes of this shard's series, like a
                // queue catching up.
                let upto = (k + 1 + rng.below(3) as usize).min(SCRAPES);
                let mut req = pb::WriteRequest::default();
                for &(e, input) in &members {
                    let engine = e.to_string();
                    let samples: Vec<(f64, i64)> = (k..upto)
                        .map(|i| (values[e][i][input], BASE_TS + i as i64 * 15_000))
                        .collect();
                    req.timeseries.push(series(
                        &[
                            ("__name__", if input == 0 { HITS } else { QUERIES }),
                            ("engine", &engine),
                        ],
                        &samples,
                    ));
                }
                let r = post(&url, encode(&req), RW_HEADERS).await;
                assert_eq!(r.status, 204, "{}", r.body);
                if k == 0 {
                    started.wait().await;
                }
                k = upto;
                tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // Expected: one value per engine and scrape after the first (rate() semantics).
    let mut want: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for (e, v) in values.iter().enumerate() {
        let w = want.entry(e.to_string()).or_default();
        for k in 1..SCRAPES {
            let d = |i: usize| {
                if v[k][i] >= v[k - 1][i] {
                    v[k][i] - v[k - 1][i]
                } else {
                    v[k][i]
                }
            };
            w.push((BASE_TS + k as i64 * 15_000, d(0) / d(1)));
        }
    }
    let expected_total = ENGINES * (SCRAPES - 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n: usize = derived_samples(&rec, RATIO).values().map(Vec::len).sum();
        if n >= expected_total || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = derived_samples(&rec, RATIO);
    assert_eq!(got.len(), ENGINES, "a derived series per engine");
    for (engine, w) in &want {
        let g = &got[engine];
        assert_eq!(
            g, w,
            "engine {engine}: every sample once, in order, right value"
        );
    }
    println!(
        "concurrency: {ENGINES} engines x {SCRAPES} scrapes over {SHARDS} concurrent shards: {expected_total} derived samples, each exactly once, in order"
    );
}

/// What a test backend answered: (the request held derived samples, status).
type Answers = Arc<Mutex<Vec<(bool, u16)>>>;

/// A backend whose status for each request is `answer(holds derived samples, earlier
/// answers)`; it records every answer.
async fn derived_aware_backend(answer: fn(bool, &[(bool, u16)]) -> u16) -> (String, Answers) {
    let answers: Answers = Arc::new(Mutex::new(Vec::new()));
    let a2 = answers.clone();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |body: Bytes| {
            let answers = a2.clone();
            async move {
                let req = decode(&body);
                let derived = req
                    .timeseries
                    .iter()
                    .any(|t| t.labels.iter().any(|l| l.value == RATIO));
                let mut a = answers.lock().unwrap();
                let code = answer(derived, &a);
                a.push((derived, code));
                axum::http::StatusCode::from_u16(code).unwrap()
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/write"), answers)
}

/// Scrape `k` of one engine's prefix-cache counters, as one request.
fn engine_scrape(k: i64, hits: f64, queries: f64) -> Vec<u8> {
    let ts = BASE_TS + k * 15_000;
    encode(&pb::WriteRequest {
        timeseries: vec![
            series(&[("__name__", HITS), ("engine", "0")], &[(hits, ts)]),
            series(&[("__name__", QUERIES), ("engine", "0")], &[(queries, ts)]),
        ],
        metadata: vec![],
    })
}

#[tokio::test]
async fn rejected_derived_samples_never_fail_the_sender() {
    // Refuses derived samples (e.g. out of order), accepts the sender's.
    let (backend, answers) =
        derived_aware_backend(|derived, _| if derived { 400 } else { 204 }).await;
    let proxy = start_proxy(&[backend], "derived:\n  flush_interval: 20ms\n").await;
    for k in 0..5i64 {
        let body = engine_scrape(k, 10.0 * k as f64, 20.0 * k as f64);
        let r = post(&proxy.url(), body, RW_HEADERS).await;
        assert_eq!(r.status, 204, "sender's request {k}: {}", r.body);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let metrics_url = format!("http://{}/metrics", proxy.addr);
    let dropped = loop {
        let m = get(&metrics_url).await.body;
        let v = m
            .lines()
            .find(|l| l.starts_with("promnorm_samples_dropped_total{reason=\"derived_rejected\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if v >= 4.0 || tokio::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        dropped >= 4.0,
        "4 derived samples rejected and counted, got {dropped}"
    );
    let a = answers.lock().unwrap().clone();
    assert_eq!(
        a.iter().filter(|(_, c)| *c == 204).count(),
        5,
        "the sender's 5 requests delivered"
    );
    assert!(
        a.contains(&(true, 400)),
        "derived samples were offered and refused: {a:?}"
    );
}

#[tokio::test]
async fn derived_samples_are_retried_after_a_5xx() {
    // 503 to the first derived request, then accepts everything.
    let (backend, answers) = derived_aware_backend(|derived, earlier| {
        if derived && !earlier.iter().any(|(d, _)| *d) {
            503
        } else {
            204
        }
    })
    .await;
    let proxy = start_proxy(&[backend], "derived:\n  flush_interval: 20ms\n").await;
    for k in 0..2i64 {
        let body = engine_scrape(k, 3.0 * k as f64, 4.0 * k as f64);
        assert_eq!(post(&proxy.url(), body, RW_HEADERS).await.status, 204);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let derived = loop {
        let a = answers.lock().unwrap().clone();
        let d: Vec<u16> = a.iter().filter(|(d, _)| *d).map(|(_, c)| *c).collect();
        if d.contains(&204) || tokio::time::Instant::now() > deadline {
            break d;
        }
        drop(a);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        derived,
        vec![503, 204],
        "refused once, then delivered on retry"
    );
}

/// One request of `engines` engines (numbered from `first`), hits and queries each.
fn fleet_request(first: usize, engines: usize, ts: i64) -> Vec<u8> {
    use prost::Message;
    let mut timeseries = Vec::with_capacity(engines * 2);
    for e in first..first + engines {
        let engine = e.to_string();
        for (name, v) in [(HITS, 10.0), (QUERIES, 40.0)] {
            timeseries.push(series(
                &[("__name__", name), ("engine", &engine), ("model_name", "m")],
                &[(v, ts)],
            ));
        }
    }
    pb::WriteRequest {
        timeseries,
        ..Default::default()
    }
    .encode_to_vec()
}

/// Seconds per request for `rounds` requests of new engines, each observed twice.
fn seconds_per_request(
    pipeline: &promnorm::pipeline::Pipeline,
    first: usize,
    rounds: usize,
) -> f64 {
    const PER_REQUEST: usize = 10_000;
    let mut ws = pipeline.take_workspace();
    let started = std::time::Instant::now();
    for r in 0..rounds {
        let body = fleet_request(first + r * PER_REQUEST, PER_REQUEST, BASE_TS);
        pipeline.process_raw(&mut ws, &body).expect("valid");
    }
    started.elapsed().as_secs_f64() / rounds as f64
}

/// At `derived.max_series` every new series evicts one: that must cost O(1), not a
/// scan of the shard under its lock (it made requests ~80× slower at 1M series).
#[test]
fn new_series_at_the_state_limit_cost_about_what_they_cost_below_it() {
    const LIMIT: usize = 400_000;
    let cfg = |max: usize| {
        promnorm::config::Config::parse(
            &format!("listen: 127.0.0.1:1\nderived:\n  max_series: {max}\n"),
            "t.yaml",
        )
        .unwrap()
        .pipeline()
        .unwrap()
    };
    // Fill one deriver to its limit; the other has room for everything.
    let at_limit = cfg(LIMIT);
    seconds_per_request(&at_limit, 0, LIMIT / 10_000);
    assert_eq!(at_limit.deriver().unwrap().series_count(), LIMIT);
    let roomy = cfg(10 * LIMIT);
    seconds_per_request(&roomy, 0, LIMIT / 10_000);

    let below = seconds_per_request(&roomy, LIMIT, 10);
    let at = seconds_per_request(&at_limit, LIMIT, 10);
    let d = at_limit.deriver().unwrap();
    assert_eq!(d.series_count(), LIMIT, "the limit holds");
    assert!(
        d.counters
            .evicted_limit
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 100_000
    );
    println!(
        "10k new engines per request: {:.1} ms below the limit, {:.1} ms at it ({:.2}x)",
        below * 1e3,
        at * 1e3,
        at / below
    );
    assert!(
        at < 2.5 * below,
        "at the limit {at:.4}s vs {below:.4}s below it"
    );
}

/// Label values may be 64 KiB each: the derive state holds at most `max_series` × 512
/// bytes of label sets, however long they are, evicting by CLOCK to make room; one label
/// set over 16 KiB is never kept. Both counted.
#[test]
fn derived_state_is_bounded_in_label_bytes() {
    use promnorm::derive::{LABEL_BYTES_PER_SERIES, MAX_LABEL_SET_BYTES};
    use prost::Message;
    use std::sync::atomic::Ordering::Relaxed;
    const MAX_SERIES: usize = 1_000;
    let pipeline = promnorm::config::Config::parse(
        &format!("listen: 127.0.0.1:1\nderived:\n  max_series: {MAX_SERIES}\n"),
        "t.yaml",
    )
    .unwrap()
    .pipeline()
    .unwrap();
    let d = pipeline.deriver().unwrap().clone();
    let budget = MAX_SERIES * LABEL_BYTES_PER_SERIES;
    let mut ws = pipeline.take_workspace();
    // Engines with a 4 KiB label: about 125 of them fill what 1,000 short ones would.
    let pad = "p".repeat(4 << 10);
    for round in 0..20 {
        let timeseries = (0..50)
            .flat_map(|i| {
                let engine = format!("{round}-{i}");
                [(HITS, 10.0), (QUERIES, 40.0)].map(|(name, v)| {
                    series(
                        &[("__name__", name), ("engine", &engine), ("pad", &pad)],
                        &[(v, BASE_TS)],
                    )
                })
            })
            .collect();
        let body = pb::WriteRequest {
            timeseries,
            ..Default::default()
        }
        .encode_to_vec();
        pipeline.process_raw(&mut ws, &body).expect("valid");
        assert!(d.label_bytes() <= budget, "{} > {budget}", d.label_bytes());
    }
    assert!(d.series_count() < MAX_SERIES, "the bytes bound first");
    assert!(
        d.label_bytes() > budget - 2 * (4 << 10),
        "filled up to the bound"
    );
    assert!(
        d.counters.label_bytes.load(Relaxed) > 0,
        "room made by eviction, counted"
    );
    assert_eq!(
        d.counters.evicted_limit.load(Relaxed),
        0,
        "never full in series"
    );
    // One label set over the per-series cap is not kept, and says so.
    let huge = "h".repeat(MAX_LABEL_SET_BYTES);
    let before = (d.series_count(), d.counters.label_bytes.load(Relaxed));
    let body = pb::WriteRequest {
        timeseries: [(HITS, 10.0), (QUERIES, 40.0)]
            .map(|(name, v)| {
                series(
                    &[("__name__", name), ("engine", "huge"), ("pad", &huge)],
                    &[(v, BASE_TS)],
                )
            })
            .to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    pipeline.process_raw(&mut ws, &body).expect("valid");
    assert_eq!(d.series_count(), before.0);
    assert!(d.counters.label_bytes.load(Relaxed) > before.1);
}

/// A sum over ranks keeps up to 256 ranks a group: their values count against the
/// label-byte budget with the group's label set, and a rank value over 1 KiB is not
/// kept (counted), so a rank label of long values cannot grow the state past the bound.
/// A group with a rank it cannot keep ends (no sum short of a rank is emitted); ranks
/// ended by stale markers, and groups swept, give their bytes back.
#[test]
fn sums_over_ranks_count_their_ranks_bytes() {
    use promnorm::derive::{Emitted, LABEL_BYTES_PER_SERIES, ranks::MAX_RANK_BYTES};
    use prost::Message;
    use std::sync::atomic::Ordering::Relaxed;
    const MAX_SERIES: usize = 100;
    const FAMILY: &str = "sglang:hicache_backup_bytes_total";
    let pipeline_with = |derived: &str| {
        promnorm::config::Config::parse(
            &format!(
                "listen: 127.0.0.1:1\npacks:\n  sum_over_ranks: {{sglang: true}}\nderived:\n{derived}"
            ),
            "t.yaml",
        )
        .unwrap()
        .pipeline()
        .unwrap()
    };
    // Series of one model at one timestamp, value 1 (or stale markers).
    let request = |model: &str, ts: i64, value: f64, ranks: &mut dyn Iterator<Item = String>| {
        pb::WriteRequest {
            timeseries: ranks
                .map(|rank| {
                    series(
                        &[
                            ("__name__", FAMILY),
                            ("model_name", model),
                            ("tp_rank", &rank),
                        ],
                        &[(value, ts)],
                    )
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let stale = f64::from_bits(promnorm::wire::STALE_NAN_BITS);

    // Ranks of 1,000 bytes: 256 of them would be 256 KB, five times the budget.
    let pipeline = pipeline_with(&format!("  max_series: {MAX_SERIES}\n"));
    let d = pipeline.deriver().unwrap().clone();
    let budget = MAX_SERIES * LABEL_BYTES_PER_SERIES;
    let mut ws = pipeline.take_workspace();
    let long_rank = |i: usize| format!("{i:04}{}", "r".repeat(996));
    for group in 0..4 {
        let body = request(
            &format!("m{group}"),
            BASE_TS,
            1.0,
            &mut (0..256).map(long_rank),
        );
        pipeline.process_raw(&mut ws, &body).expect("valid");
        assert!(d.label_bytes() <= budget, "{} > {budget}", d.label_bytes());
    }
    assert!(
        d.counters.label_bytes.load(Relaxed) > 0,
        "ranks past the budget refused, counted"
    );

    assert!(d.label_bytes() > 0, "ranks kept up to the bound");

    // A rank value over the cap is not kept, even with room: its group's sum ends and
    // nothing short of that rank is emitted.
    let roomy = pipeline_with("  stale_after: 1s\n");
    let mut ws = roomy.take_workspace();
    let d = roomy.deriver().unwrap().clone();
    let mut send = |model: &str, ts: i64, value: f64, ranks: &[&str]| {
        let body = request(model, ts, value, &mut ranks.iter().map(|r| r.to_string()));
        roomy.process_raw(&mut ws, &body).expect("valid");
    };
    let drained = || {
        let mut out: Vec<Emitted> = Vec::new();
        d.drain(&mut out);
        out.iter()
            .map(|e| (e.timestamp - BASE_TS, f64::from_bits(e.value_bits)))
            .collect::<Vec<_>>()
    };
    let too_long = "r".repeat(MAX_RANK_BYTES + 1);
    for ts in [BASE_TS, BASE_TS + 15_000] {
        send("m", ts, 1.0, &["0", &too_long]);
    }
    assert!(drained().is_empty(), "no sum short of a rank");
    assert!(d.counters.label_bytes.load(Relaxed) >= 2);
    assert_eq!(d.series_count(), 1, "the group stays");
    let group_only = d.label_bytes();
    assert!(group_only < 100, "no rank kept: {group_only}");

    // An open sum ended by a rank it cannot keep ends with a stale marker after its
    // last sum; the group learns its ranks again, then sums again, all in order.
    for (k, ranks) in [
        (0, &["0", "1"][..]),
        (1, &["0", "1"]),
        (2, &["0", "1", &too_long]),
        (3, &["0", "1"]),
        (4, &["0", "1"]),
    ] {
        send("n", BASE_TS + k * 15_000, 1.0, ranks);
    }
    let out = drained();
    assert_eq!(out.len(), 4, "{out:?}");
    assert_eq!(&out[..2], &[(15_000, 2.0), (30_000, 2.0)]);
    assert_eq!(out[2].0, 30_001, "the stale marker after the last sum");
    assert_eq!(out[2].1.to_bits(), promnorm::wire::STALE_NAN_BITS);
    assert_eq!(
        out[3],
        (60_000, 2.0),
        "learnt again at 45 s, summed at 60 s"
    );

    // Stale markers of a rank never kept create nothing.
    let groups = d.series_count();
    send("s", BASE_TS, stale, &["0"]);
    assert_eq!(d.series_count(), groups);

    // A 257th rank ends the sum too.
    let many: Vec<String> = (0..257).map(|i| i.to_string()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let refused = d.counters.label_bytes.load(Relaxed);
    for ts in [BASE_TS, BASE_TS + 15_000] {
        send("many", ts, 1.0, &many);
    }
    assert!(drained().is_empty());
    assert_eq!(d.counters.label_bytes.load(Relaxed), refused + 2);

    // Ranks that end give their bytes back.
    let with_ranks = d.label_bytes();
    send("n", BASE_TS + 75_000, stale, &["0", "1"]);
    assert_eq!(
        with_ranks - d.label_bytes(),
        2 * promnorm::derive::ranks::RankSumState::cost(b"0"),
        "two ranks' bytes given back"
    );
    // Groups unseen for `stale_after` are swept with their ranks' bytes ("m2" holds
    // two ranks).
    send("m2", BASE_TS, 1.0, &["0", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(2100));
    d.sweep();
    assert_eq!((d.label_bytes(), d.series_count()), (0, 0));
}
