//! Keeps ARCHITECTURE.md's rule true: data flows one way (wire → mapping → derive →
//! forward; pipeline and server on top; app assembles), configuration is plain data that
//! imports no stage, and no stage imports the configuration or reaches back upstream.

use std::collections::BTreeSet;
use std::path::Path;

/// Module → modules of the crate it must not import.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "guard",
        &[
            "config",
            "mapping",
            "derive",
            "forward",
            "pipeline",
            "server",
            "app",
            "reload",
            "normalize",
            "explain",
            "exposition",
        ],
    ),
    (
        "scrape",
        &[
            "config",
            "server",
            "app",
            "reload",
            "pipeline",
            "derive",
            "normalize",
            "explain",
        ],
    ),
    (
        "federate",
        &[
            "config",
            "server",
            "app",
            "reload",
            "pipeline",
            "derive",
            "normalize",
            "explain",
        ],
    ),
    (
        "wire",
        &[
            "config",
            "mapping",
            "derive",
            "forward",
            "pipeline",
            "server",
            "app",
            "reload",
            "telemetry",
            "normalize",
            "explain",
            "exposition",
        ],
    ),
    (
        "config",
        &[
            "wire",
            "mapping",
            "derive",
            "forward",
            "pipeline",
            "server",
            "app",
            "reload",
            "telemetry",
            "normalize",
            "explain",
            "exposition",
        ],
    ),
    (
        "mapping",
        &[
            "config",
            "derive",
            "forward",
            "pipeline",
            "server",
            "app",
            "reload",
            "normalize",
            "explain",
        ],
    ),
    (
        "derive",
        &[
            "config",
            "pipeline",
            "server",
            "app",
            "reload",
            "normalize",
            "explain",
        ],
    ),
    (
        "forward",
        &[
            "config",
            "mapping",
            "derive",
            "pipeline",
            "server",
            "app",
            "reload",
            "normalize",
            "explain",
        ],
    ),
    (
        "pipeline",
        &[
            "config",
            "forward",
            "server",
            "app",
            "reload",
            "normalize",
            "explain",
        ],
    ),
    (
        "server",
        &["config", "app", "reload", "normalize", "explain"],
    ),
    // Issue 24: one assembly (`app::build`) that reload and serve build through; app
    // imports neither, reload does not import serve.
    ("app", &["reload", "serve"]),
    ("reload", &["serve"]),
    // The web UI sits beside the server (app merges its routes): it may read explain
    // and normalize, never configuration files.
    ("web", &["config", "app", "reload"]),
    (
        "migrate",
        &[
            "wire",
            "derive",
            "forward",
            "pipeline",
            "server",
            "app",
            "reload",
            "telemetry",
            "normalize",
        ],
    ),
    (
        "telemetry",
        &[
            "config", "derive", "forward", "pipeline", "server", "app", "reload",
        ],
    ),
];

/// The crate modules a source file names through `crate::…` paths.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a, b::c}`: the group may span lines; take this line's part.
                for item in group.split([',', '}']) {
                    let m: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !m.is_empty() {
                        out.insert(m);
                    }
                }
            } else {
                let m: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(m);
            }
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `.rs` file under `src/`: its path relative to `src/`, and its text.
fn src_files() -> Vec<(std::path::PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().to_path_buf();
            (rel, std::fs::read_to_string(f).unwrap())
        })
        .collect()
}

/// The crate's top-level module a file under `src/` belongs to (`forward` for
/// `forward/queue/mod.rs`, `app` for `app.rs`).
fn top_module(rel: &Path) -> String {
    rel.components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .map(|m| m.trim_end_matches(".rs").to_string())
        .unwrap_or_default()
}

