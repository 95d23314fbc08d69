//! Tenant routing through `serve` (docs/tenancy.md): one request's series split by the
//! tenant label into one request per tenant and backend, each with its tenant header;
//! one tenant's refusal never fails another's data; derived series follow their
//! inputs' tenant; queued requests keep their tenant.

use crate::common;
use crate::common::rw2_support as rw2;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use common::*;
use promnorm::wire::proto::prometheus as pb;
use promnorm::wire::proto::write_v2 as v2;

const TS: i64 = 1_700_000_000_000;

/// What a tenant-aware backend received: (tenant header, series' `i` labels, series'
/// tenant labels, status it answered).
#[derive(Clone, Debug)]
struct Got {
    tenant: Option<String>,
    ids: Vec<String>,
    tenant_labels: Vec<Option<String>>,
    names: Vec<String>,
    status: u16,
}

type Log = Arc<Mutex<Vec<Got>>>;

/// A backend that answers by the tenant header (`answer(tenant, nth request)`).
async fn tenant_backend(
    answer: impl Fn(Option<&str>, usize) -> u16 + Send + Sync + 'static,
) -> (String, Log) {
    let log: Log = Arc::default();
    let log2 = log.clone();
    let answer = Arc::new(answer);
    let count = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let log = log2.clone();
            let answer = answer.clone();
            let n = count.fetch_add(1, Ordering::SeqCst);
            async move {
                let tenant = headers
                    .get("x-scope-orgid")
                    .map(|v| v.to_str().unwrap().to_string());
                let req = decode(&body);
                let label = |ts: &pb::TimeSeries, name: &str| {
                    ts.labels
                        .iter()
                        .find(|l| l.name == name)
                        .map(|l| l.value.clone())
                };
                let status = answer(tenant.as_deref(), n);
                log.lock().unwrap().push(Got {
                    tenant,
                    ids: req
                        .timeseries
                        .iter()
                        .map(|ts| label(ts, "i").unwrap_or_default())
                        .collect(),
                    tenant_labels: req
                        .timeseries
                        .iter()
                        .map(|ts| label(ts, "tenant"))
                        .collect(),
                    names: req
                        .timeseries
                        .iter()
                        .map(|ts| label(ts, "__name__").unwrap_or_default())
                        .collect(),
                    status,
                });
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/write"), log)
}

/// One request: series `i=0..` with the given tenant labels (None: no label), two
/// samples each.
fn request(tenants: &[Option<&str>]) -> Vec<u8> {
    let timeseries = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let i = i.to_string();
            let mut labels = vec![("__name__", "t_total"), ("i", i.as_str())];
            if let Some(t) = t {
                labels.push(("tenant", t));
            }
            series(&labels, &[(1.0, TS), (2.0, TS + 1000)])
        })
        .collect();
    encode(&pb::WriteRequest {
        timeseries,
        metadata: vec![],
    })
}

/// Series ids by tenant header, over the requests a backend answered `status`.
fn by_tenant(log: &Log, status: u16) -> BTreeMap<Option<String>, BTreeSet<String>> {
    let mut out: BTreeMap<Option<String>, BTreeSet<String>> = BTreeMap::new();
    for g in log.lock().unwrap().iter().filter(|g| g.status == status) {
        out.entry(g.tenant.clone())
            .or_default()
            .extend(g.ids.iter().cloned());
    }
    out
}

