//! `InsertStreamRequest`, written by hand so that its items stay encoded: a writer encodes
//! each item once, on the thread that creates it, and keeps the bytes until the server
//! confirms the item, so every request (and every resend after a reconnect) copies those bytes
//! instead of cloning and re-encoding a message with a string and a vector per column. A
//! server decodes each item with [`decode_item`], into one message it reuses. The bytes on the
//! wire are those of the message `proto/reverb/reverb_service.proto` declares.

use crate::flat_trajectory::Column;
use crate::{ChunkData, FlatTrajectory, ItemRun, PrioritizedItem};
use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// `InsertStreamRequest` with each item held as the bytes of its `PrioritizedItem` message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InsertStreamRequest {
    /// Chunks the items reference that the server does not hold yet (field 1).
    pub chunks: Vec<ChunkData>,
    /// Encoded `PrioritizedItem`s (field 2).
    pub items: Vec<Bytes>,
    /// Chunks the server keeps after this request (field 3).
    pub keep_chunk_keys: Vec<u64>,
    /// Items in runs, stored after `items` (field 1000; not in the reference).
    pub item_runs: Vec<ItemRun>,
}

impl Message for InsertStreamRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for chunk in &self.chunks {
            encoding::message::encode(1, chunk, buf);
        }
        for item in &self.items {
            encoding::bytes::encode(2, item, buf);
        }
        encoding::uint64::encode_packed(3, &self.keep_chunk_keys, buf);
        for run in &self.item_runs {
            encoding::message::encode(1000, run, buf);
        }
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
            1000 => encoding::message::merge_repeated(wire_type, &mut self.item_runs, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::message::encoded_len_repeated(1, &self.chunks)
            + encoding::bytes::encoded_len_repeated(2, &self.items)
            + encoding::uint64::encoded_len_packed(3, &self.keep_chunk_keys)
            + encoding::message::encoded_len_repeated(1000, &self.item_runs)
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.items.clear();
        self.keep_chunk_keys.clear();
        self.item_runs.clear();
    }
}

/// `item` as an [`InsertStreamRequest`] carries it (what [`decode_item`] reads).
pub fn encode_item(item: &PrioritizedItem) -> Bytes {
    item.encode_to_vec().into()
}

/// Decodes an encoded `PrioritizedItem` into `item`, as `PrioritizedItem::decode` would, but
/// reusing `item`'s string and vectors (its columns' included). (Its errors do not name the
/// field at fault, as the generated decoder's do.)
pub fn decode_item(mut buf: &[u8], item: &mut PrioritizedItem) -> Result<(), DecodeError> {
    let ctx = DecodeContext::default();
    let mut trajectory = item.flat_trajectory.take().unwrap_or_default();
    item.key = 0;
    item.table.clear();
    item.priority = 0.0;
    item.times_sampled = 0;
    item.inserted_at = None;
    item.deprecated_chunk_keys.clear();
    item.deprecated_sequence_range = None;
    // Columns of `trajectory` decoded so far (the rest are spares from earlier items).
    let mut columns = 0;
    let mut has_trajectory = false;
    while buf.has_remaining() {
        let (tag, wire_type) = encoding::decode_key(&mut buf)?;
        let ctx = ctx.clone();
        match tag {
            1 => encoding::uint64::merge(wire_type, &mut item.key, &mut buf, ctx)?,
            2 => encoding::string::merge(wire_type, &mut item.table, &mut buf, ctx)?,
            3 => encoding::uint64::merge_repeated(
                wire_type,
                &mut item.deprecated_chunk_keys,
                &mut buf,
                ctx,
            )?,
            4 => encoding::message::merge(
                wire_type,
                item.deprecated_sequence_range
                    .get_or_insert_with(Default::default),
                &mut buf,
                ctx,
            )?,
            5 => encoding::double::merge(wire_type, &mut item.priority, &mut buf, ctx)?,
            6 => encoding::int32::merge(wire_type, &mut item.times_sampled, &mut buf, ctx)?,
            7 => encoding::message::merge(
                wire_type,
                item.inserted_at.get_or_insert_with(Default::default),
                &mut buf,
                ctx,
            )?,
            8 => {
                encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
                has_trajectory = true;
                merge_trajectory(&mut trajectory, &mut columns, &mut buf, ctx)?;
            }
            _ => encoding::skip_field(wire_type, tag, &mut buf, ctx)?,
        }
    }
    if has_trajectory {
        trajectory.columns.truncate(columns);
        item.flat_trajectory = Some(trajectory);
    }
    Ok(())
}

