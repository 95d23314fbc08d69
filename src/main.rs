use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use promnorm::app::Assemble;
use promnorm::config::{Config, LogFormat, parse_duration};

#[derive(Parser)]
#[command(
    name = "promnorm",
    version = long_version(),
    about = "Prometheus remote-write proxy that normalises LLM-inference metrics"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn long_version() -> &'static str {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (revision ",
        env!("PROMNORM_REVISION"),
        ", rustc ",
        env!("PROMNORM_RUSTC_VERSION"),
        ")"
    )
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (without --config: the embedded default configuration).
    Serve {
        /// Configuration file (YAML); keys it omits keep their defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address (`host:port`, `:port`, `localhost:port`); overrides the file.
        #[arg(long)]
        listen: Option<String>,
        /// Backend remote-write URL; repeatable; replaces the configured backends.
        #[arg(long = "backend")]
        backends: Vec<String>,
        /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or `RUST_LOG` syntax);
        /// overrides RUST_LOG.
        #[arg(long = "log.level")]
        log_level: Option<String>,
        /// Log format (`text` or `json`); overrides the file's `log_format`.
        #[arg(long = "log.format", value_parser = ["text", "json"])]
        log_format: Option<String>,
        /// Allow `POST /-/reload` (as Prometheus' flag); SIGHUP reloads either way.
        #[arg(long = "web.enable-lifecycle")]
        web_enable_lifecycle: bool,
    },
    /// Validate a configuration file exactly as `serve` would (secrets, TLS files,
    /// packs); exit 1 on error.
    CheckConfig {
        /// Configuration file (YAML).
        file: PathBuf,
        /// Print the effective configuration (defaults filled in, secrets redacted).
        #[arg(long)]
        print: bool,
    },
    /// Run the pipeline on text-exposition files and print the output samples.
    Normalize {
        /// Configuration file (YAML) whose packs and derived series apply.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Time between two files (scrapes), for timestamps and derived series.
        #[arg(long, default_value = "15s")]
        interval: String,
        /// Exposition files, one scrape each, in order (`-` or none: stdin).
        files: Vec<PathBuf>,
    },
    /// Show which rules apply to a metric name, family name or selector name{a="b"}, and
    /// what it becomes.
    Explain {
        /// Configuration file (YAML) whose packs apply.
        #[arg(long)]
        config: Option<PathBuf>,
        /// A metric name, or a selector such as `name{label="value"}`.
        name: String,
    },
    /// Print Prometheus recording rules that compute the derived series (and sums over
    /// ranks) in a backend's ruler, for promnorm run with `derived.enabled: false`.
    Rules {
        /// Configuration file (YAML) whose peaks and packs apply (not `derived.enabled`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// rate() window (default: the file's `derived.window`, else 1m); at least two
        /// scrape intervals.
        #[arg(long, value_parser = parse_duration)]
        window: Option<std::time::Duration>,
        /// The group's evaluation interval (default: the ruler's own).
        #[arg(long, value_parser = parse_duration)]
        interval: Option<std::time::Duration>,
        /// Read every selector this far back, for samples that reach the ruler late.
        #[arg(long, value_parser = parse_duration)]
        offset: Option<std::time::Duration>,
        /// Also sum this physical per-rank family, which a pack matches by pattern only
        /// (e.g. `sglang:hicache_backup_bytes_total`); repeatable.
        #[arg(long = "sum-family")]
        sum_families: Vec<String>,
    },
    /// Rewrite PromQL, Grafana dashboards and rule files written against the old metric
    /// names and units with the same rules the proxy applies (docs/migrations.md).
    Migrate {
        #[command(subcommand)]
        what: MigrateCommand,
    },
    /// Print the version, the commit it was built from and the compiler.
    Version,
    /// GET a local http:// URL and exit 0 on a 2xx answer (the container HEALTHCHECK:
    /// the runtime image has no curl).
    Healthcheck {
        /// The URL to check.
        #[arg(default_value = "http://127.0.0.1:9201/-/healthy")]
        url: String,
    },
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

