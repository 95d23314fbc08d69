//! The derived series promnorm computes (docs/derived.md). Inputs are named as they leave the
//! mapping stage, so an old engine version migrated to the new names feeds the same
//! derived series.

use std::borrow::Cow;

use crate::mapping::OtelNames;

/// How a derived value is computed from the deltas of its inputs over `dt` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Formula {
    /// Δinput0 / Δinput1.
    Ratio,
    /// 1 + Δinput0 / Δinput1.
    OnePlusRatio,
    /// Δinput0 / (Δinput0 + Δinput1): hits over hits plus misses.
    ShareOfSum,
    /// (Δinput0 / dt) / peak FLOP/s.
    FlopsUtilisation,
    /// ((Δinput0 + Δinput1) / dt) / peak bytes/s.
    BandwidthUtilisation,
}

#[derive(Clone, Copy, Debug)]
pub struct Definition {
    pub name: &'static str,
    /// One or two counters; a point is complete when all of them have a sample at the
    /// same timestamp.
    pub inputs: &'static [&'static str],
    pub formula: Formula,
}

impl Definition {
    pub fn needs_flops(&self) -> bool {
        self.formula == Formula::FlopsUtilisation
    }

    pub fn needs_bandwidth(&self) -> bool {
        self.formula == Formula::BandwidthUtilisation
    }
}

const fn ratio(name: &'static str, inputs: &'static [&'static str]) -> Definition {
    Definition {
        name,
        inputs,
        formula: Formula::Ratio,
    }
}

pub const DEFINITIONS: &[Definition] = &[
    ratio(
        "vllm:prefix_cache_hit_ratio",
        &[
            "vllm:prefix_cache_hits_total",
            "vllm:prefix_cache_queries_total",
        ],
    ),
    ratio(
        "vllm:external_prefix_cache_hit_ratio",
        &[
            "vllm:external_prefix_cache_hits_total",
            "vllm:external_prefix_cache_queries_total",
        ],
    ),
    ratio(
        "vllm:spec_decode_acceptance_ratio",
        &[
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_draft_tokens_total",
        ],
    ),
    Definition {
        name: "vllm:spec_decode_mean_acceptance_length",
        inputs: &[
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_drafts_total",
        ],
        formula: Formula::OnePlusRatio,
    },
    // llama.cpp server (tools/server/server-task.cpp, server_task_result_metrics::
    // to_metrics, recent builds): vLLM's counter names under llamacpp:, where a "draft"
    // is one verification step. Older builds have no speculative counters.
    ratio(
        "llamacpp:spec_decode_acceptance_ratio",
        &[
            "llamacpp:spec_decode_num_accepted_tokens_total",
            "llamacpp:spec_decode_num_draft_tokens_total",
        ],
    ),
    Definition {
        name: "llamacpp:spec_decode_mean_acceptance_length",
        inputs: &[
            "llamacpp:spec_decode_num_accepted_tokens_total",
            "llamacpp:spec_decode_num_drafts_total",
        ],
        formula: Formula::OnePlusRatio,
    },
    ratio(
        "vllm:prompt_tokens_cached_ratio",
        &[
            "vllm:prompt_tokens_cached_total",
            "vllm:prompt_tokens_total",
        ],
    ),
    ratio(
        "lmcache_mp_lookup_hit_ratio",
        &[
            "lmcache_mp_lookup_hit_tokens_total",
            "lmcache_mp_lookup_requested_tokens_total",
        ],
    ),
    ratio(
        "lmcache:retrieve_hit_ratio",
        &[
            "lmcache:num_hit_tokens_total",
            "lmcache:num_requested_tokens_total",
        ],
    ),
    ratio(
        "lmcache:lookup_hit_ratio",
        &[
            "lmcache:num_lookup_hits_total",
            "lmcache:num_lookup_tokens_total",
        ],
    ),
    // Triton's response cache (core src/metrics.cc): hits and misses are counted apart.
    Definition {
        name: "nv_cache_hit_ratio",
        inputs: &[
            "nv_cache_num_hits_per_model_total",
            "nv_cache_num_misses_per_model_total",
        ],
        formula: Formula::ShareOfSum,
    },
    Definition {
        name: "vllm:mfu_ratio",
        inputs: &["vllm:estimated_flops_per_gpu_total"],
        formula: Formula::FlopsUtilisation,
    },
    Definition {
        name: "sglang:mfu_ratio",
        inputs: &["sglang:estimated_flops_per_gpu_total"],
        formula: Formula::FlopsUtilisation,
    },
    Definition {
        name: "vllm:mbu_ratio",
        inputs: &[
            "vllm:estimated_read_bytes_per_gpu_total",
            "vllm:estimated_write_bytes_per_gpu_total",
        ],
        formula: Formula::BandwidthUtilisation,
    },
    Definition {
        name: "sglang:mbu_ratio",
        inputs: &[
            "sglang:estimated_read_bytes_per_gpu_total",
            "sglang:estimated_write_bytes_per_gpu_total",
        ],
        formula: Formula::BandwidthUtilisation,
    },
];

/// Inputs that are OpenTelemetry instruments (the `lmcache` pack's `otel:` list): (the
/// name [`DEFINITIONS`] give them, which is their default spelling, instrument, unit).
/// The mapping stage writes every spelling of them under the one `otel_names.strategy`
/// names; the deriver reads them under that one ([`input_spelling`]).
pub const OTEL_INPUTS: &[(&str, &str, &str)] = &[
    (
        "lmcache_mp_lookup_hit_tokens_total",
        "lmcache_mp.lookup_hit",
        "tokens",
    ),
    (
        "lmcache_mp_lookup_requested_tokens_total",
        "lmcache_mp.lookup_requested",
        "tokens",
    ),
];

/// The name a definition's input leaves the mapping stage under with `strategy`: an
/// OpenTelemetry counter's spelling (with suffixes: unit and `_total`; without: neither),
/// any other input as it is.
pub fn input_spelling(input: &'static str, strategy: OtelNames) -> Cow<'static, str> {
    match OTEL_INPUTS.iter().find(|(n, _, _)| *n == input) {
        Some((_, instrument, unit)) => {
            let name = strategy.spell(instrument, Some(unit));
            if strategy.suffixes() {
                Cow::Owned(format!("{name}_total"))
            } else {
                Cow::Owned(name)
            }
        }
        None => Cow::Borrowed(input),
    }
}

/// The largest number of inputs a definition has.
pub const MAX_INPUTS: usize = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_well_formed() {
        let mut names = std::collections::BTreeSet::new();
        for d in DEFINITIONS {
            assert!(names.insert(d.name), "{} twice", d.name);
            assert!(!d.inputs.is_empty() && d.inputs.len() <= MAX_INPUTS);
            let want = match d.formula {
                Formula::FlopsUtilisation => 1,
                _ => 2,
            };
            assert_eq!(d.inputs.len(), want, "{}", d.name);
        }
    }
}
