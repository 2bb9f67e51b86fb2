//! Batched inserts in item runs (`Client.insert_steps` against servers that list
//! "item_runs"): N steps become N items per table without an item message each. Every
//! column's rows go into chunks of about `AUTO_CHUNK_BYTES` (as a trajectory writer sizes
//! them), and each group of rows that shares one chunk in every column is one `ItemRun` per
//! table: item `i` of the group holds row `i` of each of those chunks.

use super::columns::AUTO_CHUNK_BYTES;
use crate::tensor::{encode_chunk_with, Tensor, TensorView, DT_STRING};
use crate::{Client, ClientError, Result};
use prost::Message;
use reverb_proto::{item_run, ChunkData, InsertStreamRequest, ItemRun, SequenceRange};
use std::time::Duration;

/// What a server lists in `ServerInfoResponse.features` when it takes item runs.
pub const FEATURE: &str = "item_runs";

/// The items `requests` insert (those of their item runs too): the keys a server confirms
/// for them.
pub fn item_count(requests: &[InsertStreamRequest]) -> usize {
    let runs = requests.iter().flat_map(|r| r.item_runs.iter());
    requests.iter().map(|r| r.items.len()).sum::<usize>()
        + runs.map(|run| run.keys.len()).sum::<usize>()
}

/// The requests of an insert of `steps` (leaves with a leading dimension N) as N items per
/// `(table, priorities)` (N priorities each), item `i` holding step `i`, in one episode (sent
/// with [`Client::insert_requests`]). Each request stays under half of `max_request_bytes` when
/// it can (a chunk is never split). Strings are refused (UNIMPLEMENTED): they go step by step.
pub fn run_requests(
    client: &Client,
    steps: &[TensorView<'_>],
    priorities: &[(String, Vec<f64>)],
    max_request_bytes: Option<usize>,
) -> Result<Vec<InsertStreamRequest>> {
    let n = check(steps, priorities)?;
    let episode_id = rand::random();
    // Each column's chunks, as (first row, chunk).
    let mut chunks: Vec<Vec<(usize, ChunkData)>> = Vec::with_capacity(steps.len());
    for step in steps {
        let row_bytes = step.row_bytes();
        let length = (AUTO_CHUNK_BYTES / row_bytes.max(1)).clamp(1, n);
        let column = (0..n)
            .step_by(length)
            .map(|first| {
                let rows = length.min(n - first);
                let mut shape = Vec::with_capacity(step.shape.len());
                shape.push(rows as i64);
                shape.extend_from_slice(&step.shape[1..]);
                let tensor = Tensor {
                    dtype: step.dtype,
                    shape,
                    data: step.data[first * row_bytes..(first + rows) * row_bytes].to_vec(),
                };
                let range = SequenceRange {
                    episode_id,
                    start: first as i32,
                    end: (first + rows - 1) as i32,
                    sparse: false,
                };
                let chunk = encode_chunk_with(rand::random(), range, &[tensor], false);
                (first, chunk)
            })
            .collect();
        chunks.push(column);
    }
    // Groups of rows sharing one chunk in every column: split wherever any column's
    // chunks are.
    let mut starts: Vec<usize> = chunks
        .iter()
        .flat_map(|column| column.iter().map(|(first, _)| *first))
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let limit = max_request_bytes.unwrap_or(usize::MAX) / 2;
    let mut requests = Vec::new();
    let mut request = InsertStreamRequest::default();
    let mut bytes = 0;
    // Per column, the index of the chunk the group is in and of the next one to send.
    let mut current = vec![0usize; chunks.len()];
    let mut unsent = vec![0usize; chunks.len()];
    for (g, &first) in starts.iter().enumerate() {
        let end = starts.get(g + 1).copied().unwrap_or(n);
        let mut columns = Vec::with_capacity(chunks.len());
        let mut new_bytes = 0;
        for (c, column) in chunks.iter().enumerate() {
            while current[c] + 1 < column.len() && column[current[c] + 1].0 <= first {
                current[c] += 1;
            }
            let (chunk_first, chunk) = &column[current[c]];
            if unsent[c] <= current[c] {
                new_bytes += chunk.encoded_len();
            }
            columns.push(item_run::Column {
                chunk_key: chunk.chunk_key,
                index: 0,
                offset: (first - chunk_first) as i32,
                squeeze: false,
            });
        }
        // A full request goes out first; the chunks its successors still use are kept.
        if bytes > 0 && bytes + new_bytes > limit {
            request.keep_chunk_keys = (0..chunks.len())
                .filter(|&c| unsent[c] > current[c])
                .map(|c| chunks[c][current[c]].1.chunk_key)
                .collect();
            requests.push(std::mem::take(&mut request));
            bytes = 0;
        }
        for (c, column) in chunks.iter().enumerate() {
            if unsent[c] <= current[c] {
                request.chunks.push(column[current[c]].1.clone());
                unsent[c] = current[c] + 1;
            }
        }
        bytes += new_bytes;
        for (table, priorities) in priorities {
            let keys: Vec<u64> = (first..end).map(|_| client.new_item_key()).collect();
            bytes += keys.len() * 17;
            request.item_runs.push(ItemRun {
                table: table.clone(),
                keys,
                priorities: priorities[first..end].to_vec(),
                columns: columns.clone(),
            });
        }
    }
    requests.push(request);
    Ok(requests)
}

/// The number of steps ([`super::insert::steps_of`]), once no leaf is of strings and every
/// table is named.
fn check(steps: &[TensorView<'_>], priorities: &[(String, Vec<f64>)]) -> Result<usize> {
    let n = super::insert::steps_of(steps, priorities)?;
    if steps.iter().any(|v| v.dtype == DT_STRING) {
        return Err(ClientError::unimplemented(
            "item runs do not take string values: insert them step by step",
        ));
    }
    if let Some((table, _)) = priorities.iter().find(|(t, _)| t.is_empty()) {
        return Err(ClientError::invalid(format!(
            "table must be a non-empty string, got {table:?}"
        )));
    }
    Ok(n)
}

impl Client {
    /// Whether the server takes item runs (a server of this process always does; another
    /// says so in `ServerInfo`, asked once per client and its clones).
    pub async fn takes_item_runs(&self, timeout: Option<Duration>) -> Result<bool> {
        if self.inproc().is_some() {
            return Ok(true);
        }
        if let Some(&takes) = self.takes_runs.get() {
            return Ok(takes);
        }
        let info = self.server_info_response(timeout).await?;
        let takes = info.features.iter().any(|f| f == FEATURE);
        Ok(*self.takes_runs.get_or_init(|| takes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{decode_chunk, AsView};
    use std::collections::HashMap;

    const DT_UINT8: i32 = 4;
    const DT_INT32: i32 = 3;

    /// Every item of `requests` as a server reads them, in order: (table, priority, its
    /// row of each column), checking that every chunk a run uses was sent in its request or
    /// kept from an earlier one.
    fn items_of(requests: &[InsertStreamRequest]) -> Vec<(String, f64, Vec<Vec<u8>>)> {
        let mut held: HashMap<u64, Tensor> = HashMap::new();
        let mut out = Vec::new();
        for request in requests {
            for chunk in &request.chunks {
                let mut tensors = decode_chunk(chunk).unwrap();
                held.insert(chunk.chunk_key, tensors.remove(0));
            }
            for run in &request.item_runs {
                for (i, priority) in run.priorities.iter().enumerate() {
                    let rows = run
                        .columns
                        .iter()
                        .map(|c| {
                            let t = held.get(&c.chunk_key).expect("a sent or kept chunk");
                            let row = t.view().row_bytes();
                            let at = (c.offset as usize + i) * row;
                            t.data[at..at + row].to_vec()
                        })
                        .collect();
                    out.push((run.table.clone(), *priority, rows));
                }
            }
            held.retain(|k, _| request.keep_chunk_keys.contains(k));
        }
        out
    }

    #[test]
    fn groups_follow_every_columns_chunks_and_big_inserts_split_keeping_shared_chunks() {
        let client = Client::new("localhost:1").unwrap();
        let n = 7usize;
        // 6000-byte rows go 2 to a chunk; int32 rows all in one.
        // (Noise, which snappy cannot shrink: the chunks keep their size.)
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let frames: Vec<u8> = (0..n * 6000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let ids: Vec<u8> = (0..n as i32).flat_map(i32::to_le_bytes).collect();
        let frames = Tensor::new(DT_UINT8, vec![n as i64, 6000], frames).unwrap();
        let ids = Tensor::new(DT_INT32, vec![n as i64], ids).unwrap();
        let steps = [frames.view(), ids.view()];
        let priorities = vec![
            (
                "a".to_string(),
                (0..n).map(|i| i as f64).collect::<Vec<f64>>(),
            ),
            ("b".to_string(), vec![0.5; n]),
        ];
        let expected: Vec<(String, f64, Vec<Vec<u8>>)> = (0..n)
            .map(|i| {
                let frame = frames.data[i * 6000..(i + 1) * 6000].to_vec();
                vec![frame, (i as i32).to_le_bytes().to_vec()]
            })
            .enumerate()
            .flat_map(|(i, rows)| {
                [("a", i as f64), ("b", 0.5)].map(|(t, p)| (t.to_string(), p, rows.clone()))
            })
            .collect();
        let by_table = |mut items: Vec<(String, f64, Vec<Vec<u8>>)>| {
            items.sort_by(|x, y| x.0.cmp(&y.0));
            items
        };
        for limit in [None, Some(30_000), Some(1)] {
            let requests = run_requests(&client, &steps, &priorities, limit).unwrap();
            // Groups [0,2) [2,4) [4,6) [6,7): one run per table each.
            let runs: usize = requests.iter().map(|r| r.item_runs.len()).sum();
            assert_eq!(runs, 8, "{limit:?}");
            let items: usize = requests
                .iter()
                .flat_map(|r| &r.item_runs)
                .map(|run| run.keys.len())
                .sum();
            assert_eq!(items, 2 * n);
            let chunks: usize = requests.iter().map(|r| r.chunks.len()).sum();
            assert_eq!(chunks, 5, "each chunk sent once ({limit:?})");
            if limit.is_some() {
                assert!(requests.len() >= 2, "{limit:?}: {}", requests.len());
            }
            assert_eq!(
                by_table(items_of(&requests)),
                by_table(expected.clone()),
                "{limit:?}"
            );
        }
    }

    #[test]
    fn bad_steps_are_refused() {
        let client = Client::new("localhost:1").unwrap();
        let one = Tensor::new(DT_INT32, vec![2], vec![0; 8]).unwrap();
        let other = Tensor::new(DT_INT32, vec![3], vec![0; 12]).unwrap();
        let p = |n: usize| vec![("t".to_string(), vec![1.0; n])];
        let refused = |steps: &[TensorView<'_>], p: &[(String, Vec<f64>)]| {
            run_requests(&client, steps, p, None).unwrap_err().message
        };
        assert!(refused(&[one.view(), other.view()], &p(2)).contains("same leading"));
        assert!(refused(&[one.view()], &p(3)).contains("3 priorities for 2 steps"));
        assert!(refused(&[one.view()], &[]).contains("priorities must not be empty"));
        assert!(refused(&[], &p(2)).contains("at least one tensor"));
    }
}
