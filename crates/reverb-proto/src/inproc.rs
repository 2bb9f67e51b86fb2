//! The in-process transport's contract (not in the reference): a server running in this process
//! offers a client of the same binary its tables directly, with the semantics of the RPCs and
//! chunk bytes shared instead of copied through protobuf, HTTP/2 and a socket.
//!
//! The server implements [`Service`] and registers it by port while it serves ([`register`]);
//! the client looks a port up ([`lookup`]) and calls it. Both sides live in their crates'
//! `transport/inproc.rs`. The TensorFlow kernels are a separate library with a registry of their
//! own (always empty); they reach the Python extension's servers through a C ABI instead.

use crate::gather::Batch;
use crate::held::HeldSample;
use crate::{InsertStreamRequest, ServerInfoResponse};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::Status;

/// A boxed future borrowing its receiver.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a server of this process offers, with the semantics of the RPCs of the same names.
/// Every call fails with UNAVAILABLE once the server has stopped.
pub trait Service: Send + Sync {
    /// Whether a client holding `token` may call this server (the server's auth token, if
    /// it has one); a client that may not goes over gRPC and is refused there.
    fn accepts(&self, token: Option<&str>) -> bool;
    /// Opens an insert stream (`InsertStream`).
    fn insert_stream(&self) -> Box<dyn InsertStream>;

    /// Samples up to `max_items` items of `table` in one batch (`SampleStream`), waiting for
    /// the rate limiter at most `rate_limiter_timeout` (forever when `None`): then
    /// DEADLINE_EXCEEDED. Never empty on success. Dropping the future stops the wait. The
    /// items come as the server holds them, not copied, or (with `columns`, from a table
    /// that keeps its items' rows) as their rows gathered into columns.
    fn sample<'a>(
        &'a self,
        table: &'a str,
        max_items: usize,
        rate_limiter_timeout: Option<Duration>,
        columns: bool,
    ) -> BoxFuture<'a, Result<SampledBatch, Status>>;

    /// Deletes `deletes`, then updates priorities (`MutatePriorities`).
    fn mutate_priorities(
        &self,
        table: &str,
        updates: &[(u64, f64)],
        deletes: &[u64],
    ) -> Result<(), Status>;

    /// Empties a table (`Reset`).
    fn reset(&self, table: &str) -> Result<(), Status>;

    /// Every table's info (`ServerInfo`).
    fn server_info(&self) -> Result<ServerInfoResponse, Status>;

    /// Saves a checkpoint and returns its path (`Checkpoint`).
    fn checkpoint(&self) -> BoxFuture<'_, Result<String, Status>>;
}

/// A batch a server of this process sampled.
#[derive(Debug)]
pub enum SampledBatch {
    /// The items, held in place.
    Held(Vec<HeldSample>),
    /// The items' rows as columns.
    Columns(Batch),
}

/// One insert stream to a server of this process.
pub trait InsertStream: Send {
    /// Handles one request as `InsertStream` does: stores its chunks, inserts its items
    /// (waiting while a rate limiter blocks) and returns their keys once stored.
    fn insert(&mut self, request: InsertStreamRequest) -> BoxFuture<'_, Result<Vec<u64>, Status>>;
}

/// Servers of this process by port.
struct Registry {
    pid: u32,
    servers: Mutex<BTreeMap<u16, Arc<dyn Service>>>,
}

static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(std::ptr::null_mut());

/// This process's registry. A child of `fork` starts an empty one of its own: it inherits a
/// copy of its parent's tables, not its servers, and the copy of the parent's lock may be
/// held by a thread that does not exist in the child. (Registries are never freed: the
/// parent's copy in a child is leaked.)
fn registry() -> &'static Registry {
    let pid = crate::process::id();
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

/// Makes `service` reachable in this process as the server on `port`.
pub fn register(port: u16, service: Arc<dyn Service>) {
    lock(registry()).insert(port, service);
}

/// Removes `service` from `port` (if another server took the port since, it stays).
pub fn unregister(port: u16, service: &Arc<dyn Service>) {
    let mut servers = lock(registry());
    if servers.get(&port).is_some_and(|s| Arc::ptr_eq(s, service)) {
        servers.remove(&port);
    }
}

/// The server of this process on `port`, if there is one.
pub fn lookup(port: u16) -> Option<Arc<dyn Service>> {
    lock(registry()).get(&port).cloned()
}

/// The registry's map (a panic elsewhere while holding the lock leaves the map intact).
fn lock(registry: &Registry) -> std::sync::MutexGuard<'_, BTreeMap<u16, Arc<dyn Service>>> {
    registry
        .servers
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{_exit, fork, kill, waitpid, SIGKILL, WNOHANG};
    use std::time::Instant;

    struct Nothing;

    impl Service for Nothing {
        fn accepts(&self, _: Option<&str>) -> bool {
            true
        }
        fn insert_stream(&self) -> Box<dyn InsertStream> {
            unimplemented!()
        }
        fn sample<'a>(
            &'a self,
            _: &'a str,
            _: usize,
            _: Option<Duration>,
            _: bool,
        ) -> BoxFuture<'a, Result<SampledBatch, Status>> {
            unimplemented!()
        }
        fn mutate_priorities(&self, _: &str, _: &[(u64, f64)], _: &[u64]) -> Result<(), Status> {
            unimplemented!()
        }
        fn reset(&self, _: &str) -> Result<(), Status> {
            unimplemented!()
        }
        fn server_info(&self) -> Result<ServerInfoResponse, Status> {
            Ok(ServerInfoResponse::default())
        }
        fn checkpoint(&self) -> BoxFuture<'_, Result<String, Status>> {
            unimplemented!()
        }
    }

    #[test]
    fn a_forked_child_has_its_own_registry_even_when_the_parents_lock_is_held() {
        let first: Arc<dyn Service> = Arc::new(Nothing);
        register(1, first.clone());
        assert!(lookup(1).is_some());
        let held = lock(registry());
        // SAFETY: the child only uses the registry (allocating and locking new objects) and
        // leaves with `_exit`.
        let child = unsafe { fork() };
        if child == 0 {
            // The parent's servers are not this process's, and its lock is not waited on.
            let ok = lookup(1).is_none() && {
                register(2, Arc::new(Nothing));
                lookup(2).is_some()
            };
            // SAFETY: ends the child without running the test harness's code.
            unsafe { _exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: waits for our own child without blocking.
        while unsafe { waitpid(child, &mut status, WNOHANG) } == 0 {
            if Instant::now() > deadline {
                // SAFETY: kills our own child.
                unsafe { kill(child, SIGKILL) };
                panic!("the child hung on its parent's registry lock");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(held);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        // Only the service that is there is removed.
        unregister(1, &(Arc::new(Nothing) as Arc<dyn Service>));
        assert!(lookup(1).is_some());
        unregister(1, &first);
        assert!(lookup(1).is_none());
    }
}
