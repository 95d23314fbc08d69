//! Helpers shared by the integration tests: request builders, an in-process proxy, a
//! recording fake backend and a tiny HTTP client.
#![allow(dead_code)]

pub mod procs;
pub mod rw2_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use promnorm::config::Config;
use promnorm::server::{Live, router_live, run};
use promnorm::wire::proto::prometheus as pb;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub fn label(n: &str, v: &str) -> pb::Label {
    pb::Label {
        name: n.into(),
        value: v.into(),
    }
}

pub fn series(labels: &[(&str, &str)], samples: &[(f64, i64)]) -> pb::TimeSeries {
    let mut l: Vec<pb::Label> = labels.iter().map(|(n, v)| label(n, v)).collect();
    l.sort_by(|a, b| a.name.cmp(&b.name));
    pb::TimeSeries {
        labels: l,
        samples: samples
            .iter()
            .map(|&(value, timestamp)| pb::Sample { value, timestamp })
            .collect(),
        ..Default::default()
    }
}

pub fn compress(raw: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(raw)
        .expect("snappy compress")
}

pub fn encode(req: &pb::WriteRequest) -> Vec<u8> {
    compress(&req.encode_to_vec())
}

pub fn decode(body: &[u8]) -> pb::WriteRequest {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .expect("snappy");
    pb::WriteRequest::decode(raw.as_slice()).expect("protobuf")
}

/// What the fake backend answers.
#[derive(Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Vec<(&'static str, &'static str)>,
    pub body: &'static str,
    pub delay: Duration,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply {
            status: StatusCode::NO_CONTENT,
            headers: vec![],
            body: "",
            delay: Duration::ZERO,
        }
    }
    pub fn status(code: u16, body: &'static str) -> Reply {
        Reply {
            status: StatusCode::from_u16(code).unwrap(),
            body,
            ..Reply::ok()
        }
    }
}

/// One request the fake backend received: its headers and body.
pub type RecordedRequest = (HeaderMap, Vec<u8>);

#[derive(Clone, Default)]
pub struct Recorded {
    pub bodies: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl Recorded {
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.bodies.lock().unwrap().clone()
    }
}

