//! What each target's last scrape did, for `GET /api/v1/targets` (Prometheus' answer
//! format, so tools written for Prometheus' agent read it) and the UI's targets page.
//! One entry per running target: added when its loop starts, removed when it stops.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::TargetSpec;

/// A target's health after its last scrape (`unknown` before the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Up,
    Down,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        }
    }
}

/// One running target as the status shows it.
#[derive(Debug, Clone)]
pub struct TargetState {
    /// The URL scraped, `params` included.
    pub scrape_url: String,
    /// The labels its series get (`job` and `instance` included), sorted.
    pub labels: Vec<(String, String)>,
    pub health: Health,
    /// Why the last scrape failed; empty when it did not.
    pub last_error: String,
    /// When the last scrape started (Unix milliseconds).
    pub last_scrape_ms: Option<i64>,
    pub last_duration_seconds: f64,
    /// Samples the last scrape read.
    pub last_samples: u64,
    pub interval: Duration,
    pub timeout: Duration,
}

/// A scrape's result, as its loop records it.
pub struct Scraped<'a> {
    pub up: bool,
    pub error: Option<&'a str>,
    pub at_ms: i64,
    pub duration_seconds: f64,
    pub samples: u64,
    pub interval: Duration,
    pub timeout: Duration,
}

/// Every running target's state; outlives reloads (the scraper keeps its targets
/// across them).
#[derive(Default)]
pub struct Targets {
    running: Mutex<BTreeMap<TargetSpec, TargetState>>,
}

impl Targets {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TargetSpec, TargetState>> {
        // A panic elsewhere while holding it leaves only a status table behind.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A target's loop started: `unknown` until its first scrape.
    pub fn started(&self, spec: &TargetSpec, interval: Duration, timeout: Duration) {
        let mut labels = super::target_labels(spec);
        labels.sort();
        self.lock().insert(
            spec.clone(),
            TargetState {
                scrape_url: spec.scrape_url(),
                labels,
                health: Health::Unknown,
                last_error: String::new(),
                last_scrape_ms: None,
                last_duration_seconds: 0.0,
                last_samples: 0,
                interval,
                timeout,
            },
        );
    }

    pub fn scraped(&self, spec: &TargetSpec, s: &Scraped<'_>) {
        if let Some(t) = self.lock().get_mut(spec) {
            t.health = if s.up { Health::Up } else { Health::Down };
            t.last_error = s.error.unwrap_or_default().to_string();
            t.last_scrape_ms = Some(s.at_ms);
            t.last_duration_seconds = s.duration_seconds;
            t.last_samples = s.samples;
            t.interval = s.interval;
            t.timeout = s.timeout;
        }
    }

    /// A target's loop stopped (removed from the configuration or its `file_sd` file).
    pub fn stopped(&self, spec: &TargetSpec) {
        self.lock().remove(spec);
    }

