//! The operations assets under `deploy/` checked against the code they describe:
//! every metric of promnorm's own (`promnorm_*`, `process_*`) a dashboard or alert
//! queries is one `src/` emits (a renamed metric breaks this test), and is in the
//! `/metrics` of a running `promnorm serve` (a live scrape); the inference dashboard queries only names promnorm
//! writes after normalisation (golden outputs, packs, README's derived series), never a
//! name a pack renames away; the Kubernetes manifests parse, agree with each other
//! (kustomizations, ports, probes, the HPA's target, the StatefulSet's pod template is the
//! Deployment's, the Prometheus Operator sidecar writes to its promnorm) and the
//! configuration in their ConfigMaps passes `Config::validate`. Their schemas are checked
//! by scripts/test.sh (kubernetes-validate). With `PROMETHEUS_BIN` set (scripts/test.sh
//! sets it), promtool (beside it) also checks the PromQL and runs the alerts' unit tests.

use crate::common;

use promnorm::app::Assemble;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use promnorm::config::Config;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: impl AsRef<Path>) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Files under `dir` (recursively) whose name ends with `suffix`, sorted.
fn files_under(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("listing {}: {e}", d.display()))
                .path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// YAML through the crate's one YAML entry point, into a JSON value (the assets use
/// string keys only).
fn yaml(rel: &str) -> Value {
    let text = read(rel);
    promnorm::config::yaml::from_str::<Value>(&text)
        .unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}"))
}

fn json(rel: &str) -> Value {
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not valid JSON: {e}"))
}

/// Maximal runs of `[A-Za-z0-9_:]` that start with a letter, `_` or `:`: metric and
/// label names, functions, keywords (`5m` or `1m:30s` are not identifiers).
fn identifiers(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':'))
        .collect()
}

/// PromQL with its string literals (label values, regexes) blanked out, so only names
/// are left to extract.
fn without_strings(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expr.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q != '`' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
                out.push(' ');
            }
            None if c == '"' || c == '\'' || c == '`' => {
                quote = Some(c);
                out.push(' ');
            }
            None => out.push(c),
        }
    }
    out
}

/// The name itself, then without one histogram/summary/counter suffix.
fn name_forms(name: &str) -> Vec<&str> {
    let mut forms = vec![name];
    for suffix in ["_bucket", "_sum", "_count", "_total"] {
        if let Some(base) = name.strip_suffix(suffix) {
            forms.push(base);
        }
    }
    forms
}

/// Every identifier in the Rust sources under `src/`.
fn source_identifiers() -> BTreeSet<String> {
    let files = files_under(&root().join("src"), ".rs");
    assert!(!files.is_empty(), "no Rust sources found under src/");
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f)
                .unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
            identifiers(&text)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// promnorm's own names (`promnorm_*`, and the `process_*` ones it exports) in `exprs`
/// that no source file under `src/` mentions, with where each was used.
fn unknown_own_metrics<'a>(
    exprs: impl IntoIterator<Item = (String, &'a str)>,
    known: &BTreeSet<String>,
) -> (BTreeSet<String>, Vec<String>) {
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (place, expr) in exprs {
        for name in identifiers(&without_strings(expr)) {
            if !(name.starts_with("promnorm_") || name.starts_with("process_")) {
                continue;
            }
            used.insert(name.to_string());
            if !name_forms(name).iter().any(|f| known.contains(*f)) {
                unknown.push(format!("{name} (in {place})"));
            }
        }
    }
    (used, unknown)
}

/// Every panel of a dashboard, panels nested in collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .map(|a| a.iter().rev().collect())
        .unwrap_or_default();
    while let Some(p) = stack.pop() {
        if let Some(nested) = p["panels"].as_array() {
            stack.extend(nested.iter().rev());
        }
        out.push(p);
    }
    out
}

fn panel_title(p: &Value) -> String {
    format!(
        "panel {} {:?}",
        p["id"],
        p["title"].as_str().unwrap_or("<untitled>")
    )
}

/// (place, PromQL) of every panel target and every query variable of a dashboard.
fn dashboard_queries(rel: &str, dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((
                    format!("{rel} {} target {}", panel_title(p), t["refId"]),
                    expr.to_string(),
                ));
            }
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"].as_str().or(v["query"].as_str());
        if let Some(q) = query {
            out.push((format!("{rel} variable {}", v["name"]), q.to_string()));
        }
    }
    out
}

/// The common shape of both dashboards: schema, data source variable, panels with a
/// query each, unique ids.
fn check_dashboard(rel: &str, variables: &[&str]) -> Value {
    let d = json(rel);
    assert_eq!(d["schemaVersion"], 39, "{rel}: schemaVersion");
    assert!(
        d["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{rel}: the dashboard needs a uid"
    );
    let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v)))
        .collect();
    for name in variables {
        assert!(
            vars.contains_key(name),
            "{rel}: variable ${name} is missing"
        );
    }
    let ds = vars
        .get("datasource")
        .unwrap_or_else(|| panic!("{rel}: variable $datasource is missing"));
    assert_eq!(ds["type"], "datasource", "{rel}: $datasource type");
    assert_eq!(ds["query"], "prometheus", "{rel}: $datasource plugin");

    let mut ids = BTreeSet::new();
    let all = panels(&d);
    assert!(!all.is_empty(), "{rel}: no panels");
    for p in all {
        let title = panel_title(p);
        assert!(
            ids.insert(p["id"].to_string()),
            "{rel}: {title}: duplicate panel id"
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{rel}: {title} must query the $datasource variable"
        );
        let targets = p["targets"].as_array();
        assert!(
            targets.is_some_and(|ts| ts
                .iter()
                .any(|t| t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()))),
            "{rel}: {title} has no target with a non-empty expr"
        );
        for t in targets.into_iter().flatten() {
            let ds = &t["datasource"];
            assert!(
                ds.is_null() || ds["uid"] == "${datasource}",
                "{rel}: {title} target {} must use the $datasource variable",
                t["refId"]
            );
        }
    }
    d
}

#[test]
fn promnorm_dashboard_queries_only_metrics_promnorm_emits() {
    let rel = "deploy/grafana/promnorm.json";
    let d = check_dashboard(rel, &["datasource", "job", "instance"]);
    let known = source_identifiers();
    let queries = dashboard_queries(rel, &d);
    let (used, unknown) =
        unknown_own_metrics(queries.iter().map(|(p, e)| (p.clone(), e.as_str())), &known);
    assert!(
        unknown.is_empty(),
        "promnorm.json queries metrics that no file under src/ emits (renamed or removed?):\n  {}",
        unknown.join("\n  ")
    );
    // The issue's list: the dashboard covers each of these.
    for expected in [
        "promnorm_samples_received_total",
        "promnorm_samples_forwarded_total",
        "promnorm_samples_dropped_total",
        "promnorm_series_renamed_total",
        "promnorm_series_rescaled_total",
        "promnorm_requests_total",
        "promnorm_backend_request_duration_seconds_bucket",
        "promnorm_backend_requests_total",
        "promnorm_backend_misconfigured",
        "promnorm_http_connections_open",
        "promnorm_derived_state_series",
        "promnorm_derived_evictions_total",
        "promnorm_derived_samples_total",
        "promnorm_build_info",
        "promnorm_config_last_reload_successful",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ] {
        assert!(
            used.contains(expected),
            "promnorm.json has no panel on {expected}"
        );
    }
}

