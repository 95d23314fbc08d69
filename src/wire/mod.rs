//! Wire format: snappy block framing and the remote-write protobuf schema, read into a
//! borrowed view and written straight into reusable buffers.

pub mod bodies;
pub mod decode;
pub mod decode_v2;
pub mod encode;
pub mod encode_v2;
pub mod fields;
pub mod histogram;
pub mod pb;
pub mod shard;
pub mod snappy;
pub mod split;

/// Generated (owned) prost types: used by tests as the decoding oracle and by tools;
/// the hot path never builds them.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    pub mod prometheus {
        include!(concat!(env!("OUT_DIR"), "/prometheus.rs"));
    }
    pub mod write_v2 {
        include!(concat!(env!("OUT_DIR"), "/io.prometheus.write.v2.rs"));
    }
}

pub use decode::{DecodeLimits, DecodedRequest, Span};

/// Prometheus' stale marker: a NaN with this exact payload. Compared by bits, never with
/// `is_nan()`, and never rescaled.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// Bytes a vector's capacity holds (what a reused buffer keeps between requests).
pub fn held<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

/// Why a request body could not be decoded. Every variant maps to `400` except the size
/// limits, which map to `413`.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("snappy: {0}")]
    Snappy(String),
    #[error("decoded body would be {declared} bytes, over the limit of {limit}")]
    DecodedTooLarge { declared: usize, limit: usize },
    #[error("request holds more than {0} series")]
    TooManySeries(usize),
    #[error("request too large")]
    TooLarge,
    #[error(
        "request would be over {limit} bytes with its label references spelled out (limits.max_decoded_bytes)"
    )]
    ExpandedTooLarge { limit: usize },
    #[error(
        "request would take over {limit} bytes decoded into series, labels and samples ({factor} times its decoded size: very many tiny series, labels or samples)"
    )]
    ViewTooLarge { limit: usize, factor: usize },
    #[error("protobuf: truncated message")]
    Truncated,
    #[error("protobuf: varint overflow")]
    VarintOverflow,
    #[error("protobuf: invalid field number")]
    BadFieldNumber,
    #[error("protobuf: unsupported wire type {0}")]
    BadWireType(u8),
    #[error("protobuf: {0} has wrong wire type {1}")]
    UnexpectedWireType(&'static str, u8),
    #[error("symbol reference {index} is out of range: the request has {symbols} symbols")]
    SymbolRef { index: u64, symbols: usize },
    #[error("a series or exemplar has an odd number of label references ({0})")]
    OddLabelRefs(usize),
    #[error(
        "field {0} is reserved in io.prometheus.write.v2.Request: is this a 1.0 WriteRequest sent with proto=io.prometheus.write.v2.Request?"
    )]
    ReservedV2Field(u32),
    #[error(
        "no 1.0 series or metadata, but 2.0 fields (symbols, timeseries): is this a 2.0 request sent as 1.0? Use proto=io.prometheus.write.v2.Request"
    )]
    V2BodyAsV1,
    #[error("symbols[0] must be the empty string")]
    FirstSymbolNotEmpty,
    #[error("label name or value is not valid UTF-8")]
    InvalidUtf8,
    #[error("empty label name")]
    EmptyLabelName,
    #[error("duplicate label name {0:?}")]
    DuplicateLabel(String),
    #[error("series without a metric name (__name__)")]
    MissingMetricName,
    #[error("a series has more than {0} labels (limits.max_labels_per_series)")]
    TooManyLabels(usize),
    #[error(
        "label {name:?} has a value of {len} bytes, over the limit of {limit} (limits.max_label_value_bytes)"
    )]
    LabelValueTooLong {
        name: String,
        len: usize,
        limit: usize,
    },
}

impl DecodeError {
    /// True when the failure is a size limit (answered with 413), not malformed data.
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            DecodeError::DecodedTooLarge { .. }
                | DecodeError::TooManySeries(_)
                | DecodeError::TooLarge
                | DecodeError::ExpandedTooLarge { .. }
                | DecodeError::ViewTooLarge { .. }
        )
    }
}
