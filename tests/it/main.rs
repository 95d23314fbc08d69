//! The in-process tests, one crate of modules (one link of the library instead of one per
//! file): the proxy in process against recording fake backends, the rule packs, the wire
//! format, the command line and the repository's own rules (architecture, docs).

#[path = "../common/mod.rs"]
mod common;

mod adversarial;
mod architecture;
mod cli;
mod config_cli;
mod config_docs;
mod deploy_assets;
mod derived;
mod doc_links;
mod fleet;
mod genai_spec;
mod golden;
mod limits;
mod migrate_corpus;
mod native_histograms;
mod otel_names;
mod overload;
mod proxy;
mod pull;
mod query;
mod queue;
mod reload;
mod rules;
mod rw2;
mod tenancy;
mod tls;
mod web;
mod wire;