#[derive(clap::Args)]
struct MigrateOptions {
    /// Configuration file (YAML) whose packs apply.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Exit 1 and list every old metric name or label still referenced (CI of a
    /// dashboards or rules repository); write nothing.
    #[arg(long)]
    check: bool,
    /// Also write the report (per expression: what changed, why, what needs a human)
    /// as JSON to this file.
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Subcommand)]
enum MigrateCommand {
    /// Rewrite one PromQL query: the new query on stdout, one line per finding on stderr.
    Query {
        #[command(flatten)]
        opts: MigrateOptions,
        /// Return exactly the old values (a factor placed where the unit changed);
        /// without it the values come out in the new base unit, which stderr names.
        #[arg(long)]
        keep_values: bool,
        /// The query.
        query: String,
    },
    /// Rewrite a Grafana dashboard (JSON): panels, rows, variables, legends, and
    /// without --keep-values each panel's unit, thresholds and bounds. Also a ConfigMap
    /// embedding dashboards or rule files, or a directory of them (with -o OUTDIR).
    Grafana {
        #[command(flatten)]
        opts: MigrateOptions,
        /// Keep every panel's values (and unit) as they were.
        #[arg(long)]
        keep_values: bool,
        /// The dashboard, or a directory (`-`: stdin).
        input: PathBuf,
        /// Where to write the new dashboard (default: stdout); for a directory, the
        /// directory that receives the migrated copy.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Rewrite a Prometheus rule file (alerting and recording rules), a PrometheusRule
    /// resource, a ConfigMap embedding them, several YAML documents, or a directory of
    /// them (with -o OUTDIR); thresholds keep their meaning.
    Rules {
        #[command(flatten)]
        opts: MigrateOptions,
        /// The rule file, or a directory (`-`: stdin).
        input: PathBuf,
        /// Where to write the new rule file (default: stdout); for a directory, the
        /// directory that receives the migrated copy.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

/// README, for the man page's configuration section: its table is kept equal to the
/// schema by tests/it/config_docs.rs, so the page cannot drift from the code either.
const README: &str = include_str!("../README.md");

/// One page for everything: clap_mangen's title, synopsis and options, then every
/// command with its own options (its default lists `promnorm-serve(1)` and friends,
/// pages that do not exist), then the configuration keys.
fn write_man(cmd: clap::Command, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    writeln!(out, ".SH COMMANDS")?;
    for sub in cmd.get_subcommands() {
        let name = sub.get_name();
        let usage = sub
            .clone()
            .bin_name(format!("promnorm {name}"))
            .render_usage();
        let usage = usage.to_string();
        let usage = usage.trim_start_matches("Usage: ");
        writeln!(out, ".SS {}", roff(name))?;
        writeln!(out, ".B {}", roff(usage))?;
        writeln!(out, ".br")?;
        if let Some(about) = sub.get_long_about().or(sub.get_about()) {
            writeln!(out, "{}", roff(&about.to_string()))?;
        }
        for arg in sub.get_arguments() {
            if arg.is_hide_set() {
                continue;
            }
            let flag = match (arg.get_long(), arg.get_short()) {
                (Some(l), _) => format!("--{l}"),
                (None, Some(s)) => format!("-{s}"),
                (None, None) => arg.get_id().to_string().to_uppercase(),
            };
            writeln!(out, ".TP\n\\fB{}\\fR", roff(&flag))?;
            if let Some(help) = arg.get_help() {
                writeln!(out, "{}", roff(&help.to_string()))?;
            }
        }
    }
    writeln!(out, ".SH CONFIGURATION")?;
    writeln!(
        out,
        "YAML, given with \\fB--config\\fR; unknown keys are errors and every key has a default. \\fBpromnorm check-config --print FILE\\fR shows the effective configuration."
    )?;
    let table = README
        .split("| key | default | meaning |")
        .nth(1)
        .unwrap_or_default();
    for line in table.lines().skip(2) {
        let Some(row) = line.strip_prefix('|') else {
            break;
        };
        let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").collect();
        if let [key, default, meaning, ..] = cells[..] {
            let plain = |s: &str| s.trim().replace('`', "");
            writeln!(
                out,
                ".TP\n\\fB{}\\fR (default: {})\n{}",
                roff(&plain(key)),
                roff(&plain(default)),
                roff(&plain(meaning))
            )?;
        }
    }
    writeln!(out, ".SH FILES")?;
    writeln!(
        out,
        "The packs are built in; \\fBexamples/promnorm.full.yaml\\fR in the source lists every key with a comment, and \\fBdocs/\\fR holds the wire, rule, queue, tenancy and telemetry references."
    )?;
    man.render_version_section(out)
}

/// Text as roff: backslashes escaped, and no line that starts with a control character.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e")
        .lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn healthcheck(url: &str) -> anyhow::Result<bool> {
    use std::io::Write;
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("healthcheck needs an http:// URL"))?;
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(host)?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {host}"))?;
    let timeout = std::time::Duration::from_secs(3);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut head = [0u8; 12];
    let mut n = 0;
    while n < head.len() {
        let r = s.read(&mut head[n..])?;
        if r == 0 {
            break;
        }
        n += r;
    }
    Ok(n == 12 && head.starts_with(b"HTTP/1.") && head[9] == b'2')
}

fn load(config: Option<&PathBuf>) -> anyhow::Result<Config> {
    Ok(match config {
        Some(p) => Config::load(p)?,
        None => Config::embedded_default(),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Our errors carry their causes in their own message: print it once.
            eprintln!("promnorm: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Healthcheck { url } => {
            if !healthcheck(&url)? {
                eprintln!("promnorm: {url} is not healthy");
                return Ok(ExitCode::from(1));
            }
        }
        Command::Version => {
            println!(
                "promnorm {} (revision {}, rustc {})",
                promnorm::VERSION,
                promnorm::REVISION,
                promnorm::RUSTC_VERSION
            );
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "promnorm", &mut std::io::stdout());
        }
        Command::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            write_man(cmd, &mut std::io::stdout().lock())?;
        }
        Command::CheckConfig { file, print } => {
            let cfg = Config::load(&file)?;
            // What serve builds, backends (credentials, TLS files) and the ingest token
            // included: a configuration check-config accepts, serve accepts.
            let running = promnorm::app::build(&cfg, None)?;
            let rules = running.state.pipeline.rules();
            let sizing = cfg.sizing();
            for w in cfg.warnings_with(&sizing) {
                eprintln!("promnorm: warning: {w}");
            }
            if print {
                print!("{}", cfg.to_annotated_yaml(&sizing)?);
            } else {
                println!(
                    "{}: ok ({} packs, {} exact names)",
                    file.display(),
                    rules.packs().len(),
                    rules.exact_name_count()
                );
            }
        }
        Command::Migrate { what } => return migrate(what),
        Command::Explain { config, name } => {
            // A bad name or selector is an error before any configuration is read.
            promnorm::explain::parse_selector(&name)?;
            let cfg = load(config.as_ref())?;
            let rules = cfg.compile_rules()?;
            let deriver = cfg
                .derive_settings()?
                .map(|s| promnorm::derive::Deriver::new(&s));
            let backends: Vec<promnorm::explain::ExplainBackend> = cfg
                .backends
                .iter()
                .enumerate()
                .map(|(i, b)| promnorm::explain::ExplainBackend {
                    name: b.name_or_default(i),
                    protocol: match b.protocol {
                        promnorm::config::BackendProtocolConfig::V1 => "v1",
                        promnorm::config::BackendProtocolConfig::V2 => "v2",
                        promnorm::config::BackendProtocolConfig::Auto => "auto",
                    },
                    native_histograms: match b.native_histograms {
                        promnorm::config::NativeHistogramsConfig::Auto => "auto",
                        promnorm::config::NativeHistogramsConfig::AsIs => "as_is",
                        promnorm::config::NativeHistogramsConfig::Classic => "classic",
                    },
                })
                .collect();
            print!(
                "{}",
                promnorm::explain::explain_for(&rules, deriver.as_ref(), &name, &backends)?
            );
        }
        Command::Rules {
            config,
            window,
            interval,
            offset,
            sum_families,
        } => {
            let opts = promnorm::rules_export::ExportOptions {
                window,
                interval,
                offset,
                sum_families,
            };
            let cfg = load(config.as_ref())?;
            print!("{}", promnorm::rules_export::rule_file(&cfg, &opts)?);
        }
        Command::Normalize {
            config,
            interval,
            files,
        } => {
            let cfg = load(config.as_ref())?;
            let interval = parse_duration(&interval)?;
            let pipeline = cfg.pipeline()?;
            let mut inputs = Vec::new();
            if files.is_empty() || files.iter().any(|f| f.as_os_str() == "-") && files.len() == 1 {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                inputs.push(("<stdin>".to_string(), s));
            } else {
                for f in &files {
                    let text = if f.as_os_str() == "-" {
                        let mut s = String::new();
                        std::io::stdin().read_to_string(&mut s)?;
                        s
                    } else {
                        std::fs::read_to_string(f)
                            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
                    };
                    inputs.push((f.display().to_string(), text));
                }
            }
            let out =
                promnorm::normalize::normalize(&pipeline, &inputs, interval.as_millis() as i64)?;
            print!("{out}");
        }
        Command::Serve {
            config,
            listen,
            backends,
            log_level,
            log_format,
            web_enable_lifecycle,
        } => {
            // Read again, flags applied again, on every reload.
            let source = promnorm::reload::Source {
                file: config,
                listen,
                backends,
                log_format: log_format.map(|f| {
                    if f == "json" {
                        LogFormat::Json
                    } else {
                        LogFormat::Text
                    }
                }),
            };
            let cfg = source.load()?;
            promnorm::telemetry::init_logging(
                cfg.log_format == LogFormat::Json,
                log_level.as_deref(),
            );
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(promnorm::serve::serve(source, web_enable_lifecycle))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_input(path: &PathBuf) -> anyhow::Result<String> {
    use anyhow::Context as _;
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `promnorm migrate grafana|rules DIR -o OUTDIR`: one summary line per file on stderr
/// (or `--check`'s lines on stdout); 1 when a file failed or `--check` found old
/// references.
fn migrate_tree(
    rws: &promnorm::migrate::files::Rewriters<'_, '_>,
    opts: &MigrateOptions,
    keep_values: bool,
    dir: &std::path::Path,
    output: Option<&PathBuf>,
) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use promnorm::migrate::{self, tree};
    if output.is_none() && !opts.check {
        anyhow::bail!(
            "{} is a directory: name the directory that receives the migrated copy with -o \
             OUTDIR (or run --check)",
            dir.display()
        );
    }
    let out = if opts.check { None } else { output };
    let outcomes = tree::migrate_tree(rws, dir, out.map(PathBuf::as_path))?;
    let entries: Vec<migrate::Entry> = outcomes
        .iter()
        .flat_map(|o| match &o.what {
            tree::Outcome::Migrated { entries, .. } => entries.clone(),
            _ => Vec::new(),
        })
        .collect();
    if let Some(path) = &opts.report {
        std::fs::write(path, migrate::report_json(&entries, keep_values))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failed = outcomes
        .iter()
        .filter(|o| matches!(o.what, tree::Outcome::Failed(_)))
        .count();
    if opts.check {
        let lines = migrate::check_lines(&entries);
        for l in &lines {
            println!("{l}");
        }
        return Ok(if lines.is_empty() && failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    for l in migrate::finding_lines(&entries) {
        eprintln!("{l}");
    }
    for o in &outcomes {
        eprintln!("{}", o.summary());
    }
    let migrated = outcomes
        .iter()
        .filter(|o| matches!(o.what, tree::Outcome::Migrated { .. }))
        .count();
    let changed = outcomes
        .iter()
        .filter(|o| matches!(o.what, tree::Outcome::Migrated { changed: true, .. }))
        .count();
    eprintln!(
        "{} files: {migrated} dashboards or rule files ({changed} changed), {} copied as they \
         are, {failed} failed; {} expressions need a human",
        outcomes.len(),
        outcomes.len() - migrated - failed,
        entries.iter().filter(|e| e.needs_human()).count()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `promnorm migrate …`: 0 done (or `--check`: nothing old referenced); 1 when `--check`
/// found old references, or on an error (printed by the caller).
fn migrate(what: MigrateCommand) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use promnorm::migrate::{self, Entry, QueryRewriter};
    let (opts, keep_values) = match &what {
        MigrateCommand::Query {
            opts, keep_values, ..
        }
        | MigrateCommand::Grafana {
            opts, keep_values, ..
        } => (opts, *keep_values),
        // Rule files keep their values: thresholds and recorded series keep their meaning.
        MigrateCommand::Rules { opts, .. } => (opts, true),
    };
    let cfg = load(opts.config.as_ref())?;
    let rules = cfg.compile_rules()?;
    let rw = QueryRewriter::new(&rules, keep_values);
    let rules_rw = QueryRewriter::new(&rules, true);
    let rws = migrate::files::Rewriters {
        dashboards: &rw,
        rules: &rules_rw,
    };
    let (text, output, entries): (String, Option<&PathBuf>, Vec<Entry>) = match &what {
        MigrateCommand::Query { query, .. } => {
            let r = rw.rewrite(query);
            let entry = Entry::from_query("query", query, &r);
            (format!("{}\n", r.query), None, vec![entry])
        }
        MigrateCommand::Grafana { input, output, .. }
        | MigrateCommand::Rules { input, output, .. } => {
            if input.is_dir() {
                return migrate_tree(&rws, opts, keep_values, input, output.as_ref());
            }
            // The reason goes in the message: `main` prints the top error only.
            let m = migrate::files::migrate(&rws, &read_input(input)?)
                .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
            (m.text, output.as_ref(), m.entries)
        }
    };
    if let Some(path) = &opts.report {
        std::fs::write(path, migrate::report_json(&entries, keep_values))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if opts.check {
        let lines = migrate::check_lines(&entries);
        for l in &lines {
            println!("{l}");
        }
        return Ok(if lines.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    for l in migrate::finding_lines(&entries) {
        eprintln!("{l}");
    }
    match output {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
