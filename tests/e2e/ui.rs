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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_render_in_chromium_against_a_real_serve() {
    let Some(chrome) = chromium() else { return };
    let tmp = std::env::temp_dir().join(format!("promnorm-e2e-ui-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
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
    let tmp = std::env::temp_dir().join(format!("promnorm-e2e-ui-prefix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
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
