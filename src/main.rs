use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use promnorm::config::{BackendConfig, Config, parse_duration};

#[derive(Parser)]
#[command(
    name = "promnorm",
    version,
    about = "Prometheus remote-write proxy that normalises LLM-inference metrics"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (without --config: the embedded default configuration).
    Serve {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address, overrides the configuration.
        #[arg(long)]
        listen: Option<String>,
        /// Backend remote-write URL; repeatable; replaces the configured backends.
        #[arg(long = "backend")]
        backends: Vec<String>,
    },
    /// Validate a configuration file (and the packs it enables).
    CheckConfig { file: PathBuf },
    /// Run the pipeline on text-exposition files and print the output samples.
    Normalize {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value = "15s")]
        interval: String,
        files: Vec<PathBuf>,
    },
    /// Show which rules apply to a metric name, family name or selector name{a="b"}, and
    /// what it becomes.
    Explain {
        #[arg(long)]
        config: Option<PathBuf>,
        name: String,
    },
    /// Print the version.
    Version,
    /// GET a local http:// URL and exit 0 on a 2xx answer (the container HEALTHCHECK:
    /// the runtime image has no curl).
    Healthcheck {
        #[arg(default_value = "http://127.0.0.1:9201/-/healthy")]
        url: String,
    },
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
            eprintln!("promnorm: {e:#}");
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
            println!("promnorm {}", promnorm::VERSION);
        }
        Command::CheckConfig { file } => {
            let cfg = Config::load(&file)?;
            let rules = cfg.validate()?;
            println!(
                "{}: ok ({} packs, {} exact names)",
                file.display(),
                rules.packs().len(),
                rules.exact_name_count()
            );
        }
        Command::Explain { config, name } => {
            // A bad name or selector is an error before any configuration is read.
            promnorm::explain::parse_selector(&name)?;
            let cfg = load(config.as_ref())?;
            let rules = cfg.compile_rules()?;
            let deriver = cfg
                .derive_settings()?
                .map(|s| promnorm::derive::Deriver::new(&s));
            print!(
                "{}",
                promnorm::explain::explain(&rules, deriver.as_ref(), &name)?
            );
        }
        Command::Normalize {
            config,
            interval,
            files,
        } => {
            let cfg = load(config.as_ref())?;
            let interval = parse_duration(&interval).map_err(anyhow::Error::msg)?;
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
        } => {
            let mut cfg = load(config.as_ref())?;
            if let Some(l) = listen {
                cfg.listen = l;
            }
            if !backends.is_empty() {
                cfg.backends = backends.into_iter().map(BackendConfig::from_url).collect();
            }
            promnorm::telemetry::init_logging(cfg.log_format);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(promnorm::server::serve(cfg))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
