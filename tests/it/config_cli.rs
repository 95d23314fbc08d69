//! The configuration as a new user meets it, through the binary: defaults key by key,
//! check-config refusing exactly what serve refuses, errors said once with positions,
//! the printed configuration, the full example, version, help, completions.

use std::collections::BTreeSet;
use std::process::Command;

fn promnorm_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_promnorm"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run promnorm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn promnorm(args: &[&str]) -> (bool, String, String) {
    promnorm_env(args, &[])
}

fn tmp(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("promnorm-config-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn partial_files_override_the_defaults_key_by_key() {
    for (name, text) in [
        ("empty.yaml", ""),
        ("comments.yaml", "# nothing here\n"),
        (
            "only-backends.yaml",
            "backends:\n  - url: http://127.0.0.1:8428/api/v1/write\n",
        ),
        ("only-derived.yaml", "derived:\n  window: 1m\n"),
        ("only-packs.yaml", "packs:\n  builtin: {dcgm: false}\n"),
    ] {
        let f = tmp(name, text);
        let (ok, out, err) = promnorm(&["check-config", &f]);
        assert!(ok, "{name}: {err}");
        assert!(out.contains(": ok ("), "{name}: {out}");
        let (ok, printed, err) = promnorm(&["check-config", "--print", &f]);
        assert!(ok, "{name}: {err}");
        assert!(
            printed.contains("listen: 0.0.0.0:9201"),
            "{name}: {printed}"
        );
        if name != "only-backends.yaml" {
            // An omitted `backends` means the default backend.
            assert!(
                printed.contains("url: http://127.0.0.1:9090/api/v1/write"),
                "{name}: {printed}"
            );
        }
    }
}

#[test]
fn listen_takes_the_forms_prometheus_and_vmagent_take() {
    for listen in [":9201", "localhost:9201", "127.0.0.1:9201", "[::]:9201"] {
        let f = tmp("listen.yaml", &format!("listen: \"{listen}\"\n"));
        let (ok, _, err) = promnorm(&["check-config", &f]);
        assert!(ok, "{listen}: {err}");
    }
    let f = tmp("bad-listen.yaml", "listen: nonsense\n");
    let (ok, _, err) = promnorm(&["check-config", &f]);
    assert!(!ok);
    assert!(
        err.contains("bad-listen.yaml:1:9: listen \"nonsense\""),
        "{err}"
    );
}

#[test]
fn check_config_refuses_what_serve_refuses_with_positions() {
    let cases = [
        (
            "no-backends.yaml",
            "backends: []\n",
            "no-backends.yaml:1:11: at least one backend",
        ),
        (
            "unset-env.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    bearer_token: {env: PROMNORM_SURELY_UNSET}\n",
            "unset-env.yaml:3:25: backend default: environment variable PROMNORM_SURELY_UNSET is not set",
        ),
        (
            "no-password-file.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    basic_auth: {username: u, password: {file: /nonexistent/pw}}\n",
            "no-password-file.yaml:3:48: backend default: cannot read /nonexistent/pw",
        ),
        (
            "no-ca.yaml",
            "backends:\n  - url: https://x/api/v1/write\n    tls: {ca_file: /nonexistent/ca.pem}\n",
            "no-ca.yaml:3:20: backend default: cannot read ca_file /nonexistent/ca.pem",
        ),
        (
            "dup-names.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    name: a\n  - url: http://y/api/v1/write\n    name: a\n",
            "dup-names.yaml:5:11: two backends are named \"a\"",
        ),
        (
            "bad-url.yaml",
            "backends:\n  - url: 127.0.0.1:8428/api/v1/write\n",
            "bad-url.yaml:2:10: backend url \"127.0.0.1:8428/api/v1/write\"",
        ),
        (
            "bad-pack.yaml",
            "packs:\n  builtin: {dcgmm: false}\n",
            "bad-pack.yaml:2:13: unknown built-in pack \"dcgmm\"",
        ),
        (
            "bad-gpu.yaml",
            "derived:\n  peaks:\n    - match: {model_name: x}\n      gpu: A10G\n",
            "bad-gpu.yaml:4:12: derived.peaks[0]: unknown gpu \"A10G\"",
        ),
        (
            "pass-length.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    pass_headers: [Content-Length]\n",
            "pass-length.yaml:3:20: backend default: pass_headers may not list \"Content-Length\"",
        ),
        (
            "tenant-label.yaml",
            "tenancy:\n  label: 9lives\n",
            "tenant-label.yaml:2:10: tenancy.label \"9lives\" is not a label name",
        ),
        (
            "tenant-header.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    tenancy: {header: Content-Type}\n",
            "tenant-header.yaml:3:23: backend default: tenancy.header may not be \"Content-Type\"",
        ),
        (
            "tenant-default.yaml",
            "tenancy: {default: \"\"}\n",
            "tenancy.default \"\" cannot be a header value",
        ),
        (
            "tenant-max.yaml",
            "tenancy:\n  max_tenants_per_request: 0\n",
            "tenant-max.yaml:2:28: tenancy.max_tenants_per_request must be positive",
        ),
    ];
    for (name, text, want) in cases {
        let f = tmp(name, text);
        let (ok, _, err) = promnorm(&["check-config", &f]);
        assert!(!ok, "{name} must be refused");
        assert!(err.contains(want), "{name}: want {want:?} in {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
    }
}

#[test]
fn a_url_without_a_path_is_accepted_with_a_warning() {
    let f = tmp("no-path.yaml", "backends:\n  - url: http://x:8428\n");
    let (ok, _, err) = promnorm(&["check-config", &f]);
    assert!(ok, "{err}");
    assert!(err.contains("warning: "), "{err}");
    assert!(err.contains("has no path"), "{err}");
}

#[test]
fn queues_are_checked_like_serve_opens_them() {
    // A disk queue whose filesystem cannot hold max_bytes: accepted, with a warning.
    let f = tmp(
        "big-queue.yaml",
        "backends:\n  - url: http://x/api/v1/write\n    queue: {type: disk, dir: q, max_bytes: 1125899906842624}\n",
    );
    let (ok, _, err) = promnorm(&["check-config", &f]);
    assert!(ok, "{err}");
    assert!(
        err.contains("less than queue.max_bytes 1125899906842624"),
        "{err}"
    );
    // Refused, with positions: no dir, a dir two backends share, shards out of range.
    for (name, text, want) in [
        (
            "no-dir.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    queue: {type: disk}\n",
            "no-dir.yaml:3:19: backend default: a disk queue needs queue.dir",
        ),
        (
            "shared-dir.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    queue: {type: disk, dir: q}\n  - url: http://y/api/v1/write\n    queue: {type: disk, dir: q}\n",
            "is used by another backend",
        ),
        (
            "shards.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    queue: {type: memory, shards: 0}\n",
            "shards.yaml:3:35: backend default: queue.shards must be from 1 to 256",
        ),
        (
            "status.yaml",
            "server: {throttle_status: 500}\n",
            "status.yaml:1:27: server.throttle_status must be 429 or 503",
        ),
    ] {
        let f = tmp(name, text);
        let (ok, _, err) = promnorm(&["check-config", &f]);
        assert!(!ok, "{name} accepted");
        assert!(err.contains(want), "{name}: {err}");
    }
}

#[test]
fn errors_are_said_once() {
    let f = tmp(
        "typo.yaml",
        "backends:\n  - url: http://x/a\n    timout: 5s\n",
    );
    let (ok, _, err) = promnorm(&["check-config", &f]);
    assert!(!ok);
    assert!(err.contains("typo.yaml:3:5: "), "{err}");
    assert_eq!(err.matches("3:5").count(), 1, "position once: {err}");
    assert!(!err.contains("line 3 column 5"), "{err}");
    let (ok, _, err) = promnorm(&["check-config", "/nonexistent/promnorm.yaml"]);
    assert!(!ok);
    assert_eq!(
        err.matches("No such file or directory").count(),
        1,
        "cause once: {err}"
    );
}

/// Key paths of a configuration printed by `check-config --print`, free-form maps
/// (headers, per-pack overrides, matchers) taken as one key.
fn key_paths(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    const FREE_FORM: &[&str] = &[
        "headers",
        "keep_original",
        "sum_over_ranks",
        "builtin",
        "match",
    ];
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                if !FREE_FORM.contains(&k.as_str()) {
                    key_paths(v, &p, out);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

fn printed_keys(file: &str, env: &[(&str, &str)]) -> BTreeSet<String> {
    let (ok, printed, err) = promnorm_env(&["check-config", "--print", file], env);
    assert!(ok, "{err}");
    let v: serde_json::Value =
        promnorm::config::yaml::from_str(&printed).expect("printed configuration parses");
    let mut keys = BTreeSet::new();
    key_paths(&v, "", &mut keys);
    keys
}

#[test]
fn the_full_example_is_valid_and_names_every_key() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/promnorm.full.yaml");
    let env = [
        ("PROMNORM_BACKEND_TOKEN", "t"),
        ("PROMNORM_BACKEND_PASSWORD", "p"),
        ("PROMNORM_INGEST_TOKEN", "i"),
    ];
    let (ok, _, err) = promnorm_env(&["check-config", example], &env);
    assert!(ok, "{err}");
    let defaults = printed_keys(&tmp("defaults.yaml", ""), &[]);
    let written: BTreeSet<String> = {
        let text = std::fs::read_to_string(example).unwrap();
        let v: serde_json::Value = promnorm::config::yaml::from_str(&text).unwrap();
        let mut keys = BTreeSet::new();
        key_paths(&v, "", &mut keys);
        keys
    };
    let missing: Vec<_> = defaults.difference(&written).collect();
    assert!(
        missing.is_empty(),
        "keys missing from the full example: {missing:?}"
    );
    // Every key line has a comment above it or beside it.
    let text = std::fs::read_to_string(example).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start().trim_start_matches("- ");
        let is_key = !t.starts_with('#') && t.contains(':') && !t.is_empty();
        if is_key {
            let commented = line.contains(" #")
                || lines[..i]
                    .iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .is_some_and(|l| l.trim_start().starts_with('#'))
                || t.ends_with(':'); // a section header: its keys carry the comments
            assert!(commented, "line {}: {line:?} has no comment", i + 1);
        }
    }
}

#[test]
fn the_printed_configuration_hides_secrets() {
    let f = tmp(
        "secrets.yaml",
        "backends:\n  - url: http://alice:hunter2@x/api/v1/write\n    headers: {Authorization: Bearer topsecret, X-Scope-OrgID: t}\n",
    );
    let (ok, out, err) = promnorm(&["check-config", "--print", &f]);
    assert!(ok, "{err}");
    assert!(
        !out.contains("hunter2") && !out.contains("topsecret"),
        "{out}"
    );
    assert!(out.contains("alice:<secret>@x"), "{out}");
    assert!(out.contains("X-Scope-OrgID: t"), "{out}");
}

#[test]
fn version_help_completions_and_man_page() {
    let (ok, out, _) = promnorm(&["version"]);
    assert!(ok);
    assert!(out.contains("revision ") && out.contains("rustc "), "{out}");
    // Every argument of every subcommand has help text.
    for sub in [
        "serve",
        "check-config",
        "normalize",
        "explain",
        "rules",
        "healthcheck",
        "completions",
    ] {
        let (ok, out, err) = promnorm(&[sub, "--help"]);
        assert!(ok, "{sub}: {err}");
        for line in out
            .lines()
            .filter(|l| l.trim_start().starts_with("--") || l.trim_start().starts_with('<'))
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            let described = words.len() > 2 || line.contains("  ") && words.len() > 1;
            assert!(described, "{sub}: {line:?} has no help text\n{out}");
        }
    }
    let (ok, out, _) = promnorm(&["completions", "bash"]);
    assert!(ok && out.contains("promnorm"), "{out}");
    let (ok, out, _) = promnorm(&["man"]);
    assert!(ok && out.contains(".TH promnorm"), "{out}");
}

#[test]
fn logs_have_no_colours_when_stderr_is_not_a_terminal() {
    // A port already taken makes serve log a warning (the backend URL has no path) and
    // exit at once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let (ok, _, err) = promnorm_env(
        &[
            "serve",
            "--listen",
            &listen,
            "--log.level",
            "debug",
            "--backend",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert!(!ok, "serve must fail on a taken port: {err}");
    assert!(err.contains("listening on"), "{err}");
    assert!(
        err.contains("WARN") && err.contains("has no path"),
        "a log line: {err}"
    );
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escapes in piped logs: {err:?}"
    );
}

#[test]
fn sizes_take_units_everywhere_a_size_is_configured() {
    use promnorm::config::format_byte_size;
    for (written, bytes) in [
        ("1048576", 1u64 << 20),
        ("2097152B", 2 << 20),
        ("64000KB", 64_000_000),
        ("64MB", 64_000_000),
        ("1GB", 1_000_000_000),
        ("65536KiB", 64 << 20),
        ("64MiB", 64 << 20),
        ("64 MiB", 64 << 20),
        ("1GiB", 1 << 30),
    ] {
        for key in ["limits.max_inflight_bytes", "backends[].queue.max_bytes"] {
            let text = if key.starts_with("limits") {
                format!("limits:\n  max_inflight_bytes: {written}\n")
            } else {
                format!(
                    "backends:\n  - url: http://x/api/v1/write\n    queue: {{type: memory, max_bytes: {written}}}\n"
                )
            };
            let f = tmp("size.yaml", &text);
            let (ok, printed, err) = promnorm(&["check-config", "--print", &f]);
            assert!(ok, "{key}: {written}: {err}");
            let leaf = key.rsplit('.').next().unwrap();
            let want = format!("{leaf}: {}\n", format_byte_size(bytes));
            assert!(
                printed.contains(&want),
                "{written}: want {want:?} in {printed}"
            );
        }
    }
    // The other sizes take them too.
    let f = tmp(
        "sizes.yaml",
        "limits:\n  max_body_bytes: 4MiB\n  max_decoded_bytes: 60MB\n  max_label_value_bytes: 1KiB\n  max_inflight_bytes: 1GiB\n",
    );
    let (ok, printed, err) = promnorm(&["check-config", "--print", &f]);
    assert!(ok, "{err}");
    for want in [
        "max_body_bytes: 4MiB\n",
        "max_decoded_bytes: 60MB\n",
        "max_label_value_bytes: 1KiB\n",
        "max_inflight_bytes: 1GiB\n",
    ] {
        assert!(printed.contains(want), "{want:?} in {printed}");
    }
}

#[test]
fn a_size_with_an_unknown_unit_is_refused_at_its_position() {
    for (text, at) in [
        (
            "limits:\n  max_body_bytes: 1MiB\n  max_inflight_bytes: 64 MiBs\n",
            "bad-size.yaml:3:23: ",
        ),
        (
            "backends:\n  - url: http://x/api/v1/write\n    queue:\n      max_bytes: 64 MiBs\n",
            "bad-size.yaml:4:18: ",
        ),
    ] {
        let f = tmp("bad-size.yaml", text);
        let (ok, _, err) = promnorm(&["check-config", &f]);
        assert!(!ok);
        assert!(err.contains(at), "want {at:?} in {err}");
        assert!(
            err.contains("\"64 MiBs\": unknown unit; use B, KB, MB, GB, KiB, MiB, GiB"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    for (value, want) in [
        ("1.5GiB", "a size is a whole number"),
        ("-1", "cannot be negative"),
        ("lots", "a size is a whole number"),
    ] {
        let f = tmp(
            "bad-number.yaml",
            &format!("limits:\n  max_label_value_bytes: {value}\n"),
        );
        let (ok, _, err) = promnorm(&["check-config", &f]);
        assert!(!ok, "{value} accepted");
        assert!(err.contains("bad-number.yaml:2:26: "), "{value}: {err}");
        assert!(err.contains(want), "{value}: {err}");
    }
}

#[test]
fn the_printed_configuration_reads_back_as_itself() {
    let f = tmp(
        "roundtrip.yaml",
        "limits:\n  max_body_bytes: 8MiB\n  max_label_value_bytes: 100000\nderived:\n  max_series: 5000\nbackends:\n  - url: http://x/api/v1/write\n    queue: {type: memory}\n  - url: http://y/api/v1/write\n    queue: {type: memory, max_bytes: 300MB}\n",
    );
    let env = [("PROMNORM_MEMORY_LIMIT_BYTES", "4GiB")];
    let (ok, first, err) = promnorm_env(&["check-config", "--print", &f], &env);
    assert!(ok, "{err}");
    assert!(
        first.starts_with(
            "# memory: limit 4GiB (PROMNORM_MEMORY_LIMIT_BYTES), 2.4GiB allowed; bound "
        ),
        "{first}"
    );
    // `auto` stays `auto`, with its value beside it.
    let sizing = promnorm::config::Config::load(std::path::Path::new(&f))
        .unwrap()
        .sizing_for(
            Some(promnorm::config::MemoryLimit {
                bytes: 4 << 30,
                source: promnorm::config::LimitSource::Env,
            }),
            std::thread::available_parallelism().map_or(1, |n| n.get()) as u64,
        );
    for want in [
        format!(
            "max_inflight_bytes: auto # {}\n",
            promnorm::config::format_byte_size(sizing.max_inflight_bytes)
        ),
        format!(
            "max_decoded_bytes: auto # {}\n",
            promnorm::config::format_byte_size(sizing.max_decoded_bytes)
        ),
        "max_body_bytes: 8MiB\n".into(),
        "max_label_value_bytes: 100KB\n".into(),
        "max_series: 5000\n".into(),
        "max_pending_samples: auto # 5000\n".into(),
        format!(
            "max_bytes: auto # {}\n",
            promnorm::config::format_byte_size(sizing.queue_max_bytes[0])
        ),
        "max_bytes: 300MB\n".into(),
    ] {
        assert!(first.contains(&want), "want {want:?} in {first}");
    }
    let again = tmp("roundtrip-printed.yaml", &first);
    let (ok, second, err) = promnorm_env(&["check-config", "--print", &again], &env);
    assert!(ok, "{err}");
    assert_eq!(first, second);
}

#[test]
fn sizes_beyond_the_memory_limit_are_accepted_with_a_warning() {
    let f = tmp("too-big.yaml", "limits:\n  max_inflight_bytes: 1GiB\n");
    let env = [("PROMNORM_MEMORY_LIMIT_BYTES", "512MiB")];
    let (ok, _, err) = promnorm_env(&["check-config", &f], &env);
    assert!(ok, "{err}");
    assert!(
        err.contains("too-big.yaml:2:23: the memory bound "),
        "{err}"
    );
    assert!(
        err.contains("exceeds the memory limit 512MiB (PROMNORM_MEMORY_LIMIT_BYTES)"),
        "{err}"
    );
    // The defaults fit: no warning.
    let f = tmp("defaults.yaml", "");
    let (ok, _, err) = promnorm_env(
        &["check-config", &f],
        &[("PROMNORM_MEMORY_LIMIT_BYTES", "4GiB")],
    );
    assert!(ok, "{err}");
    assert!(!err.contains("memory bound"), "{err}");
    // A limit that is not a size is an error.
    let (ok, _, err) = promnorm_env(
        &["check-config", &f],
        &[("PROMNORM_MEMORY_LIMIT_BYTES", "half")],
    );
    assert!(!ok);
    assert!(
        err.contains("PROMNORM_MEMORY_LIMIT_BYTES: \"half\""),
        "{err}"
    );
}

/// Issue 26: errors that pointed at the wrong place or said nothing of the fix. Each is
/// one line, at the position of what to change, saying what to change.
#[test]
fn misleading_errors_name_the_position_and_the_fix() {
    let mut wrong = Vec::new();
    for (name, text, want) in [
        (
            // Said "invalid format" (the flag said the right thing).
            "no-scheme.yaml",
            "backends:\n  - name: a\n    url: 127.0.0.1:19091/api/v1/write\n",
            ":3:10: backend url \"127.0.0.1:19091/api/v1/write\" must be http:// or https:// with a host (write \"http://127.0.0.1:19091/api/v1/write\")",
        ),
        (
            // `url` one column left of `name`: said "4:5 … missing field 'url'".
            "misindented.yaml",
            "listen: :9201\nbackends:\n  - name: a\n   url: http://x/api/v1/write\n",
            ":4:4: wrong indentation or structure: line 4 does not line up with the keys above it",
        ),
        (
            // Said 2:5, the list item's start.
            "no-unit.yaml",
            "backends:\n  - url: http://x/api/v1/write\n    timeout: 30\n",
            ":3:14: backends[0].timeout: duration \"30\" needs a unit (ms, s, m, h)",
        ),
        (
            "no-unit-optional.yaml",
            "derived:\n  window: 60\n",
            ":2:11: derived.window: duration \"60\" needs a unit (ms, s, m, h)",
        ),
        (
            "tab.yaml",
            "backends:\n\t- url: http://x/api/v1/write\n",
            ":2:1: not valid YAML: found character that cannot start any token, while scanning for the next token; YAML indents with spaces, not tabs",
        ),
    ] {
        let f = tmp(name, text);
        let (ok, _, err) = promnorm(&["check-config", &f]);
        let want = format!("promnorm: {f}{want}");
        // All cases said, not only the first wrong one.
        if ok || !err.starts_with(&want) || err.lines().count() != 1 {
            wrong.push(format!("{name}:\n want {want}\n  got {err}"));
        }
    }

    // A missing mapping file: said "mine.yaml: No such file or directory".
    let f = tmp("missing-pack.yaml", "packs:\n  files:\n    - mine.yaml\n");
    let dir = std::path::Path::new(&f).parent().unwrap().to_path_buf();
    let out = Command::new(env!("CARGO_BIN_EXE_promnorm"))
        .args(["check-config", "missing-pack.yaml"])
        .current_dir(&dir)
        .output()
        .expect("run promnorm");
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "promnorm: missing-pack.yaml:3:7: packs.files[0]: cannot read {}: No such file or directory (os error 2)",
        dir.join("mine.yaml").display()
    );
    if out.status.success() || err.trim_end() != want {
        wrong.push(format!("missing-pack.yaml:\n want {want}\n  got {err}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
