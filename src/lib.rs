//! promnorm: a Prometheus remote-write proxy that normalises LLM-inference metrics.
//!
//! Data flows one way: [`wire`] (decode) → [`mapping`] (rules) → [`derive`] (derived
//! series, state across requests) → [`wire`] (encode) → [`forward`]. [`pipeline`] ties the stages together on reusable buffers; [`server`]
//! and [`normalize`] are its two front ends. See ARCHITECTURE.md.

// Calls into the C library live in [`sys`], the one module allowed `unsafe`.
#![deny(unsafe_code)]

pub mod app;
pub mod config;
pub mod derive;
pub mod explain;
pub mod exposition;
pub mod federate;
pub mod forward;
pub mod guard;
pub mod mapping;
pub mod migrate;
pub mod normalize;
pub mod pem;
pub mod pipeline;
pub mod query;
pub mod reload;
pub mod rules_export;
pub mod scrape;
pub mod serve;
pub mod server;
pub mod sys;
pub mod telemetry;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod web;
pub mod wire;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit this binary was built from (`unknown` outside a checkout).
pub const REVISION: &str = env!("PROMNORM_REVISION");
/// The rustc version this binary was built with.
pub const RUSTC_VERSION: &str = env!("PROMNORM_RUSTC_VERSION");
