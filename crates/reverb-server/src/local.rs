//! Servers running in this process, by port: a client in the same process (the TensorFlow
//! kernels) can sample their tables directly instead of through loopback gRPC.

use crate::service::find_table;
use reverb_core::{SampledItem, Table};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Status;

type Tables = Arc<BTreeMap<String, Arc<Table>>>;

static LOCAL: Mutex<BTreeMap<u16, Tables>> = Mutex::new(BTreeMap::new());

pub(crate) fn register(port: u16, tables: Tables) {
    LOCAL.lock().unwrap().insert(port, tables);
}

pub(crate) fn unregister(port: u16) {
    LOCAL.lock().unwrap().remove(&port);
}

/// Whether a server of this process listens on `port`.
pub fn is_local(port: u16) -> bool {
    LOCAL.lock().unwrap().contains_key(&port)
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
    let tables =
        LOCAL.lock().unwrap().get(&port).cloned().ok_or_else(|| {
            Status::unavailable(format!("No server of this process on port {port}"))
        })?;
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
