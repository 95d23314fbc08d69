#!/usr/bin/env bash
# The test command (README "Run the tests"). Installs what the tests need into
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
export SHARED_DIR=${SHARED_DIR:-$(cd .. && pwd)/shared}

# Realistic remote-write payloads for the zero-allocation test: the benchmark tool's
# generator needs a snappy module (python3-snappy or cramjam; cramjam from PyPI if
# neither is there).
PAYLOADS=$BIN_DIR/payloads
if [[ ! -f $PAYLOADS/meta.json ]]; then
  PY=""
  for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import snappy' 2>/dev/null; then PY=$cand; break; fi
  done
  if [[ -z $PY ]]; then
    PY=python3
    export PYTHONPATH=$BIN_DIR/pylib${PYTHONPATH:+:$PYTHONPATH}
    if ! "$PY" -c 'import cramjam' 2>/dev/null; then
      echo "[test] installing cramjam (snappy for python) into $BIN_DIR/pylib" >&2
      "$PY" -m pip install --quiet --target "$BIN_DIR/pylib" cramjam >&2
    fi
  fi
  "$PY" "$SHARED_DIR/tools/bench/gen_payloads.py" --out "$PAYLOADS" --count 100 >&2
fi
export PROMNORM_PAYLOAD_DIR=$PAYLOADS PAYLOAD_DIR=$PAYLOADS
export PROMNORM_REQUIRE_PAYLOADS=1

cargo test --release --all-targets -- --nocapture 2>&1 | tee .e2e-bin/test.log