fn ids(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn some(t: &str) -> Option<String> {
    Some(t.to_string())
}

#[tokio::test]
async fn three_tenants_one_refused_by_one_backend_one_throttled_by_another() {
    // Backend `strict` refuses tenant b as data (400); backend `busy` throttles tenant c.
    let (strict, strict_log) = tenant_backend(|t, _| if t == Some("b") { 400 } else { 204 }).await;
    let (busy, busy_log) = tenant_backend(|t, _| if t == Some("c") { 429 } else { 204 }).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  label: tenant\n  default: anonymous\nbackends:\n  - name: strict\n    url: {strict}\n  - name: busy\n    url: {busy}\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let body = request(&[Some("a"), Some("b"), Some("c"), None, Some("a"), Some("")]);
    let r = post(&proxy.url(), body, RW_HEADERS).await;
    // The most retryable outcome wins: 429 over 400.
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.body.contains("busy (tenant c)"), "{}", r.body);

    // Each tenant's series reached each backend in a request of its own, with its header
    // and without the tenant label; an empty label value counts as no label.
    let expected: BTreeMap<Option<String>, BTreeSet<String>> = [
        (some("a"), ids(&["0", "4"])),
        (some("b"), ids(&["1"])),
        (some("c"), ids(&["2"])),
        (some("anonymous"), ids(&["3", "5"])),
    ]
    .into_iter()
    .collect();
    let mut strict_all = by_tenant(&strict_log, 204);
    strict_all.extend(by_tenant(&strict_log, 400));
    assert_eq!(strict_all, expected);
    assert_eq!(
        by_tenant(&strict_log, 400).keys().collect::<Vec<_>>(),
        [&some("b")]
    );
    let mut busy_all = by_tenant(&busy_log, 204);
    busy_all.extend(by_tenant(&busy_log, 429));
    assert_eq!(busy_all, expected);
    assert_eq!(
        by_tenant(&busy_log, 429).keys().collect::<Vec<_>>(),
        [&some("c")]
    );
    for g in strict_log.lock().unwrap().iter() {
        assert!(g.tenant_labels.iter().all(Option::is_none), "{g:?}");
    }

    // Counted per backend and tenant: 2 samples per series.
    let count = |backend: &'static str, tenant: &'static str, outcome: &'static str| {
        let p = &proxy;
        async move {
            p.metric(
                "promnorm_tenant_samples_total",
                &[
                    &format!("backend=\"{backend}\""),
                    &format!("tenant=\"{tenant}\""),
                    &format!("outcome=\"{outcome}\""),
                ],
            )
            .await
        }
    };
    assert_eq!(count("strict", "b", "rejected").await, 2.0);
    assert_eq!(count("strict", "a", "delivered").await, 4.0);
    assert_eq!(count("strict", "c", "delivered").await, 2.0);
    assert_eq!(count("busy", "c", "failed").await, 2.0);
    assert_eq!(count("busy", "b", "delivered").await, 2.0);
    assert_eq!(count("busy", "anonymous", "delivered").await, 4.0);
    proxy.shut_down().await;
}

#[tokio::test]
async fn unlabelled_series_keep_the_senders_tenant_and_keep_label_keeps_the_label() {
    let (url, log) = tenant_backend(|_, _| 204).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  label: tenant\n  keep_label: true\nbackends:\n  - url: {url}\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let body = request(&[Some("a"), None, Some("b")]);
    let mut headers = RW_HEADERS.to_vec();
    headers.push(("X-Scope-OrgID", "from-sender"));
    assert_eq!(post(&proxy.url(), body.clone(), &headers).await.status, 204);
    // Without the sender's header, unlabelled series go without one.
    assert_eq!(post(&proxy.url(), body, RW_HEADERS).await.status, 204);
    let got = by_tenant(&log, 204);
    assert_eq!(got[&some("a")], ids(&["0"]));
    assert_eq!(got[&some("b")], ids(&["2"]));
    assert_eq!(got[&some("from-sender")], ids(&["1"]));
    assert_eq!(got[&None], ids(&["1"]));
    for g in log.lock().unwrap().iter() {
        for l in &g.tenant_labels {
            // The label stays, and always matches the header.
            assert_eq!(
                l.is_some(),
                g.tenant.is_some() && g.tenant.as_deref() != Some("from-sender"),
                "{g:?}"
            );
            if l.is_some() {
                assert_eq!(l, &g.tenant, "{g:?}");
            }
        }
    }
    proxy.shut_down().await;
}

#[tokio::test]
async fn a_backend_can_turn_routing_off_or_route_by_another_label() {
    let (routed, routed_log) = tenant_backend(|_, _| 204).await;
    let (whole, whole_log) = tenant_backend(|_, _| 204).await;
    let (other, other_log) = tenant_backend(|_, _| 204).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  label: tenant\nbackends:\n  - name: routed\n    url: {routed}\n  - name: whole\n    url: {whole}\n    tenancy:\n      enabled: false\n  - name: other\n    url: {other}\n    tenancy:\n      label: i\n      default: none\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let body = request(&[Some("a"), Some("b"), Some("a")]);
    assert_eq!(post(&proxy.url(), body, RW_HEADERS).await.status, 204);
    assert_eq!(routed_log.lock().unwrap().len(), 2);
    let whole = whole_log.lock().unwrap().clone();
    assert_eq!(whole.len(), 1, "the whole request, once");
    assert_eq!(whole[0].tenant, None);
    assert_eq!(whole[0].ids, ["0", "1", "2"]);
    assert_eq!(whole[0].tenant_labels.iter().flatten().count(), 3);
    // Routed by `i`: one tenant per series, the `i` label removed.
    let other = other_log.lock().unwrap().clone();
    let tenants: BTreeSet<Option<String>> = other.iter().map(|g| g.tenant.clone()).collect();
    assert_eq!(
        tenants,
        [some("0"), some("1"), some("2")].into_iter().collect()
    );
    assert!(other.iter().all(|g| g.ids == [""]), "{other:?}");
    proxy.shut_down().await;
}

