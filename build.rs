//! Compiles the remote-write protos with protox, so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/prometheus/remote.proto",
        "proto/prometheus/types.proto",
        "proto/io/prometheus/write/v2/types.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    build_info();
    let fds = protox::compile(files, ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}

/// The commit and compiler this binary is built from, for `promnorm version` and
/// `promnorm_build_info`. Outside a git checkout (a source tarball) the revision is
/// "unknown".
fn build_info() {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let revision = std::env::var("PROMNORM_REVISION")
        .ok()
        .or_else(|| run("git", &["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = run(&rustc, &["--version"])
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PROMNORM_REVISION={revision}");
    println!("cargo:rustc-env=PROMNORM_RUSTC_VERSION={rustc_version}");
    println!("cargo:rerun-if-env-changed=PROMNORM_REVISION");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        println!("cargo:rerun-if-changed=.git/HEAD");
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{r}");
        }
    }
}
