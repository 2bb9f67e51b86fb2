//! The offline checkpoint reader (`reverb.checkpoint.open`): a checkpoint file of ours read
//! in place, without a server, in bounded memory (`reverb_core::checkpoint::Reader`); a
//! dm-reverb checkpoint directory is first written in our format to an unlinked temporary
//! file (`reverb_server::dm_checkpoint::convert`) and read the same way.

use crate::numpy::column_out;
use parking_lot::Mutex;
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use reverb_core::checkpoint::{self, ItemCursor, Reader};
use reverb_proto::{ChunkData, KeyHashMap, PrioritizedItem, PriorityTableCheckpoint, SampleInfo};
use std::collections::VecDeque;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

/// How many bytes of chunks an item walk keeps (at least the last one read): consecutive
/// items of a writer share most of theirs.
const CHUNK_CACHE_BYTES: usize = 64 << 20;

/// Where a checkpoint's records come from: a checkpoint file of ours, read in place (for
/// a dm-reverb checkpoint, the temporary file it was converted into).
struct Source(Reader<BufReader<File>>);

/// Where a walk over one table's items stands.
type Cursor = ItemCursor;

impl Source {
    fn open(path: &str) -> Result<Self, String> {
        let path = Path::new(path);
        let ours = path.join(checkpoint::FILE_NAME);
        let (file, dir) = if path.is_dir() && !ours.is_file() {
            (converted(path)?, None)
        } else {
            let file = if path.is_dir() { ours.as_path() } else { path };
            let opened = File::open(file).map_err(|e| format!("cannot open: {e}"))?;
            (opened, file.parent())
        };
        let mut reader =
            Reader::open(BufReader::with_capacity(1 << 16, file)).map_err(|e| e.to_string())?;
        if let Some(dir) = dir {
            // (Chunks a disk-backed server's checkpoint linked are in its `segments/`.)
            reader = reader.linked_in(dir);
        }
        Ok(Self(reader))
    }

    fn tables(&self) -> Vec<(PriorityTableCheckpoint, u64)> {
        let r = &self.0;
        r.tables()
            .iter()
            .map(|t| (t.clone(), r.item_count(&t.table_name)))
            .collect()
    }

    fn cursor(&self, table: &str) -> Cursor {
        self.0.cursor(table)
    }

    fn next_item(&mut self, cursor: &mut Cursor) -> Result<Option<PrioritizedItem>, String> {
        self.0.next_item(cursor).map_err(|e| e.to_string())
    }

    /// The episode and step of chunk `key`'s first row, without reading its data.
    fn chunk_origin(&self, key: u64) -> Result<Option<(u64, i32)>, String> {
        self.0.chunk_origin(key).map_err(|e| e.to_string())
    }

    fn chunk(&mut self, key: u64) -> Result<ChunkData, String> {
        self.0.chunk(key).map_err(|e| e.to_string())
    }
}

/// The dm-reverb checkpoint in `dir` written in our format to a temporary file (under the
/// system's temporary directory, `TMPDIR`), unlinked at once: it goes when it is closed.
fn converted(dir: &Path) -> Result<File, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!(
        "reverb-dm-checkpoint-{}-{nanos}.rvb",
        std::process::id()
    ));
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot make a temporary file {}: {e}", path.display()))?;
    let _ = std::fs::remove_file(&path);
    let out = std::io::BufWriter::with_capacity(1 << 20, &file);
    reverb_server::dm_checkpoint::convert(dir, out).map_err(|e| e.to_string())?;
    Ok(file)
}

/// An opened checkpoint.
#[pyclass(name = "CheckpointReader", module = "reverb._native", frozen)]
pub(crate) struct PyCheckpointReader {
    source: Arc<Mutex<Source>>,
    path: String,
}

fn corrupt(path: &str, e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{path}: {e}"))
}

#[pymethods]
impl PyCheckpointReader {
    /// Opens the checkpoint at `path`: our checkpoint file (read once to check every
    /// record), or a dm-reverb checkpoint directory (read whole).
    #[new]
    fn new(py: Python<'_>, path: String) -> PyResult<Self> {
        let source = py
            .detach(|| Source::open(&path))
            .map_err(|e| corrupt(&path, e))?;
        Ok(Self {
            source: Arc::new(Mutex::new(source)),
            path,
        })
    }

    /// Every table as `(PriorityTableCheckpoint bytes, number of items)`, in the file's order.
    fn tables<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, u64)> {
        let tables = self.source.lock().tables();
        tables
            .into_iter()
            .map(|(t, count)| (PyBytes::new(py, &t.encode_to_vec()), count))
            .collect()
    }

    /// The items of `table` in insertion order; with `data`, each with its columns.
    #[pyo3(signature = (table, data=true))]
    fn items(&self, table: &str, data: bool) -> PyCheckpointItems {
        let source = self.source.lock();
        let table_size = source
            .tables()
            .iter()
            .find(|(t, _)| t.table_name == table)
            .map_or(0, |(_, n)| *n as i64);
        PyCheckpointItems {
            cursor: source.cursor(table),
            table_size,
            source: self.source.clone(),
            path: self.path.clone(),
            data,
            chunks: ChunkCache::default(),
        }
    }
}

