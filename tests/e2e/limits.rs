//! The cardinality guard end to end (docs/limits.md): Debian's Prometheus 2.42 scrapes a
//! target exposing 3,000 series of one metric and 20 of another, and remote-writes
//! through a real `promnorm serve` with `max_series_per_metric: 1000` into a real
//! Prometheus. Checked at the receiver, series by series: exactly 1,000 series of the
//! metric over its limit, the same ones scrape after scrape (each with every sample the
//! sender scraped), the other metric whole; and every left-out sample counted in
//! promnorm's `/metrics`.
//!
//! Needs `PROMETHEUS_BIN` (scripts/test.sh fetches it).

use crate::common;

use std::time::{Duration, Instant};

use common::procs::*;
use common::*;

const OVER: usize = 3000;
const LIMIT: usize = 1000;
const OTHER: usize = 20;

fn scratch() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("promnorm-e2e-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_receives_exactly_the_limit_and_the_rest_untouched() {
    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let dir = scratch();
    let rdir = dir.join("receiver");
    std::fs::create_dir_all(&rdir).unwrap();
    let mut receiver = prometheus_receiver(&prom, &rdir);
    receiver.start("/-/ready").await;
    let mut proxy = promnorm_serve(&dir, |port| {
        format!(
            "listen: 127.0.0.1:{port}\nshutdown_timeout: 2s\nlimits:\n  max_series_per_metric: {LIMIT}\nbackends:\n  - url: {}/api/v1/write\n",
            receiver.base
        )
    });
    proxy.start("/-/ready").await;
    let mut text = String::from("# TYPE lim_over gauge\n");
    for i in 0..OVER {
        text.push_str(&format!("lim_over{{request_id=\"r{i:05}\"}} {i}\n"));
    }
    text.push_str("# TYPE lim_other gauge\n");
    for i in 0..OTHER {
        text.push_str(&format!("lim_other{{i=\"{i}\"}} {i}\n"));
    }
    let target = serve_exposition(text).await;
    let mut sender = prometheus_sender(
        &prom,
        &dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {}/api/v1/write\n    queue_config:\n      batch_send_deadline: 250ms\n      min_backoff: 100ms\n      max_backoff: 2s\n",
            proxy.base
        ),
    );
    sender.start("/-/ready").await;
    // At least five scrapes of every series at the sender.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let sent = samples_by_label(&sender.base, "lim_other%5B15m%5D", "i").await;
        let fewest = sent.values().map(|t| t.len()).min().unwrap_or(0);
        if (sent.len() == OTHER && fewest >= 5) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 1500;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (over, other, missing) = loop {
        let sent_over = samples_by_label(&sender.base, "lim_over%5B15m%5D", "request_id").await;
        let got_over = samples_by_label(&receiver.base, "lim_over%5B15m%5D", "request_id").await;
        let sent_other = samples_by_label(&sender.base, "lim_other%5B15m%5D", "i").await;
        let got_other = samples_by_label(&receiver.base, "lim_other%5B15m%5D", "i").await;
        // Every scraped sample of an admitted series, and of the other metric, arrived.
        let mut missing = 0;
        for (sent, got) in [(&sent_over, &got_over), (&sent_other, &got_other)] {
            for (k, ts) in got.keys().filter_map(|k| Some((k, sent.get(k)?))) {
                missing += ts.range(..=until).filter(|t| !got[k].contains(t)).count();
            }
        }
        missing += sent_other.len() - got_other.len().min(sent_other.len());
        if (got_over.len() == LIMIT && got_other.len() == OTHER && missing == 0)
            || Instant::now() > deadline
        {
            break (got_over, got_other.len(), missing);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let left_out = {
        let body = get(&format!("{}/metrics", proxy.base)).await.body;
        body.lines()
            .find_map(|l| {
                l.strip_prefix(
                    r#"promnorm_samples_dropped_total{reason="max_series_per_metric"} "#,
                )?
                .parse::<f64>()
                .ok()
            })
            .unwrap_or(0.0)
    };
    let scrapes = over.values().map(|t| t.len()).max().unwrap_or(0);
    eprintln!(
        "e2e limits: {} series of lim_over at the receiver (limit {LIMIT}, {OVER} exposed), {other} of {OTHER} of lim_other, {missing} samples missing, {left_out} samples left out and counted, up to {scrapes} samples a series",
        over.len()
    );
    assert_eq!(over.len(), LIMIT, "exactly the limit reached the receiver");
    assert_eq!(other, OTHER, "the other metric untouched");
    assert_eq!(missing, 0, "admitted series lost nothing");
    // The same 1,000 every scrape: every admitted series has (about) every scrape.
    let fewest = over.values().map(|t| t.len()).min().unwrap_or(0);
    assert!(
        fewest + 2 >= scrapes,
        "series changed between scrapes: {fewest} vs {scrapes}"
    );
    assert!(
        left_out >= ((OVER - LIMIT) * 4) as f64,
        "left-out samples counted: {left_out}"
    );
    sender.kill();
    proxy.kill();
    receiver.kill();
    let _ = std::fs::remove_dir_all(&dir);
}
