#!/usr/bin/env bash
# The test command (README "Two commands"). Installs what the tests need into
# ./.e2e-bin (Debian's prometheus via apt-get download + dpkg -x: no service manager,
# nothing installed system-wide), then runs every test, end-to-end ones included.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN_DIR=$PWD/.e2e-bin
PROM=$BIN_DIR/usr/bin/prometheus
if [[ ! -x $PROM ]]; then
  echo "[test] fetching Debian's prometheus into $BIN_DIR" >&2
  mkdir -p "$BIN_DIR/debs"
  (
    cd "$BIN_DIR/debs"
    if ! apt-get download prometheus >/dev/null 2>&1; then
      apt-get update -qq >/dev/null
      apt-get download prometheus >/dev/null
    fi
  )
  dpkg -x "$BIN_DIR"/debs/prometheus_*.deb "$BIN_DIR"
fi
"$PROM" --version 2>&1 | head -n1 >&2

export PROMETHEUS_BIN=$PROM
export PROMNORM_E2E=1

# Everything else comes from the repository: the zero-allocation test and the benches
# build their remote-write payloads in process (tests/support/fleet.rs).
cargo test --release --all-targets -- --nocapture 2>&1 | tee .e2e-bin/test.log
