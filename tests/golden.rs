//! Golden tests as data: each `tests/golden/NAME.prom` (one scrape of text exposition)
//! goes through `promnorm normalize` with the embedded default configuration and must
//! equal `tests/golden/NAME.out`. `UPDATE_GOLDEN=1` rewrites the .out files; review the
//! diff before committing.

use std::path::Path;
use std::sync::Arc;

use promnorm::config::Config;
use promnorm::pipeline::{Pipeline, PipelineLimits};

#[test]
fn golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let rules = Config::embedded_default()
        .compile_rules()
        .expect("built-in packs compile");
    let pipeline = Pipeline::new(Arc::new(rules), PipelineLimits::default());
    let mut cases: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "prom"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 8, "golden cases present");
    let update = std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1");
    let mut failures = Vec::new();
    for case in &cases {
        let input = std::fs::read_to_string(case).unwrap();
        let got = promnorm::normalize::normalize(
            &pipeline,
            &[(case.display().to_string(), input)],
            15_000,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let out = case.with_extension("out");
        if update {
            std::fs::write(&out, &got).unwrap();
            continue;
        }
        let want =
            std::fs::read_to_string(&out).unwrap_or_else(|_| panic!("{} missing", out.display()));
        if got != want {
            failures.push(format!(
                "{}:\n--- want\n{want}--- got\n{got}",
                case.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("{} golden cases", cases.len());
}
