//! The offline checkpoint reader (`reverb.checkpoint.open`): a checkpoint file read in place,
//! without a server, in bounded memory (`reverb_core::checkpoint::Reader`).

use crate::numpy::column_out;
use parking_lot::Mutex;
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use reverb_core::checkpoint::{ItemCursor, Reader};
use reverb_proto::{ChunkData, SampleInfo};
use std::collections::VecDeque;
use std::fs::File;
use std::io::BufReader;
use std::sync::Arc;

type FileReader = Reader<BufReader<File>>;

/// How many chunks an item walk keeps decoded: consecutive items of a writer share most of
/// theirs.
const CHUNK_CACHE: usize = 64;

/// An opened checkpoint file.
#[pyclass(name = "CheckpointReader", module = "reverb._native", frozen)]
pub(crate) struct PyCheckpointReader {
    reader: Arc<Mutex<FileReader>>,
    path: String,
}

fn corrupt(path: &str, e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{path}: {e}"))
}

#[pymethods]
impl PyCheckpointReader {
    /// Opens the checkpoint file at `path`, reading it once to check every record.
    #[new]
    fn new(py: Python<'_>, path: String) -> PyResult<Self> {
        let reader = py.detach(|| {
            let file = File::open(&path).map_err(|e| format!("cannot open: {e}"))?;
            Reader::open(BufReader::with_capacity(1 << 16, file)).map_err(|e| e.to_string())
        });
        let reader = reader.map_err(|e| corrupt(&path, e))?;
        Ok(Self {
            reader: Arc::new(Mutex::new(reader)),
            path,
        })
    }

    /// Every table as `(PriorityTableCheckpoint bytes, number of items)`, in the file's order.
    fn tables<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, u64)> {
        let reader = self.reader.lock();
        reader
            .tables()
            .iter()
            .map(|t| {
                let count = reader.item_count(&t.table_name);
                (PyBytes::new(py, &t.encode_to_vec()), count)
            })
            .collect()
    }

    /// The items of `table` in insertion order; with `data`, each with its columns.
    #[pyo3(signature = (table, data=true))]
    fn items(&self, table: &str, data: bool) -> PyCheckpointItems {
        let reader = self.reader.lock();
        PyCheckpointItems {
            cursor: reader.cursor(table),
            table_size: reader.item_count(table) as i64,
            reader: self.reader.clone(),
            path: self.path.clone(),
            data,
            chunks: VecDeque::new(),
        }
    }
}

/// A walk over one table's items (see [`PyCheckpointReader::items`]).
#[pyclass(name = "CheckpointItems", module = "reverb._native")]
pub(crate) struct PyCheckpointItems {
    reader: Arc<Mutex<FileReader>>,
    path: String,
    cursor: ItemCursor,
    table_size: i64,
    data: bool,
    chunks: VecDeque<ChunkData>,
}

type ItemTuple<'py> = (
    u64,
    f64,
    i32,
    (i64, i32),
    (u64, i64),
    Vec<bool>,
    Option<Bound<'py, PyList>>,
);

#[pymethods]
impl PyCheckpointItems {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// `(key, priority, times_sampled, (inserted_at seconds, nanos), (episode id, first
    /// step), squeezed, columns or None)`; columns are `(dtype, shape, data)` as samples give
    /// them; `squeezed` says which columns are one step without a time dimension. The episode
    /// and step are those of the first column's first row.
    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<ItemTuple<'py>>> {
        let (reader, cursor, cache) = (&self.reader, &mut self.cursor, &mut self.chunks);
        let (data, table_size) = (self.data, self.table_size);
        let next = py.detach(|| -> Result<_, String> {
            let mut reader = reader.lock();
            let Some(item) = reader.next_item(cursor).map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            let keys = item
                .flat_trajectory
                .iter()
                .flat_map(|t| &t.columns)
                .flat_map(|c| &c.chunk_slices)
                .map(|s| s.chunk_key);
            let mut chunks = Vec::new();
            for key in keys.take(if data { usize::MAX } else { 1 }) {
                if chunks.iter().any(|c: &ChunkData| c.chunk_key == key) {
                    continue;
                }
                let chunk = match cache.iter().find(|c| c.chunk_key == key) {
                    Some(chunk) => chunk.clone(),
                    None => {
                        let chunk = reader.chunk(key).map_err(|e| e.to_string())?;
                        if cache.len() == CHUNK_CACHE {
                            cache.pop_front();
                        }
                        cache.push_back(chunk.clone());
                        chunk
                    }
                };
                chunks.push(chunk);
            }
            let first = item
                .flat_trajectory
                .iter()
                .flat_map(|t| &t.columns)
                .flat_map(|c| &c.chunk_slices)
                .next();
            let origin = first
                .and_then(|s| {
                    chunks
                        .iter()
                        .find(|c| c.chunk_key == s.chunk_key)
                        .map(|c| (s, c))
                })
                .and_then(|(s, c)| c.sequence_range.as_ref().map(|r| (s, r)))
                .map_or((0, 0), |(s, r)| {
                    (r.episode_id, i64::from(r.start) + i64::from(s.offset))
                });
            if !data {
                return Ok(Some((item, origin, None)));
            }
            let info = SampleInfo {
                item: Some(item.clone()),
                table_size,
                ..Default::default()
            };
            let sample = reverb_client::sample::plan(info, &chunks)
                .and_then(|planned| planned.assemble())
                .map_err(|e| format!("item {}: {}", item.key, e.message))?;
            Ok(Some((item, origin, Some(sample.columns))))
        });
        let Some((item, origin, columns)) = next.map_err(|e| corrupt(&self.path, e))? else {
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
            columns,
        )))
    }
}
