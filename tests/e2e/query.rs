//! The query API (docs/query.md), proven on two real Prometheus servers.
//!
//! The same 48 scrapes (15 s apart) of every family the built-in packs rename or rescale
//! are written whole and raw into Prometheus A. Prometheus B gets the first 16 raw, as a
//! Prometheus without promnorm would have stored them, and the other 24 through
//! `promnorm serve`: B holds the old names before the cut-over and the new ones after.
//! The same promnorm answers the query API with `query.upstream` pointing at B. Every
//! query of the migrate corpus (dashboard shapes of vLLM, SGLang, DCGM, LMCache,
//! Mooncake and Dynamo, plus queries generated for every renamed input name), asked in
//! its old terms through promnorm, must return what A returns for it: the same label sets
//! (`__name__` included) and values (relative 1e-9), at an instant of each period and
//! over a range across the cut-over (`POST`, as Grafana sends it). The steps whose
//! windows hold both sides of the cut-over are not compared (a `rate` over them reads
//! some samples of each side, docs/query.md). Then the series and label APIs, the
//! request sequence of Grafana's data source, errors, and promnorm's own account of the
//! old names still queried.

use crate::common;
use crate::migrate::{CORPUS, close, default_rules, generated, renamed_inputs, scrape, urlencode};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use common::procs::{binary, prometheus_receiver, promnorm_serve};
use common::*;
use promnorm::migrate::QueryRewriter;

const SCRAPES: i64 = 48;
/// The first scrape written through promnorm.
const CUT: i64 = 16;
const STEP_MS: i64 = 15_000;
/// Steps after the cut-over that may still read data from before it: Prometheus'
/// lookback delta (5m, 20 steps; longer than the corpus' longest window, a 3m subquery
/// over a 1m rate), plus one.
const STRADDLE: i64 = 21;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("promnorm-e2e-query-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

type Labels = Vec<(String, String)>;
type Vector = BTreeMap<Labels, f64>;
type Matrix = BTreeMap<Labels, BTreeMap<i64, f64>>;

fn labels_of(metric: &serde_json::Value) -> Labels {
    let mut l: Labels = metric
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    l.sort();
    l
}

fn number(v: &serde_json::Value) -> f64 {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

fn parse(body: &str) -> Result<serde_json::Value, String> {
    let doc: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    if doc["status"] != "success" {
        return Err(body.to_string());
    }
    Ok(doc)
}

async fn instant(base: &str, query: &str, time: f64) -> Result<Vector, String> {
    let reply = get(&format!(
        "{base}/api/v1/query?query={}&time={time}",
        urlencode(query)
    ))
    .await;
    let doc = parse(&reply.body)?;
    let data = &doc["data"];
    let mut out = Vector::new();
    match data["resultType"].as_str() {
        Some("vector") => {
            for item in data["result"].as_array().into_iter().flatten() {
                out.insert(labels_of(&item["metric"]), number(&item["value"][1]));
            }
        }
        Some("scalar") => {
            out.insert(Vec::new(), number(&data["result"][1]));
        }
        other => return Err(format!("result type {other:?}")),
    }
    Ok(out)
}

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

async fn range(base: &str, query: &str, start: f64, end: f64) -> Result<Matrix, String> {
    let form = format!("query={}&start={start}&end={end}&step=15", urlencode(query));
    let reply = post(
        &format!("{base}/api/v1/query_range"),
        form.into_bytes(),
        &[FORM],
    )
    .await;
    let doc = parse(&reply.body)?;
    let mut out = Matrix::new();
    for item in doc["data"]["result"].as_array().into_iter().flatten() {
        let points = item["values"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    (p[0].as_f64().unwrap_or(0.0) * 1000.0).round() as i64,
                    number(&p[1]),
                )
            })
            .collect();
        out.insert(labels_of(&item["metric"]), points);
    }
    Ok(out)
}

