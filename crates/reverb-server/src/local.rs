//! Servers running in this process, by port: a client in the same process (the TensorFlow
//! kernels) can sample their tables directly instead of through loopback gRPC.

use crate::service::find_table;
use reverb_core::{SampledItem, Table};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Status;

type Tables = Arc<BTreeMap<String, Arc<Table>>>;

/// Servers of this process by port.
struct Registry {
    pid: u32,
    servers: Mutex<BTreeMap<u16, Tables>>,
}

static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(std::ptr::null_mut());

/// This process's registry. A child of `fork` starts an empty one of its own: it inherits a
/// copy of its parent's tables, not its servers, and the copy of the parent's lock may be
/// held by a thread that does not exist in the child. (Registries are never freed: the
/// parent's copy in a child is leaked.)
fn registry() -> &'static Registry {
    let pid = std::process::id();
    loop {
        let current = REGISTRY.load(Ordering::Acquire);
        // SAFETY: a non-null pointer comes from `Box::into_raw` below and is never freed.
        if let Some(registry) = unsafe { current.as_ref() } {
            if registry.pid == pid {
                return registry;
            }
        }
        let fresh = Box::into_raw(Box::new(Registry {
            pid,
            servers: Mutex::default(),
        }));
        match REGISTRY.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published; never freed.
            Ok(_) => return unsafe { &*fresh },
            // SAFETY: lost a race, so `fresh` was never shared: free it and look again.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

pub(crate) fn register(port: u16, tables: Tables) {
    registry().servers.lock().unwrap().insert(port, tables);
}

pub(crate) fn unregister(port: u16) {
    registry().servers.lock().unwrap().remove(&port);
}

/// The tables of the server of this process on `port`.
fn tables(port: u16) -> Option<Tables> {
    registry().servers.lock().unwrap().get(&port).cloned()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_has_its_own_registry_even_when_the_parents_lock_is_held() {
        let tables: Tables = Arc::new(BTreeMap::new());
        register(1, tables.clone());
        assert!(is_local(1));
        let held = registry().servers.lock().unwrap();
        // SAFETY: the child only uses the registry (allocating and locking new objects) and
        // leaves with `_exit`.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // The parent's servers are not this process's, and its lock is not waited on.
            let ok = !is_local(1) && {
                register(2, Arc::new(BTreeMap::new()));
                is_local(2)
            };
            // SAFETY: ends the child without running the test harness's code.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: waits for our own child without blocking.
        while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
            if Instant::now() > deadline {
                // SAFETY: kills our own child.
                unsafe { libc::kill(child, libc::SIGKILL) };
                panic!("the child hung on its parent's registry lock");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(held);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        unregister(1);
        assert!(!is_local(1));
    }
}
