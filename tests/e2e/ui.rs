//! The web UI in a real browser (docs/ui.md): Debian's headless Chromium renders the
//! pages of a real `promnorm serve` that received real remote-write traffic. Skipped with
//! a message when Chromium is absent (`CHROMIUM_BIN`, else `chromium` on the PATH),
//! unless `PROMNORM_E2E=1`. Screenshots go to the target's tmp folder, not the repo.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::procs::promnorm_serve;
use common::{RW_HEADERS, Reply, encode, fake_backend, post, series};
use promnorm::wire::proto::prometheus as pb;

const XSS: &str = "<script>alert(1)</script>";

fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("CHROMIUM_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
        })
        .filter(|p| p.exists());
    if found.is_none() {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!(
                "PROMNORM_E2E=1 but no Chromium (apt-get install chromium, or set CHROMIUM_BIN)"
            );
        }
        eprintln!("SKIPPED: install chromium (or set CHROMIUM_BIN) to run the browser test");
    }
    found
}

/// The DOM Chromium renders for `url`, and the console messages of pages from `origin`.
fn render(chrome: &Path, url: &str, origin: &str, shot: Option<&Path>) -> (String, Vec<String>) {
    let mut args = vec![
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--no-first-run".into(),
        "--enable-logging=stderr".into(),
        "--v=0".into(),
        "--virtual-time-budget=5000".into(),
        "--window-size=1280,1000".into(),
    ];
    match shot {
        Some(p) => args.push(format!("--screenshot={}", p.display())),
        None => args.push("--dump-dom".into()),
    }
    args.push(url.to_string());
    let out = Command::new("timeout")
        .arg("60")
        .arg(chrome)
        .args(&args)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE") && l.contains(origin))
        .map(str::to_string)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `dir`, emptied (what an earlier run left is removed) and created.
fn fresh_dir(dir: &Path) -> std::path::PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    dir.to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_render_in_chromium_against_a_real_serve() {
    let Some(chrome) = chromium() else { return };
    let tmp =
        fresh_dir(&std::env::temp_dir().join(format!("promnorm-e2e-ui-{}", std::process::id())));
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    let (backend, _rec) = fake_backend(Reply::ok()).await;
    let mut p = promnorm_serve(&tmp, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nbackends:\n  - name: mimir\n    url: {backend}\n    \
             queue: {{type: memory}}\n"
        )
    });
    p.start("/-/ready").await;
    let base = p.base.clone();

    // Real traffic: a series whose label value is markup.
    let req = pb::WriteRequest {
        timeseries: vec![series(
            &[("__name__", "evil_metric"), ("v", XSS), ("q", "a'b\"c")],
            &[(1.0, 1_700_000_000_000)],
        )],
        ..Default::default()
    };
    let r = post(&format!("{base}/api/v1/write"), encode(&req), RW_HEADERS).await;
    assert!(r.status.is_success(), "{}", r.body);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let chrome2 = chrome.clone();
    let base2 = base.clone();
    let shots2 = shots.clone();
    let tmp2 = tmp.clone();
    tokio::task::spawn_blocking(move || {
        let (chrome, base, shots, tmp) = (chrome2, base2, shots2, tmp2);
        // Status: the backend, its protocol and its queue's bytes.
        let (dom, console) = render(&chrome, &format!("{base}/"), &base, None);
        assert!(console.is_empty(), "console: {console:?}");
        assert!(dom.contains("<td>mimir</td>"), "{dom}");
        assert!(dom.contains("memory (accepting)"), "{dom}");
        assert!(dom.contains(" bytes, "), "{dom}");
        assert!(dom.contains(">sglang</a>"), "{dom}");

        // Explain: the text `promnorm explain` prints.
        let (dom, console) = render(
            &chrome,
            &format!("{base}/explain?name=sglang%3Akv_transfer_latency_ms"),
            &base,
            None,
        );
        assert!(console.is_empty(), "console: {console:?}");
        let want = Command::new(env!("CARGO_BIN_EXE_promnorm"))
            .args(["explain", "sglang:kv_transfer_latency_ms", "--config"])
            .arg(tmp.join("promnorm.yml"))
            .output()
            .expect("promnorm explain");
        let want = String::from_utf8_lossy(&want.stdout).into_owned();
        assert!(want.contains("sglang:kv_transfer_latency_seconds"), "{want}");
        assert!(
            dom.contains(&format!("<pre id=\"explain\">{}</pre>", html_escape(&want).replace("&quot;", "\""))),
            "the explain page differs from `promnorm explain`:\n{want}\n---\n{dom}"
        );

        // Rules, filtered.
        let (dom, console) = render(&chrome, &format!("{base}/rules?q=kv_transfer_latency"), &base, None);
        assert!(console.is_empty(), "console: {console:?}");
        assert!(dom.contains("sglang:kv_transfer_latency_ms"), "{dom}");

        // Normalize: a real SGLang dump plus the markup series, pasted into the form
        // (a local page submits it, as a person would).
        let dump = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/golden/dump-sglang-0.5.7to0.5.9-dynamo-a7b23c0.prom"
        ))
        .unwrap();
        let pasted = format!("{dump}\nevil_metric{{v=\"{}\",q=\"a'b\\\"c\"}} 1\n", XSS.replace('"', "\\\""));
        let form = tmp.join("form.html");
        std::fs::write(
            &form,
            format!(
                "<!DOCTYPE html><html><body><form method=\"post\" action=\"{base}/debug/normalize\">\
                 <textarea name=\"text\">{}</textarea></form>\
                 <script>document.forms[0].submit()</script></body></html>",
                html_escape(&pasted)
            ),
        )
        .unwrap();
        let url = format!("file://{}", form.display());
        let (dom, console) = render(&chrome, &url, &base, None);
        assert!(console.is_empty(), "console: {console:?}");
        assert!(dom.contains("<title>Normalize (dry run) - promnorm</title>"), "{dom}");
        assert!(dom.contains("sglang:kv_transfer_latency_seconds"), "{dom}");
        assert!(dom.contains("pack sglang rule"), "{dom}");
        // The markup is text: escaped in the DOM, and no script element but the form page's.
        assert!(dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{dom}");
        assert!(!dom.contains("<script"), "{dom}");
        let (_, _) = render(&chrome, &url, &base, Some(&shots.join("normalize.png")));

        for (name, path) in [
            ("status", "/"),
            ("rules", "/rules?q=sglang"),
            ("explain", "/explain?name=sglang%3Akv_transfer_latency_ms"),
        ] {
            let (_, console) = render(&chrome, &format!("{base}{path}"), &base, Some(&shots.join(format!("{name}.png"))));
            assert!(console.is_empty(), "console: {console:?}");
        }
        for name in ["status", "rules", "explain", "normalize"] {
            let png = shots.join(format!("{name}.png"));
            let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
            assert!(len > 1000, "no screenshot {}", png.display());
        }
    })
    .await
    .unwrap();
    p.kill();
    eprintln!("screenshots in {}", shots.display());
    let _ = std::fs::remove_dir_all(&tmp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_work_under_a_route_prefix_in_chromium() {
    let Some(chrome) = chromium() else { return };
    let tmp = fresh_dir(
        &std::env::temp_dir().join(format!("promnorm-e2e-ui-prefix-{}", std::process::id())),
    );
    let mut p = promnorm_serve(&tmp, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nbackends:\n  - url: http://127.0.0.1:1/api/v1/write\n\
             web:\n  route_prefix: /ops/promnorm\n"
        )
    });
    p.start("/-/ready").await;
    let base = p.base.clone();
    tokio::task::spawn_blocking(move || {
        // Without the trailing slash: redirected, then rendered with working links.
        let (dom, console) = render(&chrome, &format!("{base}/ops/promnorm"), &base, None);
        assert!(console.is_empty(), "console: {console:?}");
        assert!(dom.contains("<title>Status - promnorm</title>"), "{dom}");
        assert!(dom.contains("href=\"../../metrics\""), "{dom}");
        let (dom, _) = render(
            &chrome,
            &format!("{base}/ops/promnorm/explain?name=sglang%3Akv_transfer_latency_ms"),
            &base,
            None,
        );
        assert!(dom.contains("sglang:kv_transfer_latency_seconds"), "{dom}");
    })
    .await
    .unwrap();
    p.kill();
    let _ = std::fs::remove_dir_all(&tmp);
}