#[tokio::test]
async fn more_tenants_than_allowed_is_a_clear_400_and_counted() {
    let (url, log) = tenant_backend(|_, _| 204).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  max_tenants_per_request: 2\nbackends:\n  - url: {url}\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let r = post(
        &proxy.url(),
        request(&[Some("a"), Some("b"), None]),
        RW_HEADERS,
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.body);
    let r = post(
        &proxy.url(),
        request(&[Some("a"), Some("b"), Some("c")]),
        RW_HEADERS,
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("more than 2 tenants"), "{}", r.body);
    assert_eq!(
        proxy
            .metric("promnorm_samples_dropped_total", &["too_many_tenants"])
            .await,
        6.0
    );
    assert_eq!(
        log.lock().unwrap().len(),
        3,
        "only the first request was sent"
    );
    proxy.shut_down().await;
}

#[tokio::test]
async fn queued_requests_keep_their_tenant_through_retries() {
    // Tenant c is throttled for its first three attempts; everything else is accepted.
    let c_attempts = Arc::new(AtomicUsize::new(0));
    let c2 = c_attempts.clone();
    let (url, log) = tenant_backend(move |t, _| {
        if t == Some("c") && c2.fetch_add(1, Ordering::SeqCst) < 3 {
            429
        } else {
            204
        }
    })
    .await;
    let dir = std::env::temp_dir().join(format!("promnorm-tenancy-q-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  keep_label: true\nbackends:\n  - url: {url}\n    queue:\n      type: disk\n      dir: {}\n      shards: 4\n",
        dir.display()
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    for k in 0..5 {
        let tenants: Vec<Option<&str>> =
            (0..9).map(|i| Some(["a", "b", "c"][(i + k) % 3])).collect();
        let r = post(&proxy.url(), request(&tenants), RW_HEADERS).await;
        assert_eq!(r.status, 204, "{}", r.body);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // Counted in series: a tenant's backlog may go out as one merged request.
        let delivered: usize = log
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.status == 204)
            .map(|g| g.tenant_labels.len())
            .sum();
        if delivered == 45 || tokio::time::Instant::now() > deadline {
            assert_eq!(delivered, 45, "5 requests x 9 series delivered");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(c_attempts.load(Ordering::SeqCst) >= 4);
    // Every request, retried or not, went to the tenant its series name.
    for g in log.lock().unwrap().iter() {
        assert!(g.tenant.is_some(), "{g:?}");
        assert!(g.tenant_labels.iter().all(|l| l == &g.tenant), "{g:?}");
    }
    proxy.shut_down().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn derived_series_go_to_their_inputs_tenant() {
    let (url, log) = tenant_backend(|_, _| 204).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nderived:\n  flush_interval: 20ms\ntenancy:\n  keep_label: true\nbackends:\n  - url: {url}\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    for k in 0..3i64 {
        let ts = TS + k * 15_000;
        let mut timeseries = Vec::new();
        for tenant in ["a", "b"] {
            let v = (k * 10) as f64;
            for (name, value) in [
                ("vllm:prefix_cache_hits_total", v),
                ("vllm:prefix_cache_queries_total", 2.0 * v),
            ] {
                timeseries.push(series(
                    &[("__name__", name), ("engine", "0"), ("tenant", tenant)],
                    &[(value, ts)],
                ));
            }
        }
        let body = encode(&pb::WriteRequest {
            timeseries,
            metadata: vec![],
        });
        assert_eq!(post(&proxy.url(), body, RW_HEADERS).await.status, 204);
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    // The derived ratio arrives once per tenant, in that tenant's requests.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let derived: Vec<Got> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.names.iter().any(|n| n.ends_with("hit_ratio")))
            .cloned()
            .collect();
        let tenants: BTreeSet<Option<String>> = derived.iter().map(|g| g.tenant.clone()).collect();
        if tenants.len() == 2 || tokio::time::Instant::now() > deadline {
            assert_eq!(
                tenants,
                [some("a"), some("b")].into_iter().collect(),
                "{derived:?}"
            );
            for g in &derived {
                assert!(g.tenant_labels.iter().all(|l| l == &g.tenant), "{g:?}");
                assert!(g.names.iter().all(|n| n.ends_with("hit_ratio")), "{g:?}");
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.shut_down().await;
}

/// A backend taking 1.0 and 2.0 (confirming 2.0 with the written headers); records
/// (tenant header, content type, body) of each request.
async fn any_version_backend() -> (String, rw2::V2Recorded) {
    rw2::versioned_backend(axum::http::StatusCode::NO_CONTENT, true).await
}

/// (tenant header, content type, body) of what `rec` received.
fn bodies(rec: &rw2::V2Recorded) -> Vec<(Option<String>, String, Vec<u8>)> {
    let h = |m: &HeaderMap, n: &str| m.get(n).map(|v| v.to_str().unwrap().to_string());
    rec.lock()
        .unwrap()
        .iter()
        .map(|(m, body)| {
            (
                h(m, "x-scope-orgid"),
                h(m, "content-type").unwrap_or_default(),
                body.clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_2_0_sender_is_routed_to_1_0_and_2_0_backends() {
    let (one, one_rec) = any_version_backend().await;
    let (two, two_rec) = any_version_backend().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  default: anonymous\nbackends:\n  - name: one\n    url: {one}\n  - name: two\n    url: {two}\n    protocol: v2\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    // Three series with start timestamps: tenants a, b and none.
    let mut sym = rw2::Symbols::default();
    let series: Vec<v2::TimeSeries> = [Some("a"), Some("b"), None]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let i = i.to_string();
            let mut labels = vec![("__name__", "t_total"), ("i", i.as_str())];
            if let Some(t) = t {
                labels.push(("tenant", t));
            }
            v2::TimeSeries {
                labels_refs: sym.refs(&labels),
                samples: vec![v2::Sample {
                    value: 3.0,
                    timestamp: TS,
                    start_timestamp: TS - 60_000,
                }],
                ..Default::default()
            }
        })
        .collect();
    let req = v2::Request {
        timeseries: series,
        symbols: sym.list,
    };
    let r = post(&proxy.url(), rw2::encode_v2(&req), rw2::RW2_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(
        r.headers["x-prometheus-remote-write-samples-written"], "3",
        "the 2.0 sender's written headers"
    );
    let expect = |tenant: &str| match tenant {
        "a" => "0",
        "b" => "1",
        _ => "2",
    };
    // The 1.0 backend: one 1.0 request per tenant, start timestamps dropped.
    let got = bodies(&one_rec);
    assert_eq!(got.len(), 3);
    for (tenant, ct, body) in &got {
        assert_eq!(ct, "application/x-protobuf");
        let tenant = tenant.as_deref().unwrap();
        let canon = rw2::canon_v1(&decode(body));
        assert_eq!(canon.len(), 1, "{tenant}");
        assert!(
            canon[0]
                .labels
                .contains(&("i".into(), expect(tenant).into()))
        );
        assert!(canon[0].labels.iter().all(|(n, _)| n != "tenant"));
        assert_eq!(canon[0].samples, [(3f64.to_bits(), TS, 0)]);
    }
    // The 2.0 backend: one 2.0 request per tenant, start timestamps kept.
    let got = bodies(&two_rec);
    assert_eq!(got.len(), 3);
    let mut tenants = BTreeSet::new();
    for (tenant, ct, body) in &got {
        assert!(ct.contains("io.prometheus.write.v2.Request"), "{ct}");
        let tenant = tenant.clone().unwrap();
        let canon = rw2::canon_v2(&rw2::decode_v2(body));
        assert_eq!(canon.len(), 1, "{tenant}");
        assert!(
            canon[0]
                .labels
                .contains(&("i".into(), expect(&tenant).into()))
        );
        assert!(canon[0].labels.iter().all(|(n, _)| n != "tenant"));
        assert_eq!(canon[0].samples, [(3f64.to_bits(), TS, TS - 60_000)]);
        tenants.insert(tenant);
    }
    assert_eq!(tenants, ids(&["a", "anonymous", "b"]));
    proxy.shut_down().await;
}

#[tokio::test]
async fn metadata_goes_with_its_tenants_series_and_alone_to_the_senders_tenant() {
    let (url, rec) = any_version_backend().await;
    let yaml = format!("listen: 127.0.0.1:0\ntenancy: {{}}\nbackends:\n  - url: {url}\n");
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let metadata = |family: &str| pb::MetricMetadata {
        r#type: 1,
        metric_family_name: family.into(),
        help: format!("{family} help"),
        unit: String::new(),
    };
    let mut headers = RW_HEADERS.to_vec();
    headers.push(("X-Scope-OrgID", "sender"));
    // Metadata alone, as Prometheus 1.0 sends it: to the sender's tenant.
    let alone = encode(&pb::WriteRequest {
        timeseries: vec![],
        metadata: vec![metadata("a_total")],
    });
    assert_eq!(post(&proxy.url(), alone, &headers).await.status, 204);
    // With series: each family's metadata to the tenants with its series only.
    let mixed = encode(&pb::WriteRequest {
        timeseries: vec![
            series(&[("__name__", "x_total"), ("tenant", "a")], &[(1.0, TS)]),
            series(&[("__name__", "y_total"), ("tenant", "b")], &[(1.0, TS)]),
        ],
        metadata: vec![metadata("x"), metadata("y")],
    });
    assert_eq!(post(&proxy.url(), mixed, &headers).await.status, 204);
    let mut got: Vec<(Option<String>, Vec<String>, usize)> = bodies(&rec)
        .iter()
        .map(|(t, _, body)| {
            let r = decode(body);
            (
                t.clone(),
                r.metadata
                    .into_iter()
                    .map(|m| m.metric_family_name)
                    .collect(),
                r.timeseries.len(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (some("a"), vec!["x".to_string()], 1),
            (some("b"), vec!["y".to_string()], 1),
            (some("sender"), vec!["a_total".to_string()], 0),
        ]
    );
    proxy.shut_down().await;
}

/// Issue 25, defect 10: a tenant label value with control characters (a `\n` that
/// forges a log line, an ANSI escape) reached the text log, `/metrics` and the error
/// reason raw. Now they are escaped wherever a tenant is shown; the data of the other
/// tenants is delivered.
#[tokio::test]
async fn control_characters_of_a_tenant_are_escaped_wherever_it_is_shown() {
    let (url, log) = tenant_backend(|_, _| 204).await;
    let yaml = format!("listen: 127.0.0.1:0\ntenancy: {{}}\nbackends:\n  - url: {url}\n");
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let forged = "evil\nlevel=ERROR msg=forged";
    let ansi = "ansi\u{1b}[31mred";
    let r = post(
        &proxy.url(),
        request(&[Some("good"), Some(forged), Some(ansi)]),
        RW_HEADERS,
    )
    .await;
    // The two tenants that cannot be headers are data errors; "good" is delivered.
    assert_eq!(r.status, 400, "{}", r.body);
    let reason = r.body.trim_end_matches('\n');
    assert!(
        !reason.contains('\n') && !reason.contains('\u{1b}'),
        "{reason:?}"
    );
    assert!(reason.contains(r"tenant evil\nlevel=ERROR"), "{reason:?}");
    assert_eq!(
        by_tenant(&log, 204),
        BTreeMap::from([(some("good"), ids(&["0"]))])
    );
    let metrics = get(&format!("http://{}/metrics", proxy.addr)).await.body;
    assert!(
        !metrics.contains('\u{1b}'),
        "an escape character reached /metrics"
    );
    assert!(
        !metrics.lines().any(|l| l.starts_with("level=ERROR")),
        "a tenant forged a line of /metrics"
    );
    assert!(
        metrics.contains(r"evil\\nlevel=ERROR"),
        "the tenant is counted, escaped"
    );
    assert!(
        metrics.contains(r"ansi\\u{1b}[31mred"),
        "the tenant is counted, escaped"
    );
    proxy.shut_down().await;
}

/// A backend that answers 204 after `delay`, counting the requests in flight (and their
/// peak) and the connections (client addresses) it was sent requests on.
struct SlowBackend {
    url: String,
    peak: Arc<AtomicUsize>,
    peers: Arc<Mutex<BTreeSet<std::net::SocketAddr>>>,
    served: Arc<AtomicUsize>,
}

async fn slow_backend(delay: Duration) -> SlowBackend {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let peers: Arc<Mutex<BTreeSet<std::net::SocketAddr>>> = Arc::default();
    let served = Arc::new(AtomicUsize::new(0));
    let (p2, f2, s2, c2) = (
        peak.clone(),
        in_flight.clone(),
        peers.clone(),
        served.clone(),
    );
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(
            move |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<
                std::net::SocketAddr,
            >,
                  _body: Bytes| {
                let (peak, in_flight, peers, served) =
                    (p2.clone(), f2.clone(), s2.clone(), c2.clone());
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    peers.lock().unwrap().insert(peer);
                    tokio::time::sleep(delay).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    served.fetch_add(1, Ordering::SeqCst);
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await;
    });
    SlowBackend {
        url: format!("http://{addr}/api/v1/write"),
        peak,
        peers,
        served,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_fan_out_is_bounded_per_backend_and_the_excess_is_retryable() {
    // 5 senders' requests x 40 tenants = 200 requests to one slow backend at once.
    // Before, promnorm opened a connection for each (25 x 1,000 tenants exhausted the
    // file descriptors and every request failed 502/504); now at most
    // max_concurrent_requests (default 64) are in flight, over as many pooled
    // connections, and the excess is answered 429 at once (the sender retries).
    let backend = slow_backend(Duration::from_millis(1500)).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  label: tenant\n  default: anonymous\nbackends:\n  - name: fanout\n    url: {}\n    timeout: 10s\n",
        backend.url
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let tenants: Vec<String> = (0..40).map(|t| format!("t{t}")).collect();
    let started = tokio::time::Instant::now();
    let sends = (0..5).map(|_| {
        let body = request(&tenants.iter().map(|t| Some(t.as_str())).collect::<Vec<_>>());
        let url = proxy.url();
        tokio::spawn(async move { post(&url, body, RW_HEADERS).await })
    });
    let mut statuses = Vec::new();
    for s in sends.collect::<Vec<_>>() {
        let r = s.await.unwrap();
        statuses.push((r.status.as_u16(), r.body));
    }
    let took = started.elapsed();
    let peak = backend.peak.load(Ordering::SeqCst);
    let connections = backend.peers.lock().unwrap().len();
    println!(
        "200 tenant requests at once: peak {peak} in flight at the backend over {connections} connections, {} served, sender answers {:?} in {took:?}",
        backend.served.load(Ordering::SeqCst),
        statuses.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    assert!(peak <= 64, "{peak} requests in flight at the backend");
    assert!(
        connections <= 64,
        "{connections} connections to the backend"
    );
    for (status, body) in &statuses {
        assert!(
            *status == 204 || *status == 429,
            "the sender gets a delivery or a retryable 429: {status} {body}"
        );
    }
    assert!(
        statuses.iter().any(|s| s.0 == 429),
        "200 requests over a limit of 64: some were refused"
    );
    assert!(
        statuses
            .iter()
            .filter(|s| s.0 == 429)
            .all(|s| s.1.contains("max_concurrent_requests")),
        "{statuses:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "the excess is answered quickly"
    );
    assert!(
        proxy
            .metric("promnorm_backend_saturated_total", &["backend=\"fanout\""])
            .await
            >= 200.0 - 64.0
    );
    // The pool keeps its connections: a second wave opens no new ones.
    let before = backend.peers.lock().unwrap().clone();
    let r = post(
        &proxy.url(),
        request(
            &tenants[..10]
                .iter()
                .map(|t| Some(t.as_str()))
                .collect::<Vec<_>>(),
        ),
        RW_HEADERS,
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.body);
    let after = backend.peers.lock().unwrap().clone();
    assert!(
        after.is_subset(&before),
        "new connections although {} were pooled: {:?}",
        before.len(),
        after.difference(&before).collect::<Vec<_>>()
    );
    proxy.shut_down().await;
}

/// (tenant, metadata families, series) of each request a gateway accepted.
type GatewayLog = Arc<Mutex<Vec<(String, Vec<String>, usize)>>>;

/// A tenant-aware gateway (nginx in front of Mimir): 401 without the tenant header, and
/// 401 for the tenants in `refused`; records (tenant, metadata families, series) of the
/// requests it accepted and counts the refused ones.
async fn gateway(refused: &'static [&'static str]) -> (String, GatewayLog, Arc<AtomicUsize>) {
    let log: GatewayLog = Arc::default();
    let refusals = Arc::new(AtomicUsize::new(0));
    let (log2, ref2) = (log.clone(), refusals.clone());
    let app = axum::Router::new().route(
        "/api/v1/push",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (log, refusals) = (log2.clone(), ref2.clone());
            async move {
                let tenant = headers
                    .get("x-scope-orgid")
                    .map(|v| v.to_str().unwrap().to_string());
                let Some(tenant) = tenant.filter(|t| !refused.contains(&t.as_str())) else {
                    refusals.fetch_add(1, Ordering::SeqCst);
                    return (axum::http::StatusCode::UNAUTHORIZED, "no org id");
                };
                let req = decode(&body);
                let mut families: Vec<String> = req
                    .metadata
                    .into_iter()
                    .map(|m| m.metric_family_name)
                    .collect();
                families.sort();
                log.lock()
                    .unwrap()
                    .push((tenant, families, req.timeseries.len()));
                (axum::http::StatusCode::OK, "")
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/push"), log, refusals)
}

fn metadata_only(families: &[&str]) -> Vec<u8> {
    encode(&pb::WriteRequest {
        timeseries: vec![],
        metadata: families
            .iter()
            .map(|f| pb::MetricMetadata {
                r#type: 1,
                metric_family_name: f.to_string(),
                help: format!("{f} help"),
                unit: String::new(),
            })
            .collect(),
    })
}

#[tokio::test]
async fn metadata_alone_goes_to_the_tenants_seen_for_its_family_or_is_dropped_counted() {
    // Tenancy without `default`, a sender without a tenant header (Prometheus), a
    // gateway that requires one. Before, Prometheus' metadata-only requests went
    // without a tenant, got 401, and the sender was answered 503 and retried forever.
    let (url, log, refusals) = gateway(&[]).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  label: tenant\nbackends:\n  - name: gw_meta\n    url: {url}\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    // No series seen yet: nowhere to send it. Dropped and counted, not retried.
    let r = post(&proxy.url(), metadata_only(&["m"]), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let series = encode(&pb::WriteRequest {
        timeseries: vec![
            series(&[("__name__", "m_total"), ("tenant", "a")], &[(1.0, TS)]),
            series(&[("__name__", "m_total"), ("tenant", "b")], &[(1.0, TS)]),
            series(
                &[("__name__", "other_bucket"), ("tenant", "c"), ("le", "1")],
                &[(1.0, TS)],
            ),
        ],
        metadata: vec![],
    });
    let r = post(&proxy.url(), series, RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    log.lock().unwrap().clear();
    // Metadata alone, as Prometheus sends it once a minute: to the tenants whose series
    // of each family were seen; a family never seen is dropped.
    let r = post(
        &proxy.url(),
        metadata_only(&["m", "other", "unseen"]),
        RW_HEADERS,
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.body);
    let mut got = log.lock().unwrap().clone();
    got.sort();
    assert_eq!(
        got,
        [
            ("a".to_string(), vec!["m".to_string()], 0),
            ("b".to_string(), vec!["m".to_string()], 0),
            ("c".to_string(), vec!["other".to_string()], 0),
        ]
    );
    assert_eq!(
        refusals.load(Ordering::SeqCst),
        0,
        "nothing went without a tenant"
    );
    assert_eq!(
        proxy
            .metric(
                "promnorm_metadata_dropped_total",
                &["backend=\"gw_meta\"", "reason=\"no_tenant\""]
            )
            .await,
        2.0
    );
    assert_eq!(
        proxy
            .metric("promnorm_backend_misconfigured", &["backend=\"gw_meta\""])
            .await,
        0.0
    );
    proxy.shut_down().await;
}

#[tokio::test]
async fn the_misconfigured_gauge_holds_while_a_backend_keeps_refusing_some_requests() {
    // The gateway refuses tenant `bad` (401) and accepts `good`. Before, each delivery to
    // `good` set promnorm_backend_misconfigured back to 0, so with requests interleaved
    // it flapped 1/0 and the alert (`for: 2m`) never fired.
    let (url, _log, refusals) = gateway(&["bad"]).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\ntenancy:\n  label: tenant\n  default: good\nbackends:\n  - name: gw_flap\n    url: {url}\n"
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let gauge = || proxy.metric("promnorm_backend_misconfigured", &["backend=\"gw_flap\""]);
    for round in 0..3 {
        let r = post(&proxy.url(), request(&[Some("bad")]), RW_HEADERS).await;
        assert_eq!(r.status, 503, "{}", r.body);
        assert_eq!(gauge().await, 1.0, "round {round}: after a refusal");
        let r = post(&proxy.url(), request(&[Some("good"), None]), RW_HEADERS).await;
        assert_eq!(r.status, 204, "{}", r.body);
        assert_eq!(
            gauge().await,
            1.0,
            "round {round}: a delivery for another tenant does not clear the refusal"
        );
    }
    assert_eq!(refusals.load(Ordering::SeqCst), 3);
    proxy.shut_down().await;
}

/// A saturated backend's excess is answered with `server.throttle_status`: a sender
/// with Prometheus' defaults (which drop a batch answered 429) can be given 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_backend_answers_the_configured_throttle_status() {
    let backend = slow_backend(Duration::from_millis(1500)).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nserver:\n  throttle_status: 503\ntenancy:\n  label: tenant\n  default: anonymous\nbackends:\n  - name: fanout\n    url: {}\n    timeout: 10s\n    max_concurrent_requests: 4\n",
        backend.url
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let tenants: Vec<String> = (0..10).map(|t| format!("t{t}")).collect();
    let body = request(&tenants.iter().map(|t| Some(t.as_str())).collect::<Vec<_>>());
    let r = post(&proxy.url(), body, RW_HEADERS).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("max_concurrent_requests"), "{}", r.body);
    assert!(backend.peak.load(Ordering::SeqCst) <= 4);
    proxy.shut_down().await;
}

/// A request whose series all name one tenant goes to it as one body (routing reads the
/// tenant off the input, not the body), its samples counted and its names remembered for
/// metadata sent alone; with a rule that edits the tenant label, the series it moves go
/// to the tenant it gives them.
#[tokio::test]
async fn one_tenant_requests_go_whole_and_a_rule_editing_the_tenant_label_is_honoured() {
    let (url, log) = tenant_backend(|_, _| 204).await;
    let tenancy = "tenancy:\n  label: tenant\n  keep_label: true\n";
    let yaml =
        format!("listen: 127.0.0.1:0\n{tenancy}backends:\n  - name: one_tenant\n    url: {url}\n");
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    let r = post(&proxy.url(), request(&[Some("a"); 4]), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    {
        let got = log.lock().unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].tenant, some("a"));
        assert_eq!(got[0].ids, ["0", "1", "2", "3"]);
        assert!(
            got[0].tenant_labels.iter().all(|t| t == &some("a")),
            "{got:?}"
        );
    }
    assert_eq!(
        proxy
            .metric(
                "promnorm_tenant_samples_total",
                &[
                    "backend=\"one_tenant\"",
                    "tenant=\"a\"",
                    "outcome=\"delivered\""
                ]
            )
            .await,
        8.0
    );
    // Metadata alone for the family just sent: to its tenant, from the names remembered.
    log.lock().unwrap().clear();
    let r = post(&proxy.url(), metadata_only(&["t"]), RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    {
        let got = log.lock().unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].tenant.clone(), got[0].ids.len()), (some("a"), 0));
    }
    proxy.shut_down().await;

    // Every series names tenant a, but a rule moves family `moved` to b.
    let dir = std::env::temp_dir().join(format!("promnorm-one-tenant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pack = dir.join("mover.yaml");
    std::fs::write(
        &pack,
        "pack: mover\nrules:\n  - match: {family: moved}\n    set_labels: {tenant: b}\n",
    )
    .unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\n{tenancy}packs:\n  builtin: none\n  files: [{}]\nbackends:\n  - url: {url}\n",
        pack.display()
    );
    let proxy = start_proxy_yaml(&yaml, Duration::from_secs(2)).await;
    log.lock().unwrap().clear();
    let body = encode(&pb::WriteRequest {
        timeseries: vec![
            series(
                &[("__name__", "t_total"), ("i", "0"), ("tenant", "a")],
                &[(1.0, TS)],
            ),
            series(
                &[("__name__", "moved"), ("i", "1"), ("tenant", "a")],
                &[(1.0, TS)],
            ),
            series(
                &[("__name__", "t_total"), ("i", "2"), ("tenant", "a")],
                &[(1.0, TS)],
            ),
        ],
        metadata: vec![],
    });
    let r = post(&proxy.url(), body, RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let got = by_tenant(&log, 204);
    assert_eq!(got[&some("a")], ids(&["0", "2"]));
    assert_eq!(got[&some("b")], ids(&["1"]));
    for g in log.lock().unwrap().iter() {
        assert!(g.tenant_labels.iter().all(|t| t == &g.tenant), "{g:?}");
    }
    proxy.shut_down().await;
    let _ = std::fs::remove_dir_all(&dir);
}
