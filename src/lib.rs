//! promnorm: a Prometheus remote-write proxy that normalises LLM-inference metrics.
//!
//! Data flows one way: [`wire`] (decode) → [`mapping`] (rules) → [`derive`] (derived
//! series, state across requests) → [`wire`] (encode) → [`forward`]. [`pipeline`] ties the stages together on reusable buffers; [`server`]
//! and [`normalize`] are its two front ends. See ARCHITECTURE.md.

pub mod config;
pub mod derive;
pub mod explain;
pub mod exposition;
pub mod forward;
pub mod mapping;
pub mod normalize;
pub mod pipeline;
pub mod server;
pub mod telemetry;
pub mod wire;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