#[test]
fn alerts_are_complete_and_use_emitted_metrics() {
    let rel = "deploy/prometheus/alerts.yml";
    let doc = yaml(rel);
    let groups = doc["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("{rel}: no `groups` list"));
    let known = source_identifiers();
    let mut exprs = Vec::new();
    let mut names = BTreeSet::new();
    for g in groups {
        let group = g["name"].as_str().unwrap_or("<unnamed group>");
        let rules = g["rules"]
            .as_array()
            .unwrap_or_else(|| panic!("{rel}: group {group} has no `rules` list"));
        assert!(!rules.is_empty(), "{rel}: group {group} is empty");
        for r in rules {
            let alert = r["alert"]
                .as_str()
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| panic!("{rel}: group {group}: a rule without `alert`: {r}"));
            assert!(names.insert(alert), "{rel}: alert {alert} is defined twice");
            let expr = r["expr"]
                .as_str()
                .filter(|e| !e.trim().is_empty())
                .unwrap_or_else(|| panic!("{rel}: alert {alert} has no `expr`"));
            for key in ["summary", "description"] {
                assert!(
                    r["annotations"][key]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{rel}: alert {alert} has no annotations.{key}"
                );
            }
            assert!(
                matches!(
                    r["labels"]["severity"].as_str(),
                    Some("critical" | "warning" | "info")
                ),
                "{rel}: alert {alert}: labels.severity must be critical, warning or info, not {}",
                r["labels"]["severity"]
            );
            assert!(
                r["for"].as_str().is_some(),
                "{rel}: alert {alert} has no `for` (one failed evaluation would page)"
            );
            exprs.push((format!("{rel} alert {alert}"), expr));
        }
    }
    let (used, unknown) = unknown_own_metrics(exprs, &known);
    assert!(
        unknown.is_empty(),
        "alerts.yml uses metrics that no file under src/ emits (renamed or removed?):\n  {}",
        unknown.join("\n  ")
    );
    for expected in [
        "promnorm_backend_misconfigured",
        "promnorm_backend_requests_total",
        "promnorm_requests_total",
        "promnorm_samples_dropped_total",
        "promnorm_derived_evictions_total",
        "promnorm_backend_request_duration_seconds_bucket",
        "promnorm_config_last_reload_successful",
    ] {
        assert!(
            used.contains(expected),
            "alerts.yml has no alert on {expected}"
        );
    }
}

/// promnorm's own metric names (`promnorm_*`, `process_*`) in `exprs`.
fn own_metric_names<'a>(exprs: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    exprs
        .into_iter()
        .flat_map(|e| {
            identifiers(&without_strings(e))
                .into_iter()
                .filter(|n| n.starts_with("promnorm_") || n.starts_with("process_"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every metric promnorm's dashboard and alerts query is in the `/metrics` of a real
/// `promnorm serve` that has forwarded one request and derived one sample (the
/// per-backend series appear with the first backend answer). The test above checks the
/// names against the source; this one against what a running process exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alert_metrics_are_in_a_live_scrape() {
    use common::{RW_HEADERS, Reply, encode, fake_backend, free_port, get, post, series};
    use promnorm::wire::proto::prometheus as pb;

    let dashboard_rel = "deploy/grafana/promnorm.json";
    let dashboard = json(dashboard_rel);
    let alerts = yaml("deploy/prometheus/alerts.yml");
    let mut exprs: Vec<String> = dashboard_queries(dashboard_rel, &dashboard)
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    for g in alerts["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            exprs.extend(r["expr"].as_str().map(str::to_string));
        }
    }
    let used = own_metric_names(exprs.iter().map(String::as_str));
    assert!(used.len() >= 20, "too few names found: {used:?}");

    let (backend, _rec) = fake_backend(Reply::ok()).await;
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("promnorm-scrape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("promnorm.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\nderived: {{flush_interval: 50ms}}\nbackends:\n  - url: {backend}\n  - name: queued\n    url: {backend}\n    queue: {{type: memory}}\n  - name: tenanted\n    url: {backend}\n    tenancy: {{label: model_name}}\n"
        ),
    )
    .unwrap();
    let _served = common::Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_promnorm"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn promnorm"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "promnorm did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Two points of a derived ratio's inputs: forwarded, and one derived sample.
    for (t, hits, queries) in [(1_000, 1.0, 2.0), (16_000, 2.0, 4.0)] {
        let req = pb::WriteRequest {
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
                // An old name (renamed in vLLM 0.10): the cut-over tracking series exist.
                series(
                    &[
                        ("__name__", "vllm:gpu_cache_usage_perc"),
                        ("model_name", "m"),
                    ],
                    &[(0.5, t)],
                ),
            ],
            ..Default::default()
        };
        let r = post(&format!("{base}/api/v1/write"), encode(&req), RW_HEADERS).await;
        assert_eq!(r.status, 204, "{}", r.body);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let scraped = loop {
        let text = get(&format!("{base}/metrics")).await.body;
        let mut scraped = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_string)
            .collect::<BTreeSet<_>>();
        // Histogram base names: `F` for `F_bucket`, `F_sum`, `F_count`.
        let bases: Vec<String> = scraped
            .iter()
            .filter_map(|n| {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s))
                    .map(str::to_string)
            })
            .collect();
        scraped.extend(bases);
        if used.iter().all(|n| scraped.contains(n)) || std::time::Instant::now() > deadline {
            break scraped;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let _ = std::fs::remove_dir_all(&dir);
    let missing: Vec<&String> = used.iter().filter(|n| !scraped.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "queried by deploy/grafana/promnorm.json or deploy/prometheus/alerts.yml but not in a running promnorm's /metrics: {missing:?}\nscraped: {scraped:?}"
    );
}

