//! The bodies a mapped request (or one tenant's share of it, [`super::split`]) is sent
//! as: the snappy-compressed 1.0 body, without 2.0's start timestamps, and, when asked,
//! the snappy-compressed 2.0 body. Buffers are reused, so a warm encoder allocates
//! nothing per sample; the returned slices live until the next call.

use std::sync::RwLock;

use super::DecodeError;
use super::encode_v2::{MetadataMemory, StripScratch, V2Encoder, strip_v2};
use super::snappy;

/// Reusable buffers of [`BodyEncoder::encode`].
#[derive(Default)]
pub struct BodyEncoder {
    snappy: Option<snap::raw::Encoder>,
    plain: Vec<u8>,
    strip: StripScratch,
    v2: V2Encoder,
    v2_raw: Vec<u8>,
    v1_out: Vec<u8>,
    v1_len: usize,
    v2_out: Vec<u8>,
    v2_len: usize,
}

/// What [`BodyEncoder::encode`] wrote.
#[derive(Clone, Copy, Debug)]
pub struct Bodies<'a> {
    /// The compressed 1.0 body.
    pub v1: &'a [u8],
    /// The compressed 2.0 body and the series it holds, when asked for.
    pub v2: Option<(&'a [u8], usize)>,
}

/// Whether to write a 2.0 body too, and with which remembered metadata.
#[derive(Clone, Copy)]
pub enum V2Output<'a> {
    No,
    /// Series get their family's metadata from the request, else from `memory`.
    Yes(Option<&'a RwLock<MetadataMemory>>),
}

impl BodyEncoder {
    /// Encodes `mapped` (a mapped 1.0 request that may carry start timestamps when
    /// `has_start_timestamps`). `v1_done`: the compressed 1.0 body, when the caller has
    /// it already (it is not compressed again). `metadata_in_body`: false when the
    /// caller knows `mapped` holds no metadata entries (the 2.0 encoder skips looking).
    pub fn encode<'a>(
        &'a mut self,
        mapped: &[u8],
        has_start_timestamps: bool,
        v1_done: Option<&'a [u8]>,
        v2: V2Output<'_>,
        metadata_in_body: bool,
    ) -> Result<Bodies<'a>, DecodeError> {
        let encoder = self.snappy.get_or_insert_with(snap::raw::Encoder::new);
        self.v1_len = 0;
        if v1_done.is_none() {
            // 1.0 has no field for start timestamps.
            let plain: &[u8] = if has_start_timestamps {
                strip_v2(mapped, &mut self.plain, &mut self.strip)?;
                &self.plain
            } else {
                mapped
            };
            self.v1_len = snappy::compress_into(encoder, plain, &mut self.v1_out);
        }
        let mut series = 0;
        self.v2_len = 0;
        if let V2Output::Yes(memory) = v2 {
            let written = match memory {
                Some(m) => {
                    self.v2
                        .encode_remembering(mapped, m, &mut self.v2_raw, metadata_in_body)?
                }
                None if metadata_in_body => self.v2.encode(mapped, None, &mut self.v2_raw)?,
                None => self
                    .v2
                    .encode_metadata_free(mapped, None, &mut self.v2_raw)?,
            };
            series = written.series;
            self.v2_len = snappy::compress_into(encoder, &self.v2_raw, &mut self.v2_out);
        }
        Ok(Bodies {
            v1: v1_done.unwrap_or(&self.v1_out[..self.v1_len]),
            v2: matches!(v2, V2Output::Yes(_)).then_some((&self.v2_out[..self.v2_len], series)),
        })
    }

    /// Bytes its buffers hold between requests, all together.
    pub fn retained_bytes(&self) -> usize {
        self.plain.capacity()
            + self.strip.retained_bytes()
            + self.v2_raw.capacity()
            + self.v1_out.capacity()
            + self.v2_out.capacity()
            + self.v2.retained_bytes()
    }
}
