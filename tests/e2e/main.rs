//! The end-to-end tests: real processes on loopback (Debian's Prometheus 2.42 and
//! VictoriaMetrics, headless Chromium, the `promnorm serve` binary), faults injected into
//! them, losses counted at the receiver. Each test skips with a message when its binary is
//! missing, unless `PROMNORM_E2E=1` (scripts/test.sh sets it) makes that a failure.

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod limits;
mod migrate;
mod native_histograms;
mod prometheus;
mod pull;
mod query;
mod queue_faults;
mod rules;
mod rw2;
mod tenancy;
mod ui;