/// Merges a length-delimited `FlatTrajectory` into `trajectory`, whose first `columns` columns
/// are decoded (the field may repeat: its columns are appended); later ones are reused.
fn merge_trajectory(
    trajectory: &mut FlatTrajectory,
    columns: &mut usize,
    buf: &mut &[u8],
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    encoding::merge_loop(trajectory, buf, ctx, |trajectory, buf, ctx| {
        let (tag, wire_type) = encoding::decode_key(buf)?;
        if tag != 1 {
            return encoding::skip_field(wire_type, tag, buf, ctx);
        }
        encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
        if *columns == trajectory.columns.len() {
            trajectory.columns.push(Column::default());
        }
        let column = &mut trajectory.columns[*columns];
        column.chunk_slices.clear();
        column.squeeze = false;
        *columns += 1;
        encoding::merge_loop(column, buf, ctx, |column, buf, ctx| {
            let (tag, wire_type) = encoding::decode_key(buf)?;
            match tag {
                1 => {
                    encoding::message::merge_repeated(wire_type, &mut column.chunk_slices, buf, ctx)
                }
                2 => encoding::bool::merge(wire_type, &mut column.squeeze, buf, ctx),
                _ => encoding::skip_field(wire_type, tag, buf, ctx),
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat_trajectory::ChunkSlice;
    use crate::SequenceRange;
    use proptest::prelude::*;

    /// The message as prost generates it from `proto/`.
    mod generated {
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct InsertStreamRequest {
            #[prost(message, repeated, tag = "1")]
            pub chunks: Vec<crate::ChunkData>,
            #[prost(message, repeated, tag = "2")]
            pub items: Vec<crate::PrioritizedItem>,
            #[prost(uint64, repeated, tag = "3")]
            pub keep_chunk_keys: Vec<u64>,
            #[prost(message, repeated, tag = "1000")]
            pub item_runs: Vec<crate::ItemRun>,
        }
    }

    fn item(key: u64, table: &str, columns: usize) -> PrioritizedItem {
        PrioritizedItem {
            key,
            table: table.into(),
            priority: 0.5 * key as f64,
            flat_trajectory: Some(FlatTrajectory {
                columns: (0..columns)
                    .map(|c| Column {
                        chunk_slices: (0..=c % 3)
                            .map(|s| ChunkSlice {
                                chunk_key: 100 + (c * 3 + s) as u64,
                                offset: c as i32,
                                length: 2,
                                index: s as i32,
                            })
                            .collect(),
                        squeeze: c % 2 == 0,
                    })
                    .collect(),
            }),
            ..Default::default()
        }
    }

    fn plain() -> generated::InsertStreamRequest {
        generated::InsertStreamRequest {
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
            item_runs: vec![crate::ItemRun {
                table: "transitions".into(),
                keys: vec![5, 6, u64::MAX],
                priorities: vec![1.0, 0.5, 0.0],
                columns: vec![crate::item_run::Column {
                    chunk_key: 7,
                    index: 0,
                    offset: 2,
                    squeeze: true,
                }],
            }],
        }
    }

    fn encoded(plain: &generated::InsertStreamRequest) -> InsertStreamRequest {
        InsertStreamRequest {
            chunks: plain.chunks.clone(),
            items: plain.items.iter().map(encode_item).collect(),
            keep_chunk_keys: plain.keep_chunk_keys.clone(),
            item_runs: plain.item_runs.clone(),
        }
    }

    #[test]
    fn encodes_and_decodes_as_the_generated_message() {
        for plain in [plain(), generated::InsertStreamRequest::default()] {
            let encoded = encoded(&plain);
            let bytes = encoded.encode_to_vec();
            assert_eq!(bytes, plain.encode_to_vec());
            assert_eq!(encoded.encoded_len(), bytes.len());
            assert_eq!(InsertStreamRequest::decode(&bytes[..]).unwrap(), encoded);
            assert_eq!(
                generated::InsertStreamRequest::decode(&bytes[..]).unwrap(),
                plain
            );
        }
    }

    #[test]
    fn decoding_items_reuses_one_message_whatever_their_shapes() {
        let mut reused = PrioritizedItem::default();
        for original in [
            item(1, "a much longer table name", 6),
            item(2, "t", 2),
            item(3, "", 0),
            PrioritizedItem::default(),
            item(4, "tt", 9),
        ] {
            decode_item(&original.encode_to_vec(), &mut reused).unwrap();
            assert_eq!(reused, original);
        }
    }

    #[test]
    fn malformed_items_fail_to_decode() {
        let mut reused = PrioritizedItem::default();
        let good = item(5, "nstep", 3).encode_to_vec();
        for bad in [
            // A string longer than the message.
            &b"\x12\xff"[..],
            // Cut short.
            &good[..good.len() - 1],
            // A table name that is not UTF-8.
            &b"\x12\x02\xff\xfe"[..],
            // A column longer than its trajectory.
            &b"\x42\x02\x0a\x05"[..],
            // A trajectory that is a number.
            &b"\x40\x01"[..],
        ] {
            assert!(decode_item(bad, &mut reused).is_err(), "{bad:?}");
            assert!(PrioritizedItem::decode(bad).is_err(), "{bad:?}");
        }
    }

    fn arb_item() -> impl Strategy<Value = PrioritizedItem> {
        let slice = (any::<u64>(), any::<i32>(), any::<i32>(), any::<i32>()).prop_map(
            |(chunk_key, offset, length, index)| ChunkSlice {
                chunk_key,
                offset,
                length,
                index,
            },
        );
        let column = (prop::collection::vec(slice, 0..4), any::<bool>()).prop_map(
            |(chunk_slices, squeeze)| Column {
                chunk_slices,
                squeeze,
            },
        );
        let trajectory = prop::option::of(
            prop::collection::vec(column, 0..5).prop_map(|columns| FlatTrajectory { columns }),
        );
        (
            any::<u64>(),
            "[a-z_]{0,12}",
            any::<f64>(),
            any::<i32>(),
            prop::option::of((any::<i64>(), any::<i32>())),
            trajectory,
            prop::collection::vec(any::<u64>(), 0..3),
        )
            .prop_map(
                |(key, table, priority, times_sampled, at, trajectory, old)| PrioritizedItem {
                    key,
                    table,
                    priority,
                    times_sampled,
                    inserted_at: at
                        .map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
                    flat_trajectory: trajectory,
                    deprecated_chunk_keys: old,
                    deprecated_sequence_range: None,
                },
            )
    }

    proptest! {
        /// Decoding into a reused message gives what prost gives, for any item and for the
        /// concatenation of two (which protobuf merges: repeated fields append, the
        /// trajectory's columns included).
        #[test]
        fn decode_item_agrees_with_prost(a in arb_item(), b in arb_item(), c in arb_item()) {
            let mut reused = PrioritizedItem::default();
            decode_item(&c.encode_to_vec(), &mut reused).unwrap();
            let mut both = a.encode_to_vec();
            both.extend(b.encode_to_vec());
            for bytes in [a.encode_to_vec(), both] {
                decode_item(&bytes, &mut reused).unwrap();
                let expected = PrioritizedItem::decode(&bytes[..]).unwrap();
                // (NaN priorities compare unequal: compare their bits.)
                prop_assert_eq!(reused.priority.to_bits(), expected.priority.to_bits());
                reused.priority = 0.0;
                let expected = PrioritizedItem { priority: 0.0, ..expected };
                prop_assert_eq!(&reused, &expected);
            }
        }
    }
}
