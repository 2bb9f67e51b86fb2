//! [`EncodedInsertRequest`]: an `InsertStreamRequest` whose items are already encoded, as
//! writers send them. A writer encodes each item once, on the thread that creates it, and
//! keeps the bytes until the server confirms the item; every request (and every resend after
//! a reconnect) then copies those bytes instead of cloning and re-encoding the item's
//! message, a string and a vector per column.

use crate::{ChunkData, InsertStreamRequest, PrioritizedItem};
use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// `InsertStreamRequest` with each item held as the bytes of its `PrioritizedItem` message.
/// It encodes to the same bytes as the `InsertStreamRequest` of the decoded items.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EncodedInsertRequest {
    /// Chunks the items reference that the server does not hold yet (field 1).
    pub chunks: Vec<ChunkData>,
    /// Encoded `PrioritizedItem`s (field 2).
    pub items: Vec<Bytes>,
    /// Chunks the server keeps after this request (field 3).
    pub keep_chunk_keys: Vec<u64>,
}

impl EncodedInsertRequest {
    /// The request with its items decoded (for a server of this process).
    pub fn decode_items(self) -> Result<InsertStreamRequest, DecodeError> {
        Ok(InsertStreamRequest {
            chunks: self.chunks,
            items: self
                .items
                .into_iter()
                .map(PrioritizedItem::decode)
                .collect::<Result<_, _>>()?,
            keep_chunk_keys: self.keep_chunk_keys,
        })
    }
}

impl Message for EncodedInsertRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for chunk in &self.chunks {
            encoding::message::encode(1, chunk, buf);
        }
        for item in &self.items {
            encoding::bytes::encode(2, item, buf);
        }
        encoding::uint64::encode_packed(3, &self.keep_chunk_keys, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => encoding::message::merge_repeated(wire_type, &mut self.chunks, buf, ctx),
            2 => encoding::bytes::merge_repeated(wire_type, &mut self.items, buf, ctx),
            3 => encoding::uint64::merge_repeated(wire_type, &mut self.keep_chunk_keys, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::message::encoded_len_repeated(1, &self.chunks)
            + encoding::bytes::encoded_len_repeated(2, &self.items)
            + encoding::uint64::encoded_len_packed(3, &self.keep_chunk_keys)
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.items.clear();
        self.keep_chunk_keys.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat_trajectory::{ChunkSlice, Column};
    use crate::{FlatTrajectory, SequenceRange};

    fn item(key: u64, table: &str, columns: usize) -> PrioritizedItem {
        PrioritizedItem {
            key,
            table: table.into(),
            priority: 0.5 * key as f64,
            flat_trajectory: Some(FlatTrajectory {
                columns: (0..columns)
                    .map(|c| Column {
                        chunk_slices: vec![ChunkSlice {
                            chunk_key: 100 + c as u64,
                            offset: c as i32,
                            length: 2,
                            index: 0,
                        }],
                        squeeze: c % 2 == 0,
                    })
                    .collect(),
            }),
            ..Default::default()
        }
    }

    fn plain() -> InsertStreamRequest {
        InsertStreamRequest {
            chunks: vec![ChunkData {
                chunk_key: 7,
                sequence_range: Some(SequenceRange {
                    episode_id: 3,
                    start: 0,
                    end: 9,
                    ..Default::default()
                }),
                data: Bytes::from_static(b"\x0a\x02xy"),
                data_tensors_len: 1,
                ..Default::default()
            }],
            items: vec![
                item(1, "nstep", 5),
                item(2, "sequence", 4),
                item(u64::MAX, "", 0),
            ],
            keep_chunk_keys: vec![7, 1 << 40],
        }
    }

    fn encoded(plain: &InsertStreamRequest) -> EncodedInsertRequest {
        EncodedInsertRequest {
            chunks: plain.chunks.clone(),
            items: plain
                .items
                .iter()
                .map(|i| i.encode_to_vec().into())
                .collect(),
            keep_chunk_keys: plain.keep_chunk_keys.clone(),
        }
    }

    #[test]
    fn encodes_as_the_request_of_its_decoded_items() {
        for plain in [plain(), InsertStreamRequest::default()] {
            let encoded = encoded(&plain);
            let bytes = encoded.encode_to_vec();
            assert_eq!(bytes, plain.encode_to_vec());
            assert_eq!(encoded.encoded_len(), bytes.len());
            assert_eq!(InsertStreamRequest::decode(&bytes[..]).unwrap(), plain);
            assert_eq!(EncodedInsertRequest::decode(&bytes[..]).unwrap(), encoded);
            assert_eq!(encoded.decode_items().unwrap(), plain);
        }
    }

    #[test]
    fn an_item_that_is_not_a_message_fails_to_decode() {
        let mut encoded = encoded(&plain());
        encoded.items[1] = Bytes::from_static(b"\x0a\xff");
        assert!(encoded.decode_items().is_err());
    }
}