/// A walk over one table's items (see [`PyCheckpointReader::items`]).
#[pyclass(name = "CheckpointItems", module = "reverb._native")]
pub(crate) struct PyCheckpointItems {
    source: Arc<Mutex<Source>>,
    path: String,
    cursor: Cursor,
    table_size: i64,
    data: bool,
    chunks: ChunkCache,
}

/// The chunks an item walk read last, at most [`CHUNK_CACHE_BYTES`] of them (and the last),
/// by key; the oldest read goes first.
#[derive(Default)]
struct ChunkCache {
    chunks: KeyHashMap<ChunkData>,
    order: VecDeque<u64>,
    bytes: usize,
}

impl ChunkCache {
    fn get(&self, key: u64) -> Option<ChunkData> {
        self.chunks.get(&key).cloned()
    }
    fn add(&mut self, chunk: ChunkData) {
        self.bytes += chunk.data.len();
        self.order.push_back(chunk.chunk_key);
        if let Some(old) = self.chunks.insert(chunk.chunk_key, chunk) {
            self.bytes -= old.data.len();
        }
        while self.bytes > CHUNK_CACHE_BYTES && self.order.len() > 1 {
            let key = self.order.pop_front().expect("more than one chunk");
            if let Some(old) = self.chunks.remove(&key) {
                self.bytes -= old.data.len();
            }
        }
    }
}

type ItemTuple<'py> = (
    u64,
    f64,
    i32,
    (i64, i32),
    (u64, i64),
    Vec<bool>,
    Vec<(u64, i64, i64)>,
    Option<Bound<'py, PyList>>,
);

#[pymethods]
impl PyCheckpointItems {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// `(key, priority, times_sampled, (inserted_at seconds, nanos), (episode id, first
    /// step), squeezed, spans, columns or None)`; columns are `(dtype, shape, data)` as
    /// samples give them; `squeezed` says which columns are one step without a time
    /// dimension; `spans` are each column's `(episode id, first step, rows)`, rows -1 when
    /// they are not consecutive steps of one episode. The episode and step are those of the
    /// first column's first row.
    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<ItemTuple<'py>>> {
        let (source, cursor, cache) = (&self.source, &mut self.cursor, &mut self.chunks);
        let (data, table_size) = (self.data, self.table_size);
        let next = py.detach(|| -> Result<_, String> {
            let mut source = source.lock();
            let Some(item) = source.next_item(cursor)? else {
                return Ok(None);
            };
            let columns: Vec<_> = item
                .flat_trajectory
                .iter()
                .flat_map(|t| &t.columns)
                .collect();
            // Per column: the episode and step of its first row, and its rows (-1 when its
            // rows are not consecutive steps of one episode: a strided slice, say).
            let mut spans: Vec<(u64, i64, i64)> = Vec::with_capacity(columns.len());
            for column in &columns {
                let mut span: Option<(u64, i64, i64)> = None;
                for slice in &column.chunk_slices {
                    let (episode, start) = source.chunk_origin(slice.chunk_key)?.unwrap_or((0, 0));
                    let step = i64::from(start) + i64::from(slice.offset);
                    let rows = i64::from(slice.length);
                    span = Some(match span {
                        None => (episode, step, rows),
                        Some((e, first, n)) if e == episode && first + n == step && n >= 0 => {
                            (e, first, n + rows)
                        }
                        Some((e, first, _)) => (e, first, -1),
                    });
                }
                spans.push(span.unwrap_or((0, 0, 0)));
            }
            let origin = spans.first().map_or((0, 0), |&(e, s, _)| (e, s));
            if !data {
                return Ok(Some((item, origin, spans, None)));
            }
            let mut chunks: Vec<ChunkData> = Vec::new();
            for slice in columns.iter().flat_map(|c| &c.chunk_slices) {
                let key = slice.chunk_key;
                if chunks.iter().any(|c| c.chunk_key == key) {
                    continue;
                }
                let chunk = match cache.get(key) {
                    Some(chunk) => chunk,
                    None => {
                        let chunk = source.chunk(key)?;
                        cache.add(chunk.clone());
                        chunk
                    }
                };
                chunks.push(chunk);
            }
            let info = SampleInfo {
                item: Some(item.clone()),
                table_size,
                ..Default::default()
            };
            let sample = reverb_client::sample::plan(info, &chunks)
                .and_then(|planned| planned.assemble())
                .map_err(|e| format!("item {}: {}", item.key, e.message))?;
            Ok(Some((item, origin, spans, Some(sample.columns))))
        });
        let Some((item, origin, spans, columns)) = next.map_err(|e| corrupt(&self.path, e))? else {
            return Ok(None);
        };
        let columns = match columns {
            Some(columns) => {
                let out = columns
                    .into_iter()
                    .map(|t| column_out(py, t))
                    .collect::<PyResult<Vec<_>>>()?;
                Some(PyList::new(py, out)?)
            }
            None => None,
        };
        let at = item.inserted_at.unwrap_or_default();
        let squeezed = item
            .flat_trajectory
            .as_ref()
            .map(|t| t.columns.iter().map(|c| c.squeeze).collect())
            .unwrap_or_default();
        Ok(Some((
            item.key,
            item.priority,
            item.times_sampled,
            (at.seconds, at.nanos),
            origin,
            squeezed,
            spans,
            columns,
        )))
    }
}