fn compare_vectors(a: &Vector, b: &Vector) -> Result<(), String> {
    if a.keys().ne(b.keys()) {
        return Err(format!(
            "label sets differ:\n    A {:?}\n    promnorm {:?}",
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>()
        ));
    }
    for (k, va) in a {
        if !close(*va, b[k]) {
            return Err(format!("{k:?}: A {va} / promnorm {}", b[k]));
        }
    }
    Ok(())
}

/// Compares the steps `keep` accepts.
fn compare_matrices(a: &Matrix, b: &Matrix, keep: impl Fn(i64) -> bool) -> Result<usize, String> {
    let pick = |m: &Matrix| -> BTreeMap<(i64, Labels), f64> {
        m.iter()
            .flat_map(|(l, pts)| {
                pts.iter()
                    .filter(|(t, _)| keep(**t))
                    .map(move |(t, v)| ((*t, l.clone()), *v))
            })
            .collect()
    };
    let (pa, pb) = (pick(a), pick(b));
    let ka: BTreeSet<_> = pa.keys().collect();
    let kb: BTreeSet<_> = pb.keys().collect();
    if ka != kb {
        let only_a: Vec<_> = ka.difference(&kb).take(3).collect();
        let only_b: Vec<_> = kb.difference(&ka).take(3).collect();
        return Err(format!(
            "points differ: only on A {only_a:?}, only through promnorm {only_b:?}"
        ));
    }
    for (k, va) in &pa {
        if !close(*va, pb[k]) {
            return Err(format!("{k:?}: A {va} / promnorm {}", pb[k]));
        }
    }
    Ok(pa.len())
}

async fn json(url: &str) -> serde_json::Value {
    let reply = get(url).await;
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{url}: {e}: {}", reply.body))
}

