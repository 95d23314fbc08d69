//! The query API against a recording fake upstream (docs/query.md): what reaches the
//! upstream (the rewritten and the original question, the caller's headers), what comes
//! back (the old terms, merged), and every way an answer can fail: time-out, size limit,
//! no upstream, an upstream error, authentication, the API off.

use crate::common::*;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};

/// One request the fake upstream got: path, the form (query string and body), headers.
#[derive(Clone, Debug)]
struct Asked {
    path: String,
    form: Vec<(String, String)>,
    headers: HeaderMap,
}

type Answerer = Arc<dyn Fn(&Asked) -> (StatusCode, String) + Send + Sync>;

/// A fake query API: records every request, answers with `answer`, after `delay`.
async fn upstream(answer: Answerer, delay: Duration) -> (String, Arc<Mutex<Vec<Asked>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let rec = asked.clone();
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let rec = rec.clone();
        let answer = answer.clone();
        async move {
            let mut form = promnorm::query::form::decode(uri.query().unwrap_or(""));
            form.extend(promnorm::query::form::decode(&String::from_utf8_lossy(
                &body,
            )));
            let a = Asked {
                path: uri.path().to_string(),
                form,
                headers,
            };
            rec.lock().unwrap().push(a.clone());
            tokio::time::sleep(delay).await;
            let (status, body) = answer(&a);
            (status, [("content-type", "application/json")], body)
        }
    });
    let addr = serve(app).await;
    (format!("http://{addr}"), asked)
}

fn query_of(a: &Asked) -> String {
    promnorm::query::form::get(&a.form, "query")
        .unwrap_or_default()
        .to_string()
}

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

async fn proxy_for(upstream: &str, extra: &str) -> Proxy {
    start_proxy(
        &["http://127.0.0.1:9/api/v1/write".into()],
        &format!("query:\n  upstream: {upstream}\n{extra}"),
    )
    .await
}

#[tokio::test]
async fn a_query_the_rules_do_not_touch_passes_through_with_the_callers_headers() {
    let body =
        r#"{"status":"success","data":{"resultType":"vector","result":[]},"warnings":["w"]}"#;
    let (up, asked) = upstream(
        Arc::new(move |_| (StatusCode::OK, body.to_string())),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&up, "").await;
    let r = post(
        &format!("http://{}/api/v1/query", p.addr),
        b"query=up%7Bjob%3D%22x%22%7D&time=10".to_vec(),
        &[
            FORM,
            ("Authorization", "Bearer caller"),
            ("X-Scope-OrgID", "team-a"),
            ("Accept-Encoding", "gzip"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, body, "the answer's bytes as they came");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].path, "/api/v1/query");
    assert_eq!(query_of(&asked[0]), "up{job=\"x\"}");
    assert_eq!(
        promnorm::query::form::get(&asked[0].form, "time"),
        Some("10")
    );
    let h = &asked[0].headers;
    assert_eq!(h["authorization"], "Bearer caller");
    assert_eq!(h["x-scope-orgid"], "team-a");
    assert!(
        h.get("accept-encoding").is_none(),
        "promnorm reads the answer"
    );
    assert!(
        p.metric(
            "promnorm_query_requests_total",
            &["endpoint=\"query\"", "rewritten=\"false\""]
        )
        .await
            >= 1.0
    );
    p.shut_down().await;
}