/// Serves `app` on a free port of 127.0.0.1 until the test ends.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Starts a fake remote-write backend on a free port; returns its write URL.
pub async fn fake_backend(reply: Reply) -> (String, Recorded) {
    let rec = Recorded::default();
    let rec2 = rec.clone();
    let reply = Arc::new(reply);
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let rec = rec2.clone();
            let reply = reply.clone();
            async move {
                rec.bodies.lock().unwrap().push((headers, body.to_vec()));
                tokio::time::sleep(reply.delay).await;
                let mut resp = axum::response::Response::new(axum::body::Body::from(reply.body));
                *resp.status_mut() = reply.status;
                for (k, v) in &reply.headers {
                    resp.headers_mut().insert(*k, v.parse().unwrap());
                }
                resp
            }
        }),
    );
    let addr = serve(app).await;
    (format!("http://{addr}/api/v1/write"), rec)
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Proxy {
    pub fn url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }

    /// Sum of the values of `name`'s lines on the proxy's `/metrics` that contain every
    /// filter.
    pub async fn metric(&self, name: &str, filters: &[&str]) -> f64 {
        get(&format!("http://{}/metrics", self.addr))
            .await
            .body
            .lines()
            .filter(|l| l.starts_with(name) && filters.iter().all(|f| l.contains(f)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Starts promnorm in-process with `extra_yaml` appended to a minimal configuration.
pub async fn start_proxy(backends: &[String], extra_yaml: &str) -> Proxy {
    let mut yaml = String::from("listen: 127.0.0.1:0\n");
    if !backends.is_empty() {
        yaml.push_str("backends:\n");
    }
    for b in backends {
        yaml.push_str(&format!("  - url: {b}\n    timeout: 2s\n"));
    }
    yaml.push_str(extra_yaml);
    start_proxy_yaml(&yaml, Duration::from_secs(5)).await
}

/// Starts promnorm in-process on a whole configuration; on stop it drains for at most
/// `shutdown`.
pub async fn start_proxy_yaml(yaml: &str, shutdown: Duration) -> Proxy {
    let cfg = Config::parse(yaml, "test.yaml").expect("test config parses");
    // The assembly serve and reload use.
    let state = promnorm::app::build(&cfg, None)
        .expect("test config is valid")
        .state;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    state.start_queues().expect("queues open");
    let background = state.spawn_background();
    // The routes serve merges: the server's, the query API's (docs/query.md), the UI's.
    let live = Arc::new(Live::new(state.clone()));
    let app = router_live(live.clone(), &cfg.write_paths)
        .merge(promnorm::query::router(
            live.clone() as Arc<dyn promnorm::query::Source>,
            "",
        ))
        .merge(promnorm::federate::router(
            live.clone() as Arc<dyn promnorm::federate::Source>,
            "",
        ))
        .merge(promnorm::web::router(
            live.clone(),
            &promnorm::web::WebOptions::default(),
        ));
    // The scraper, as serve runs it (idle without `scrape:`).
    let tls = promnorm::forward::tls::client_config(&Default::default()).unwrap();
    let scraper = tokio::spawn(promnorm::scrape::run(
        live as Arc<dyn promnorm::scrape::Host>,
        tls,
    ));
    let done = tokio::spawn(async move {
        let r = run(
            listener,
            state.clone(),
            app,
            async move {
                let _ = rx.await;
            },
            shutdown,
        )
        .await;
        scraper.abort();
        state.stop_background(background, shutdown).await;
        state.stop_queues(shutdown).await;
        r
    });
    Proxy {
        addr,
        stop: Some(tx),
        done,
    }
}

impl Proxy {
    /// Stops the proxy and waits until it has drained.
    pub async fn shut_down(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.done).await;
    }
}

pub struct HttpReply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

pub async fn post(url: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> HttpReply {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = axum::http::Request::post(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    HttpReply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub const RW_HEADERS: &[(&str, &str)] = &[
    ("Content-Encoding", "snappy"),
    ("Content-Type", "application/x-protobuf"),
    ("X-Prometheus-Remote-Write-Version", "0.1.0"),
];

pub async fn get(url: &str) -> HttpReply {
    get_with(url, &[]).await
}

/// `GET url` with these request headers.
pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> HttpReply {
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
    HttpReply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A child process killed (and reaped) when dropped: test servers never outlive a test.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Debian's Prometheus for the end-to-end tests (`PROMETHEUS_BIN`, set by scripts/test.sh).
pub fn prometheus_bin() -> Option<std::path::PathBuf> {
    let p = std::env::var_os("PROMETHEUS_BIN").map(std::path::PathBuf::from)?;
    p.exists().then_some(p)
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Timestamps by series: the value of one label → every sample's timestamp (ms).
pub type SamplesByLabel = std::collections::BTreeMap<String, std::collections::BTreeSet<i64>>;

/// Every sample a Prometheus-compatible server (Prometheus, VictoriaMetrics) holds for
/// `selector` (a range selector, e.g. `qf_total[15m]`, URL-encoded), keyed by the value
/// of `label`.
pub async fn samples_by_label(base: &str, selector: &str, label: &str) -> SamplesByLabel {
    let url = format!("{base}/api/v1/query?query={selector}");
    let v: serde_json::Value = serde_json::from_str(&get(&url).await.body).unwrap_or_default();
    let mut out = SamplesByLabel::new();
    for item in v["data"]["result"].as_array().cloned().unwrap_or_default() {
        let key = item["metric"][label]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for pair in item["values"].as_array().cloned().unwrap_or_default() {
            let ts = pair[0].as_f64().unwrap_or_default();
            out.entry(key.clone())
                .or_default()
                .insert((ts * 1000.0).round() as i64);
        }
    }
    out
}
