//! The web UI and its dry-run APIs (docs/ui.md): JSON shapes and errors, HTML escaping,
//! relative links, and that a dry run forwards nothing.

use crate::common;

use std::sync::Arc;

use common::{RW_HEADERS, fake_backend, get, post, series};
use promnorm::config::Config;
use promnorm::server::{Live, router_live};
use promnorm::wire::proto::prometheus as pb;

/// promnorm's routes and the UI's around one configuration, on a free port; with a
/// recording backend.
async fn start() -> (String, common::Recorded) {
    let (backend, rec) = fake_backend(common::Reply::ok()).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n  - url: {backend}\n    timeout: 2s\n    queue: {{type: memory}}\n"
    );
    let cfg = Config::parse(&yaml, "test.yaml").expect("config parses");
    let state = promnorm::app::build(&cfg, None).expect("valid").state;
    state.start_queues().expect("queues");
    let live = Arc::new(Live::new(state));
    let app = router_live(live.clone(), &cfg.write_paths)
        .merge(promnorm::web::router(live, &Default::default()));
    let addr = common::serve(app).await;
    (format!("http://{addr}"), rec)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

const XSS: &str = "<script>alert(1)</script>";

#[tokio::test]
async fn explain_api_returns_what_the_command_prints() {
    let (base, _) = start().await;
    let r = get(&format!(
        "{base}/api/v1/explain?name={}",
        enc("sglang:kv_transfer_latency_ms")
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.headers["content-type"], "application/json");
    let v = json(&r.body);
    assert_eq!(v["status"], "success");
    let text = v["data"]["text"].as_str().expect("text");
    // The same text the offline command prints for a configuration with one backend of
    // the same settings (the backends' part of the text names them).
    let file =
        std::env::temp_dir().join(format!("promnorm-web-explain-{}.yaml", std::process::id()));
    std::fs::write(
        &file,
        "backends:\n  - url: http://127.0.0.1:1/api/v1/write\n    queue: {type: memory}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(["explain", "sglang:kv_transfer_latency_ms", "--config"])
        .arg(&file)
        .output()
        .expect("promnorm explain");
    let _ = std::fs::remove_file(&file);
    let want = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("sglang:kv_transfer_latency_seconds"),
        "{text}"
    );
    assert!(text.contains("pack sglang"), "{text}");
    assert_eq!(text, want, "the text the command prints");
}

#[tokio::test]
async fn explain_api_errors_are_400_with_the_message() {
    let (base, _) = start().await;
    let r = get(&format!(
        "{base}/api/v1/explain?name={}",
        enc("x{a=~\"b\"}")
    ))
    .await;
    assert_eq!(r.status, 400);
    let v = json(&r.body);
    assert_eq!(v["status"], "error");
    assert!(
        v["error"].as_str().unwrap().contains("only = matchers"),
        "{}",
        r.body
    );
    let r = get(&format!("{base}/api/v1/explain")).await;
    assert_eq!(r.status, 400);
    assert!(json(&r.body)["error"].as_str().unwrap().contains("name"));
}

#[tokio::test]
async fn normalize_api_shape_several_metrics_and_drops() {
    let (base, rec) = start().await;
    let text = "# TYPE sglang:kv_transfer_latency_ms gauge\n\
                sglang:kv_transfer_latency_ms{engine=\"a\"} 250\n\
                untouched_metric{x=\"1\"} 7\n";
    let r = post(&format!("{base}/api/v1/normalize"), text.into(), &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = json(&r.body);
    assert_eq!(v["status"], "success");
    let d = &v["data"];
    let input: Vec<&str> = d["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        input,
        [
            "sglang:kv_transfer_latency_ms{engine=\"a\"} 250",
            "untouched_metric{x=\"1\"} 7"
        ]
    );
    let output: Vec<&str> = d["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        output
            .iter()
            .any(|l| l.starts_with("sglang:kv_transfer_latency_seconds{engine=\"a\"} 0.25 ")),
        "{output:?}"
    );
    assert!(
        output
            .iter()
            .any(|l| l.starts_with("untouched_metric{x=\"1\"} 7 ")),
        "{output:?}"
    );
    let trace = d["trace"].as_array().unwrap();
    assert_eq!(trace.len(), 2);
    assert_eq!(
        trace[0]["input"],
        "sglang:kv_transfer_latency_ms{engine=\"a\"}"
    );
    assert!(
        trace[0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().starts_with("pack sglang rule")),
        "{}",
        trace[0]
    );
    assert_eq!(
        trace[0]["results"][0]["output"],
        "sglang:kv_transfer_latency_seconds{engine=\"a\"}"
    );
    assert_eq!(trace[0]["results"][0]["scale"], "values ÷1000");
    assert_eq!(trace[1]["rules"].as_array().unwrap().len(), 0);
    assert_eq!(
        trace[1]["results"][0]["output"],
        "untouched_metric{x=\"1\"}"
    );

    // A dropped series names its reason: SGLang's rank dedup keeps tp_rank 0 only.
    let r = post(
        &format!("{base}/api/v1/normalize"),
        "sglang:num_running_reqs{tp_rank=\"1\"} 3\nsglang:num_running_reqs{tp_rank=\"0\"} 3\n"
            .into(),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = json(&r.body);
    let dropped = v["data"]["trace"][0]["results"][0]["dropped"]
        .as_str()
        .unwrap_or_else(|| panic!("not dropped: {}", r.body));
    assert!(dropped.contains("rank"), "{dropped}");
    assert!(
        v["data"]["trace"][1]["results"][0]["output"].is_string(),
        "{}",
        r.body
    );
    assert_eq!(
        v["data"]["output"].as_array().unwrap().len(),
        1,
        "{}",
        r.body
    );
    // A dry run forwards nothing.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(rec.requests().is_empty(), "a dry run reached the backend");
}

#[tokio::test]
async fn normalize_api_refuses_empty_huge_and_bad_input() {
    let (base, _) = start().await;
    let url = format!("{base}/api/v1/normalize");
    for empty in ["", "  \n", "# HELP x only comments\n"] {
        let r = post(&url, empty.into(), &[]).await;
        assert_eq!(r.status, 400, "{empty:?}: {}", r.body);
        assert_eq!(json(&r.body)["status"], "error");
    }
    // 10 MB: refused by its Content-Length, before it is read.
    let big = "x 1\n".repeat(10 << 18);
    let r = post(&url, big.into_bytes(), &[]).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(json(&r.body)["error"].as_str().unwrap().contains("limit"));
    // The parser's line.
    let r = post(&url, "ok 1\nbad{a=1} 2\n".into(), &[]).await;
    assert_eq!(r.status, 400);
    let e = json(&r.body)["error"].as_str().unwrap().to_string();
    assert!(e.contains("line 2"), "{e}");
    let r = post(&url, vec![0xff, 0xfe, b'\n'], &[]).await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn a_chunked_body_over_the_limit_is_413_without_reading_it_all() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (base, _) = start().await;
    let addr = base.trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    // A chunked body without a Content-Length that would go on for 64 MiB: the answer
    // must come once the first MiB is over.
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sent2 = sent.clone();
    tokio::spawn(async move {
        let head = format!(
            "POST /api/v1/normalize HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        if wr.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = "x 1\n".repeat(16 << 10);
        let frame = format!("{:x}\r\n{chunk}\r\n", chunk.len());
        for _ in 0..1024 {
            if wr.write_all(frame.as_bytes()).await.is_err() {
                return;
            }
            sent2.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
    });
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), rd.read(&mut buf))
        .await
        .expect("answered while the body was still coming")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent < 32 << 20, "{sent} bytes were taken before the answer");
}

#[tokio::test]
async fn pages_escape_what_senders_control() {
    let (base, _) = start().await;
    // A label value, a HELP text and an explain query carrying markup and quotes.
    let text = format!(
        "# HELP evil_metric {XSS} \"quoted\"\n# TYPE evil_metric gauge\n\
         evil_metric{{v=\"{}\",q=\"a'b\\\"c\"}} 1\n",
        XSS.replace('"', "\\\"")
    );
    let form = format!("text={}", enc(&text));
    let r = post(
        &format!("{base}/debug/normalize"),
        form.into(),
        &[("Content-Type", "application/x-www-form-urlencoded")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(!r.body.contains("<script"), "unescaped markup:\n{}", r.body);
    assert!(
        r.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        r.body
    );
    assert!(r.body.contains("a&#39;b\\&quot;c"), "{}", r.body);
    assert!(r.body.contains("id=\"output\""));
    assert!(r.body.contains("id=\"trace\""));

    let r = get(&format!(
        "{base}/explain?name={}",
        enc(&format!("x{{a=\"{XSS}\"}}"))
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("<script"), "{}", r.body);
    assert!(r.body.contains("&lt;script&gt;"), "{}", r.body);
    let r = get(&format!("{base}/explain?name={}", enc(&format!("{XSS}\"")))).await;
    assert_eq!(r.status, 400);
    assert!(!r.body.contains("<script"), "{}", r.body);
    let r = get(&format!("{base}/rules?q={}", enc(&format!("\"><{XSS}")))).await;
    assert_eq!(r.status, 200);
    assert!(!r.body.contains("<script"), "{}", r.body);
    assert!(
        r.body.contains("value=\"&quot;&gt;&lt;&lt;script&gt;"),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn pages_render_the_running_configuration_with_relative_links() {
    let (base, _) = start().await;
    // Traffic first, so the status page shows a queue that has seen a request.
    let req = pb::WriteRequest {
        timeseries: vec![series(&[("__name__", "up"), ("job", "j")], &[(1.0, 1)])],
        ..Default::default()
    };
    let r = post(
        &format!("{base}/api/v1/write"),
        common::encode(&req),
        RW_HEADERS,
    )
    .await;
    assert!(r.status.is_success(), "{}", r.body);

    let r = get(&format!("{base}/")).await;
    assert_eq!(r.status, 200);
    let b = &r.body;
    assert!(b.contains(env!("CARGO_PKG_VERSION")), "{b}");
    assert!(
        b.contains("<td>sglang</a>") || b.contains(">sglang</a>"),
        "{b}"
    );
    assert!(b.contains("memory (accepting)"), "{b}");
    assert!(b.contains("href=\"metrics\""), "{b}");
    // Every link and form is relative: the pages work behind a path prefix.
    for page in [
        "/",
        "/rules",
        "/explain",
        "/debug/normalize",
        "/queries",
        "/cardinality",
        "/cardinality?metric=up",
    ] {
        let r = get(&format!("{base}{page}")).await;
        assert_eq!(r.status, 200, "{page}");
        for attr in ["href=\"/", "action=\"/", "src=\"/"] {
            assert!(
                !r.body.contains(attr),
                "{page} has an absolute {attr}: {}",
                r.body
            );
        }
        assert!(
            r.headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'none'")
        );
    }
    let r = get(&format!("{base}/debug/normalize")).await;
    assert!(
        r.body.contains("href=\"../static/promnorm.css\""),
        "{}",
        r.body
    );
    assert!(r.body.contains("href=\"../rules\""), "{}", r.body);
    let r = get(&format!("{base}/static/promnorm.css")).await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );

    // The rules page lists the built-in packs' rules, and filters them.
    let all = get(&format!("{base}/rules")).await.body;
    let some = get(&format!("{base}/rules?q=kv_transfer_latency"))
        .await
        .body;
    assert!(all.matches("<tr>").count() > some.matches("<tr>").count());
    assert!(some.contains("sglang:kv_transfer_latency_ms"), "{some}");
    assert!(!some.contains("vllm:"), "{some}");

    // Per-rule counts since start, for every rule (per-family counters): one that
    // renames and one that only rewrites label values.
    let req = pb::WriteRequest {
        timeseries: vec![
            series(
                &[
                    ("__name__", "sglang:kv_transfer_latency_ms"),
                    ("engine", "a"),
                ],
                &[(250.0, 1), (260.0, 2)],
            ),
            series(
                &[
                    ("__name__", "sglang:kv_transfer_latency_ms"),
                    ("engine", "b"),
                ],
                &[(250.0, 1)],
            ),
            series(
                &[
                    ("__name__", "sglang:per_stage_req_latency_seconds_bucket"),
                    ("stage", "dispatch"),
                    ("le", "1"),
                ],
                &[(4.0, 1)],
            ),
        ],
        ..Default::default()
    };
    let r = post(
        &format!("{base}/api/v1/write"),
        common::encode(&req),
        RW_HEADERS,
    )
    .await;
    assert!(r.status.is_success(), "{}", r.body);
    let page = get(&format!("{base}/rules?q=kv_transfer_latency_ms"))
        .await
        .body;
    let row = page
        .lines()
        .flat_map(|l| l.split("<tr>"))
        .find(|r| r.contains("sglang:kv_transfer_latency_ms</code>"))
        .unwrap_or_else(|| panic!("no row: {page}"));
    assert!(
        row.contains("<td>2</td><td>3</td>"),
        "series, samples: {row}"
    );
    assert!(row.contains("s ago</td>"), "{row}");
    let page = get(&format!("{base}/rules?q=per_stage_req_latency"))
        .await
        .body;
    let row = page
        .lines()
        .flat_map(|l| l.split("<tr>"))
        .find(|r| r.contains("stage label values renamed upstream"))
        .unwrap_or_else(|| panic!("no row: {page}"));
    assert!(
        row.contains("<td>1</td><td>1</td>"),
        "a rule that renames nothing: {row}"
    );
    assert!(row.contains("s ago</td>"), "{row}");
    let untouched = get(&format!("{base}/rules?q=kv_transfer_bootstrap_ms"))
        .await
        .body;
    assert!(
        untouched.contains("<td>0</td><td>0</td><td>not since start</td>"),
        "{untouched}"
    );

    // The explain page shows the same text as the API.
    let r = get(&format!(
        "{base}/explain?name={}",
        enc("sglang:kv_transfer_latency_ms")
    ))
    .await;
    assert_eq!(r.status, 200);
    assert!(
        r.body.contains("sglang:kv_transfer_latency_seconds"),
        "{}",
        r.body
    );
}

/// The UI alone (no ingest routes) with `web` options, on a free port.
async fn start_web(yaml_web: &str) -> String {
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n  - url: http://127.0.0.1:1/api/v1/write\n{yaml_web}"
    );
    let cfg = Config::parse(&yaml, "test.yaml").expect("config parses");
    let state = promnorm::app::build(&cfg, None).expect("valid").state;
    let opts = promnorm::app::web_options(&cfg).expect("web options");
    let live = Arc::new(Live::new(state));
    let app = router_live(live.clone(), &cfg.write_paths).merge(promnorm::web::router(live, &opts));
    format!("http://{}", common::serve(app).await)
}

async fn get_with(url: &str, headers: &[(&str, &str)]) -> common::HttpReply {
    use axum::body::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = axum::http::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    common::HttpReply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[tokio::test]
async fn a_route_prefix_moves_the_ui_and_its_links_still_reach_the_root() {
    let base = start_web("web:\n  route_prefix: /ops/promnorm\n").await;
    assert_eq!(get(&format!("{base}/")).await.status, 404);
    assert_eq!(get(&format!("{base}/rules")).await.status, 404);
    let r = get(&format!("{base}/ops/promnorm")).await;
    assert_eq!(r.status, 308);
    assert_eq!(r.headers["location"], "/ops/promnorm/");
    let r = get(&format!("{base}/ops/promnorm/")).await;
    assert_eq!(r.status, 200);
    // /metrics stays at the server's root: two segments up from the UI's root.
    assert!(r.body.contains("href=\"../../metrics\""), "{}", r.body);
    assert!(r.body.contains("href=\"./rules\""), "{}", r.body);
    let r = get(&format!("{base}/ops/promnorm/debug/normalize")).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("href=\"../../../metrics\""), "{}", r.body);
    assert!(
        r.body.contains("href=\"../static/promnorm.css\""),
        "{}",
        r.body
    );
    let r = get(&format!(
        "{base}/ops/promnorm/api/v1/explain?name=sglang%3Akv_transfer_latency_ms"
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(get(&format!("{base}/metrics")).await.status, 200);
}

#[tokio::test]
async fn web_auth_protects_the_ui_and_not_the_rest() {
    // SAFETY: set once, before the configuration reads it; no other test reads this name.
    unsafe { std::env::set_var("PROMNORM_TEST_WEB_TOKEN", "s3cret") };
    let base = start_web("web:\n  auth:\n    bearer_token: {env: PROMNORM_TEST_WEB_TOKEN}\n").await;
    for path in [
        "/",
        "/rules",
        "/api/v1/explain?name=up",
        "/static/promnorm.css",
    ] {
        let r = get(&format!("{base}{path}")).await;
        assert_eq!(r.status, 401, "{path}");
        assert!(r.headers.contains_key("www-authenticate"));
        let r = get_with(
            &format!("{base}{path}"),
            &[("Authorization", "Bearer wrong")],
        )
        .await;
        assert_eq!(r.status, 401, "{path}");
        let r = get_with(
            &format!("{base}{path}"),
            &[("Authorization", "bearer s3cret")],
        )
        .await;
        assert_eq!(r.status, 200, "{path}");
    }
    let r = post(&format!("{base}/api/v1/normalize"), "x 1\n".into(), &[]).await;
    assert_eq!(r.status, 401);
    // The proxy's own endpoints are not the UI's.
    assert_eq!(get(&format!("{base}/metrics")).await.status, 200);

    let base = start_web(
        "web:\n  auth:\n    basic: {username: ops, password: {env: PROMNORM_TEST_WEB_TOKEN}}\n",
    )
    .await;
    let r = get(&format!("{base}/")).await;
    assert_eq!(r.status, 401);
    assert!(
        r.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );
    // ops:s3cret
    let r = get_with(
        &format!("{base}/"),
        &[("Authorization", "Basic b3BzOnMzY3JldA==")],
    )
    .await;
    assert_eq!(r.status, 200);
    let r = get_with(
        &format!("{base}/"),
        &[("Authorization", "Basic b3BzOnd3b25n")],
    )
    .await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn web_disabled_serves_no_page() {
    let base = start_web("web:\n  enabled: false\n").await;
    assert_eq!(get(&format!("{base}/")).await.status, 404);
    assert_eq!(
        get(&format!("{base}/api/v1/explain?name=up")).await.status,
        404
    );
    assert_eq!(get(&format!("{base}/-/healthy")).await.status, 200);
}

#[test]
fn bad_web_settings_are_refused_and_a_reload_keeps_them() {
    for (yaml, want) in [
        ("web:\n  route_prefix: promnorm\n", "route_prefix"),
        ("web:\n  route_prefix: /promnorm/\n", "route_prefix"),
        ("web:\n  route_prefix: /a b\n", "route_prefix"),
        ("web:\n  auth: {}\n", "exactly one"),
        (
            "web:\n  auth:\n    bearer_token: {env: PROMNORM_TEST_SURELY_UNSET_WEB}\n",
            "PROMNORM_TEST_SURELY_UNSET_WEB",
        ),
    ] {
        let e = Config::parse(yaml, "t.yaml")
            .and_then(|c| c.check().map(|_| c))
            .err()
            .unwrap_or_else(|| panic!("{yaml:?} was accepted"));
        assert!(e.to_string().contains(want), "{yaml:?}: {e}");
    }
    let running = Config::parse("", "t.yaml").unwrap();
    let mut new = Config::parse("web:\n  route_prefix: /x\n", "t.yaml").unwrap();
    let kept = promnorm::reload::keep_restart_settings(&running, &mut new);
    assert_eq!(kept, ["web"]);
    assert_eq!(new.web.route_prefix, None);
}

#[tokio::test]
async fn the_status_page_shows_the_effective_configuration_without_secrets() {
    // SAFETY: set before the configuration reads it; no other test reads this name.
    unsafe { std::env::set_var("PROMNORM_TEST_WEB_INGEST", "ingest-s3cret-<b>") };
    let base = start_web("ingest_auth:\n  bearer_token: {env: PROMNORM_TEST_WEB_INGEST}\n").await;
    let r = get(&format!("{base}/")).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("<pre id=\"config\">"), "{}", r.body);
    assert!(r.body.contains("PROMNORM_TEST_WEB_INGEST"), "{}", r.body);
    assert!(r.body.contains("max_body_bytes"), "{}", r.body);
    assert!(!r.body.contains("s3cret"), "{}", r.body);

    // A password written in a backend URL is redacted too.
    let yaml =
        "listen: 127.0.0.1:0\nbackends:\n  - url: http://ops:hunter2@127.0.0.1:1/api/v1/write\n";
    let cfg = Config::parse(yaml, "test.yaml").expect("config parses");
    let state = promnorm::app::build(&cfg, None).expect("valid").state;
    let live = Arc::new(Live::new(state));
    let app = promnorm::web::router(live, &Default::default());
    let base = format!("http://{}", common::serve(app).await);
    let r = get(&format!("{base}/")).await;
    assert!(r.body.contains("127.0.0.1:1"), "{}", r.body);
    assert!(!r.body.contains("hunter2"), "{}", r.body);
}

/// promnorm with a recording backend and the live tap on (`web.enable_debug`).
async fn start_tap() -> String {
    let (backend, _rec) = fake_backend(common::Reply::ok()).await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nbackends:\n  - url: {backend}\n    timeout: 2s\nweb:\n  enable_debug: true\n"
    );
    let cfg = Config::parse(&yaml, "test.yaml").expect("config parses");
    let state = promnorm::app::build(&cfg, None).expect("valid").state;
    let opts = promnorm::app::web_options(&cfg).expect("web options");
    assert!(opts.debug);
    let live = Arc::new(Live::new(state));
    let app = router_live(live.clone(), &cfg.write_paths).merge(promnorm::web::router(live, &opts));
    format!("http://{}", common::serve(app).await)
}

/// Sends `labels` every 100 ms until `done` (bounded: 100 times).
async fn send_until(
    base: &str,
    labels: &[(&str, &str)],
    done: &tokio::task::JoinHandle<common::HttpReply>,
) {
    for i in 0..100 {
        if done.is_finished() {
            return;
        }
        let req = pb::WriteRequest {
            timeseries: vec![
                series(&[("__name__", "unrelated"), ("x", "1")], &[(1.0, i)]),
                series(labels, &[(250.0, 1_700_000_000_000 + i)]),
            ],
            ..Default::default()
        };
        let r = post(
            &format!("{base}/api/v1/write"),
            common::encode(&req),
            RW_HEADERS,
        )
        .await;
        assert!(r.status.is_success(), "{}", r.body);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn tap_is_off_unless_enable_debug_and_says_how_to_turn_it_on() {
    let base = start_web("").await;
    let r = get(&format!("{base}/api/v1/tap?match=up")).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("web.enable_debug: true"), "{}", r.body);
    let r = get(&format!("{base}/debug/tap?match=up")).await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("web.enable_debug: true"), "{}", r.body);
}

#[tokio::test]
async fn tap_api_shows_series_sent_after_it_opened_with_the_trace_and_one_at_a_time() {
    let base = start_tap().await;
    // Before the tap opens: not captured (the tap only sees what arrives after).
    let before = pb::WriteRequest {
        timeseries: vec![series(
            &[
                ("__name__", "sglang:kv_transfer_latency_ms"),
                ("engine", "before"),
            ],
            &[(1.0, 1)],
        )],
        ..Default::default()
    };
    let r = post(
        &format!("{base}/api/v1/write"),
        common::encode(&before),
        RW_HEADERS,
    )
    .await;
    assert!(r.status.is_success());
    let url = format!(
        "{base}/api/v1/tap?match={}&limit=2&timeout=20s",
        enc("sglang:kv_transfer_latency_ms{engine=\"a\"}")
    );
    let tap = tokio::spawn(async move { get(&url).await });
    // Wait until it is open: a second tap is then refused with 409.
    let mut refused = None;
    for _ in 0..50 {
        let r = get(&format!("{base}/api/v1/tap?match=up&timeout=1s")).await;
        if r.status == 409 {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let refused = refused.expect("a second tap is refused while one is open");
    assert!(
        json(&refused.body)["error"]
            .as_str()
            .unwrap()
            .contains("already open"),
        "{}",
        refused.body
    );
    send_until(
        &base,
        &[
            ("__name__", "sglang:kv_transfer_latency_ms"),
            ("engine", "a"),
        ],
        &tap,
    )
    .await;
    let r = tap.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v = json(&r.body);
    let d = &v["data"];
    assert_eq!(d["filled"], true, "{}", r.body);
    let s = d["series"].as_array().unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(
        s[0]["series"], "sglang:kv_transfer_latency_ms{engine=\"a\"}",
        "{}",
        r.body
    );
    assert_eq!(s[0]["samples"][0][0], 250.0);
    assert_eq!(s[0]["protocol"], "1.0");
    let out = d["dry_run"]["output"].to_string();
    assert!(
        out.contains("sglang:kv_transfer_latency_seconds{engine=\\\"a\\\"} 0.25"),
        "{out}"
    );
    let rules = d["dry_run"]["trace"][0]["rules"].to_string();
    assert!(rules.contains("pack sglang"), "{rules}");
    // Counted, and the tap is free again.
    let m = get(&format!("{base}/metrics")).await.body;
    assert!(
        m.contains("promnorm_taps_total{outcome=\"filled\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("promnorm_taps_total{outcome=\"refused\"}"),
        "{m}"
    );
    let r = get(&format!("{base}/api/v1/tap?match=up&timeout=100ms")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r.body)["data"]["filled"], false);
}

#[tokio::test]
async fn tap_rejects_bad_parameters() {
    let base = start_tap().await;
    for (q, want) in [
        ("", "missing parameter match"),
        ("match=up&limit=101", "limit must be 1 to 100"),
        ("match=up&timeout=10m", "timeout must be"),
        ("match=x%7Ba%3D~%22b%22%7D", "only = matchers"),
    ] {
        let r = get(&format!("{base}/api/v1/tap?{q}")).await;
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.body.contains(want), "{q}: {}", r.body);
    }
}

#[tokio::test]
async fn tap_page_escapes_what_it_captured() {
    let base = start_tap().await;
    let url = format!("{base}/debug/tap?match=up&limit=1&timeout=20s");
    let tap = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    send_until(&base, &[("__name__", "up"), ("job", XSS)], &tap).await;
    let r = tap.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(XSS), "{}", r.body);
    assert!(
        r.body
            .contains("job=\\&quot;&lt;script&gt;alert(1)&lt;/script&gt;\\&quot;")
            || r.body
                .contains("job=&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;"),
        "{}",
        r.body
    );
    assert!(r.body.contains("1 of 1 series"), "{}", r.body);
    assert!(r.body.contains("no rule applies"), "{}", r.body);
}

#[tokio::test]
async fn normalize_page_takes_an_uploaded_file() {
    let (base, _) = start().await;
    // As a browser sends the form: multipart, an empty text area and the file.
    let body = "--b0undary\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\n\r\n\
                --b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"dump.prom\"\r\n\
                Content-Type: application/octet-stream\r\n\r\n\
                # TYPE sglang:kv_transfer_latency_ms gauge\n\
                sglang:kv_transfer_latency_ms{engine=\"a\"} 250\n\r\n--b0undary--\r\n";
    let r = post(
        &format!("{base}/debug/normalize"),
        body.into(),
        &[("content-type", "multipart/form-data; boundary=b0undary")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body
            .contains("sglang:kv_transfer_latency_seconds{engine=&quot;a&quot;} 0.25"),
        "{}",
        r.body
    );
    // The form offers the upload and sends multipart.
    let r = get(&format!("{base}/debug/normalize")).await;
    assert!(r.body.contains("type=\"file\""), "{}", r.body);
    assert!(r.body.contains("multipart/form-data"), "{}", r.body);
}

#[tokio::test]
async fn the_cardinality_page_lists_metrics_and_a_metrics_labels() {
    let (base, _) = start().await;
    let series: Vec<pb::TimeSeries> = (0..12)
        .map(|i| {
            let pod = format!("pod-{i}");
            series(
                &[
                    ("__name__", "vllm_page_metric"),
                    ("pod", pod.as_str()),
                    ("job", "j"),
                ],
                &[(1.0, 1)],
            )
        })
        .collect();
    let req = pb::WriteRequest {
        timeseries: series,
        ..Default::default()
    };
    let r = post(
        &format!("{base}/api/v1/write"),
        common::encode(&req),
        RW_HEADERS,
    )
    .await;
    assert!(r.status.is_success(), "{}", r.body);
    let r = get(&format!("{base}/cardinality")).await;
    assert_eq!(r.status, 200);
    assert!(
        r.body
            .contains("<code>vllm_page_metric</code></a></td><td>12</td>"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("href=\"cardinality?metric=vllm_page_metric"),
        "{}",
        r.body
    );
    let r = get(&format!("{base}/cardinality?metric=vllm_page_metric")).await;
    assert_eq!(r.status, 200);
    assert!(
        r.body
            .contains("<tr><td><code>pod</code></td><td>12</td></tr>"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("<tr><td><code>job</code></td><td>1</td></tr>"),
        "{}",
        r.body
    );
}