#[tokio::test]
async fn an_old_query_asks_both_names_and_answers_in_the_old_terms() {
    // The new side holds h1 after the cut-over; the old side h1 before it and h0.
    let (up, asked) = upstream(
        Arc::new(|a: &Asked| {
            let q = query_of(a);
            let body = if q.contains("DCGM_FI_DEV_FB_USED_bytes") {
                r#"{"status":"success","data":{"resultType":"matrix","result":[
                    {"metric":{"hostname":"h1"},"values":[[20,"3"],[30,"4"]]}]}}"#
            } else {
                r#"{"status":"success","data":{"resultType":"matrix","result":[
                    {"metric":{"__name__":"DCGM_FI_DEV_FB_USED","Hostname":"h1"},"values":[[10,"1"],[20,"2"]]},
                    {"metric":{"__name__":"DCGM_FI_DEV_FB_USED","Hostname":"h0"},"values":[[10,"9"]]}]}}"#
            };
            (StatusCode::OK, body.to_string())
        }),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&up, "").await;
    let r = post(
        &format!("http://{}/api/v1/query_range", p.addr),
        b"query=DCGM_FI_DEV_FB_USED&start=10&end=30&step=10".to_vec(),
        &[FORM],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        doc["data"],
        serde_json::json!({"resultType": "matrix", "result": [
            {"metric": {"Hostname": "h0", "__name__": "DCGM_FI_DEV_FB_USED"}, "values": [[10, "9"]]},
            {"metric": {"Hostname": "h1", "__name__": "DCGM_FI_DEV_FB_USED"},
             "values": [[10, "1"], [20, "3"], [30, "4"]]}
        ]}),
        "the new side wins at 20, the old fills 10"
    );
    let mut queries: Vec<String> = asked.lock().unwrap().iter().map(query_of).collect();
    queries.sort();
    assert_eq!(queries.len(), 2, "{queries:?}");
    assert_eq!(queries[0], "DCGM_FI_DEV_FB_USED");
    assert!(
        queries[1].starts_with("DCGM_FI_DEV_FB_USED_bytes") && queries[1].contains("1048576"),
        "{queries:?}"
    );
    assert!(
        p.metric(
            "promnorm_query_old_name_requests_total",
            &["from=\"DCGM_FI_DEV_FB_USED\""]
        )
        .await
            >= 1.0
    );
    let renames: serde_json::Value =
        serde_json::from_str(&get(&format!("http://{}/api/v1/renames", p.addr)).await.body)
            .unwrap();
    let e = renames["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["from"] == "DCGM_FI_DEV_FB_USED")
        .unwrap();
    assert_eq!(e["queries"], 1);
    assert!(e["last_queried"].as_f64().is_some(), "{e}");
    // The web UI lists the query beside what was asked upstream.
    let page = get(&format!("http://{}/queries", p.addr)).await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("<code>DCGM_FI_DEV_FB_USED</code>")
            && page.body.contains("DCGM_FI_DEV_FB_USED_bytes")
            && page.body.contains("query_range"),
        "{}",
        page.body
    );
    p.shut_down().await;
}

#[tokio::test]
async fn without_merging_only_the_new_names_are_asked() {
    let (up, asked) = upstream(
        Arc::new(|_| {
            (
                StatusCode::OK,
                r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#.into(),
            )
        }),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&up, "  merge_old_names: false\n").await;
    let r = get(&format!(
        "http://{}/api/v1/query?query=DCGM_FI_DEV_FB_USED",
        p.addr
    ))
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert!(query_of(&asked[0]).contains("DCGM_FI_DEV_FB_USED_bytes"));
    p.shut_down().await;
}

#[tokio::test]
async fn a_slow_upstream_is_a_timeout_and_a_large_answer_a_clear_error() {
    let (slow, _) = upstream(
        Arc::new(|_| (StatusCode::OK, "{}".into())),
        Duration::from_secs(5),
    )
    .await;
    let p = proxy_for(&slow, "  timeout: 300ms\n").await;
    let started = std::time::Instant::now();
    let r = get(&format!("http://{}/api/v1/query?query=up", p.addr)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert!(started.elapsed() < Duration::from_secs(3));
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["errorType"], "timeout");
    assert!(
        doc["error"].as_str().unwrap().contains("query.timeout"),
        "{doc}"
    );
    assert!(
        p.metric("promnorm_query_failures_total", &["reason=\"timeout\""])
            .await
            >= 1.0
    );
    p.shut_down().await;

    let big = format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"a":"{}"}},"value":[1,"1"]}}]}}}}"#,
        "x".repeat(2 << 20)
    );
    let (large, _) = upstream(
        Arc::new(move |_| (StatusCode::OK, big.clone())),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&large, "  max_response_bytes: 1MiB\n").await;
    for q in ["up", "DCGM_FI_DEV_FB_USED"] {
        let r = get(&format!("http://{}/api/v1/query?query={q}", p.addr)).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{q}: {}",
            r.body
        );
        let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(doc["errorType"], "execution");
        assert!(
            doc["error"]
                .as_str()
                .unwrap()
                .contains("query.max_response_bytes"),
            "{doc}"
        );
    }
    p.shut_down().await;
}

