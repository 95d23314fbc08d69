//! The operations assets under `deploy/` checked against the code they describe:
//! every metric of promnorm's own (`promnorm_*`, `process_*`) a dashboard or alert
//! queries is one `src/` emits (a renamed metric breaks this test); the inference dashboard queries only names promnorm
//! writes after normalisation (golden outputs, packs, README's derived series), never a
//! name a pack renames away; the Kubernetes manifests parse and the configuration in
//! their ConfigMap passes `Config::validate`. With `PROMETHEUS_BIN` set (scripts/test.sh
//! sets it), promtool (beside it) also checks the PromQL and runs the alerts' unit tests.

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
    // The list: the dashboard covers each of these.
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
    ] {
        assert!(
            used.contains(expected),
            "alerts.yml has no alert on {expected}"
        );
    }
}

/// Identifiers that name an inference-stack metric (not a function, label or keyword).
fn is_fleet_metric(name: &str) -> bool {
    name.contains(':')
        || [
            "DCGM_", "mooncake", "lmcache", "sglang", "vllm", "node_", "master_", "dynamo_",
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

/// Every manifest, by file name.
fn kubernetes_manifests() -> BTreeMap<String, Value> {
    let dir = root().join("deploy/kubernetes");
    let files = files_under(&dir, ".yaml");
    assert!(!files.is_empty(), "no manifests in deploy/kubernetes");
    files
        .iter()
        .map(|f| {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let doc = yaml(&format!("deploy/kubernetes/{name}"));
            assert!(
                doc["kind"].as_str().is_some(),
                "deploy/kubernetes/{name}: no `kind`"
            );
            (name, doc)
        })
        .collect()
}

/// The configuration inside the ConfigMap, parsed and validated.
fn configmap_config(manifests: &BTreeMap<String, Value>) -> Config {
    let cm = &manifests["configmap.yaml"];
    assert_eq!(cm["kind"], "ConfigMap", "configmap.yaml: kind");
    let text = cm["data"]["promnorm.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("configmap.yaml has no data.promnorm.yaml string"));
    let cfg = Config::parse(text, "configmap.yaml")
        .unwrap_or_else(|e| panic!("configmap.yaml's promnorm.yaml does not parse: {e}"));
    if let Err(e) = cfg.validate() {
        panic!("configmap.yaml's promnorm.yaml does not validate: {e}");
    }
    cfg
}

#[test]
fn kubernetes_manifests_parse_and_agree() {
    let manifests = kubernetes_manifests();
    for name in [
        "deployment.yaml",
        "configmap.yaml",
        "service.yaml",
        "poddisruptionbudget.yaml",
        "servicemonitor.yaml",
        "kustomization.yaml",
    ] {
        assert!(
            manifests.contains_key(name),
            "deploy/kubernetes/{name} is missing"
        );
    }
    let cfg = configmap_config(&manifests);

    // kustomization.yaml lists every other manifest.
    let listed: BTreeSet<&str> = manifests["kustomization.yaml"]["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let present: BTreeSet<&str> = manifests
        .keys()
        .map(String::as_str)
        .filter(|n| *n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, present,
        "kustomization.yaml's resources must list every manifest"
    );

    let deployment = &manifests["deployment.yaml"];
    assert_eq!(deployment["kind"], "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or_else(|| panic!("deployment.yaml: no terminationGracePeriodSeconds"));
    assert!(
        grace > cfg.shutdown_timeout.as_secs(),
        "terminationGracePeriodSeconds ({grace}) must exceed shutdown_timeout ({:?}), or \
         the kubelet kills promnorm while it drains",
        cfg.shutdown_timeout
    );

    // The port promnorm listens on is the one the pod, probes and Service use.
    let listen: std::net::SocketAddr = cfg
        .listen
        .parse()
        .unwrap_or_else(|e| panic!("listen {:?}: {e}", cfg.listen));
    let ports = container["ports"].as_array();
    assert!(
        ports.is_some_and(|ps| ps
            .iter()
            .any(|p| p["name"] == "http" && p["containerPort"] == listen.port())),
        "deployment.yaml: container port `http` must be {} (the configured listen port)",
        listen.port()
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"], "/-/ready",
        "deployment.yaml: readiness probe"
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"], "/-/healthy",
        "deployment.yaml: liveness probe"
    );
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "readOnlyRootFilesystem");
    assert_eq!(sc["capabilities"]["drop"][0], "ALL", "capabilities.drop");
    assert!(
        pod["securityContext"]["runAsNonRoot"] == true || sc["runAsNonRoot"] == true,
        "deployment.yaml: runAsNonRoot"
    );

    // --config names the file the ConfigMap volume mounts.
    let args: Vec<&str> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let config_path = args
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("deployment.yaml: args {args:?} have no --config FILE"));
    let mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| {
            m["mountPath"].as_str().is_some_and(|dir| {
                *config_path == format!("{}/promnorm.yaml", dir.trim_end_matches('/'))
            }) && pod["volumes"].as_array().into_iter().flatten().any(|v| {
                v["name"] == m["name"]
                    && v["configMap"]["name"] == manifests["configmap.yaml"]["metadata"]["name"]
            })
        });
    assert!(
        mounted,
        "deployment.yaml: {config_path} must be promnorm.yaml of a mounted volume of the ConfigMap"
    );

    let service = &manifests["service.yaml"];
    assert!(
        service["spec"]["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["port"] == listen.port())),
        "service.yaml must expose port {}",
        listen.port()
    );
    let monitor = &manifests["servicemonitor.yaml"];
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
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
