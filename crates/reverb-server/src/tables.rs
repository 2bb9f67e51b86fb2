//! `Tables`: the fixed set of tables a server serves, by name, and where their chunks'
//! payloads are kept (memory, or a [`ChunkStore`] on disk).

use reverb_core::{Chunk, ChunkStore, Journal, SampledItem, Table};
use reverb_proto::ChunkData;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::Status;

/// A server's tables by name. Cheap to clone (shared).
#[derive(Clone)]
pub struct Tables(Arc<BTreeMap<String, Arc<Table>>>, Option<Storage>);

/// Where a disk-backed server's tables keep their chunks' payloads and their changes.
#[derive(Clone)]
struct Storage {
    chunks: Arc<ChunkStore>,
    journal: Arc<Journal>,
    /// Inserts are confirmed once durable (else within the journal's sync interval).
    always: bool,
}

impl Tables {
    /// The tables; names must be unique, and there must be at least one.
    pub fn new(tables: Vec<Arc<Table>>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for t in tables {
            let name = t.name().to_string();
            if map.insert(name.clone(), t).is_some() {
                return Err(format!(
                    "Table names must be unique; '{name}' appears more than once"
                ));
            }
        }
        if map.is_empty() {
            return Err("At least one table must be provided".to_string());
        }
        Ok(Self(Arc::new(map), None))
    }

    /// The same tables with their chunks' payloads stored in `chunks`, their changes logged
    /// in `journal`.
    /// With `always`, inserts are confirmed only once durable (see [`Tables::durable`]).
    pub fn with_storage(
        mut self,
        chunks: Arc<ChunkStore>,
        journal: Arc<Journal>,
        always: bool,
    ) -> Self {
        self.1 = Some(Storage {
            chunks,
            journal,
            always,
        });
        self
    }

    /// Waits until the changes made so far are on disk, when the server syncs "always"
    /// (before it confirms inserts).
    pub async fn durable(&self) -> Result<(), Status> {
        match &self.1 {
            Some(s) if s.always => s
                .journal
                .durable()
                .await
                .map_err(crate::status::from_storage),
            _ => Ok(()),
        }
    }

    /// Where chunk payloads are stored on disk, if they are.
    pub fn storage(&self) -> Option<&Arc<ChunkStore>> {
        self.1.as_ref().map(|s| &s.chunks)
    }

    /// Where the tables' changes are logged on disk, if they are.
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        self.1.as_ref().map(|s| &s.journal)
    }

    /// A received chunk as the tables keep it: in memory, or its payload written to the
    /// store (a full disk is RESOURCE_EXHAUSTED, naming the directory).
    pub fn keep_chunk(&self, data: ChunkData) -> Result<Arc<Chunk>, Status> {
        match &self.1 {
            None => Ok(Arc::new(Chunk::new(data))),
            Some(storage) => {
                // (While the journal cannot be written, nothing more is taken in.)
                storage
                    .journal
                    .check()
                    .map_err(crate::status::from_storage)?;
                storage
                    .chunks
                    .store(data)
                    .map_err(crate::status::from_storage)
            }
        }
    }

    /// `batch` (sampled from `table`) with every item's chunks in memory: a server storing
    /// chunks on disk reads them back here, outside the table's lock. An item whose chunk
    /// cannot be read back whole (it fails its checksum, or is missing) is deleted from the
    /// table, reported and left out of the batch: it is never served. A batch left empty so
    /// fails with DATA_LOSS naming the item and the store.
    pub fn resident(
        &self,
        table: &Table,
        batch: Vec<SampledItem>,
    ) -> Result<Vec<SampledItem>, Status> {
        if self.1.is_none()
            || !batch
                .iter()
                .any(|s| s.item.chunks().iter().any(|c| c.is_stored()))
        {
            return Ok(batch);
        }
        let load = move || {
            // The reads of the batch's chunks from disk start together, then are waited for.
            for sample in &batch {
                sample.item.chunks().iter().for_each(|c| c.will_need());
            }
            let mut served = Vec::with_capacity(batch.len());
            let mut lost = None;
            for mut sample in batch {
                match sample.item.resident() {
                    Ok(None) => served.push(sample),
                    Ok(Some(item)) => {
                        sample.item = Arc::new(item);
                        served.push(sample);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::InvalidData | std::io::ErrorKind::NotFound
                        ) =>
                    {
                        let key = sample.item.key;
                        // (A key that is gone already is ignored.)
                        let _ = table.mutate_items(&[], &[key]);
                        let message = format!(
                            "Item {key} of table {} could not be read back and was deleted: {e}",
                            crate::status::echo(table.name())
                        );
                        eprintln!("reverb server: {message}");
                        lost.get_or_insert(message);
                    }
                    Err(e) => return Err(crate::status::from_storage(e)),
                }
            }
            match lost {
                Some(message) if served.is_empty() => Err(Status::data_loss(message)),
                _ => Ok(served),
            }
        };
        // Reading from disk blocks: a worker of a multi-threaded runtime hands its other
        // tasks over first.
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi {
            tokio::task::block_in_place(load)
        } else {
            load()
        }
    }

    /// The table called `name`, or NOT_FOUND listing the tables that exist.
    pub fn get(&self, name: &str) -> Result<Arc<Table>, Status> {
        self.0.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = self.0.keys().map(String::as_str).collect();
            Status::not_found(format!(
                "Priority table {} was not found. Available tables: [{}]",
                crate::status::echo(name),
                known.join(", ")
            ))
        })
    }

    /// Every table, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.0.values()
    }

    /// Every table, in name order.
    pub fn to_vec(&self) -> Vec<Arc<Table>> {
        self.0.values().cloned().collect()
    }
}