#[tokio::test]
async fn upstream_errors_pass_through_and_a_missing_upstream_is_named() {
    let err = r#"{"status":"error","errorType":"execution","error":"query processing would load too many samples into memory"}"#;
    let (up, _) = upstream(
        Arc::new(move |_| (StatusCode::UNPROCESSABLE_ENTITY, err.to_string())),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&up, "").await;
    for q in ["up", "DCGM_FI_DEV_FB_USED"] {
        let r = get(&format!("http://{}/api/v1/query?query={q}", p.addr)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{q}");
        assert_eq!(r.body, err, "{q}");
    }
    // Not PromQL: Prometheus' 400, the upstream not asked.
    let r = get(&format!("http://{}/api/v1/query?query=sum(", p.addr)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["errorType"], "bad_data");
    // A match[] that is no selector.
    let r = get(&format!(
        "http://{}/api/v1/series?match[]=sum(DCGM_FI_DEV_FB_USED)",
        p.addr
    ))
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    p.shut_down().await;

    let port = free_port();
    let p = proxy_for(&format!("http://127.0.0.1:{port}"), "").await;
    let r = get(&format!("http://{}/api/v1/query?query=up", p.addr)).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.body);
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(doc["errorType"], "unavailable");
    assert!(
        doc["error"].as_str().unwrap().contains(&port.to_string()),
        "{doc}"
    );
    p.shut_down().await;
}