// ---------------------------------------------------------------------------------------
// WebDriver: Debian's chromedriver driving headless Chromium through the W3C protocol
// (a small client over the tests' HTTP client), for what `--dump-dom` cannot do: typing
// into forms, clicking, the browser's console log, alerts, a tap opened before traffic.

fn chromedriver() -> Option<PathBuf> {
    let found = std::env::var_os("CHROMEDRIVER_BIN")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/bin/chromedriver")))
        .filter(|p| p.exists());
    if found.is_none() {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!(
                "PROMNORM_E2E=1 but no chromedriver (apt-get install chromium-driver, or set \
                 CHROMEDRIVER_BIN)"
            );
        }
        eprintln!(
            "SKIPPED: install chromium-driver (or set CHROMEDRIVER_BIN) to run the WebDriver test"
        );
    }
    found
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

struct Driver {
    url: String,
    _proc: common::Killed,
}

struct Session {
    d: String,
}

async fn wd(method: &str, url: &str, body: Option<serde_json::Value>) -> serde_json::Value {
    use axum::body::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = axum::http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .expect("webdriver answers within 60s")
        .expect("webdriver request");
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "webdriver: not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

impl Driver {
    async fn start(bin: &Path) -> Driver {
        let port = common::free_port();
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let d = Driver {
            url: format!("http://127.0.0.1:{port}"),
            _proc: common::Killed(child),
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not listen on {port}");
    }

    async fn session(&self, chrome: &Path) -> Session {
        let v = wd(
            "POST",
            &format!("{}/session", self.url),
            Some(serde_json::json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                // Navigation and clicks return at once: the test waits for elements
                // itself (the tap's page answers only once traffic has arrived).
                "pageLoadStrategy": "none",
                "goog:loggingPrefs": {"browser": "ALL"},
                "goog:chromeOptions": {
                    "binary": chrome.display().to_string(),
                    "args": ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--window-size=1280,1000"],
                },
            }}})),
        )
        .await;
        let id = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"));
        Session {
            d: format!("{}/session/{id}", self.url),
        }
    }
}