fn sorted(v: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut items: Vec<serde_json::Value> = v.as_array().cloned().unwrap_or_default();
    items.sort_by_key(|i| i.to_string());
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_queries_through_the_query_api_answer_as_the_raw_data_does() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let (dir_a, dir_b, dir_p) = (scratch("a"), scratch("b"), scratch("p"));
    let mut a = prometheus_receiver(&prom, &dir_a);
    let mut b = prometheus_receiver(&prom, &dir_b);
    a.start("/-/ready").await;
    b.start("/-/ready").await;
    let b_write = format!("{}/api/v1/write", b.base);
    let b_root = b.base.clone();
    let mut proxy = promnorm_serve(&dir_p, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nbackends:\n  - name: b\n    url: {b_write}\n\
             query:\n  upstream: {b_root}\n"
        )
    });
    proxy.start("/-/ready").await;

    let rules = default_rules();
    let mut names = renamed_inputs(&rules);
    // A family whose only change is a label rename (Hostname → hostname): the query's
    // text stays, and one answer holds both periods.
    names.push("DCGM_FI_DEV_POWER_USAGE".into());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let t0 = now_ms - (SCRAPES + 2) * STEP_MS;
    for i in 0..SCRAPES {
        let body = encode(&scrape(&names, i, t0 + i * STEP_MS));
        let ra = post(
            &format!("{}/api/v1/write", a.base),
            body.clone(),
            RW_HEADERS,
        )
        .await;
        assert!(ra.status.is_success(), "A: {} {}", ra.status, ra.body);
        let to = if i < CUT { &b.base } else { &proxy.base };
        let rb = post(&format!("{to}/api/v1/write"), body, RW_HEADERS).await;
        assert!(
            rb.status.is_success(),
            "B ({to}): {} {}",
            rb.status,
            rb.body
        );
    }
    let at = |i: i64| (t0 + i * STEP_MS) as f64 / 1000.0;
    let (before, after) = (at(10), at(SCRAPES - 1));
    let compared_step = |ts_ms: i64| {
        let i = (ts_ms - t0) / STEP_MS;
        !(CUT..CUT + STRADDLE).contains(&i)
    };

    let keep = QueryRewriter::new(&rules, true);
    let mut corpus: Vec<(String, bool)> = CORPUS.iter().map(|q| (q.to_string(), true)).collect();
    corpus.push(("DCGM_FI_DEV_POWER_USAGE".into(), true));
    corpus.push(("max by (Hostname) (DCGM_FI_DEV_POWER_USAGE)".into(), true));
    for n in &names {
        corpus.extend(generated(n).into_iter().map(|q| (q, false)));
    }
    let (mut compared, mut points, mut reported, mut empty) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    for (q, must_have_data) in &corpus {
        if keep.rewrite(q).needs_human() {
            reported += 1;
            continue;
        }
        let mut any_data = false;
        for (period, t) in [("before the cut-over", before), ("after it", after)] {
            let va = match instant(&a.base, q, t).await {
                Ok(v) => v,
                Err(e) => {
                    failures.push(format!("{q}: A refused it: {e}"));
                    continue;
                }
            };
            any_data |= !va.is_empty();
            match instant(&proxy.base, q, t).await {
                Ok(vp) => {
                    if let Err(e) = compare_vectors(&va, &vp) {
                        failures.push(format!("instant {period}: {q}\n  {e}"));
                    }
                }
                Err(e) => failures.push(format!("instant {period}: {q}: promnorm: {e}")),
            }
        }
        if !any_data {
            empty += 1;
            if *must_have_data {
                failures.push(format!("{q}: no data on A (the corpus must select data)"));
            }
            continue;
        }
        let (start, end) = (at(4), at(SCRAPES - 1));
        match (
            range(&a.base, q, start, end).await,
            range(&proxy.base, q, start, end).await,
        ) {
            (Ok(ma), Ok(mp)) => match compare_matrices(&ma, &mp, compared_step) {
                Ok(n) => points += n,
                Err(e) => failures.push(format!("range across the cut-over: {q}\n  {e}")),
            },
            (Err(e), _) => failures.push(format!("{q}: A refused the range: {e}")),
            (_, Err(e)) => failures.push(format!("{q}: promnorm refused the range: {e}")),
        }
        compared += 1;
    }
    eprintln!(
        "query API: {} queries; {compared} compared with A at an instant of each period and \
         over a range across the cut-over ({points} points), {reported} reported as needing \
         a human, {empty} without data on A",
        corpus.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(compared >= CORPUS.len() / 2, "too few compared: {compared}");

    let p = &proxy.base;
    let (s, e) = (at(0), at(SCRAPES - 1));
    // Series, labels and label values of an old name: the old view over both periods.
    for path in [
        format!("/api/v1/series?match[]=DCGM_FI_DEV_FB_USED&start={s}&end={e}"),
        format!("/api/v1/labels?match[]=DCGM_FI_DEV_FB_USED&start={s}&end={e}"),
        format!("/api/v1/label/Hostname/values?match[]=DCGM_FI_DEV_FB_USED&start={s}&end={e}"),
        format!(
            "/api/v1/label/le/values?match[]=sglang:kv_transfer_latency_ms_bucket&start={s}&end={e}"
        ),
        format!("/api/v1/label/Hostname/values?start={s}&end={e}"),
    ] {
        let from_a = json(&format!("{}{path}", a.base)).await;
        let through = json(&format!("{p}{path}")).await;
        assert_eq!(through["status"], "success", "{path}: {through}");
        assert_eq!(
            sorted(&through["data"]),
            sorted(&from_a["data"]),
            "{path}: promnorm {through} / A {from_a}"
        );
        assert!(!sorted(&from_a["data"]).is_empty(), "{path}: A has data");
    }
    // Only new data asked for by the series API: the old view of the new series alone.
    let late = format!(
        "/api/v1/series?match[]=DCGM_FI_DEV_FB_USED&start={}&end={e}",
        at(CUT + 2)
    );
    let through = json(&format!("{p}{late}")).await;
    let from_a = json(&format!("{}{late}", a.base)).await;
    assert_eq!(sorted(&through["data"]), sorted(&from_a["data"]), "{late}");

    grafana_sequence(p, s, e).await;
    errors(p, s, e).await;
    account_of_old_names(p).await;
    drop(proxy);
}

