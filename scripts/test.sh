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

# VictoriaMetrics single-node, one receiver of the fault suite (tests/e2e/queue_faults.rs).
VM=$BIN_DIR/usr/bin/victoria-metrics
if [[ ! -x $VM ]]; then
  echo "[test] fetching Debian's victoria-metrics into $BIN_DIR" >&2
  mkdir -p "$BIN_DIR/debs"
  (
    cd "$BIN_DIR/debs"
    if ! apt-get download victoria-metrics >/dev/null 2>&1; then
      apt-get update -qq >/dev/null
      apt-get download victoria-metrics >/dev/null
    fi
  )
  dpkg -x "$BIN_DIR"/debs/victoria-metrics_*.deb "$BIN_DIR"
fi
export VICTORIA_METRICS_BIN=$VM

export PROMETHEUS_BIN=$PROM
export PROMNORM_E2E=1

# Headless Chromium for the browser test of the web UI (tests/e2e/ui.rs). Debian's
# chromium needs too many libraries for dpkg -x, so it is installed with apt-get (as
# root) when absent.
if ! command -v chromium >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "[test] installing Debian's chromium" >&2
    apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || {
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends chromium >/dev/null
    }
  else
    echo "[test] chromium is missing: apt-get install chromium (tests/e2e/ui.rs)" >&2
    exit 1
  fi
fi
CHROMIUM_BIN=$(command -v chromium)
export CHROMIUM_BIN
# Debian's chromedriver, for the WebDriver test of the same file.
if ! command -v chromedriver >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    echo "[test] installing Debian's chromium-driver" >&2
    apt-get install -y -qq --no-install-recommends chromium-driver >/dev/null 2>&1 || {
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends chromium-driver >/dev/null
    }
  else
    echo "[test] chromedriver is missing: apt-get install chromium-driver (tests/e2e/ui.rs)" >&2
    exit 1
  fi
fi
CHROMEDRIVER_BIN=$(command -v chromedriver)
export CHROMEDRIVER_BIN

# The Kubernetes manifests against the API's schemas, offline: kubernetes-validate
# bundles them (installed once into ./.e2e-bin/pylib; ~0.5 s a run). Kinds it has no
# schema for (the Prometheus Operator's CRDs, Kustomization) are reported as WARN and
# left to tests/it/deploy_assets.rs. With kubectl on PATH the kustomizations are rendered
# and validated too, as `kubectl apply -k` would send them.
PYLIB=$BIN_DIR/pylib
if [[ ! -d $PYLIB/kubernetes_validate ]]; then
  echo "[test] installing kubernetes-validate into $PYLIB" >&2
  python3 -m pip install --quiet --disable-pip-version-check --target "$PYLIB" \
    'kubernetes-validate==1.37.0'
fi
k8s_validate() { PYTHONPATH=$PYLIB python3 -m kubernetes_validate --strict --quiet "$@"; }
mapfile -t manifests < <(find deploy/kubernetes -name '*.yaml' ! -name kustomization.yaml | sort)
k8s_validate "${manifests[@]}"
if command -v kubectl >/dev/null 2>&1; then
  for k in deploy/kubernetes deploy/kubernetes/statefulset; do
    kubectl kustomize "$k" >"$BIN_DIR/kustomized.yaml"
    k8s_validate "$BIN_DIR/kustomized.yaml"
  done
fi

# BENCHMARKS.md's table and chart are generated from bench/results/: stale ones fail.
python3 bench/summary.py --check

# Everything else comes from the repository: the zero-allocation test and the benches
# build their remote-write payloads in process (promnorm::testkit::fleet).
# Tests build optimised but without link-time optimisation: ~25 test binaries link in
# minutes instead of tens of minutes on two cores; benchmarks keep the release profile.
export CARGO_PROFILE_RELEASE_LTO=false
cargo test --release --workspace --all-targets --no-fail-fast -- --nocapture 2>&1 | tee .e2e-bin/test.log