impl Session {
    async fn go(&self, url: &str) {
        wd(
            "POST",
            &format!("{}/url", self.d),
            Some(serde_json::json!({"url": url})),
        )
        .await;
    }

    /// The first element `css` selects, waiting up to `within` for it.
    async fn find(&self, css: &str, within: Duration) -> String {
        let until = std::time::Instant::now() + within;
        loop {
            let v = wd(
                "POST",
                &format!("{}/element", self.d),
                Some(serde_json::json!({"using": "css selector", "value": css})),
            )
            .await;
            if let Some(e) = v["value"][ELEMENT].as_str() {
                return e.to_string();
            }
            assert!(std::time::Instant::now() < until, "no element {css:?}: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn text(&self, css: &str) -> String {
        let e = self.find(css, Duration::from_secs(30)).await;
        let v = wd("GET", &format!("{}/element/{e}/text", self.d), None).await;
        v["value"].as_str().unwrap_or_default().to_string()
    }

    /// The text of the first element `css` selects once it contains `needle`, waiting up to
    /// 30 s: after a form's submit the old page answers until the new one has loaded, and an
    /// element found on it goes stale. On time out, the last text seen (for the assertion).
    async fn text_containing(&self, css: &str, needle: &str) -> String {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.text(css).await;
            if text.contains(needle) || std::time::Instant::now() >= until {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to 30 s for the page's URL to contain `part` (a form's submit has
    /// navigated), and returns it.
    async fn url_containing(&self, part: &str) -> String {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let v = wd("GET", &format!("{}/url", self.d), None).await;
            let url = v["value"].as_str().unwrap_or_default().to_string();
            if url.contains(part) || std::time::Instant::now() >= until {
                return url;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css, Duration::from_secs(10)).await;
        wd(
            "POST",
            &format!("{}/element/{e}/clear", self.d),
            Some(serde_json::json!({})),
        )
        .await;
        wd(
            "POST",
            &format!("{}/element/{e}/value", self.d),
            Some(serde_json::json!({"text": text})),
        )
        .await;
    }

    async fn click(&self, css: &str) {
        let e = self.find(css, Duration::from_secs(10)).await;
        wd(
            "POST",
            &format!("{}/element/{e}/click", self.d),
            Some(serde_json::json!({})),
        )
        .await;
    }

    /// Sets a text area's value as a paste would (sending 34 kB as key strokes is slow).
    async fn paste(&self, css: &str, text: &str) {
        wd(
            "POST",
            &format!("{}/execute/sync", self.d),
            Some(serde_json::json!({
                "script": "document.querySelector(arguments[0]).value = arguments[1];",
                "args": [css, text],
            })),
        )
        .await;
    }

    async fn title(&self) -> String {
        wd("GET", &format!("{}/title", self.d), None).await["value"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The browser console's entries since the last call, but a missing favicon.
    async fn console(&self) -> Vec<String> {
        let v = wd(
            "POST",
            &format!("{}/se/log", self.d),
            Some(serde_json::json!({"type": "browser"})),
        )
        .await;
        v["value"]
            .as_array()
            .unwrap_or_else(|| panic!("no browser log: {v}"))
            .iter()
            .map(|e| format!("{} {}", e["level"], e["message"]))
            .filter(|m| !m.contains("favicon.ico"))
            .collect()
    }

    /// An open alert's text (none: `None`).
    async fn alert(&self) -> Option<String> {
        let v = wd("GET", &format!("{}/alert/text", self.d), None).await;
        v["value"].as_str().map(str::to_string)
    }

    async fn screenshot(&self, to: &Path) {
        let v = wd("GET", &format!("{}/screenshot", self.d), None).await;
        let png = base64_decode(v["value"].as_str().expect("a screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(to, png).unwrap();
    }

    async fn close(self) {
        wd("DELETE", &self.d, None).await;
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !matches!(c, b'=' | b'\n' | b'\r'))
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(val(c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdriver_drives_every_page_of_a_real_serve_under_a_prefix() {
    let Some(chrome) = chromium() else { return };
    let Some(driver_bin) = chromedriver() else {
        return;
    };
    let tmp =
        fresh_dir(&std::env::temp_dir().join(format!("promnorm-e2e-wd-{}", std::process::id())));
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-webdriver");
    std::fs::create_dir_all(&shots).unwrap();

    let (backend, _rec) = fake_backend(Reply::ok()).await;
    let mut p = promnorm_serve(&tmp, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nbackends:\n  - name: mimir\n    url: {backend}\n    \
             queue: {{type: memory}}\nweb:\n  route_prefix: /promnorm\n  enable_debug: true\n"
        )
    });
    p.start("/-/ready").await;
    let base = p.base.clone();
    let ui = format!("{base}/promnorm");
    let rw = base.clone();
    let send = move |labels: Vec<(&'static str, String)>, v: f64| {
        let base = rw.clone();
        async move {
            let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let req = pb::WriteRequest {
                timeseries: vec![series(&l, &[(v, 1_700_000_000_000)])],
                ..Default::default()
            };
            let r = post(&format!("{base}/api/v1/write"), encode(&req), RW_HEADERS).await;
            assert!(r.status.is_success(), "{}", r.body);
        }
    };
    // Real traffic first: the queue has seen bytes.
    send(vec![("__name__", "up".into()), ("job", "j".into())], 1.0).await;

    let driver = Driver::start(&driver_bin).await;
    let s = driver.session(&chrome).await;

    // Status: the backend and its queue's bytes.
    s.go(&format!("{ui}/")).await;
    let status = s.text("table:nth-of-type(3)").await;
    assert!(status.contains("mimir"), "{status}");
    assert!(status.contains("bytes"), "{status}");
    assert_eq!(s.title().await, "Status - promnorm");
    s.screenshot(&shots.join("status.png")).await;
    assert_eq!(
        s.console().await,
        Vec::<String>::new(),
        "status page console"
    );

    // Rules, filtered through the form.
    s.go(&format!("{ui}/rules")).await;
    s.type_into("input[name=q]", "kv_transfer_latency").await;
    s.click("form button").await;
    // The unfiltered page lists the rule too: wait for the filtered one, which counts
    // fewer rules than there are.
    let url = s.url_containing("q=kv_transfer_latency").await;
    assert!(url.contains("q=kv_transfer_latency"), "{url}");
    let rules = s
        .text_containing("body", "sglang:kv_transfer_latency_ms")
        .await;
    assert!(rules.contains("sglang:kv_transfer_latency_ms"), "{rules}");
    let counts: Vec<usize> = rules
        .split(" rules")
        .next()
        .and_then(|head| head.rsplit('\n').next())
        .map(|line| {
            line.split(" of ")
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        matches!(counts[..], [shown, all] if shown > 0 && shown < all),
        "the filter kept some rules: {counts:?} in {rules}"
    );
    s.screenshot(&shots.join("rules.png")).await;
    assert_eq!(
        s.console().await,
        Vec::<String>::new(),
        "rules page console"
    );

    // Explain through the form: what `promnorm explain` prints.
    s.go(&format!("{ui}/explain")).await;
    s.type_into("input[name=name]", "sglang:kv_transfer_latency_ms")
        .await;
    s.click("form button").await;
    let shown = s
        .text_containing("#explain", "sglang:kv_transfer_latency_seconds")
        .await;
    let want = Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(["explain", "sglang:kv_transfer_latency_ms", "--config"])
        .arg(tmp.join("promnorm.yml"))
        .output()
        .expect("promnorm explain");
    let want = String::from_utf8_lossy(&want.stdout).into_owned();
    assert!(
        want.contains("sglang:kv_transfer_latency_seconds"),
        "{want}"
    );
    assert_eq!(shown.trim_end(), want.trim_end(), "the explain page's text");
    s.screenshot(&shots.join("explain.png")).await;
    assert_eq!(
        s.console().await,
        Vec::<String>::new(),
        "explain page console"
    );

    // Normalize: a real SGLang dump pasted, with a markup label value.
    let dump = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/dump-sglang-0.5.7to0.5.9-dynamo-a7b23c0.prom"
    ))
    .unwrap();
    let pasted = format!(
        "{dump}\nevil_metric{{v=\"{}\"}} 1\n",
        XSS.replace('"', "\\\"")
    );
    s.go(&format!("{ui}/debug/normalize")).await;
    let _ = s.find("textarea", Duration::from_secs(10)).await;
    s.paste("textarea", &pasted).await;
    s.click("form button").await;
    let out = s
        .text_containing("#output", "sglang:kv_transfer_latency_seconds")
        .await;
    assert!(out.contains("sglang:kv_transfer_latency_seconds"), "{out}");
    let trace = s.text("#trace").await;
    assert!(trace.contains("pack sglang rule"), "{trace}");
    assert!(trace.contains(XSS), "the markup is shown as text: {trace}");
    assert_eq!(s.alert().await, None, "no alert fires");
    s.screenshot(&shots.join("normalize.png")).await;
    assert_eq!(
        s.console().await,
        Vec::<String>::new(),
        "normalize page console"
    );

    // The tap: opened through its form, then traffic; the page shows what came after.
    s.go(&format!("{ui}/debug/tap")).await;
    s.type_into("input[name=match]", "tap_probe").await;
    s.type_into("input[name=limit]", "1").await;
    s.type_into("input[name=timeout]", "30s").await;
    s.click("form button").await;
    let sender = tokio::spawn({
        let send = send.clone();
        async move {
            for i in 0..100 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                send(
                    vec![("__name__", "tap_probe".into()), ("v", XSS.into())],
                    f64::from(i),
                )
                .await;
            }
        }
    });
    let summary = s.text_containing("#summary", "of 1 series").await;
    sender.abort();
    assert!(summary.starts_with("1 of 1 series"), "{summary}");
    let tap = s.text("#tap").await;
    assert!(tap.contains(&format!("tap_probe{{v=\"{XSS}\"}}")), "{tap}");
    assert!(tap.contains("no rule applies"), "{tap}");
    assert_eq!(s.alert().await, None, "no alert fires");
    s.screenshot(&shots.join("tap.png")).await;
    assert_eq!(s.console().await, Vec::<String>::new(), "tap page console");

    s.close().await;
    p.kill();
    for name in ["status", "rules", "explain", "normalize", "tap"] {
        let png = shots.join(format!("{name}.png"));
        let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "no screenshot {}", png.display());
    }
    eprintln!("screenshots in {}", shots.display());
    let _ = std::fs::remove_dir_all(&tmp);
}
