//! TLS on the listener (`server.tls`): a real client (curl) over HTTP/1.1 and HTTP/2
//! (ALPN), mutual TLS, certificates re-read when their files change (a bad new file
//! keeps the old certificate), check-config positions, and the real Prometheus sender
//! remote-writing with `tls_config`. Certificates are generated in the test (rcgen).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use promnorm::wire::proto::prometheus as pb;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// A CA and what it signed, as PEM.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// (certificate PEM, key PEM) for `names`, for a server or a client.
    fn issue(&self, names: &[&str], client: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn tmpdir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "promnorm-tls-{what}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn body_file(dir: &Path) -> PathBuf {
    let req = pb::WriteRequest {
        timeseries: vec![series(
            &[("__name__", "up"), ("job", "tls")],
            &[(1.0, 1000)],
        )],
        ..Default::default()
    };
    let p = dir.join("body.bin");
    std::fs::write(&p, encode(&req)).unwrap();
    p
}

/// curl's `%{http_code} %{http_version}`, or `Err(exit code, stderr)` when it failed.
async fn curl(args: Vec<String>) -> Result<String, (i32, String)> {
    tokio::task::spawn_blocking(move || {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
            ])
            .args(["--max-time", "10"])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("curl is installed");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err((
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ))
        }
    })
    .await
    .unwrap()
}

fn post_args(url: &str, ca: &Path, body: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--cacert".into(),
        ca.display().to_string(),
        "--data-binary".into(),
        format!("@{}", body.display()),
        "-H".into(),
        "Content-Encoding: snappy".into(),
        "-H".into(),
        "Content-Type: application/x-protobuf".into(),
        "-H".into(),
        "X-Prometheus-Remote-Write-Version: 0.1.0".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push(url.to_string());
    a
}

