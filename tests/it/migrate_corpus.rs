//! `promnorm migrate` over the public corpus (`tests/corpus`, sources in its README):
//! every dashboard, rule file, PrometheusRule, ConfigMap and GrafanaDashboard of the
//! LLM-serving and GPU world that we could collect, with the built-in packs, in both
//! modes. Nothing crashes, every output parses, a second run changes nothing, every
//! rewritten expression parses, no panel's numbers change scale under an unchanged unit,
//! and every old name still referenced after the migration is reported as needing a
//! human. `tests/e2e/migrate.rs` checks the same outputs with a real `promtool`.

use std::path::{Path, PathBuf};

use promnorm::app::Assemble;
use promnorm::config::{Config, yaml};
use promnorm::mapping::Rules;
use promnorm::migrate::files::{self, Rewriters};
use promnorm::migrate::grafana::unit_for;
use promnorm::migrate::{Entry, MigrateError, QueryRewriter, Reason};
use serde_json::Value;

/// Files that are none of the forms migrate knows (prometheus-adapter's values).
const NOT_OURS: &[&str] = &["prodstack__prom-adapter.yaml"];

fn corpus() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut out = Vec::new();
    for dir in ["dashboards", "rules"] {
        for e in std::fs::read_dir(root.join(dir)).expect("corpus directory") {
            let p = e.expect("entry").path();
            if matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("json" | "yaml" | "yml")
            ) {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 50, "the corpus holds {} files", out.len());
    out
}

fn rules() -> Rules {
    Config::embedded_default()
        .compile_rules()
        .expect("built-in packs compile")
}

fn name(p: &Path) -> String {
    p.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn parses(text: &str, json: bool) -> Result<(), String> {
    if json {
        return serde_json::from_str::<Value>(text)
            .map(drop)
            .map_err(|e| e.to_string());
    }
    for range in files::documents(text) {
        yaml::from_str::<Value>(&text[range]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The panels of a dashboard, nested ones included, by their JSON pointer.
fn panels<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a Value)>) {
    for key in ["panels", "rows"] {
        if let Some(Value::Array(ps)) = v.get(key) {
            for (i, p) in ps.iter().enumerate() {
                let here = format!("{at}/{key}/{i}");
                out.push((here.clone(), p));
                panels(p, here, out);
            }
        }
    }
}

/// The dashboard of a file: itself, or the API export's `dashboard`.
fn dashboard(v: &Value) -> &Value {
    v.get("dashboard").filter(|d| d.is_object()).unwrap_or(v)
}

fn panel_unit(p: &Value) -> Option<&str> {
    p.pointer("/fieldConfig/defaults/unit")
        .or_else(|| p.pointer("/yaxes/0/format"))
        .and_then(Value::as_str)
}

/// No panel whose queries' values change by a factor keeps a unit that does not fit
/// them: either the unit changed, or it is the unit the values are now in.
fn units_agree(file: &str, before: &Value, after: &Value, rw: &QueryRewriter<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    panels(dashboard(before), String::new(), &mut a);
    panels(dashboard(after), String::new(), &mut b);
    assert_eq!(a.len(), b.len(), "{file}: the panels stay");
    for ((at, old), (_, new)) in a.iter().zip(&b) {
        let Some(Value::Array(targets)) = old.get("targets") else {
            continue;
        };
        for (i, t) in targets.iter().enumerate() {
            let Some(expr) = t.get("expr").and_then(Value::as_str) else {
                continue;
            };
            let out = new
                .pointer(&format!("/targets/{i}/expr"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let r = rw.rewrite(expr);
            let Some(f) = r.value_factor else { continue };
            if out != r.query {
                continue; // rewritten to keep its values
            }
            let (u0, u1) = (panel_unit(old), panel_unit(new));
            let fits = u1.is_some() && u1 == r.value_unit.as_deref().and_then(unit_for);
            if u0 == u1 && !fits {
                problems.push(format!(
                    "{file}{at}: values {f} under the unchanged unit {u0:?}: {out}"
                ));
            }
        }
    }
    problems
}

#[derive(Default)]
struct Tally {
    files: usize,
    entries: usize,
    rewritten: usize,
    human: usize,
}

fn check_entries(
    file: &str,
    entries: &[Entry],
    rw: &QueryRewriter<'_>,
    problems: &mut Vec<String>,
) {
    for e in entries {
        // Panel and rule expressions (not units, legends or variable functions).
        let is_expr = e.location.contains(".expr") || e.location.contains(".rules[");
        if !is_expr || e.before == e.after {
            continue;
        }
        let again = rw.rewrite(&e.after);
        if again
            .findings
            .iter()
            .any(|f| f.reason == Reason::ParseError)
        {
            problems.push(format!(
                "{file}: {}: does not parse: {}",
                e.location, e.after
            ));
        }
    }
}

fn run(keep_values: bool) -> Tally {
    let rules = rules();
    let dash = QueryRewriter::new(&rules, keep_values);
    let rule_rw = QueryRewriter::new(&rules, true);
    let rw = Rewriters {
        dashboards: &dash,
        rules: &rule_rw,
    };
    let mut problems = Vec::new();
    let mut tally = Tally::default();
    for path in corpus() {
        let file = name(&path);
        let text = std::fs::read_to_string(&path).expect("corpus file");
        let json = file.ends_with(".json");
        let m = match files::migrate(&rw, &text) {
            Ok(m) => m,
            Err(MigrateError::Unrecognized(_)) if NOT_OURS.contains(&file.as_str()) => continue,
            Err(e) => {
                problems.push(format!("{file}: {e}"));
                continue;
            }
        };
        tally.files += 1;
        tally.entries += m.entries.len();
        tally.rewritten += m.entries.iter().filter(|e| e.before != e.after).count();
        tally.human += m.entries.iter().filter(|e| e.needs_human()).count();
        if let Err(e) = parses(&m.text, json) {
            problems.push(format!("{file}: the output does not parse: {e}"));
            continue;
        }
        check_entries(&file, &m.entries, &dash, &mut problems);
        if json && !keep_values {
            let before: Value = serde_json::from_str(&text).expect("corpus JSON");
            let after: Value = serde_json::from_str(&m.text).expect("checked above");
            problems.extend(units_agree(&file, &before, &after, &dash));
        }
        // A second run changes nothing, and what still references an old name is said.
        match files::migrate(&rw, &m.text) {
            Ok(again) => {
                if again.changed {
                    problems.push(format!("{file}: a second migration changed it again"));
                }
                for e in again
                    .entries
                    .iter()
                    .filter(|e| !e.old_references.is_empty())
                {
                    if !e.needs_human() {
                        problems.push(format!(
                            "{file}: {}: still references {:?} and nothing says why",
                            e.location, e.old_references
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!("{file}: the output does not migrate: {e}")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    tally
}

#[test]
fn the_public_corpus_migrates_to_valid_consistent_files() {
    let new_unit = run(false);
    let keep = run(true);
    eprintln!(
        "corpus: {} files; new units: {} entries, {} rewritten, {} need a human; keep values: \
         {} entries, {} rewritten, {} need a human",
        new_unit.files,
        new_unit.entries,
        new_unit.rewritten,
        new_unit.human,
        keep.entries,
        keep.rewritten,
        keep.human
    );
    assert!(new_unit.rewritten > 100, "the corpus exercises the rewrite");
}
