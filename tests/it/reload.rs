//! Hot reload of a real `promnorm serve` process (docs/operations.md): SIGHUP and
//! `POST /-/reload` under continuous load lose and fail no request and switch the
//! rules; a broken mapping file keeps the running rules, says where it is broken and
//! turns `promnorm_config_last_reload_successful` to 0; derived-series state survives a
//! reload that does not touch it.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::{
    Killed, RW_HEADERS, Recorded, Reply, decode, encode, fake_backend, free_port, get, series,
};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use promnorm::wire::proto::prometheus as pb;

struct Served {
    child: Killed,
    addr: SocketAddr,
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Served {
    /// Writes `files` and the configuration (`listen:` first, then `config`) into a
    /// fresh folder and starts `promnorm serve` on it.
    async fn start(
        name: &str,
        config: &str,
        files: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Served {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("promnorm-reload-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let config_path = dir.join("promnorm.yaml");
        std::fs::write(&config_path, format!("listen: {addr}\n{config}")).unwrap();
        let log = dir.join("stderr.log");
        let child = Command::new(promnorm_bin())
            .args(["serve", "--config"])
            .arg(&config_path)
            .args(extra_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn promnorm");
        let s = Served {
            child: Killed(child),
            addr,
            dir,
            config: config_path,
            log,
        };
        let mut s = s;
        let deadline = Instant::now() + Duration::from_secs(45);
        while tokio::net::TcpStream::connect(s.addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "promnorm did not start: {}",
                s.logs()
            );
            if let Ok(Some(status)) = s.child.0.try_wait() {
                panic!(
                    "promnorm exited ({status}) instead of serving: {}",
                    s.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s
    }

    /// SIGTERM, then waits (at most `limit`) for the process to end: how long it took.
    async fn stop_timed(&mut self, limit: Duration) -> Duration {
        let t = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.child.0.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0, "kill -TERM");
        while self.child.0.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < limit,
                "promnorm still running {limit:?} after SIGTERM: {}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t.elapsed()
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Rewrites the configuration, `listen:` as started.
    fn write_config(&self, text: &str) {
        self.write_config_raw(&format!("listen: {}\n{text}", self.addr));
    }

    fn write_config_raw(&self, text: &str) {
        write_atomically(&self.config, text);
    }

    fn sighup(&self) {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.child.0.id() as i32, libc::SIGHUP) };
        assert_eq!(r, 0, "kill -HUP");
    }

    /// (`promnorm_config_last_reload_successful`,
    /// `promnorm_config_last_reload_success_timestamp_seconds`).
    async fn reload_status(&self) -> (f64, f64) {
        let text = get(&self.url("/metrics")).await.body;
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
        };
        (
            value("promnorm_config_last_reload_successful"),
            value("promnorm_config_last_reload_success_timestamp_seconds"),
        )
    }

    /// Reloads that have finished, as logged (the gauges are set before the line).
    fn reloads_logged(&self) -> usize {
        let logs = self.logs();
        logs.matches("configuration reloaded").count()
            + logs.matches("configuration reload failed").count()
    }

    /// SIGHUP, then waits until the reload it caused has finished and returns the
    /// gauges it left.
    async fn sighup_and_wait(&self) -> (f64, f64) {
        let before = self.reloads_logged();
        // The success timestamp has sub-second precision, but two reloads within one
        // clock tick must still be told apart.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.sighup();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.reloads_logged() == before {
            assert!(
                Instant::now() < deadline,
                "no reload after SIGHUP: {}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.reload_status().await
    }
}

/// The binary under test: `PROMNORM_BIN` when set (another build, e.g. to measure a fix
/// against the code before it), else the one cargo built for these tests.
fn promnorm_bin() -> PathBuf {
    std::env::var_os("PROMNORM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_promnorm")))
}

impl Drop for Served {
    fn drop(&mut self) {
        // Kept after a failure: its log is the first thing to read.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Replaces a file in one rename, as configuration management tools do: a reload never
/// reads half a file.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn backend_yaml(url: &str, header: &str) -> String {
    format!("backends:\n  - url: {url}\n    headers: {{X-Gen: \"{header}\"}}\n")
}

const PACK: &str = "pack: mine\nrules:\n  - match: {family: reload_old}\n    rename: reload_new\n";

/// A sample as the backend received it: name, labels but the name, timestamp, value.
type Received = (String, Vec<(String, String)>, i64, f64);

/// Every sample the backend received.
fn received(rec: &Recorded) -> Vec<Received> {
    let mut out = Vec::new();
    for (_, body) in rec.requests() {
        for ts in decode(&body).timeseries {
            let name = ts
                .labels
                .iter()
                .find(|l| l.name == "__name__")
                .map(|l| l.value.clone())
                .unwrap_or_default();
            let labels: Vec<(String, String)> = ts
                .labels
                .iter()
                .filter(|l| l.name != "__name__")
                .map(|l| (l.name.clone(), l.value.clone()))
                .collect();
            for s in ts.samples {
                out.push((name.clone(), labels.clone(), s.timestamp, s.value));
            }
        }
    }
    out
}

fn names(rec: &Recorded) -> Vec<String> {
    let mut n: Vec<String> = received(rec).into_iter().map(|r| r.0).collect();
    n.sort();
    n.dedup();
    n
}

fn one(name: &str, labels: &[(&str, &str)], value: f64, ts: i64) -> Vec<u8> {
    let mut l = vec![("__name__", name)];
    l.extend_from_slice(labels);
    encode(&pb::WriteRequest {
        timeseries: vec![series(&l, &[(value, ts)])],
        ..Default::default()
    })
}

async fn post_ok(url: &str, body: Vec<u8>) {
    let r = common::post(url, body, RW_HEADERS).await;
    assert_eq!(r.status, 204, "{}", r.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_under_load_fails_and_loses_no_request_and_switches_rules() {
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let without_pack = format!(
        "derived: {{enabled: false}}\n{}",
        backend_yaml(&backend, "1")
    );
    let with_pack = format!("{without_pack}packs:\n  files: [mine.yaml]\n");
    let s = Served::start(
        "load",
        &without_pack,
        &[("mine.yaml", PACK)],
        &["--web.enable-lifecycle"],
    )
    .await;
    let write = s.url("/api/v1/write");

    // Before any reload: no pack, the series passes as it is.
    post_ok(&write, one("reload_old", &[("job", "x")], 1.0, 1)).await;
    assert!(names(&rec).contains(&"reload_old".to_string()));

    const SENDERS: usize = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..SENDERS {
        let (stop, failures, sent, write) =
            (stop.clone(), failures.clone(), sent.clone(), write.clone());
        tasks.push(tokio::spawn(async move {
            // One keep-alive client per sender, as Prometheus' queue shards.
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            let task_label = task.to_string();
            let mut seq: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let body = one("reload_probe", &[("task", &task_label)], seq as f64, seq);
                let mut req = axum::http::Request::post(&write);
                for (k, v) in RW_HEADERS {
                    req = req.header(*k, *v);
                }
                match client
                    .request(req.body(Full::new(Bytes::from(body))).unwrap())
                    .await
                {
                    Ok(resp) => {
                        let status = resp.status();
                        let text = resp.into_body().collect().await.map(|b| b.to_bytes());
                        if status != 204 {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("task {task} seq {seq}: {status} {text:?}"));
                        }
                    }
                    Err(e) => failures
                        .lock()
                        .unwrap()
                        .push(format!("task {task} seq {seq}: {e}")),
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            seq
        }));
    }

    // Six reloads while they send, alternating SIGHUP and POST /-/reload, the pack on
    // and off.
    let mut last_ts = s.reload_status().await.1;
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.write_config(if i % 2 == 0 {
            &with_pack
        } else {
            &without_pack
        });
        let (ok, ts) = if i % 3 == 0 {
            s.sighup_and_wait().await
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
            assert_eq!(r.status, 200, "{}", r.body);
            s.reload_status().await
        };
        assert_eq!(ok, 1.0, "{}", s.logs());
        assert!(
            ts > last_ts,
            "reload {i}: timestamp {ts} not after {last_ts}"
        );
        last_ts = ts;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_task = Vec::new();
    for t in tasks {
        per_task.push(t.await.unwrap());
    }
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "failed requests: {failures:#?}");
    let total: i64 = per_task.iter().sum();
    assert_eq!(total as usize, sent.load(Ordering::Relaxed));
    assert!(total >= 40, "only {total} requests sent in the run");
    eprintln!("{total} requests from {SENDERS} senders, all 204, all delivered once");

    // Every probe sample arrived, once.
    let mut probes: Vec<(String, i64)> = received(&rec)
        .into_iter()
        .filter(|r| r.0 == "reload_probe")
        .map(|r| (r.1[0].1.clone(), r.2))
        .collect();
    probes.sort();
    let mut expected: Vec<(String, i64)> = per_task
        .iter()
        .enumerate()
        .flat_map(|(t, &n)| (1..=n).map(move |seq| (t.to_string(), seq)))
        .collect();
    expected.sort();
    assert_eq!(probes.len(), expected.len(), "samples lost or duplicated");
    assert_eq!(probes, expected);

    // The last reload turned the pack off; switch it on once more, with four reloads at
    // once (they run one after the other) and a SIGHUP among them (6 + 5 reloads in
    // all): renamed from now on.
    s.write_config(&with_pack);
    let reload_url = s.url("/-/reload");
    let concurrent: Vec<_> = (0..4)
        .map(|_| {
            let url = reload_url.clone();
            tokio::spawn(async move { common::post(&url, vec![], &[]).await })
        })
        .collect();
    s.sighup();
    for r in concurrent {
        let r = r.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.reloads_logged() < 11 {
        assert!(Instant::now() < deadline, "{}", s.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    post_ok(&write, one("reload_old", &[("job", "y")], 2.0, 2)).await;
    let after: Vec<_> = received(&rec)
        .into_iter()
        .filter(|r| r.1.contains(&("job".into(), "y".into())))
        .map(|r| r.0)
        .collect();
    assert_eq!(after, ["reload_new"]);
    let logs = s.logs();
    assert_eq!(logs.matches("configuration reloaded").count(), 11, "{logs}");
    assert!(!logs.contains("configuration reload failed"), "{logs}");
    assert!(logs.contains("SIGHUP received"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_file_keeps_the_running_rules_and_says_where() {
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let config = format!(
        "derived: {{enabled: false}}\npacks:\n  files: [mine.yaml]\n{}",
        backend_yaml(&backend, "1")
    );
    let s = Served::start(
        "broken",
        &config,
        &[("mine.yaml", PACK)],
        &["--web.enable-lifecycle"],
    )
    .await;
    let write = s.url("/api/v1/write");
    let (ok, started) = s.reload_status().await;
    assert_eq!(ok, 1.0);
    assert!(started > 1.7e9, "start-up sets the timestamp: {started}");

    // A broken mapping file: an unclosed flow mapping on line 3.
    let pack = s.path("mine.yaml");
    write_atomically(
        &pack,
        "pack: mine\nrules:\n  - match: {family: reload_old\n    rename: reload_new\n",
    );
    let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
    assert_eq!(r.status, 500, "{}", r.body);
    let at = format!("{}:", pack.display());
    let position = |text: &str| {
        text.find(&at).is_some_and(|i| {
            let rest = &text[i + at.len()..];
            let mut parts = rest.splitn(3, ':');
            let line = parts.next().unwrap_or("");
            let col = parts.next().unwrap_or("");
            line.parse::<u32>().is_ok() && col.parse::<u32>().is_ok()
        })
    };
    assert!(position(&r.body), "no file:line:column in {:?}", r.body);
    let logs = s.logs();
    assert!(
        logs.contains("configuration reload failed") && position(&logs),
        "{logs}"
    );
    let (ok, ts) = s.reload_status().await;
    assert_eq!(ok, 0.0);
    assert_eq!(ts, started, "a failed reload leaves the success timestamp");
    // The running rules stay: still renamed.
    post_ok(&write, one("reload_old", &[("job", "a")], 1.0, 1)).await;
    assert_eq!(names(&rec), ["reload_new"]);

    // A broken configuration file (unknown key) through SIGHUP: the same.
    s.write_config(&format!("{config}no_such_key: 1\n"));
    let (ok, _) = s.sighup_and_wait().await;
    assert_eq!(ok, 0.0);
    let logs = s.logs();
    assert_eq!(
        logs.matches("configuration reload failed").count(),
        2,
        "{logs}"
    );
    assert!(logs.contains(&format!("{}:", s.config.display())), "{logs}");

    // Both fixed, with a new rename: 1 again, a newer timestamp, the new rules.
    s.write_config(&config);
    write_atomically(
        &pack,
        "pack: mine\nrules:\n  - match: {family: reload_old}\n    rename: reload_fixed\n",
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (ok, ts) = s.reload_status().await;
    assert_eq!(ok, 1.0);
    assert!(ts > started, "{ts} not after {started}");
    post_ok(&write, one("reload_old", &[("job", "b")], 1.0, 2)).await;
    assert_eq!(names(&rec), ["reload_fixed", "reload_new"]);
}

/// The derived ratio's samples the backend received, by timestamp, with the `X-Gen`
/// header of the request that carried each.
fn ratios(rec: &Recorded) -> Vec<(i64, f64, String)> {
    let mut out = Vec::new();
    for (headers, body) in rec.requests() {
        let gen_ = headers
            .get("x-gen")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        for ts in decode(&body).timeseries {
            if ts
                .labels
                .iter()
                .any(|l| l.name == "__name__" && l.value == "vllm:prefix_cache_hit_ratio")
            {
                for s in ts.samples {
                    out.push((s.timestamp, s.value, gen_.clone()));
                }
            }
        }
    }
    out.sort_by_key(|r| r.0);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_state_survives_a_reload_that_does_not_touch_it() {
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let derived = "derived: {flush_interval: 50ms}\n";
    let s = Served::start(
        "derived",
        &format!("{derived}{}", backend_yaml(&backend, "1")),
        &[],
        &[],
    )
    .await;
    let write = s.url("/api/v1/write");
    // Without --web.enable-lifecycle, POST /-/reload is refused.
    let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("--web.enable-lifecycle"), "{}", r.body);

    let point = |hits: f64, queries: f64, t: i64| {
        encode(&pb::WriteRequest {
            timeseries: vec![
                series(
                    &[
                        ("__name__", "vllm:prefix_cache_hits_total"),
                        ("model_name", "m"),
                    ],
                    &[(hits, t)],
                ),
                series(
                    &[
                        ("__name__", "vllm:prefix_cache_queries_total"),
                        ("model_name", "m"),
                    ],
                    &[(queries, t)],
                ),
            ],
            ..Default::default()
        })
    };
    let wait_for = |t: i64| {
        let rec = rec.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !ratios(&rec).iter().any(|r| r.0 == t) {
                assert!(Instant::now() < deadline, "no derived sample at {t}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    post_ok(&write, point(10.0, 20.0, 1_000)).await;
    post_ok(&write, point(20.0, 40.0, 16_000)).await;
    wait_for(16_000).await;

    // Only a backend header changes (and `listen`, which needs a restart): the ratio's
    // next point needs no warm-up, and leaves with the new header.
    s.write_config_raw(&format!(
        "listen: 127.0.0.1:1\n{derived}{}",
        backend_yaml(&backend, "2")
    ));
    let (ok, _) = s.sighup_and_wait().await;
    assert_eq!(ok, 1.0, "{}", s.logs());
    post_ok(&write, point(25.0, 50.0, 31_000)).await;
    wait_for(31_000).await;
    let got = ratios(&rec);
    assert_eq!(
        got,
        [
            (16_000, 0.5, "1".to_string()),
            (31_000, 0.5, "2".to_string())
        ]
    );
    let logs = s.logs();
    assert!(
        logs.contains("listen changed: it takes effect only after a restart"),
        "{logs}"
    );
    assert!(logs.contains("derived_state_kept=true"), "{logs}");

    // A pack change resets derived state (documented): the next point is a warm-up.
    s.write_config(&format!(
        "{derived}keep_original: true\n{}",
        backend_yaml(&backend, "3")
    ));
    let (ok, _) = s.sighup_and_wait().await;
    assert_eq!(ok, 1.0, "{}", s.logs());
    post_ok(&write, point(30.0, 60.0, 46_000)).await;
    post_ok(&write, point(40.0, 80.0, 61_000)).await;
    wait_for(61_000).await;
    assert!(
        !ratios(&rec).iter().any(|r| r.0 == 46_000),
        "{:?}",
        ratios(&rec)
    );
    assert!(s.logs().contains("derived_state_kept=false"));
}

/// A backend whose status the test switches; it records the names and timestamps it
/// accepted.
async fn switchable(status: Arc<std::sync::atomic::AtomicU16>) -> (String, Arc<Mutex<Vec<i64>>>) {
    let got: Arc<Mutex<Vec<i64>>> = Arc::default();
    let g = got.clone();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |body: Bytes| {
            let (g, status) = (g.clone(), status.clone());
            async move {
                let s = status.load(std::sync::atomic::Ordering::SeqCst);
                if s == 204 {
                    for t in decode(&body).timeseries {
                        g.lock()
                            .unwrap()
                            .extend(t.samples.iter().map(|s| s.timestamp));
                    }
                }
                axum::http::StatusCode::from_u16(s).unwrap()
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/write"), got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_survive_a_reload_and_a_changed_disk_queue_hands_its_data_over() {
    let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (url, got) = switchable(status.clone()).await;
    let memory = format!("backends:\n  - url: {url}\n    queue: {{type: memory}}\n");
    let s = Served::start("queues", &memory, &[], &[]).await;
    for ts in 1..=5 {
        post_ok(&s.url("/api/v1/write"), one("reload_queued", &[], 1.0, ts)).await;
    }
    // A reload that leaves the backend as it is keeps its queue and what it holds.
    s.write_config(&format!("{memory}keep_original: true\n"));
    assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
    status.store(204, std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().len() < 5 {
        assert!(
            Instant::now() < deadline,
            "queued samples lost in the reload: {}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*got.lock().unwrap(), vec![1, 2, 3, 4, 5]);

    // A disk queue whose settings change: the old queue stops, the new one opens the
    // same directory and delivers what the old one held.
    status.store(503, std::sync::atomic::Ordering::SeqCst);
    got.lock().unwrap().clear();
    let dir = s.path("queue");
    let disk = |fsync: &str| {
        format!(
            "backends:\n  - url: {url}\n    queue: {{type: disk, dir: {}, fsync_interval: {fsync}}}\n",
            dir.display()
        )
    };
    s.write_config(&disk("1s"));
    assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
    for ts in 11..=15 {
        post_ok(&s.url("/api/v1/write"), one("reload_queued", &[], 1.0, ts)).await;
    }
    s.write_config(&disk("0s"));
    assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
    status.store(204, std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(15);
    while got.lock().unwrap().len() < 5 {
        assert!(
            Instant::now() < deadline,
            "the new queue did not replay: {}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*got.lock().unwrap(), vec![11, 12, 13, 14, 15]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_turns_tenant_routing_on_and_off() {
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let plain = format!(
        "derived: {{enabled: false}}\n{}",
        backend_yaml(&backend, "1")
    );
    let s = Served::start("tenancy", &plain, &[], &["--web.enable-lifecycle"]).await;
    let write = s.url("/api/v1/write");
    let request = |ts: i64| {
        encode(&pb::WriteRequest {
            timeseries: vec![
                series(&[("__name__", "t_total"), ("team", "a")], &[(1.0, ts)]),
                series(&[("__name__", "t_total"), ("team", "b")], &[(1.0, ts)]),
            ],
            ..Default::default()
        })
    };
    // (tenant header, number of series) of each request the backend got.
    let seen = |from: usize| -> Vec<(Option<String>, usize)> {
        rec.requests()[from..]
            .iter()
            .map(|(h, body)| {
                (
                    h.get("x-scope-orgid")
                        .map(|v| v.to_str().unwrap().to_string()),
                    decode(body).timeseries.len(),
                )
            })
            .collect()
    };
    post_ok(&write, request(1_000)).await;
    assert_eq!(seen(0), [(None, 2)], "no routing before the reload");

    s.write_config(&format!("{plain}tenancy: {{label: team}}\n"));
    let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    post_ok(&write, request(2_000)).await;
    let mut routed = seen(1);
    routed.sort();
    assert_eq!(
        routed,
        [(Some("a".to_string()), 1), (Some("b".to_string()), 1)],
        "one request per tenant after the reload"
    );

    s.write_config(&plain);
    let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    post_ok(&write, request(3_000)).await;
    assert_eq!(seen(3), [(None, 2)], "whole requests again");
}

/// (tenant header, series' `i` labels) of each request a backend accepted.
type TenantRequests = Arc<Mutex<Vec<(Option<String>, Vec<String>)>>>;

/// A backend answering `status`, recording what it accepts.
async fn switchable_tenants(status: Arc<std::sync::atomic::AtomicU16>) -> (String, TenantRequests) {
    let got: TenantRequests = Arc::default();
    let g = got.clone();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let (g, status) = (g.clone(), status.clone());
            async move {
                let s = status.load(std::sync::atomic::Ordering::SeqCst);
                if s == 204 {
                    let ids = decode(&body)
                        .timeseries
                        .iter()
                        .flat_map(|t| t.labels.iter().filter(|l| l.name == "i"))
                        .map(|l| l.value.clone())
                        .collect();
                    let tenant = headers
                        .get("x-scope-orgid")
                        .map(|v| v.to_str().unwrap().to_string());
                    g.lock().unwrap().push((tenant, ids));
                }
                axum::http::StatusCode::from_u16(s).unwrap()
            }
        }),
    );
    let addr = common::serve(app).await;
    (format!("http://{addr}/api/v1/write"), got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_keep_their_tenant_when_a_reload_turns_routing_off() {
    let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (url, got) = switchable_tenants(status.clone()).await;
    let s = Served::start("tenant-queue", "derived: {enabled: false}\n", &[], &[]).await;
    let dir = s.path("queue");
    let config = |tenancy: &str| {
        format!(
            "derived: {{enabled: false}}\nbackends:\n  - url: {url}\n    queue: {{type: disk, dir: {}}}\n    tenancy: {tenancy}\n",
            dir.display()
        )
    };
    s.write_config(&config("{label: team}"));
    assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
    let request = |ts: i64| {
        encode(&pb::WriteRequest {
            timeseries: vec![
                series(
                    &[("__name__", "t_total"), ("i", "1"), ("team", "a")],
                    &[(1.0, ts)],
                ),
                series(
                    &[("__name__", "t_total"), ("i", "2"), ("team", "b")],
                    &[(1.0, ts)],
                ),
            ],
            ..Default::default()
        })
    };
    post_ok(&s.url("/api/v1/write"), request(1_000)).await;
    // Routing off: the backend changes, its successor replays the same directory.
    s.write_config(&config("{enabled: false}"));
    assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
    status.store(204, std::sync::atomic::Ordering::SeqCst);
    post_ok(&s.url("/api/v1/write"), request(2_000)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while got.lock().unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "not delivered: {}", s.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen = got.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            (None, vec!["1".to_string(), "2".to_string()]),
            (Some("a".to_string()), vec!["1".to_string()]),
            (Some("b".to_string()), vec!["2".to_string()]),
        ],
        "the queued tenant requests kept their tenant; the new request went whole"
    );
}

/// `n` series `reload_batch{i="0".."n"}`, one sample each at `ts`; `pad` bytes of
/// incompressible label text per series (to fill a disk quickly).
fn batch(ts: i64, n: usize, pad: usize) -> Vec<u8> {
    let mut x = ts as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut noise = || {
        (0..pad)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect::<String>()
    };
    let timeseries = (0..n)
        .map(|i| {
            let (i, pad) = (i.to_string(), noise());
            series(
                &[("__name__", "reload_batch"), ("i", &i), ("pad", &pad)],
                &[(1.0, ts)],
            )
        })
        .collect();
    encode(&pb::WriteRequest {
        timeseries,
        ..Default::default()
    })
}

/// Waits until the backend holds at least `want` samples (at most `limit`), then a
/// little longer for any extra; returns what it holds.
async fn wait_for_samples(got: &Mutex<Vec<i64>>, want: usize, limit: Duration) -> Vec<i64> {
    let deadline = Instant::now() + limit;
    while got.lock().unwrap().len() < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    got.lock().unwrap().clone()
}

fn queue_yaml(url: &str, queue: &str) -> String {
    format!(
        "derived: {{enabled: false}}\nbackends:\n  - url: {url}\n    name: q\n    queue: {queue}\n"
    )
}

/// Issue: a reload from a disk queue to a memory queue (or none) stranded everything the
/// disk queue held (0 of 1,000 samples delivered), and a memory queue's records were
/// dropped at the old queue's shutdown timeout. Every case hands all 1,000 over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_hands_every_queued_sample_to_the_new_queue_or_backend() {
    let qdir = std::env::temp_dir().join(format!("promnorm-handover-{}", std::process::id()));
    let disk = |sub: &str| {
        format!(
            "{{type: disk, dir: {}, fsync_interval: 0s}}",
            qdir.join(sub).display()
        )
    };
    let cases = [
        ("disk-to-memory", disk("a"), "{type: memory}".to_string()),
        ("disk-to-none", disk("b"), "{type: none}".to_string()),
        ("memory-to-disk", "{type: memory}".to_string(), disk("c")),
        (
            "memory-to-memory",
            "{type: memory}".to_string(),
            "{type: memory, max_bytes: 2097152}".to_string(),
        ),
        ("disk-to-other-disk", disk("d"), disk("e")),
    ];
    let mut failures = Vec::new();
    for (name, from, to) in cases {
        let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
        let (url, got) = switchable(status.clone()).await;
        // A short shutdown_timeout: what a memory queue was given to drain at a reload
        // before this fix (its records then dropped).
        let yaml = |queue: &str| format!("shutdown_timeout: 5s\n{}", queue_yaml(&url, queue));
        let s = Served::start(&format!("handover-{name}"), &yaml(&from), &[], &[]).await;
        for ts in 1..=50 {
            post_ok(&s.url("/api/v1/write"), batch(ts, 20, 0)).await;
        }
        s.write_config(&yaml(&to));
        assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
        status.store(204, std::sync::atomic::Ordering::SeqCst);
        let mut samples = wait_for_samples(&got, 1000, Duration::from_secs(20)).await;
        eprintln!("{name}: {} of 1000 samples delivered", samples.len());
        samples.sort_unstable();
        let want: Vec<i64> = (1..=50).flat_map(|ts| [ts; 20]).collect();
        if samples != want {
            failures.push(format!(
                "{name}: {} of 1000 samples delivered\n{}",
                samples.len(),
                s.logs()
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&qdir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Issue: 20 reloads between a memory and a disk queue in front of a slow backend lost
/// 13,135 of 38,160 acknowledged samples. Every acknowledged sample arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_between_memory_and_disk_queues_under_load_lose_nothing() {
    let got: Arc<Mutex<Vec<i64>>> = Arc::default();
    let g = got.clone();
    // About 30 requests/s: the queues always hold something when a reload comes.
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |body: Bytes| {
            let g = g.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                for t in decode(&body).timeseries {
                    g.lock()
                        .unwrap()
                        .extend(t.samples.iter().map(|s| s.timestamp));
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let url = format!("http://{}/api/v1/write", common::serve(app).await);
    let qdir = std::env::temp_dir().join(format!("promnorm-churn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&qdir);
    let memory = queue_yaml(&url, "{type: memory}");
    let disk = queue_yaml(
        &url,
        &format!(
            "{{type: disk, dir: {}, fsync_interval: 1s}}",
            qdir.display()
        ),
    );
    let s = Served::start("churn", &memory, &[], &[]).await;
    let write = s.url("/api/v1/write");
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (stop, accepted, write) = (stop.clone(), accepted.clone(), write.clone());
        tokio::spawn(async move {
            let mut ts = 0;
            while !stop.load(Ordering::Relaxed) {
                ts += 1;
                let r = common::post(&write, batch(ts, 20, 0), RW_HEADERS).await;
                if r.status == 204 {
                    accepted.fetch_add(20, Ordering::Relaxed);
                }
                // Faster than the backend, so the queues hold a backlog at each reload,
                // not so fast that the backlog takes minutes to deliver. (A refused
                // request is retried by a real sender; here a new one stands in for it.)
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        s.write_config(if i % 2 == 0 { &disk } else { &memory });
        assert_eq!(s.sighup_and_wait().await.0, 1.0, "{}", s.logs());
    }
    stop.store(true, Ordering::Relaxed);
    sender.await.unwrap();
    let accepted = accepted.load(Ordering::Relaxed);
    let delivered = wait_for_samples(&got, accepted, Duration::from_secs(60))
        .await
        .len();
    eprintln!("{delivered} of {accepted} acknowledged samples delivered");
    let _ = std::fs::remove_dir_all(&qdir);
    assert!(accepted > 1000, "{accepted}");
    assert!(
        delivered >= accepted,
        "{delivered} of {accepted} acknowledged samples delivered: {}",
        s.logs()
    );
}

/// Issue: with a disk queue and a dead backend SIGTERM waited the whole
/// shutdown_timeout, and a promnorm started meanwhile exited on the queue's lock. Now the
/// first stops at once, the second waits for the lock, then replays what the first held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_queue_stops_at_once_and_a_successor_waits_for_its_lock() {
    let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (url, got) = switchable(status.clone()).await;
    let qdir = std::env::temp_dir().join(format!("promnorm-stoplock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&qdir);
    let cfg = format!(
        "shutdown_timeout: 20s\n{}",
        queue_yaml(
            &url,
            &format!(
                "{{type: disk, dir: {}, fsync_interval: 1s}}",
                qdir.display()
            )
        )
    );
    // A stop with a dead backend: prompt, whatever shutdown_timeout says.
    let mut first = Served::start("stoplock-1", &cfg, &[], &[]).await;
    for ts in 1..=10 {
        post_ok(&first.url("/api/v1/write"), batch(ts, 5, 0)).await;
    }
    let took = first.stop_timed(Duration::from_secs(25)).await;
    eprintln!("SIGTERM to exit with a dead backend and a disk queue: {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "stopping took {took:?} of shutdown_timeout 20s"
    );
    // A second starts while a first holds the directory, and must wait for it.
    let mut first = Served::start("stoplock-1b", &cfg, &[], &[]).await;
    let second_log = std::env::temp_dir()
        .join(format!("promnorm-reload-stoplock-2-{}", std::process::id()))
        .join("stderr.log");
    let (second, ()) = tokio::join!(Served::start("stoplock-2", &cfg, &[], &[]), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let log = std::fs::read_to_string(&second_log).unwrap_or_default();
        assert!(log.contains("waiting for it"), "second start: {log}");
        first.stop_timed(Duration::from_secs(25)).await;
    });
    status.store(204, std::sync::atomic::Ordering::SeqCst);
    let samples = wait_for_samples(&got, 50, Duration::from_secs(20)).await;
    assert_eq!(
        samples.len(),
        50,
        "replayed by the second: {}",
        second.logs()
    );
    drop(second);
    let _ = std::fs::remove_dir_all(&qdir);
}

/// Issue: once a disk queue had filled its disk, it answered 429 to every request even
/// after it drained (70 of 70 over 50 s) and /-/ready stayed 503. On an 8 MiB tmpfs
/// (skipped where one cannot be mounted): after the drain, requests are accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_queue_that_filled_its_disk_accepts_requests_again_once_drained() {
    struct Mount(PathBuf);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let mnt = std::env::temp_dir().join(format!("promnorm-fulldisk-{}", std::process::id()));
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here");
        let _ = std::fs::remove_dir_all(&mnt);
        return;
    }
    let _mount = Mount(mnt.clone());
    let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
    let (url, got) = switchable(status.clone()).await;
    let s = Served::start(
        "fulldisk",
        &queue_yaml(
            &url,
            &format!(
                "{{type: disk, dir: {}, fsync_interval: 1s}}",
                mnt.join("q").display()
            ),
        ),
        &[],
        &[],
    )
    .await;
    let write = s.url("/api/v1/write");
    let mut accepted = 0;
    let full = loop {
        let r = common::post(&write, batch(accepted + 1, 20, 400), RW_HEADERS).await;
        if r.status != 204 {
            break r;
        }
        accepted += 1;
        assert!(accepted < 5000, "an 8 MiB disk never filled");
    };
    assert_eq!(full.status, 429, "{}", full.body);
    assert!(full.body.contains("out of space"), "{}", full.body);
    status.store(204, std::sync::atomic::Ordering::SeqCst);
    let delivered = wait_for_samples(&got, accepted as usize * 20, Duration::from_secs(60))
        .await
        .len();
    assert_eq!(delivered, accepted as usize * 20, "{}", s.logs());
    let mut after = 0;
    for ts in 0..20 {
        let r = common::post(&write, batch(100_000 + ts, 20, 400), RW_HEADERS).await;
        after += usize::from(r.status == 204);
    }
    let ready = get(&s.url("/-/ready")).await.status;
    eprintln!(
        "{accepted} requests accepted before the disk filled; after the drain {after} of 20 accepted, /-/ready {ready}"
    );
    assert_eq!(after, 20, "{}", s.logs());
    assert_eq!(ready, 200);
}

/// Offsets of the frames of a queue segment, in either format (before and after the
/// frame magic), with the offset of each frame's length field.
fn frames(data: &[u8]) -> Vec<(usize, usize)> {
    const MAGIC: u32 = 0x9E51_C0DE;
    let word = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
    let mut out = Vec::new();
    let mut off = 0;
    while off + 8 <= data.len() {
        let (len_at, header) = if word(off) == MAGIC as usize {
            (off + 4, 24)
        } else {
            (off, 8)
        };
        out.push((off, len_at));
        off += header + word(len_at);
    }
    out
}

fn segment_of(queue: &Path) -> PathBuf {
    let shard = queue.join("shard-0");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&shard)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .filter(|p| std::fs::metadata(p).unwrap().len() > 0)
        .collect();
    segs.sort();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.remove(0)
}

/// Issue: one damaged length byte cost the rest of its segment (187 of 600 records), and
/// a cursor edited to point past the data deleted every segment silently. Now one
/// damaged record costs one record, counted, and a bad cursor replays everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_to_a_disk_queue_costs_only_the_damaged_record_and_a_bad_cursor_nothing() {
    let mut failures = Vec::new();
    for case in ["length", "cursor"] {
        let status = Arc::new(std::sync::atomic::AtomicU16::new(503));
        let (url, got) = switchable(status.clone()).await;
        let qdir =
            std::env::temp_dir().join(format!("promnorm-damage-{case}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&qdir);
        let cfg = format!(
            "shutdown_timeout: 2s\n{}",
            queue_yaml(
                &url,
                &format!(
                    "{{type: disk, dir: {}, fsync_interval: 0s}}",
                    qdir.display()
                )
            )
        );
        let mut s = Served::start(&format!("damage-{case}-1"), &cfg, &[], &[]).await;
        for ts in 1..=600 {
            post_ok(&s.url("/api/v1/write"), batch(ts, 1, 0)).await;
        }
        s.stop_timed(Duration::from_secs(10)).await;
        let seg = segment_of(&qdir);
        let want = if case == "length" {
            let mut data = std::fs::read(&seg).unwrap();
            let f = frames(&data);
            assert_eq!(f.len(), 600);
            data[f[100].1 + 1] ^= 0x01;
            std::fs::write(&seg, &data).unwrap();
            599
        } else {
            std::fs::write(qdir.join("shard-0").join("cursor"), "99999 0\n").unwrap();
            600
        };
        status.store(204, std::sync::atomic::Ordering::SeqCst);
        let s = Served::start(&format!("damage-{case}-2"), &cfg, &[], &[]).await;
        let samples = wait_for_samples(&got, want, Duration::from_secs(20)).await;
        let metrics = get(&s.url("/metrics")).await.body;
        let corrupt = metrics
            .lines()
            .find(|l| l.starts_with("promnorm_queue_corrupt_records_total{backend=\"q\"}"))
            .unwrap_or("none")
            .to_string();
        eprintln!(
            "{case}: {} of 600 records delivered; {corrupt}",
            samples.len()
        );
        let counted = if case == "length" {
            corrupt.ends_with(" 1")
        } else {
            s.logs().contains("queue cursor")
        };
        if samples.len() != want || !counted {
            failures.push(format!(
                "{case}: {} of 600 delivered, {corrupt}: {}",
                samples.len(),
                s.logs()
            ));
        }
        drop(s);
        let _ = std::fs::remove_dir_all(&qdir);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A scrape target a reload removes gets its staleness markers (its series and its
/// report series, bit for bit) and leaves `/api/v1/targets` and `/targets`; the one
/// kept goes on being scraped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_removed_by_reload_gets_staleness_markers_and_leaves_the_status() {
    let a = common::procs::serve_exposition("kept_gauge 1\n".into()).await;
    let b = common::procs::serve_exposition("removed_gauge{x=\"y\"} 2\n".into()).await;
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let target = |addr: SocketAddr, job: &str| {
        format!("    - url: http://{addr}/metrics\n      labels: {{job: {job}}}\n")
    };
    let scrape = "scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n";
    let both = format!(
        "{}{scrape}{}{}",
        backend_yaml(&backend, "1"),
        target(a, "kept"),
        target(b, "removed")
    );
    let s = Served::start("scrape-targets", &both, &[], &["--web.enable-lifecycle"]).await;
    let jobs = |doc: &serde_json::Value| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = doc["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["scrapePool"].as_str().unwrap_or("").to_string(),
                    t["health"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let up = |job: &str| (job.to_string(), "up".to_string());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc: serde_json::Value =
            serde_json::from_str(&get(&s.url("/api/v1/targets")).await.body).unwrap();
        if jobs(&doc) == [up("kept"), up("removed")] {
            break;
        }
        assert!(Instant::now() < deadline, "{doc}\n{}", s.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = get(&s.url("/targets")).await.body;
    assert!(page.contains(&format!("http://{b}/metrics")), "{page}");

    s.write_config(&format!(
        "{}{scrape}{}",
        backend_yaml(&backend, "1"),
        target(a, "kept")
    ));
    let r = common::post(&s.url("/-/reload"), vec![], &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let stale = |name: &str| {
        received(&rec).iter().any(|(n, labels, _, v)| {
            n == name
                && labels.contains(&("job".to_string(), "removed".to_string()))
                && v.to_bits() == promnorm::wire::STALE_NAN_BITS
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(stale("removed_gauge") && stale("up") && stale("scrape_samples_scraped")) {
        assert!(
            Instant::now() < deadline,
            "no staleness markers: {}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let doc: serde_json::Value =
        serde_json::from_str(&get(&s.url("/api/v1/targets")).await.body).unwrap();
    assert_eq!(jobs(&doc), [up("kept")], "{doc}");
    let page = get(&s.url("/targets")).await.body;
    assert!(!page.contains(&format!("http://{b}/metrics")), "{page}");
    assert!(page.contains(&format!("http://{a}/metrics")), "{page}");
    // The kept target is still scraped after the removal.
    let kept = |rec: &Recorded| {
        received(rec)
            .iter()
            .filter(|(n, _, _, v)| n == "kept_gauge" && *v == 1.0)
            .count()
    };
    let before = kept(&rec);
    let deadline = Instant::now() + Duration::from_secs(20);
    while kept(&rec) <= before {
        assert!(
            Instant::now() < deadline,
            "kept target not scraped: {}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.logs().contains("scrape target removed"), "{}", s.logs());
}
