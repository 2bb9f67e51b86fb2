//! Servers running in this process, by port: a client in the same process (the TensorFlow
//! kernels) can sample their tables directly instead of through loopback gRPC.

use crate::service::find_table;
use reverb_core::{SampledItem, Table};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Status;

type Tables = Arc<BTreeMap<String, Arc<Table>>>;

/// Servers by port, with the process that started them: a child made by `fork` inherits a
/// copy of the tables, not the server, so it must go through gRPC.
static LOCAL: Mutex<BTreeMap<u16, (u32, Tables)>> = Mutex::new(BTreeMap::new());

/// The process that last registered a server. Checked before taking the registry's lock: a
/// child of `fork` must not wait on a lock that a thread of its parent held at the fork.
static REGISTERED_BY: AtomicU32 = AtomicU32::new(0);

pub(crate) fn register(port: u16, tables: Tables) {
    let pid = std::process::id();
    LOCAL.lock().unwrap().insert(port, (pid, tables));
    REGISTERED_BY.store(pid, Ordering::SeqCst);
}

pub(crate) fn unregister(port: u16) {
    LOCAL.lock().unwrap().remove(&port);
}

/// The tables of the server of this process on `port`.
fn tables(port: u16) -> Option<Tables> {
    if REGISTERED_BY.load(Ordering::SeqCst) != std::process::id() {
        return None; // no server of this process (or a child of fork: its parent's)
    }
    match LOCAL.lock().unwrap().get(&port) {
        Some((pid, tables)) if *pid == std::process::id() => Some(tables.clone()),
        _ => None,
    }
}

/// Whether a server of this process listens on `port`.
pub fn is_local(port: u16) -> bool {
    tables(port).is_some()
}

/// Samples up to `max_items` items of `table` from the server of this process on `port`,
/// waiting at most `wait` for the first. An empty result means the wait passed (the rate
/// limiter blocked). Chunk bytes are shared, not copied.
pub fn sample(
    port: u16,
    table: &str,
    max_items: usize,
    wait: Duration,
) -> Result<Vec<SampledItem>, Status> {
    let tables = tables_or_unavailable(port)?;
    let table = find_table(&tables, table)?;
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_micros(50);
    loop {
        let batch = table.try_sample(max_items, crate::sample::MAX_BATCH_BYTES);
        if !batch.is_empty() {
            return Ok(batch);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Vec::new());
        }
        // Only while the rate limiter blocks: poll, backing off to 2 ms.
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}

/// The tables of the server of this process on `port`, or UNAVAILABLE.
fn tables_or_unavailable(port: u16) -> Result<Tables, Status> {
    tables(port)
        .ok_or_else(|| Status::unavailable(format!("No server of this process on port {port}")))
}

/// `MutatePriorities` on the server of this process on `port`: deletes, then updates.
pub fn mutate_priorities(
    port: u16,
    table: &str,
    updates: &[(u64, f64)],
    deletes: &[u64],
) -> Result<(), Status> {
    let tables = tables_or_unavailable(port)?;
    find_table(&tables, table)?
        .mutate_items(updates, deletes)
        .map_err(crate::status)
}

/// `Reset` on the server of this process on `port`.
pub fn reset(port: u16, table: &str) -> Result<(), Status> {
    let tables = tables_or_unavailable(port)?;
    find_table(&tables, table)?.reset();
    Ok(())
}

/// An insert stream to the server of this process on a port, without gRPC: the same checks
/// and semantics as `InsertStream`, with chunk bytes shared instead of copied.
pub struct LocalInsert {
    port: u16,
    tables: Tables,
    inserter: crate::insert::Inserter,
}

impl LocalInsert {
    /// Opens a stream to the server of this process on `port`, if there is one.
    pub fn open(port: u16) -> Option<Self> {
        let tables = tables(port)?;
        Some(Self {
            port,
            tables,
            inserter: Default::default(),
        })
    }

    /// Whether the server this stream was opened to still runs.
    fn alive(port: u16, tables: &Tables) -> bool {
        self::tables(port).is_some_and(|t| Arc::ptr_eq(&t, tables))
    }

    /// Handles one request as `InsertStream` would; returns the confirmed keys. UNAVAILABLE
    /// once the server stopped (a new server on the same port needs a new stream).
    pub async fn insert(
        &mut self,
        request: reverb_proto::InsertStreamRequest,
    ) -> Result<Vec<u64>, Status> {
        let (port, tables) = (self.port, self.tables.clone());
        let alive = move || Self::alive(port, &tables);
        if !alive() {
            return Err(Status::unavailable("the server stopped"));
        }
        self.inserter.handle(&self.tables, request, &alive).await
    }
}
