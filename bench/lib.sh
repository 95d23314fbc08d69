# Shared by bench/vs-vmagent.sh and bench/latency.sh (sourced, from the repository root).
# Sets BENCH (promnorm-bench), PROMNORM and, with need_vmagent, VMAGENT.

# Release binaries: PROMNORM_BIN / BENCH_BIN, else cargo build into $CARGO_TARGET_DIR.
if [ -z "${PROMNORM_BIN:-}" ] || [ -z "${BENCH_BIN:-}" ]; then
  cargo build --release --quiet -p promnorm -p promnorm-tools --bin promnorm --bin promnorm-bench
fi
RELEASE=${CARGO_TARGET_DIR:-$PWD/target}/release
PROMNORM=${PROMNORM_BIN:-$RELEASE/promnorm}
BENCH=${BENCH_BIN:-$RELEASE/promnorm-bench}
# The commit measured, stored with every result ("-dirty" when the tree has changes).
BENCH_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || BENCH_COMMIT+=-dirty
export BENCH_COMMIT

# vmagent: $VMAGENT, else on PATH, else the one scripts/test.sh unpacked into .e2e-bin,
# else Debian's victoria-metrics package (which ships vmagent) fetched with
# `apt-get download` and unpacked with `dpkg -x` into .tmp/victoria-metrics (no root,
# nothing installed system-wide).
need_vmagent() {
  VMAGENT=${VMAGENT:-$(command -v vmagent || true)}
  [ -n "$VMAGENT" ] && return 0
  if [ -x .e2e-bin/usr/bin/vmagent ]; then VMAGENT=$PWD/.e2e-bin/usr/bin/vmagent; return 0; fi
  local dir=$PWD/.tmp/victoria-metrics
  if [ ! -x "$dir/usr/bin/vmagent" ]; then
    mkdir -p "$dir/debs"
    (cd "$dir/debs" && apt-get download victoria-metrics >/dev/null) || {
      echo "no vmagent: install Debian's victoria-metrics or set VMAGENT" >&2; return 1; }
    for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir"; done
  fi
  VMAGENT=$dir/usr/bin/vmagent
}