/// Identifiers that name an inference-stack metric (not a function, label or keyword).
fn is_fleet_metric(name: &str) -> bool {
    name.contains(':')
        || [
            "DCGM_", "mooncake", "lmcache", "sglang", "vllm", "node_", "master_", "dynamo_", "nv_",
            "tgi_", "trtllm", "lmdeploy", "llamacpp", "llm_d_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Names that a built-in pack renames into something else: a dashboard that queries
/// them shows nothing once promnorm is in the path.
fn renamed_inputs() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for f in files_under(&root().join("mappings"), ".yaml") {
        let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        let pack = yaml(&rel);
        for rule in pack["rules"].as_array().into_iter().flatten() {
            // A copy rule (`copy: true`) adds a series beside the family, which keeps its name.
            if rule["copy"] == true {
                continue;
            }
            let renames = rule.get("rename").is_some() || rule.get("split_by_label").is_some();
            // Counters without _total get it (a family already ending in _total keeps
            // its name).
            let gains_total = rule["type"] == "counter" && rule.get("drop").is_none();
            let families = rule["match"]["family"].as_str().into_iter().chain(
                rule["match"]["families"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str),
            );
            for family in families {
                if renames || (gains_total && !family.ends_with("_total")) {
                    out.insert(family.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn llm_serving_dashboard_queries_only_normalised_names() {
    let rel = "deploy/grafana/llm-serving.json";
    let d = check_dashboard(rel, &["datasource", "model_name"]);

    // Names promnorm is known to write: golden outputs, the packs, README's tables.
    let mut corpus = files_under(&root().join("tests/golden"), ".out");
    corpus.extend(files_under(&root().join("mappings"), ".yaml"));
    corpus.push(root().join("README.md"));
    let mut known = BTreeSet::new();
    for f in &corpus {
        let text =
            std::fs::read_to_string(f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        known.extend(identifiers(&text).into_iter().map(str::to_string));
    }
    let renamed = renamed_inputs();

    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    let mut stale = Vec::new();
    for (place, expr) in dashboard_queries(rel, &d) {
        for name in identifiers(&without_strings(&expr)) {
            if !is_fleet_metric(name) {
                continue;
            }
            used.insert(name.to_string());
            if !name_forms(name).iter().any(|f| known.contains(*f)) {
                unknown.push(format!("{name} (in {place})"));
            }
            if renamed.contains(name) {
                stale.push(format!("{name} (in {place})"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "llm-serving.json queries names found in no golden output, pack or README:\n  {}",
        unknown.join("\n  ")
    );
    assert!(
        stale.is_empty(),
        "llm-serving.json queries names a built-in pack renames away (use the new name):\n  {}",
        stale.join("\n  ")
    );
    for expected in [
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hit_ratio",
        "vllm:spec_decode_acceptance_ratio",
        "vllm:mfu_ratio",
        "sglang:mfu_ratio",
        "DCGM_FI_DEV_FB_USED_bytes",
        "sglang:kv_transfer_latency_seconds_bucket",
        "mooncake_transfer_get_latency_seconds_bucket",
        "nv_cache_hit_ratio",
        "llamacpp:spec_decode_acceptance_ratio",
    ] {
        assert!(
            used.contains(expected),
            "llm-serving.json has no panel on {expected}"
        );
    }
}

#[test]
fn renamed_inputs_are_found() {
    // Guards the check above against a mappings layout it no longer understands.
    let renamed = renamed_inputs();
    for name in [
        "vllm:gpu_cache_usage_perc",
        "DCGM_FI_DEV_FB_USED",
        "sglang:kv_transfer_latency_ms",
        "mooncake_transfer_read_bytes",
        "vllm:gpu_prefix_cache_hits_total",
    ] {
        assert!(
            renamed.contains(name),
            "{name} should be known as renamed by a pack"
        );
    }
}

/// Every manifest under `deploy/kubernetes`, by path relative to it
/// (`common/service.yaml`), each with its YAML documents in order.
fn kubernetes_manifests() -> BTreeMap<String, Vec<Value>> {
    let dir = root().join("deploy/kubernetes");
    let files = files_under(&dir, ".yaml");
    assert!(!files.is_empty(), "no manifests in deploy/kubernetes");
    files
        .iter()
        .map(|f| {
            let name = f
                .strip_prefix(&dir)
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned();
            let rel = format!("deploy/kubernetes/{name}");
            let text = read(&rel);
            let docs: Vec<Value> = text
                .split("\n---\n")
                .filter(|d| {
                    d.lines()
                        .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                })
                .map(|d| {
                    promnorm::config::yaml::from_str::<Value>(d)
                        .unwrap_or_else(|e| panic!("{rel} is not valid YAML: {e}"))
                })
                .collect();
            assert!(!docs.is_empty(), "{rel}: no document");
            for d in &docs {
                assert!(
                    d["kind"].as_str().is_some(),
                    "{rel}: a document has no `kind`"
                );
            }
            (name, docs)
        })
        .collect()
}

/// The one document of kind `kind` in manifest file `name`.
fn doc<'a>(manifests: &'a BTreeMap<String, Vec<Value>>, name: &str, kind: &str) -> &'a Value {
    let docs = manifests
        .get(name)
        .unwrap_or_else(|| panic!("deploy/kubernetes/{name} is missing"));
    let mut of_kind = docs.iter().filter(|d| d["kind"] == kind);
    let d = of_kind
        .next()
        .unwrap_or_else(|| panic!("deploy/kubernetes/{name} has no {kind}"));
    assert!(
        of_kind.next().is_none(),
        "deploy/kubernetes/{name}: more than one {kind}"
    );
    d
}

/// The configuration inside a ConfigMap, parsed and validated.
fn configmap_config(cm: &Value, name: &str) -> Config {
    assert_eq!(cm["kind"], "ConfigMap", "{name}: kind");
    let text = cm["data"]["promnorm.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} has no data.promnorm.yaml string"));
    let cfg = Config::parse(text, name)
        .unwrap_or_else(|e| panic!("{name}'s promnorm.yaml does not parse: {e}"));
    if let Err(e) = cfg.validate() {
        panic!("{name}'s promnorm.yaml does not validate: {e}");
    }
    cfg
}

fn listen_port(cfg: &Config) -> u16 {
    let listen: std::net::SocketAddr = cfg
        .listen
        .parse()
        .unwrap_or_else(|e| panic!("listen {:?}: {e}", cfg.listen));
    listen.port()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// What every promnorm container must get right: the listen port, the probes, a locked
/// down security context, and `--config` naming promnorm.yaml of a mounted volume of the
/// ConfigMap `configmap` (`volumes` is the pod's). Returns the container port's name.
fn check_container(
    what: &str,
    container: &Value,
    pod_security: &Value,
    volumes: &Value,
    configmap: &str,
    cfg: &Config,
) -> String {
    let port = container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["containerPort"] == listen_port(cfg))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no container port {} (the configured listen port)",
                listen_port(cfg)
            )
        });
    let port_name = port["name"].as_str().unwrap_or_default().to_string();
    for (probe, path) in [
        ("readinessProbe", "/-/ready"),
        ("livenessProbe", "/-/healthy"),
    ] {
        assert_eq!(
            container[probe]["httpGet"]["path"], path,
            "{what}: {probe} path"
        );
        assert_eq!(
            container[probe]["httpGet"]["port"], port_name,
            "{what}: {probe} port"
        );
    }
    let sc = &container["securityContext"];
    assert_eq!(
        sc["readOnlyRootFilesystem"], true,
        "{what}: readOnlyRootFilesystem"
    );
    assert_eq!(
        sc["allowPrivilegeEscalation"], false,
        "{what}: allowPrivilegeEscalation"
    );
    assert_eq!(
        sc["capabilities"]["drop"][0], "ALL",
        "{what}: capabilities.drop"
    );
    assert!(
        pod_security["runAsNonRoot"] == true || sc["runAsNonRoot"] == true,
        "{what}: runAsNonRoot"
    );

    check_memory(what, container, cfg);

    let args = strings(&container["args"]);
    let config_path = args
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("{what}: args {args:?} have no --config FILE"));
    let mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| {
            m["mountPath"].as_str().is_some_and(|dir| {
                *config_path == format!("{}/promnorm.yaml", dir.trim_end_matches('/'))
            }) && volumes
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| v["name"] == m["name"] && v["configMap"]["name"] == configmap)
        });
    assert!(
        mounted,
        "{what}: {config_path} must be promnorm.yaml of a mounted volume of ConfigMap {configmap}"
    );
    port_name
}

/// The container's memory limit holds README's memory bound: with the limit and the
/// workers its CPU limit gives, the configuration's sizes (`auto` ones derived from the
/// limit, as `serve` does in the pod) keep the bound within the allowed percent.
fn check_memory(what: &str, container: &Value, cfg: &Config) {
    let limits = &container["resources"]["limits"];
    let memory = limits["memory"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no resources.limits.memory"));
    let bytes = [("Gi", 1u64 << 30), ("Mi", 1 << 20)]
        .iter()
        .find_map(|(unit, f)| Some(memory.strip_suffix(unit)?.parse::<u64>().ok()? * f))
        .unwrap_or_else(|| panic!("{what}: memory limit {memory:?} is not N Gi or N Mi"));
    let cpu = limits["cpu"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no resources.limits.cpu"));
    let workers = match cpu.strip_suffix('m') {
        Some(milli) => milli.parse::<u64>().unwrap().div_ceil(1000),
        None => cpu.parse::<u64>().unwrap(),
    };
    let limit = promnorm::config::MemoryLimit {
        bytes,
        source: promnorm::config::LimitSource::CgroupV2,
    };
    let sizing = cfg.sizing_for(Some(limit), workers);
    assert!(
        sizing.bound <= sizing.allowed.unwrap(),
        "{what}: {}",
        sizing.summary()
    );
    assert_eq!(cfg.memory_warning(&sizing), None, "{what}");
}

/// A pod template's checks, for the Deployment and the StatefulSet.
fn check_pod_template(what: &str, workload: &Value, configmap: &str, cfg: &Config) {
    let pod = &workload["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: no terminationGracePeriodSeconds"));
    assert!(
        grace > cfg.shutdown_timeout.as_secs(),
        "{what}: terminationGracePeriodSeconds ({grace}) must exceed shutdown_timeout \
         ({:?}), or the kubelet kills promnorm while it drains",
        cfg.shutdown_timeout
    );
    let selector = &workload["spec"]["selector"]["matchLabels"];
    let labels = &workload["spec"]["template"]["metadata"]["labels"];
    for (k, v) in selector.as_object().into_iter().flatten() {
        assert_eq!(
            &labels[k], v,
            "{what}: the selector must match the pod labels"
        );
    }
    let port = check_container(
        what,
        &pod["containers"][0],
        &pod["securityContext"],
        &pod["volumes"],
        configmap,
        cfg,
    );
    assert_eq!(
        port, "http",
        "{what}: the Services target the port named http"
    );
}

/// Each kustomization lists existing files and directories (a directory must hold a
/// kustomization.yaml), and every manifest beside it but `standalone` ones.
fn check_kustomization(
    manifests: &BTreeMap<String, Vec<Value>>,
    dir: &str,
    standalone: &[&str],
) -> Vec<String> {
    let name = if dir.is_empty() {
        "kustomization.yaml".to_string()
    } else {
        format!("{dir}/kustomization.yaml")
    };
    let k = doc(manifests, &name, "Kustomization");
    let base = root().join("deploy/kubernetes").join(dir);
    let listed = strings(&k["resources"]);
    for r in &listed {
        let p = base.join(r);
        assert!(
            p.is_file() || p.join("kustomization.yaml").is_file(),
            "{name}: resource {r} is neither a file nor a kustomization directory"
        );
    }
    let beside: BTreeSet<String> = manifests
        .keys()
        .filter_map(|m| match m.rsplit_once('/') {
            Some((d, f)) if d == dir => Some(f.to_string()),
            None if dir.is_empty() => Some(m.clone()),
            _ => None,
        })
        .filter(|f| f != "kustomization.yaml" && !standalone.contains(&f.as_str()))
        .collect();
    for f in &beside {
        assert!(
            listed.contains(&f.as_str()),
            "{name}: resources must list {f} (or it is documented as standalone)"
        );
    }
    listed.iter().map(|s| s.to_string()).collect()
}

#[test]
fn kubernetes_manifests_parse_and_agree() {
    let manifests = kubernetes_manifests();
    let cm = doc(&manifests, "common/configmap.yaml", "ConfigMap");
    let cfg = configmap_config(cm, "common/configmap.yaml");
    let cm_name = cm["metadata"]["name"].as_str().unwrap_or_default();

    // Kustomizations: the base (Deployment, HPA, common/), common/, statefulset/ (common/
    // without the Deployment); the sidecar example stands alone.
    let root_listed = check_kustomization(
        &manifests,
        "",
        &["prometheus-operator-sidecar.yaml", "engine-sidecar.yaml"],
    );
    assert!(
        root_listed.contains(&"common".to_string()),
        "kustomization.yaml: common"
    );
    check_kustomization(&manifests, "common", &[]);
    let sts_listed = check_kustomization(&manifests, "statefulset", &[]);
    assert!(
        sts_listed.contains(&"../common".to_string()),
        "statefulset/kustomization.yaml: ../common"
    );
    assert!(
        !sts_listed
            .iter()
            .any(|r| r == ".." || r == "../" || r.ends_with("deployment.yaml")),
        "statefulset/kustomization.yaml must not pull in the Deployment"
    );

    let deployment = doc(&manifests, "deployment.yaml", "Deployment");
    check_pod_template("deployment.yaml", deployment, cm_name, &cfg);

    // The HPA scales the Deployment on CPU, and the Deployment leaves the count to it.
    let hpa = doc(
        &manifests,
        "horizontalpodautoscaler.yaml",
        "HorizontalPodAutoscaler",
    );
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    let target = &hpa["spec"]["scaleTargetRef"];
    assert_eq!(target["kind"], "Deployment", "HPA target kind");
    assert_eq!(
        target["name"], deployment["metadata"]["name"],
        "HPA target name"
    );
    assert!(
        hpa["spec"]["metrics"].as_array().is_some_and(|ms| ms
            .iter()
            .any(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu")),
        "the HPA scales on CPU"
    );
    assert!(
        deployment["spec"].get("replicas").is_none(),
        "deployment.yaml: no replicas while the HPA owns the count"
    );
    let pdb = doc(
        &manifests,
        "common/poddisruptionbudget.yaml",
        "PodDisruptionBudget",
    );
    let min_available = pdb["spec"]["minAvailable"].as_u64().unwrap_or(0);
    let min_replicas = hpa["spec"]["minReplicas"].as_u64().unwrap_or(1);
    let max_replicas = hpa["spec"]["maxReplicas"].as_u64().unwrap_or(0);
    assert!(
        min_replicas > min_available,
        "HPA minReplicas ({min_replicas}) must exceed the PDB's minAvailable ({min_available}), \
         or no pod can ever be evicted"
    );
    assert!(max_replicas >= min_replicas, "HPA maxReplicas");
    // CPU utilization is relative to the request: there must be one.
    assert!(
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
            .is_string(),
        "deployment.yaml: a CPU request for the HPA"
    );

    let service = doc(&manifests, "common/service.yaml", "Service");
    assert!(
        service["spec"]["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["port"] == listen_port(&cfg))),
        "common/service.yaml must expose port {}",
        listen_port(&cfg)
    );
    let monitor = doc(&manifests, "common/servicemonitor.yaml", "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn statefulset_variant_is_the_deployment_with_a_volume() {
    let manifests = kubernetes_manifests();
    let cm = doc(&manifests, "common/configmap.yaml", "ConfigMap");
    let cfg = configmap_config(cm, "common/configmap.yaml");
    let cm_name = cm["metadata"]["name"].as_str().unwrap_or_default();
    let deployment = doc(&manifests, "deployment.yaml", "Deployment");
    let sts = doc(&manifests, "statefulset/statefulset.yaml", "StatefulSet");
    check_pod_template("statefulset/statefulset.yaml", sts, cm_name, &cfg);

    // Governed by a headless Service that selects its pods.
    let headless = doc(&manifests, "statefulset/service-headless.yaml", "Service");
    assert_eq!(sts["spec"]["serviceName"], headless["metadata"]["name"]);
    assert_eq!(headless["spec"]["clusterIP"], "None", "headless");
    for (k, v) in headless["spec"]["selector"]
        .as_object()
        .into_iter()
        .flatten()
    {
        assert_eq!(
            &sts["spec"]["template"]["metadata"]["labels"][k], v,
            "the headless Service selects the StatefulSet's pods"
        );
    }

    // Every claim template is mounted, writable by the pod's group.
    let claims = sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| panic!("statefulset.yaml: no volumeClaimTemplates"));
    let pod = &sts["spec"]["template"]["spec"];
    let mounts = &pod["containers"][0]["volumeMounts"];
    for c in claims {
        let name = &c["metadata"]["name"];
        assert!(
            mounts
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["name"] == *name && m["readOnly"] != true),
            "claim template {name} is not mounted writable"
        );
        assert!(
            c["spec"]["resources"]["requests"]["storage"].is_string(),
            "claim template {name}: a storage request"
        );
    }
    assert!(
        pod["securityContext"]["fsGroup"].is_u64(),
        "fsGroup for the volume"
    );

    // The pod template is the Deployment's plus the volume: nothing else may drift.
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v["spec"]["securityContext"].as_object_mut() {
            o.remove("fsGroup");
        }
        if let Some(c) = v["spec"]["containers"][0].as_object_mut() {
            c.remove("volumeMounts");
        }
        v
    };
    assert_eq!(
        strip(&sts["spec"]["template"]),
        strip(&deployment["spec"]["template"]),
        "statefulset.yaml's pod template must be deployment.yaml's plus the volume"
    );
    let dep_mounts = &deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    for m in dep_mounts.as_array().into_iter().flatten() {
        assert!(
            mounts.as_array().into_iter().flatten().any(|x| x == m),
            "statefulset.yaml lacks the Deployment's mount {m}"
        );
    }
}

#[test]
fn prometheus_operator_sidecar_writes_to_its_promnorm() {
    let manifests = kubernetes_manifests();
    let file = "prometheus-operator-sidecar.yaml";
    let cm = doc(&manifests, file, "ConfigMap");
    let cfg = configmap_config(cm, file);
    let cm_name = cm["metadata"]["name"].as_str().unwrap_or_default();
    let prom = doc(&manifests, file, "Prometheus");
    assert_eq!(prom["apiVersion"], "monitoring.coreos.com/v1");
    let spec = &prom["spec"];

    // Remote write to the sidecar on localhost, at its port and one of its write paths.
    let url = spec["remoteWrite"][0]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{file}: no remoteWrite url"));
    assert_eq!(
        url, "http://localhost:9201/api/v1/write",
        "{file}: remoteWrite"
    );
    let port = listen_port(&cfg);
    let path = url
        .strip_prefix(&format!("http://localhost:{port}"))
        .unwrap_or_else(|| panic!("{file}: {url} is not promnorm's port {port} on localhost"));
    assert!(
        cfg.write_paths.iter().any(|p| p == path),
        "{file}: {path} is not one of promnorm's write_paths {:?}",
        cfg.write_paths
    );
    assert_eq!(
        spec["remoteWrite"].as_array().map(Vec::len),
        Some(1),
        "{file}: everything goes through promnorm"
    );

    let container = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "promnorm")
        .unwrap_or_else(|| panic!("{file}: no promnorm container"));
    let port_name = check_container(
        file,
        container,
        &Value::Null,
        &spec["volumes"],
        cm_name,
        &cfg,
    );
    assert!(
        cfg.listen.starts_with("0.0.0.0:"),
        "{file}: promnorm must listen on the pod IP too, for the kubelet's probes"
    );

    // Its metrics are scraped under job="promnorm", as the alerts expect.
    let monitor = doc(&manifests, file, "PodMonitor");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(
        endpoint["port"],
        port_name.as_str(),
        "{file}: PodMonitor port"
    );
    assert_eq!(endpoint["path"], "/metrics");
    assert!(
        endpoint["relabelings"].as_array().is_some_and(|rs| rs
            .iter()
            .any(|r| r["targetLabel"] == "job" && r["replacement"] == "promnorm")),
        "{file}: PodMonitor sets job=\"promnorm\""
    );
}

/// promtool beside `PROMETHEUS_BIN` (Debian's prometheus package ships both).
fn promtool() -> Option<PathBuf> {
    let prom = std::env::var_os("PROMETHEUS_BIN").map(PathBuf::from)?;
    let tool = prom.parent()?.join("promtool");
    tool.exists().then_some(tool)
}

fn run_promtool(tool: &Path, args: &[&str], dir: &Path) -> Result<(), String> {
    let out = Command::new(tool)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running {}: {e}", tool.display()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "promtool {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[test]
fn promtool_checks_rules_and_dashboard_queries() {
    let Some(tool) = promtool() else {
        if std::env::var("PROMNORM_E2E").as_deref() == Ok("1") {
            panic!("PROMNORM_E2E=1 but there is no promtool beside PROMETHEUS_BIN");
        }
        eprintln!("SKIPPED: set PROMETHEUS_BIN (scripts/test.sh does) to check with promtool");
        return;
    };
    let rules_dir = root().join("deploy/prometheus");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        if let Err(e) = run_promtool(&tool, &args, &rules_dir) {
            panic!("{e}");
        }
    }

    // Every dashboard query as a recording rule, Grafana's variables filled in, so that
    // promtool parses the PromQL.
    let mut rules = String::from("groups:\n  - name: dashboards\n    rules:\n");
    let mut n = 0;
    for rel in [
        "deploy/grafana/promnorm.json",
        "deploy/grafana/llm-serving.json",
    ] {
        for (_, expr) in dashboard_queries(rel, &json(rel)) {
            if expr.starts_with("label_values(") {
                continue;
            }
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$__interval", "1m")
                .replace("$job", ".*")
                .replace("$instance", ".*")
                .replace("$model_name", ".*")
                .replace("$dynamo_model", ".*")
                .replace("$hostname", ".*");
            n += 1;
            // A JSON string is a valid YAML double-quoted scalar.
            let quoted = serde_json::to_string(&expr).unwrap_or_else(|e| panic!("quoting: {e}"));
            rules.push_str(&format!(
                "      - record: dashboard:query{n}\n        expr: {quoted}\n"
            ));
        }
    }
    let dir = std::env::temp_dir().join(format!("promnorm-deploy-assets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let file = dir.join("dashboards.rules.yml");
    std::fs::write(&file, rules).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    let checked = run_promtool(&tool, &["check", "rules", "dashboards.rules.yml"], &dir);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = checked {
        panic!("a dashboard query is not valid PromQL: {e}");
    }
}

/// The panels of the row titled `title` of a dashboard (rows not collapsed: the panels
/// after it up to the next row).
fn row_panels<'a>(dashboard: &'a Value, title: &str) -> Vec<&'a Value> {
    let top = dashboard["panels"].as_array().cloned().unwrap_or_default();
    let start = top
        .iter()
        .position(|p| p["type"] == "row" && p["title"] == title)
        .unwrap_or_else(|| panic!("no row {title:?}"));
    let all = dashboard["panels"].as_array().expect("panels");
    all[start + 1..]
        .iter()
        .take_while(|p| p["type"] != "row")
        .collect()
}

/// Names of README's table of derived series (computed by promnorm from counter deltas).
fn derived_series_names() -> BTreeSet<String> {
    let readme = read("README.md");
    let table = readme
        .split("## Derived series")
        .nth(1)
        .and_then(|s| s.split("\n\n").find(|b| b.starts_with("| series")))
        .expect("README's table of derived series");
    table
        .lines()
        .skip(2)
        .filter_map(|l| l.split('|').nth(1))
        .flat_map(|cell| {
            cell.split(',')
                .map(|n| n.trim().trim_matches('`').to_string())
        })
        .filter(|n| !n.is_empty())
        .collect()
}

#[test]
fn derived_series_panels_say_they_stay_empty_until_counters_move() {
    let rel = "deploy/grafana/llm-serving.json";
    let d = json(rel);
    let derived = derived_series_names();
    assert!(
        derived.contains("vllm:mfu_ratio") && derived.contains("lmcache:lookup_hit_ratio"),
        "README's derived table not understood: {derived:?}"
    );
    let mut with_derived = 0;
    for p in panels(&d) {
        let queries_derived = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["expr"].as_str())
            .any(|e| identifiers(e).iter().any(|n| derived.contains(*n)));
        if !queries_derived {
            continue;
        }
        with_derived += 1;
        let desc = p["description"].as_str().unwrap_or_default();
        assert!(
            desc.contains("empty until those counters move"),
            "{rel}: {} shows a derived series; its description must say it stays empty until the counters move: {desc:?}",
            panel_title(p)
        );
    }
    assert!(
        with_derived >= 5,
        "only {with_derived} derived panels found"
    );
}

/// The Dynamo row queries the names promnorm writes for a real Dynamo frontend: every
/// name it uses is in that dump's normalised output.
#[test]
fn dynamo_row_queries_the_dumps_normalised_names() {
    let rel = "deploy/grafana/llm-serving.json";
    let d = json(rel);
    let out = read("tests/golden/dump-dynamo-frontend-ce30a76.out");
    let written: BTreeSet<&str> = identifiers(&out).into_iter().collect();
    let row = row_panels(&d, "Dynamo frontend");
    assert!(row.len() >= 6, "the Dynamo row has {} panels", row.len());
    let mut used = BTreeSet::new();
    for p in &row {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            for name in identifiers(&without_strings(expr)) {
                if name.starts_with("dynamo_") {
                    assert!(
                        written.contains(name),
                        "{}: {name} is not in the normalised Dynamo dump",
                        panel_title(p)
                    );
                    used.insert(name.to_string());
                }
            }
        }
    }
    for want in [
        "dynamo_frontend_requests_total",
        "dynamo_frontend_time_to_first_token_seconds_bucket",
        "dynamo_frontend_inter_token_latency_seconds_bucket",
        "dynamo_frontend_inflight_requests",
        "dynamo_frontend_output_tokens_total",
    ] {
        assert!(used.contains(want), "the Dynamo row has no panel on {want}");
    }
}

/// The rows of the engines added in issue 22, each with the golden cases whose output
/// holds the names its panels may query and names it must query.
const ENGINE_ROWS: [(&str, &[&str], &[&str]); 5] = [
    (
        "Hugging Face TGI",
        &["tgi"],
        &[
            "tgi_request_success_total",
            "tgi_request_duration_seconds_bucket",
            "tgi_queue_size",
        ],
    ),
    (
        "TensorRT-LLM",
        &["trtllm"],
        &[
            "trtllm_request_success_total",
            "trtllm_time_to_first_token_seconds_bucket",
            "trtllm_time_per_output_token_seconds_bucket",
            "trtllm_kv_cache_utilization",
        ],
    ),
    (
        "TensorRT-LLM (Triton backend)",
        &["triton"],
        &[
            "nv_trt_llm_kv_cache_usage_ratio",
            "nv_trt_llm_inflight_batcher_generation_requests",
            "nv_trt_llm_kv_cache_transfer_seconds_total",
        ],
    ),
    (
        "LMDeploy",
        &["lmdeploy"],
        &[
            "lmdeploy:generation_tokens_total",
            "lmdeploy:time_to_first_token_seconds_bucket",
            "lmdeploy:kv_cache_usage_ratio",
        ],
    ),
    (
        "llm-d router (EPP)",
        &["llmd", "llmd_twins"],
        &[
            "llm_d_epp_request_total",
            "llm_d_epp_request_duration_seconds_bucket",
            "llm_d_epp_ready_endpoints",
        ],
    ),
];

/// Each engine row of llm-serving.json queries only what the compiled packs write for
/// that engine: every query comes out of the migrate rewriter (the built-in rules run
/// over PromQL) unchanged, and every metric it names is in the engine's golden output.
#[test]
fn engine_rows_query_names_the_compiled_packs_write() {
    let rel = "deploy/grafana/llm-serving.json";
    let d = json(rel);
    let rules = Config::parse("", "default")
        .expect("the default configuration parses")
        .compile_rules()
        .expect("the built-in packs compile");
    let rw = promnorm::migrate::QueryRewriter::new(&rules, false);
    // Guards the check: a query over an engine's raw name is rewritten.
    for raw in [
        "rate(tgi_request_count[5m])",
        r#"nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}"#,
        "lmdeploy:gpu_cache_usage_perc",
        "inference_objective_request_total",
        "trtllm:time_per_output_token_seconds_bucket",
    ] {
        assert!(rw.rewrite(raw).changed, "{raw} should be rewritten");
    }
    for (title, cases, wanted) in ENGINE_ROWS {
        let mut written = BTreeSet::new();
        for case in cases {
            let out = read(format!("tests/golden/{case}/expected.out"));
            written.extend(identifiers(&out).into_iter().map(str::to_string));
        }
        let row = row_panels(&d, title);
        assert!(row.len() >= 3, "the {title} row has {} panels", row.len());
        let mut used = BTreeSet::new();
        for p in &row {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_default();
                let r = rw.rewrite(expr);
                assert!(
                    !r.changed && r.findings.is_empty(),
                    "{title}: {}: the built-in rules rewrite {expr:?} into {:?} ({:?})",
                    panel_title(p),
                    r.query,
                    r.findings
                );
                for name in identifiers(&without_strings(expr)) {
                    if !is_fleet_metric(name) {
                        continue;
                    }
                    assert!(
                        written.contains(name),
                        "{title}: {}: {name} is in no output of {cases:?}",
                        panel_title(p)
                    );
                    used.insert(name.to_string());
                }
            }
        }
        for want in wanted {
            assert!(
                used.contains(*want),
                "the {title} row has no panel on {want}"
            );
        }
    }
}

/// A dashboard query as Prometheus evaluates it: Grafana's variables filled in (all
/// values), the rate interval one minute.
fn filled(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$model_name", ".*")
        .replace("$dynamo_model", ".*")
        .replace("$hostname", ".*")
        .replace("$job", ".*")
        .replace("$instance", ".*")
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `expr`'s value at a Prometheus' now, one per series returned (NaN where Prometheus
/// answers NaN).
async fn instant_query(base: &str, expr: &str) -> Vec<f64> {
    let url = format!("{base}/api/v1/query?query={}", percent_encode(expr));
    let v: Value = serde_json::from_str(&common::get(&url).await.body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            r["value"][1]
                .as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        })
        .collect()
}

/// `text` (an exposition) with every counter and histogram sample multiplied by `n`: a
/// frontend that keeps serving the same mix of requests, so that `rate()` and
/// `histogram_quantile()` have something to show (a static dump gives rates of 0 and
/// quantiles of NaN).
fn advanced(text: &str, n: u64) -> String {
    let mut moving: Vec<&str> = Vec::new();
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(family), Some(kind)) = (parts.next(), parts.next())
                && kind != "gauge"
                && kind != "untyped"
            {
                moving.push(family);
            }
        }
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let moves = !line.starts_with('#')
            && moving.iter().any(|f| {
                name.strip_prefix(f).is_some_and(|suffix| {
                    ["", "_bucket", "_sum", "_count", "_total"].contains(&suffix)
                })
            });
        match line.rsplit_once(' ').map(|(s, v)| (s, v.parse::<f64>())) {
            Some((series, Ok(v))) if moves => {
                out.push_str(&format!("{series} {}\n", v * n as f64));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Issue 26: the Dynamo row on a real Dynamo frontend. Debian's Prometheus scrapes the
/// dump (counters advancing), remote-writes through promnorm into a second Prometheus,
/// and every query of the row (promtool parses them in
/// `promtool_checks_rules_and_dashboard_queries`) returns numbers there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_row_returns_data_for_a_real_frontend_through_promnorm() {
    use common::procs::{binary, prometheus_receiver, prometheus_sender};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    let Some(prom) = binary("PROMETHEUS_BIN") else {
        return;
    };
    let rel = "deploy/grafana/llm-serving.json";
    let d = json(rel);
    let row: Vec<String> = row_panels(&d, "Dynamo frontend")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(filled))
        .collect();
    assert!(row.len() >= 8, "Dynamo row queries: {row:?}");

    // The dump, its counters moving on with every scrape.
    let dump = Arc::new(read("tests/golden/dump-dynamo-frontend-ce30a76.prom"));
    let scrapes = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = scrapes.fetch_add(1, Ordering::Relaxed) + 1;
            let text = advanced(&dump, n);
            async move { text }
        }),
    );
    let target = common::serve(app).await;

    let dir = std::env::temp_dir().join(format!("promnorm-dynamo-row-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut receiver = prometheus_receiver(&prom, &dir);
    receiver.start("/-/ready").await;
    let proxy = common::start_proxy(&[format!("{}/api/v1/write", receiver.base)], "").await;

    let sender_dir = dir.join("sender");
    std::fs::create_dir_all(&sender_dir).unwrap_or_else(|e| panic!("{e}"));
    let mut sender = prometheus_sender(
        &prom,
        &sender_dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: dynamo-frontend\n    static_configs:\n      - targets: ['{target}']\nremote_write:\n  - url: {}\n    queue_config:\n      batch_send_deadline: 1s\n",
            proxy.url()
        ),
    );
    sender.start("/-/ready").await;

    // Until every query of the row returns numbers (bounded).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut empty: Vec<String> = row.clone();
    while !empty.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut still = Vec::new();
        for q in &empty {
            let values = instant_query(&receiver.base, q).await;
            if values.is_empty() || values.iter().any(|v| v.is_nan()) {
                still.push(q.clone());
            }
        }
        empty = still;
    }

    // The whole dashboard on this one frontend, for the record.
    let mut with_data = 0;
    let all: Vec<String> = dashboard_queries(rel, &d)
        .into_iter()
        .filter(|(_, e)| !e.starts_with("label_values("))
        .map(|(_, e)| filled(&e))
        .collect();
    for q in &all {
        if !instant_query(&receiver.base, q).await.is_empty() {
            with_data += 1;
        }
    }
    eprintln!(
        "llm-serving.json on the Dynamo frontend dump: {with_data} of {} queries return data; the Dynamo row: {} of {}",
        all.len(),
        row.len() - empty.len(),
        row.len()
    );
    let ttft_p50 = match row
        .iter()
        .find(|q| q.starts_with("histogram_quantile(0.5,") && q.contains("time_to_first_token"))
    {
        Some(q) => instant_query(&receiver.base, q).await,
        None => Vec::new(),
    };
    sender.kill();
    proxy.shut_down().await;
    receiver.kill();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        empty.is_empty(),
        "Dynamo row queries without numbers after 60s: {empty:#?}"
    );
    // The dump's one request took its first token between 1s and 2.2s (its bucket):
    // the median is interpolated in there.
    assert!(
        !ttft_p50.is_empty() && ttft_p50.iter().all(|v| (1.0..=2.2).contains(v)),
        "TTFT median: {ttft_p50:?}"
    );
}