#[test]
fn no_stage_reaches_back_and_config_imports_no_stage() {
    let mut violations = Vec::new();
    for (rel, text) in src_files() {
        let module = top_module(&rel);
        let Some((_, forbidden)) = FORBIDDEN.iter().find(|(m, _)| *m == module) else {
            continue;
        };
        for used in imports(&text) {
            if forbidden.contains(&used.as_str()) {
                violations.push(format!("{} imports crate::{used}", rel.display()));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Top-level module → the crate's modules it imports.
fn import_graph() -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for (rel, text) in src_files() {
        let module = top_module(&rel);
        let out = graph.entry(module.clone()).or_default();
        out.extend(imports(&text).into_iter().filter(|m| *m != module));
    }
    graph
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn find_cycle(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Depth-first, iterative over the path; each module is finished once.
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        let mut path: Vec<String> = Vec::new();
        let mut stack = vec![(start.clone(), false)];
        while let Some((m, leaving)) = stack.pop() {
            if leaving {
                path.pop();
                done.insert(m);
                continue;
            }
            if done.contains(&m) {
                continue;
            }
            if let Some(i) = path.iter().position(|p| *p == m) {
                let mut cycle = path[i..].to_vec();
                cycle.push(m);
                return Some(cycle);
            }
            path.push(m.clone());
            stack.push((m.clone(), true));
            for n in graph.get(&m).into_iter().flatten() {
                if !done.contains(n) {
                    stack.push((n.clone(), false));
                }
            }
        }
    }
    None
}

/// Issue 24: the crate's modules import each other without a cycle (app and reload
/// once did: two ways to assemble the proxy).
#[test]
fn the_modules_import_each_other_without_a_cycle() {
    let graph = import_graph();
    assert!(graph.contains_key("app") && graph.contains_key("reload"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
    // The search finds one when there is one.
    let mut with_cycle = graph.clone();
    with_cycle
        .entry("app".to_string())
        .or_default()
        .insert("reload".to_string());
    assert!(find_cycle(&with_cycle).is_some());
}

#[test]
fn the_import_scanner_sees_what_it_must() {
    let found = imports(
        "use crate::{config::Config, wire};\nlet x = crate::derive::Deriver::new(); // crate::server",
    );
    assert_eq!(
        found,
        ["config", "derive", "wire"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}

#[test]
fn every_mapping_file_is_a_built_in_pack() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("mappings");
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension().is_some_and(|x| x == "yaml"))
                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    let built_in: BTreeSet<String> = promnorm::config::BUILTIN_PACKS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(on_disk, built_in);
    // A pack is named by its file: the declared name must agree.
    for (name, text) in promnorm::config::BUILTIN_PACKS {
        assert!(
            text.lines()
                .any(|l| l.trim_end() == format!("pack: {name}")),
            "mappings/{name}.yaml does not declare `pack: {name}`"
        );
    }
}

/// Issue 24: every call into the C library and every `unsafe` block lives in `src/sys.rs`
/// (`#![deny(unsafe_code)]` on the crate enforces the second; this test both, and the
/// binaries too).
#[test]
fn unsafe_code_and_libc_live_in_sys_only() {
    let mut violations = Vec::new();
    for (rel, text) in src_files() {
        if rel == Path::new("sys.rs") {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let unsafe_block = code.contains("unsafe ") || code.contains("unsafe{");
            if unsafe_block || code.contains("libc::") {
                violations.push(format!("{}:{}: {}", rel.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "outside src/sys.rs:\n{}",
        violations.join("\n")
    );
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    assert!(
        lib.contains("#![deny(unsafe_code)]"),
        "lib.rs denies unsafe code"
    );
}

/// The product package ships the product: one binary (`cargo install` installs the proxy
/// alone); the benchmark tools are the `tools/` workspace member's.
#[test]
fn the_promnorm_package_has_one_binary_and_the_tools_their_own_package() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let bins = manifest.matches("[[bin]]").count();
    assert_eq!(bins, 1, "Cargo.toml declares {bins} binaries");
    assert!(
        !root.join("src/bin").exists(),
        "src/bin would add binaries to the package"
    );
    let tools = std::fs::read_to_string(root.join("tools/Cargo.toml")).unwrap();
    for bin in ["promnorm-bench", "promnorm-payloads"] {
        assert!(
            tools.contains(&format!("name = \"{bin}\"")),
            "tools/ builds {bin}"
        );
    }
    assert!(
        manifest.contains("members = [\"tools\"]"),
        "tools/ is a workspace member"
    );
}

/// Issue 24: the synthetic fleet is a library module only for the tools, tests and benches;
/// nothing the proxy runs imports it, so `--no-default-features` drops it whole.
#[test]
fn only_the_tools_import_the_testkit() {
    let mut violations = Vec::new();
    for (rel, text) in src_files() {
        if rel.starts_with("testkit") || rel == Path::new("lib.rs") {
            continue;
        }
        if imports(&text).contains("testkit") || text.contains("promnorm::testkit") {
            violations.push(rel.display().to_string());
        }
    }
    assert!(violations.is_empty(), "import testkit: {violations:?}");
}

/// Issue 24: four test crates (in process, end to end, and the two with their own global
/// allocator), not one per file: a new `tests/*.rs` would be ignored (`autotests = false`),
/// so a file there other than those two is a test that never runs.
#[test]
fn tests_are_four_crates() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let top: BTreeSet<String> = std::fs::read_dir(&tests)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        top,
        ["fuzz.rs", "zero_alloc.rs"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    // Every module file of the two crates is declared in its main.rs.
    for krate in ["it", "e2e"] {
        let dir = tests.join(krate);
        let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(module) = name.strip_suffix(".rs") else {
                continue;
            };
            if module != "main" {
                assert!(
                    main.contains(&format!("mod {module};")),
                    "tests/{krate}/{name} is not declared in tests/{krate}/main.rs, so it never runs"
                );
            }
        }
    }
}

/// Issue 24: a configuration key's doc comment is its reference, so every item and field of
/// `config/schema.rs` has one (`#![warn(missing_docs)]` there makes clippy say so too).
#[test]
fn every_config_field_has_a_doc_comment() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config/schema.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("#![warn(missing_docs)]"));
    let missing = undocumented(&text);
    assert!(
        missing.is_empty(),
        "src/config/schema.rs: no doc comment on\n{}",
        missing.join("\n")
    );
    // The check sees what it must.
    assert_eq!(
        undocumented(
            "/// A.\npub struct A {\n    /// x\n    pub x: u8,\n    #[serde(default)]\n    pub y: u8,\n}\n"
        ),
        ["6: pub y: u8,"]
    );
}

/// Lines declaring a public item, a public field or an enum variant without a `///` line
/// before them (attributes in between are skipped).
fn undocumented(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut in_enum = false;
    let mut depth = 0usize;
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        let variant = in_enum
            && depth == 1
            && t.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && !t.starts_with("//");
        let declares =
            t.starts_with("pub ") && !t.starts_with("pub use") && !t.starts_with("pub mod");
        if declares || variant {
            let mut k = i;
            // Back over attributes, including ones written over several lines.
            while k > 0 {
                let above = lines[k - 1].trim();
                if above.starts_with("#[") {
                    k -= 1;
                } else if above.ends_with(")]") {
                    while k > 0 && !lines[k - 1].trim().starts_with("#[") {
                        k -= 1;
                    }
                } else {
                    break;
                }
            }
            if k == 0 || !lines[k - 1].trim().starts_with("///") {
                missing.push(format!("{}: {t}", i + 1));
            }
        }
        if depth == 0 && t.starts_with("pub enum") {
            in_enum = true;
        }
        depth += t.matches('{').count();
        depth = depth.saturating_sub(t.matches('}').count());
        if depth == 0 {
            in_enum = false;
        }
    }
    missing
}
