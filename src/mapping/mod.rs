//! Mapping: the rule language ([`spec`]), its compilation into lookup structures
//! ([`compile`]) and its application to decoded requests ([`apply`]).

pub mod apply;
pub mod cache;
pub mod compile;
pub mod meta;
pub mod native;
pub mod number;
pub mod renames;
pub mod spec;
pub mod unroll;

pub use apply::{
    CounterFamilies, MapContext, MapOutcome, MapStats, Mapper, STALE_NAN_BITS, TapSet, TappedSeries,
};
pub use compile::{CompileError, GlobalOptions, MetadataPlan, OtelNames, PackOptions, Rules};
pub use spec::PackSpec;