#[test]
fn engine_sidecar_scrapes_its_engine_on_localhost() {
    let manifests = kubernetes_manifests();
    let file = "engine-sidecar.yaml";
    let cm = doc(&manifests, file, "ConfigMap");
    let cfg = configmap_config(cm, file);
    let cm_name = cm["metadata"]["name"].as_str().unwrap_or_default();
    let workload = doc(&manifests, file, "Deployment");
    let pod = &workload["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    assert!(
        grace > cfg.shutdown_timeout.as_secs(),
        "{file}: terminationGracePeriodSeconds must exceed shutdown_timeout"
    );
    let container = |name: &str| {
        pod["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{file}: no {name} container"))
    };
    let port_name = check_container(
        file,
        container("promnorm"),
        &pod["securityContext"],
        &pod["volumes"],
        cm_name,
        &cfg,
    );
    assert!(cfg.listen.starts_with("0.0.0.0:"), "{file}: listen");

    // The init container writes a file_sd file where the sidecar looks for one, naming
    // the engine's port on localhost and the pod as `instance`.
    let scrape = cfg.scrape.as_ref().expect("scrape: configured");
    assert!(
        scrape.targets.is_empty(),
        "{file}: targets come from file_sd"
    );
    let pattern = scrape.file_sd.first().expect("a file_sd pattern");
    let init = &pod["initContainers"][0];
    let script = strings(&init["command"]).join(" ");
    let written = script
        .rsplit_once("> ")
        .map(|(_, path)| path.trim())
        .unwrap_or_else(|| panic!("{file}: the init container writes no file: {script}"));
    let (dir, glob) = pattern.rsplit_once('/').expect("a directory");
    let (wdir, wname) = written.rsplit_once('/').expect("a directory");
    assert_eq!(
        dir, wdir,
        "{file}: the init container writes where file_sd looks"
    );
    assert!(
        promnorm::scrape::sd::glob_match(glob, wname),
        "{file}: {wname} does not match {glob}"
    );
    for (c, what) in [(init, "init container"), (container("promnorm"), "sidecar")] {
        assert!(
            c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"] == dir),
            "{file}: the {what} does not mount {dir}"
        );
    }
    let format = script
        .split('\'')
        .nth(1)
        .unwrap_or_else(|| panic!("{file}: no printf format in {script}"));
    let groups: Value = serde_json::from_str(&format.replace("%s", "vllm-0").replace("\\n", ""))
        .unwrap_or_else(|e| panic!("{file}: the file_sd written is not JSON: {e}"));
    let engine_port = container("vllm")["ports"][0]["containerPort"]
        .as_u64()
        .expect("the engine's port");
    assert_eq!(
        groups[0]["targets"][0],
        format!("127.0.0.1:{engine_port}"),
        "{file}: the sidecar scrapes its engine"
    );
    assert_eq!(
        groups[0]["labels"]["instance"], "vllm-0",
        "{file}: per-pod instance"
    );
    let env: Vec<&str> = init["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].as_str())
        .collect();
    assert!(
        env.contains(&"metadata.name"),
        "{file}: the pod name from the downward API"
    );

    // Collectors that pull find /federate at the sidecar's port.
    assert!(cfg.exposition.is_some(), "{file}: exposition is on");
    let ann = &workload["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/path"], "/federate");
    let port = listen_port(&cfg).to_string();
    assert_eq!(ann["prometheus.io/port"], port.as_str());
    assert_eq!(port_name, "promnorm");
}