    /// Every running target, in a stable order (by URL, then labels).
    pub fn snapshot(&self) -> Vec<(TargetSpec, TargetState)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// `GET /api/v1/targets` as Prometheus answers it: `activeTargets` (every running
/// target), `droppedTargets` (always empty: promnorm has no relabelling that drops
/// targets). `state` is the query's `state` (`active`, `dropped`, `any`; absent: any).
pub fn api_document(targets: &[(TargetSpec, TargetState)], state: Option<&str>) -> String {
    let active = !matches!(state, Some("dropped"));
    let list: Vec<serde_json::Value> = if active {
        targets
            .iter()
            .map(|(spec, t)| active_target(spec, t))
            .collect()
    } else {
        Vec::new()
    };
    serde_json::json!({
        "status": "success",
        "data": {"activeTargets": list, "droppedTargets": []},
    })
    .to_string()
}

fn active_target(spec: &TargetSpec, t: &TargetState) -> serde_json::Value {
    let labels: serde_json::Map<String, serde_json::Value> = t
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let pool = t
        .labels
        .iter()
        .find(|(k, _)| k == "job")
        .map_or("", |(_, v)| v.as_str());
    serde_json::json!({
        "discoveredLabels": discovered_labels(spec),
        "labels": labels,
        "scrapePool": pool,
        "scrapeUrl": t.scrape_url,
        "globalUrl": t.scrape_url,
        "lastError": t.last_error,
        "lastScrape": t.last_scrape_ms.map_or_else(|| "0001-01-01T00:00:00Z".to_string(), rfc3339_ms),
        "lastScrapeDuration": t.last_duration_seconds,
        "lastSamplesScraped": t.last_samples,
        "health": t.health.as_str(),
        "scrapeInterval": prom_duration(t.interval),
        "scrapeTimeout": prom_duration(t.timeout),
    })
}

/// The labels a target was configured with, with Prometheus' `__address__`,
/// `__scheme__`, `__metrics_path__` and `__param_<name>` (first value) spelled out.
fn discovered_labels(spec: &TargetSpec) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    if let Ok(uri) = spec.url.parse::<http::Uri>() {
        let s = |v: &str| serde_json::Value::String(v.to_string());
        out.insert(
            "__address__".into(),
            s(uri.authority().map_or("", |a| a.as_str())),
        );
        out.insert("__scheme__".into(), s(uri.scheme_str().unwrap_or("http")));
        out.insert("__metrics_path__".into(), s(uri.path()));
    }
    for (name, values) in &spec.params {
        if let Some(first) = values.first() {
            out.insert(
                format!("__param_{name}"),
                serde_json::Value::String(first.clone()),
            );
        }
    }
    for (k, v) in &spec.labels {
        out.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    out
}

/// A duration as Prometheus' `model.Duration` writes it: `15s`, `1m30s`, `250ms`.
fn prom_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

/// Unix milliseconds → `2026-12-07T20:15:03.123Z`.
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_in_utc() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_674_503_123), "2026-12-07T20:15:03.123Z");
        assert_eq!(prom_duration(Duration::from_millis(90_250)), "1m30s250ms");
        assert_eq!(prom_duration(Duration::from_secs(3600)), "1h");
    }

    #[test]
    fn the_api_document_has_prometheus_fields() {
        let spec = TargetSpec {
            url: "http://10.0.0.1:8000/metrics".into(),
            labels: [("job".to_string(), "vllm".to_string())].into(),
            params: [("module".to_string(), vec!["gpu".to_string()])].into(),
        };
        let t = Targets::default();
        t.started(&spec, Duration::from_secs(15), Duration::from_secs(10));
        let doc: serde_json::Value =
            serde_json::from_str(&api_document(&t.snapshot(), None)).unwrap();
        let a = &doc["data"]["activeTargets"][0];
        assert_eq!(a["health"], "unknown");
        assert_eq!(a["scrapePool"], "vllm");
        assert_eq!(a["scrapeUrl"], "http://10.0.0.1:8000/metrics?module=gpu");
        assert_eq!(a["labels"]["instance"], "10.0.0.1:8000");
        assert_eq!(a["discoveredLabels"]["__param_module"], "gpu");
        assert_eq!(a["discoveredLabels"]["__address__"], "10.0.0.1:8000");
        assert_eq!(a["scrapeInterval"], "15s");
        t.scraped(
            &spec,
            &Scraped {
                up: false,
                error: Some("server returned HTTP status 500"),
                at_ms: 0,
                duration_seconds: 0.5,
                samples: 0,
                interval: Duration::from_secs(15),
                timeout: Duration::from_secs(10),
            },
        );
        let doc: serde_json::Value =
            serde_json::from_str(&api_document(&t.snapshot(), Some("active"))).unwrap();
        let a = &doc["data"]["activeTargets"][0];
        assert_eq!(a["health"], "down");
        assert_eq!(a["lastError"], "server returned HTTP status 500");
        assert_eq!(a["lastScrape"], "1970-01-01T00:00:00.000Z");
        let dropped: serde_json::Value =
            serde_json::from_str(&api_document(&t.snapshot(), Some("dropped"))).unwrap();
        assert_eq!(
            dropped["data"]["activeTargets"].as_array().unwrap().len(),
            0
        );
        t.stopped(&spec);
        assert!(t.snapshot().is_empty());
    }
}