#[tokio::test]
async fn ingest_auth_protects_the_query_paths_and_stays_with_promnorm() {
    let (up, asked) = upstream(
        Arc::new(|_| {
            (
                StatusCode::OK,
                r#"{"status":"success","data":["a"]}"#.into(),
            )
        }),
        Duration::ZERO,
    )
    .await;
    let token_file = std::env::temp_dir().join(format!("promnorm-query-token-{}", free_port()));
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let p = proxy_for(
        &up,
        &format!(
            "  headers: {{X-Scope-OrgID: fixed}}\ningest_auth:\n  bearer_token: {{file: {}}}\n",
            token_file.display()
        ),
    )
    .await;
    let url = format!("http://{}/api/v1/labels", p.addr);
    let r = get(&url).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(asked.lock().unwrap().is_empty());
    let r = post(
        &url,
        Vec::new(),
        &[
            ("Authorization", "Bearer s3cret"),
            ("X-Scope-OrgID", "caller"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let asked = asked.lock().unwrap().clone();
    assert!(
        asked[0].headers.get("authorization").is_none(),
        "promnorm's own token is not the caller's identity upstream"
    );
    assert_eq!(
        asked[0].headers["x-scope-orgid"], "fixed",
        "query.headers win"
    );
    p.shut_down().await;
    let _ = std::fs::remove_file(token_file);
}

#[tokio::test]
async fn without_query_the_paths_answer_404() {
    let p = start_proxy(&["http://127.0.0.1:9/api/v1/write".into()], "").await;
    let r = get(&format!("http://{}/api/v1/query?query=up", p.addr)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert!(doc["error"].as_str().unwrap().contains("query.upstream"));
    let page = get(&format!("http://{}/queries", p.addr)).await;
    assert!(page.body.contains("The query API is off"), "{}", page.body);
    p.shut_down().await;
}

#[tokio::test]
async fn label_values_of_an_old_label_read_the_new_label_too() {
    let (up, asked) = upstream(
        Arc::new(|a: &Asked| {
            let body = if a.path.contains("/hostname/") {
                r#"{"status":"success","data":["h2","h1"]}"#
            } else {
                r#"{"status":"success","data":["h1","h0"]}"#
            };
            (StatusCode::OK, body.into())
        }),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&up, "").await;
    for path in [
        "/api/v1/label/Hostname/values",
        "/api/v1/label/Hostname/values?match[]=DCGM_FI_DEV_FB_USED",
    ] {
        let r = get(&format!("http://{}{path}", p.addr)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        let doc: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(doc["data"], serde_json::json!(["h0", "h1", "h2"]), "{path}");
    }
    let asked = asked.lock().unwrap().clone();
    let with_match: Vec<&Asked> = asked.iter().filter(|a| !a.form.is_empty()).collect();
    assert!(
        with_match.iter().any(|a| a.path.contains("/hostname/")
            && promnorm::query::form::get(&a.form, "match[]") == Some("DCGM_FI_DEV_FB_USED_bytes")),
        "{with_match:?}"
    );
    p.shut_down().await;
}

#[tokio::test]
async fn metadata_of_an_old_name_is_the_histories_or_else_the_new_familys() {
    // The old family has metadata only while `old` says so; the new one always.
    let old_known = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = old_known.clone();
    let (up, asked) = upstream(
        Arc::new(move |a: &Asked| {
            let metric = promnorm::query::form::get(&a.form, "metric").unwrap_or_default();
            let body = match metric {
                "DCGM_FI_DEV_FB_USED_bytes" => {
                    r#"{"status":"success","data":{"DCGM_FI_DEV_FB_USED_bytes":[{"type":"gauge","help":"new help","unit":"bytes"}]}}"#
                }
                "DCGM_FI_DEV_FB_USED" if flag.load(std::sync::atomic::Ordering::SeqCst) => {
                    r#"{"status":"success","data":{"DCGM_FI_DEV_FB_USED":[{"type":"gauge","help":"Framebuffer memory used (in MiB).","unit":""}]}}"#
                }
                _ => r#"{"status":"success","data":{}}"#,
            };
            (StatusCode::OK, body.to_string())
        }),
        Duration::ZERO,
    )
    .await;
    let p = proxy_for(&up, "").await;
    let url = format!(
        "http://{}/api/v1/metadata?metric=DCGM_FI_DEV_FB_USED",
        p.addr
    );
    let r = get(&url).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let entry = &v["data"]["DCGM_FI_DEV_FB_USED"][0];
    assert_eq!(entry["type"], "gauge", "{v}");
    assert_eq!(entry["help"], "new help", "{v}");
    assert_eq!(entry["unit"], "", "the new unit is not the old name's: {v}");
    assert!(v["data"].get("DCGM_FI_DEV_FB_USED_bytes").is_none(), "{v}");
    let metrics: Vec<String> = asked
        .lock()
        .unwrap()
        .iter()
        .map(|a| {
            promnorm::query::form::get(&a.form, "metric")
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert!(
        metrics.contains(&"DCGM_FI_DEV_FB_USED_bytes".to_string()),
        "{metrics:?}"
    );
    assert!(
        metrics.contains(&"DCGM_FI_DEV_FB_USED".to_string()),
        "{metrics:?}"
    );

    old_known.store(true, std::sync::atomic::Ordering::SeqCst);
    let v: serde_json::Value = serde_json::from_str(&get(&url).await.body).unwrap();
    assert_eq!(
        v["data"]["DCGM_FI_DEV_FB_USED"][0]["help"], "Framebuffer memory used (in MiB).",
        "the history's own metadata first: {v}"
    );

    // A name no rule touches passes through.
    let r = get(&format!("http://{}/api/v1/metadata?metric=up", p.addr)).await;
    assert_eq!(r.body, r#"{"status":"success","data":{}}"#);
    p.shut_down().await;
}