/// deploy/kubernetes/limits (docs/limits.md, "Scale-out"): the StatefulSet with its
/// ConfigMap replaced by one whose limits, times the replicas, stay within the Mimir
/// limits it names, and which check-config accepts.
#[test]
fn scale_out_limits_add_up_to_no_more_than_mimirs() {
    let manifests = kubernetes_manifests();
    // configmap.yaml is a patch, not a resource.
    let listed = check_kustomization(&manifests, "limits", &["configmap.yaml"]);
    assert!(listed.contains(&"../statefulset".to_string()), "{listed:?}");
    let k = doc(&manifests, "limits/kustomization.yaml", "Kustomization");
    let patches: Vec<&str> = k["patches"]
        .as_array()
        .expect("limits/kustomization.yaml: patches")
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert_eq!(patches, ["configmap.yaml"]);
    let cm = doc(&manifests, "limits/configmap.yaml", "ConfigMap");
    let common = doc(&manifests, "common/configmap.yaml", "ConfigMap");
    assert_eq!(
        cm["metadata"]["name"], common["metadata"]["name"],
        "the patch replaces the shared ConfigMap"
    );
    let cfg = configmap_config(cm, "limits/configmap.yaml");
    cfg.check().expect("check-config accepts it");
    let sts = doc(&manifests, "statefulset/statefulset.yaml", "StatefulSet");
    let replicas = sts["spec"]["replicas"].as_u64().unwrap() as usize;
    let l = &cfg.limits;
    // The Mimir limits the file's comment names.
    assert!(l.max_series_per_tenant * replicas <= 300_000);
    assert!(l.max_series_per_metric * replicas <= 20_000);
    assert!(l.series_max_labels <= 30 && l.series_max_labels > 0);
    assert!(l.series_max_label_value_bytes.0 <= 2048 && l.series_max_label_value_bytes.0 > 0);
    for (tenant, o) in &l.tenant_overrides {
        let t = o.max_series_per_tenant.unwrap_or(l.max_series_per_tenant);
        assert!(t * replicas <= 1_000_000, "{tenant}");
    }
    assert!(cfg.tenancy.is_some(), "limits per tenant need tenancy");
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    check_memory("limits (statefulset)", container, &cfg);
}