fn tls_yaml(cert: &Path, key: &Path, client_ca: Option<&Path>) -> String {
    let mut y = format!(
        "server:\n  tls:\n    cert_file: {}\n    key_file: {}\n",
        cert.display(),
        key.display()
    );
    if let Some(ca) = client_ca {
        y.push_str(&format!("    client_ca_file: {}\n", ca.display()));
    }
    y
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_posts_remote_write_over_https_with_http1_and_h2() {
    let dir = tmpdir("curl");
    let ca = Ca::new("promnorm test CA");
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"], false);
    let (ca_file, cert_file, key_file) = (
        write(&dir, "ca.pem", &ca.pem),
        write(&dir, "cert.pem", &cert),
        write(&dir, "key.pem", &key),
    );
    let body = body_file(&dir);
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let p = start_proxy(&[backend], &tls_yaml(&cert_file, &key_file, None)).await;
    let url = format!("https://127.0.0.1:{}/api/v1/write", p.addr.port());
    assert_eq!(
        curl(post_args(&url, &ca_file, &body, &["--http1.1"]))
            .await
            .unwrap(),
        "204 1.1"
    );
    assert_eq!(
        curl(post_args(&url, &ca_file, &body, &["--http2"]))
            .await
            .unwrap(),
        "204 2"
    );
    assert_eq!(rec.requests().len(), 2);
    // Cleartext on the TLS port is not served.
    let plain = format!("http://127.0.0.1:{}/api/v1/write", p.addr.port());
    let r = curl(post_args(&plain, &ca_file, &body, &[])).await;
    assert!(r.as_ref().map_or(true, |s| !s.starts_with("204")), "{r:?}");
    // A client that does not trust the CA refuses the server.
    let other = write(&dir, "other-ca.pem", &Ca::new("other").pem);
    assert!(curl(post_args(&url, &other, &body, &[])).await.is_err());
    assert_eq!(rec.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate_from_the_ca() {
    let dir = tmpdir("mtls");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (cert, key) = server_ca.issue(&["localhost", "127.0.0.1"], false);
    let (ccert, ckey) = client_ca.issue(&["sender"], true);
    let (rogue_cert, rogue_key) = Ca::new("rogue CA").issue(&["sender"], true);
    let ca_file = write(&dir, "ca.pem", &server_ca.pem);
    let client_ca_file = write(&dir, "client-ca.pem", &client_ca.pem);
    let (cert_file, key_file) = (write(&dir, "cert.pem", &cert), write(&dir, "key.pem", &key));
    let (ccert_file, ckey_file) = (
        write(&dir, "client.pem", &ccert),
        write(&dir, "client-key.pem", &ckey),
    );
    let (rcert_file, rkey_file) = (
        write(&dir, "rogue.pem", &rogue_cert),
        write(&dir, "rogue-key.pem", &rogue_key),
    );
    let body = body_file(&dir);
    let (backend, rec) = fake_backend(Reply::ok()).await;
    let p = start_proxy(
        &[backend],
        &tls_yaml(&cert_file, &key_file, Some(&client_ca_file)),
    )
    .await;
    let url = format!("https://127.0.0.1:{}/api/v1/write", p.addr.port());
    let without = curl(post_args(&url, &ca_file, &body, &[])).await;
    assert!(without.is_err(), "no client certificate: {without:?}");
    let rogue = curl(post_args(
        &url,
        &ca_file,
        &body,
        &[
            "--cert",
            &rcert_file.display().to_string(),
            "--key",
            &rkey_file.display().to_string(),
        ],
    ))
    .await;
    assert!(rogue.is_err(), "certificate of another CA: {rogue:?}");
    assert!(rec.requests().is_empty());
    for version in ["--http1.1", "--http2"] {
        let with = curl(post_args(
            &url,
            &ca_file,
            &body,
            &[
                version,
                "--cert",
                &ccert_file.display().to_string(),
                "--key",
                &ckey_file.display().to_string(),
            ],
        ))
        .await;
        assert!(
            with.as_deref().is_ok_and(|s| s.starts_with("204")),
            "{with:?}"
        );
    }
    assert_eq!(rec.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_reloaded_when_their_files_change() {
    let dir = tmpdir("reload");
    let ca1 = Ca::new("first CA");
    let ca2 = Ca::new("second CA");
    let (cert1, key1) = ca1.issue(&["127.0.0.1"], false);
    let (cert2, key2) = ca2.issue(&["127.0.0.1"], false);
    let (ca1_file, ca2_file) = (
        write(&dir, "ca1.pem", &ca1.pem),
        write(&dir, "ca2.pem", &ca2.pem),
    );
    let (cert_file, key_file) = (
        write(&dir, "cert.pem", &cert1),
        write(&dir, "key.pem", &key1),
    );
    let body = body_file(&dir);
    let (backend, _) = fake_backend(Reply::ok()).await;
    let p = start_proxy(&[backend], &tls_yaml(&cert_file, &key_file, None)).await;
    let url = format!("https://127.0.0.1:{}/api/v1/write", p.addr.port());
    assert!(curl(post_args(&url, &ca1_file, &body, &[])).await.is_ok());
    assert!(curl(post_args(&url, &ca2_file, &body, &[])).await.is_err());

    // Rotate: new key and certificate from another CA, no restart.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    std::fs::write(&key_file, &key2).unwrap();
    std::fs::write(&cert_file, &cert2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The files are looked at, at most once a second, when a connection arrives.
        if curl(post_args(&url, &ca2_file, &body, &[])).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(curl(post_args(&url, &ca1_file, &body, &[])).await.is_err());

    // A broken new file keeps the current certificate.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    std::fs::write(&cert_file, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for _ in 0..3 {
        let r = curl(post_args(&url, &ca2_file, &body, &[])).await;
        assert!(r.as_deref().is_ok_and(|s| s.starts_with("204 ")), "{r:?}");
    }
}

#[test]
fn check_config_names_the_position_of_a_bad_tls_file() {
    let dir = tmpdir("check");
    let ca = Ca::new("check CA");
    let (cert, key) = ca.issue(&["localhost"], false);
    let cert_file = write(&dir, "cert.pem", &cert);
    let key_file = write(&dir, "key.pem", &key);
    let garbage = write(&dir, "garbage.pem", "this is not PEM\n");
    let (_, other_key) = ca.issue(&["localhost"], false);
    let other_key_file = write(&dir, "other-key.pem", &other_key);
    let missing = dir.join("missing.pem");
    let check = |yaml: String| {
        let cfg = promnorm::config::Config::parse(&yaml, "tls.yaml").unwrap();
        cfg.check().map(|_| ()).map_err(|e| e.to_string())
    };
    check(tls_yaml(&cert_file, &key_file, None)).unwrap();
    check(tls_yaml(&cert_file, &key_file, Some(&cert_file))).unwrap();
    for (yaml, line, key, why) in [
        (
            tls_yaml(&missing, &key_file, None),
            3,
            "cert_file",
            "cannot read",
        ),
        (
            tls_yaml(&garbage, &key_file, None),
            3,
            "cert_file",
            "no PEM certificate",
        ),
        (
            tls_yaml(&cert_file, &missing, None),
            4,
            "key_file",
            "cannot read",
        ),
        (
            tls_yaml(&cert_file, &cert_file, None),
            4,
            "key_file",
            "no PEM private key",
        ),
        (
            tls_yaml(&cert_file, &other_key_file, None),
            4,
            "key_file",
            "does not fit",
        ),
        (
            tls_yaml(&cert_file, &key_file, Some(&garbage)),
            5,
            "client_ca_file",
            "no PEM certificate",
        ),
    ] {
        let err = check(yaml).unwrap_err();
        let col = if key == "client_ca_file" {
            21
        } else if key == "cert_file" {
            16
        } else {
            15
        };
        assert!(
            err.starts_with(&format!("tls.yaml:{line}:{col}: server.tls.{key}: ")),
            "{err}"
        );
        assert!(err.contains(why), "{err}");
    }
    // The key's contents never appear in an error.
    let err = check(tls_yaml(&key_file, &key_file, None)).unwrap_err();
    let body: String = key.lines().nth(1).unwrap().into();
    assert!(!err.contains(&body), "{err}");
}

/// Debian's Prometheus 2.42 remote-writes through promnorm over TLS (`tls_config:
/// {ca_file}`) and over mutual TLS (`cert_file`, `key_file` too); its samples arrive at
/// the test backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_prometheus_remote_writes_over_tls_and_mutual_tls() {
    let Some(prom) = prometheus_bin() else {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!("PROMNORM_E2E=1 but PROMETHEUS_BIN is not set to an existing binary");
        }
        eprintln!("SKIPPED: set PROMETHEUS_BIN (scripts/test.sh does) to run the end-to-end test");
        return;
    };
    let dir = tmpdir("prom");
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (cert, key) = server_ca.issue(&["localhost", "127.0.0.1"], false);
    let (ccert, ckey) = client_ca.issue(&["prometheus"], true);
    let ca_file = write(&dir, "ca.pem", &server_ca.pem);
    let client_ca_file = write(&dir, "client-ca.pem", &client_ca.pem);
    let (cert_file, key_file) = (write(&dir, "cert.pem", &cert), write(&dir, "key.pem", &key));
    let (ccert_file, ckey_file) = (
        write(&dir, "client.pem", &ccert),
        write(&dir, "client-key.pem", &ckey),
    );
    let (b1, rec1) = fake_backend(Reply::ok()).await;
    let (b2, rec2) = fake_backend(Reply::ok()).await;
    let tls = start_proxy(&[b1], &tls_yaml(&cert_file, &key_file, None)).await;
    let mtls = start_proxy(
        &[b2],
        &tls_yaml(&cert_file, &key_file, Some(&client_ca_file)),
    )
    .await;
    let port = free_port();
    let cfg = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: self\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n\
         remote_write:\n\
         \x20 - url: https://127.0.0.1:{}/api/v1/write\n    tls_config:\n      ca_file: {}\n    queue_config: {{batch_send_deadline: 1s}}\n\
         \x20 - url: https://127.0.0.1:{}/api/v1/write\n    tls_config:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n    queue_config: {{batch_send_deadline: 1s}}\n",
        tls.addr.port(),
        ca_file.display(),
        mtls.addr.port(),
        ca_file.display(),
        ccert_file.display(),
        ckey_file.display()
    );
    let cfg_file = write(&dir, "prometheus.yml", &cfg);
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prom = Killed(
        Command::new(&prom)
            .arg(format!("--config.file={}", cfg_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let has_up = |rec: &Recorded| {
        rec.requests().iter().any(|(_, body)| {
            decode(body).timeseries.iter().any(|ts| {
                ts.labels
                    .iter()
                    .any(|l| l.name == "__name__" && l.value == "up")
                    && ts.samples.iter().any(|s| s.value == 1.0)
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(has_up(&rec1) && has_up(&rec2)) {
        assert!(
            Instant::now() < deadline,
            "samples did not arrive over TLS ({}) and mutual TLS ({}); prometheus log:\n{}",
            rec1.requests().len(),
            rec2.requests().len(),
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
