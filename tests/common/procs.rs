//! Real processes for the end-to-end tests: Debian's Prometheus (sender and receivers),
//! `promnorm serve`, started, killed and restarted by the tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Bytes;

use super::{Killed, free_port};

/// The binary `var` names (`PROMETHEUS_BIN`, `VICTORIA_METRICS_BIN`, set by
/// scripts/test.sh); `None` skips the test, unless `PROMNORM_E2E=1`.
pub fn binary(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var).map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        _ if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") => {
            panic!("PROMNORM_E2E=1 but {var} is not set to an existing binary")
        }
        _ => {
            eprintln!("SKIPPED: set {var} (scripts/test.sh does) to run this end-to-end test");
            None
        }
    }
}

/// A process the test can kill and start again with the same arguments (and data).
pub struct Proc {
    pub bin: PathBuf,
    pub args: Vec<String>,
    pub base: String,
    pub child: Option<Killed>,
}

impl Proc {
    pub fn new(bin: &Path, args: Vec<String>, port: u16) -> Proc {
        Proc {
            bin: bin.to_path_buf(),
            args,
            base: format!("http://127.0.0.1:{port}"),
            child: None,
        }
    }

    pub async fn start(&mut self, ready_path: &str) {
        self.child = Some(Killed(
            Command::new(&self.bin)
                .args(&self.args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start"),
        ));
        let up = Instant::now() + Duration::from_secs(30);
        while status_of(&format!("{}{ready_path}", self.base)).await != 200 {
            assert!(Instant::now() < up, "{} did not start", self.bin.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL, reaped.
    pub fn kill(&mut self) {
        self.child = None;
    }
}

pub async fn status_of(url: &str) -> u16 {
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = axum::http::Request::get(url)
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(2), client.request(req)).await {
        Ok(Ok(r)) => r.status().as_u16(),
        _ => 0,
    }
}

/// A Prometheus that accepts remote writes (`--web.enable-remote-write-receiver`).
pub fn prometheus_receiver(prom: &Path, dir: &Path) -> Proc {
    let port = free_port();
    std::fs::write(dir.join("receiver.yml"), "global: {}\n").unwrap();
    Proc::new(
        prom,
        vec![
            format!("--config.file={}", dir.join("receiver.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--web.enable-remote-write-receiver".into(),
            "--log.level=error".into(),
        ],
        port,
    )
}

/// `promnorm serve` on the configuration `config(port)` writes (its `promnorm.yml` in
/// `dir`), listening on a free `port`. Start it with `.start("/-/ready")`.
pub fn promnorm_serve(dir: &Path, config: impl FnOnce(u16) -> String) -> Proc {
    let port = free_port();
    std::fs::write(dir.join("promnorm.yml"), config(port)).unwrap();
    Proc::new(
        Path::new(env!("CARGO_BIN_EXE_promnorm")),
        vec![
            "serve".into(),
            format!("--config={}", dir.join("promnorm.yml").display()),
        ],
        port,
    )
}

/// A Prometheus that scrapes and remote-writes as `config` (its `sender.yml`) says,
/// its data under `dir/sender-data`. Start it with `.start("/-/ready")`.
pub fn prometheus_sender(prom: &Path, dir: &Path, config: &str) -> Proc {
    let port = free_port();
    std::fs::write(dir.join("sender.yml"), config).unwrap();
    Proc::new(
        prom,
        vec![
            format!("--config.file={}", dir.join("sender.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("sender-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=error".into(),
        ],
        port,
    )
}

/// A scrape target serving `text` (an exposition) at `/metrics`.
pub async fn serve_exposition(text: String) -> std::net::SocketAddr {
    let text = std::sync::Arc::new(text);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let t = text.clone();
            async move { (*t).clone() }
        }),
    );
    super::serve(app).await
}