/// What Grafana's Prometheus data source asks when a dashboard loads: the build info
/// (to choose the flavour), label names for the query editor, a template variable
/// (`label_values(DCGM_FI_DEV_FB_USED, Hostname)` as the series API), the panels'
/// range queries (`POST`).
async fn grafana_sequence(p: &str, s: f64, e: f64) {
    let info = json(&format!("{p}/api/v1/status/buildinfo")).await;
    assert_eq!(info["status"], "success", "{info}");
    assert!(info["data"]["version"].is_string(), "{info}");
    let labels = post(
        &format!("{p}/api/v1/labels"),
        format!("start={s}&end={e}").into_bytes(),
        &[FORM],
    )
    .await;
    let labels = parse(&labels.body).unwrap();
    assert!(
        labels["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "Hostname"),
        "{labels}"
    );
    let var = post(
        &format!("{p}/api/v1/series"),
        format!("match%5B%5D=DCGM_FI_DEV_FB_USED&start={s}&end={e}").into_bytes(),
        &[FORM],
    )
    .await;
    let var = parse(&var.body).unwrap();
    let hosts: BTreeSet<&str> = var["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["Hostname"].as_str())
        .collect();
    assert_eq!(hosts, BTreeSet::from(["h-a", "h-b"]), "{var}");
    let panel = range(
        p,
        "sum by (Hostname) (DCGM_FI_DEV_FB_USED{Hostname=~\"h-a|h-b\"})",
        s,
        e,
    )
    .await
    .unwrap();
    assert_eq!(panel.len(), 2, "{panel:?}");
    for points in panel.values() {
        // No gap at the cut-over: a point at every step of both periods.
        assert_eq!(points.len() as i64, SCRAPES, "{points:?}");
    }
}

async fn errors(p: &str, s: f64, e: f64) {
    // Not PromQL: promnorm answers as Prometheus does.
    let r = get(&format!(
        "{p}/api/v1/query?query={}",
        urlencode("sum(rate(x[5m])")
    ))
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.body);
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["errorType"], "bad_data", "{doc}");
    // An error of the upstream, for a query promnorm rewrote: its status and errorType.
    let r = post(
        &format!("{p}/api/v1/query_range"),
        format!("query=DCGM_FI_DEV_FB_USED&start={s}&end={e}&step=0").into_bytes(),
        &[FORM],
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.body);
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["errorType"], "bad_data", "{doc}");
    assert!(doc["error"].as_str().unwrap().contains("step"), "{doc}");
    // What needs a human is said in the answer's warnings.
    let r = get(&format!(
        "{p}/api/v1/query?query={}",
        urlencode("sum by (tp_rank) (sglang:num_running_reqs)")
    ))
    .await;
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["status"], "success", "{doc}");
    assert!(
        doc["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w.as_str().unwrap().contains("promnorm"))),
        "{doc}"
    );
}

async fn account_of_old_names(p: &str) {
    let metrics = get(&format!("{p}/metrics")).await.body;
    for needle in [
        "promnorm_query_requests_total{endpoint=\"query\",rewritten=\"true\"}",
        "promnorm_query_requests_total{endpoint=\"query_range\",rewritten=\"true\"}",
        "promnorm_query_old_name_requests_total{from=\"DCGM_FI_DEV_FB_USED\"}",
        "promnorm_query_duration_seconds_bucket{endpoint=\"series\"",
    ] {
        assert!(metrics.contains(needle), "{needle} not in:\n{metrics}");
    }
    let doc = json(&format!("{p}/api/v1/renames")).await;
    let entry = doc["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["from"] == "DCGM_FI_DEV_FB_USED")
        .cloned()
        .expect("tracked");
    assert!(entry["queries"].as_u64().unwrap() > 0, "{entry}");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last = entry["last_queried"].as_f64().expect("queried");
    assert!((now - last).abs() < 300.0, "last queried {last}, now {now}");
}
