//! The `SampleStream` RPC. Protocol: each `SampleStreamRequest` asks for `num_samples` items of
//! a table, waiting at most `rate_limiter_timeout` whenever the rate limiter blocks (then
//! DEADLINE_EXCEEDED ends the stream). Batches are sampled while the rate limiter allows and
//! streamed back as `SampleEntry`s in responses of about 2 MiB: a sample's first entry carries
//! its info, its last has `end_of_sequence`, its chunks may be split over entries. Requests are
//! pipelined; a request may also only report ring space released (`shm_released`, see
//! `shm.rs`). A request with `columnar` (not in the reference) is answered with each batch
//! gathered into columns (`SampleBatch`) where its items allow it (one shape, no strings or
//! delta encoding), with entries otherwise.
//!
//! [`sample_waiting`] is the one wait on a table's rate limiter, shared with the in-process
//! service.

use crate::shm::RingWriter;
use crate::status::RATE_LIMITER_TIMEOUT;
use crate::tables::Tables;
use bytes::Bytes;
use reverb_core::{Draw, SampledItem, Table, Waiter};
use reverb_proto::gather::{gather, Batch, DecodedCache};
use reverb_proto::held::HeldSample;
use reverb_proto::sample_stream_response::SampleEntry;
use reverb_proto::shm::MIN_CHUNK_BYTES;
use reverb_proto::{ChunkData, SampleBatch, SampleStreamRequest, SampleStreamResponse};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

type Tx = mpsc::Sender<Result<SampleStreamResponse, Status>>;

/// Most chunk bytes one table call samples (the reference's kMaxSampleResponseSizeBytes).
pub(crate) const MAX_BATCH_BYTES: usize = 1 << 20;
/// A response is sent once it holds this many chunk bytes.
const MAX_RESPONSE_BYTES: usize = 2 << 20;
/// Most items one table call samples.
pub(crate) const MAX_BATCH_ITEMS: usize = 1024;
/// Bytes of compressed chunk tensors a stream answering with columns keeps decoded for rows
/// of later batches (see [`DecodedCache`]; each entry also keeps its item's chunks alive).
const DECODED_CACHE_BYTES: usize = 8 << 20;
/// Bytes of rows a batch sent as columns aims at: its items are drawn by the size of the
/// last batch's samples of the same table.
const COLUMNS_BYTES: usize = 4 << 20;
/// A gathered batch over this many bytes (its samples were larger than the last batch's)
/// is sent as entries, which are split into responses of about [`MAX_RESPONSE_BYTES`].
const MAX_COLUMNS_BYTES: usize = 4 * COLUMNS_BYTES;

/// What a stream answering with columns keeps between batches.
struct Columnar {
    cache: DecodedCache,
    /// The table of the last batch, and the bytes per sample of its rows if it was
    /// gathered; `None` once a batch of it could not be (or was too large): the stream then
    /// sends that table's samples as entries.
    last: Option<(String, Option<usize>)>,
}

impl Columnar {
    /// Items the next draw from `table` gathers at most: about [`COLUMNS_BYTES`] of rows
    /// after a gathered batch of it, one item first (whose size is not known); `None`:
    /// entries, not columns.
    fn max_items(&self, table: &str) -> Option<usize> {
        match &self.last {
            Some((t, Some(b))) if t == table => {
                Some((COLUMNS_BYTES / (*b).max(1)).clamp(1, MAX_BATCH_ITEMS))
            }
            Some((t, None)) if t == table => None,
            _ => Some(1),
        }
    }
}

/// Serves one gRPC sample stream until the client closes it or it fails.
pub(crate) async fn run(
    tables: Tables,
    inbound: Streaming<SampleStreamRequest>,
    tx: Tx,
    mut ring: Option<RingWriter>,
) {
    let mut requests = Requests::new(inbound, ring.as_ref());
    // (Made when a request first asks for columns.)
    let mut columnar = None;
    while let Some(next) = requests.next().await {
        let request = match next {
            Ok(r) => r,
            // A malformed message (or a broken connection): say so, then stop reading.
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                break;
            }
        };
        let columns = request.columnar.then(|| {
            columnar.get_or_insert_with(|| Columnar {
                cache: DecodedCache::with_budget(DECODED_CACHE_BYTES),
                last: None,
            })
        });
        if let Err(status) = serve(&tables, request, &tx, &mut ring, columns).await {
            if let Some(status) = status {
                let _ = tx.send(Err(status)).await;
            }
            break;
        }
    }
}

/// A stream's sample requests (release-only requests taken out).
enum Requests {
    /// Read when the last request was served: one task less per round trip.
    Direct(Box<Streaming<SampleStreamRequest>>),
    /// Read by a task of their own while samples are served, which records ring releases
    /// as they come (a stream with a ring).
    Forwarded {
        requests: mpsc::Receiver<Result<SampleStreamRequest, Status>>,
        _reader: AbortOnDrop,
    },
}

impl Requests {
    fn new(inbound: Streaming<SampleStreamRequest>, ring: Option<&RingWriter>) -> Self {
        match ring {
            None => Requests::Direct(Box::new(inbound)),
            Some(ring) => {
                let (requests_tx, requests) = mpsc::channel(16);
                let reader = tokio::spawn(read_requests(inbound, ring.releases(), requests_tx));
                Requests::Forwarded {
                    requests,
                    _reader: AbortOnDrop(reader),
                }
            }
        }
    }

    /// The next request; `None` once the client closed its side.
    async fn next(&mut self) -> Option<Result<SampleStreamRequest, Status>> {
        match self {
            Requests::Forwarded { requests, .. } => requests.recv().await,
            Requests::Direct(inbound) => loop {
                match inbound.message().await {
                    // Without a ring there is nothing to release.
                    Ok(Some(r)) if r.num_samples == 0 && r.shm_released > 0 => {}
                    Ok(Some(r)) => return Some(Ok(r)),
                    Ok(None) => return None,
                    Err(status) => return Some(Err(status)),
                }
            },
        }
    }
}

/// Stops a task when dropped (however the owner ends).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Forwards sample requests to `out` and records ring releases as they come.
async fn read_requests(
    mut inbound: Streaming<SampleStreamRequest>,
    released: Arc<AtomicU64>,
    out: mpsc::Sender<Result<SampleStreamRequest, Status>>,
) {
    loop {
        let request = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(status) => {
                let _ = out.send(Err(status)).await;
                return;
            }
        };
        if request.shm_released > 0 {
            released.fetch_max(request.shm_released, Ordering::AcqRel);
            if request.num_samples == 0 {
                continue; // only a release
            }
        }
        if out.send(Ok(request)).await.is_err() {
            return;
        }
    }
}

/// Serves one request (as columns where they can be gathered, with `columns`' cache);
/// `Err(None)` when the client went away.
async fn serve(
    tables: &Tables,
    request: SampleStreamRequest,
    tx: &Tx,
    ring: &mut Option<RingWriter>,
    mut columns: Option<&mut Columnar>,
) -> Result<(), Option<Status>> {
    if request.num_samples <= 0 {
        return Err(Some(Status::invalid_argument(format!(
            "num_samples must be > 0, got {}",
            request.num_samples
        ))));
    }
    let table = tables.get(&request.table)?;
    // As in the reference, a missing or non-positive timeout means wait forever.
    let timeout = request
        .rate_limiter_timeout
        .map(|t| t.milliseconds)
        .filter(|&ms| ms > 0)
        .map(|ms| Duration::from_millis(ms as u64));
    let mut remaining = request.num_samples as usize;
    while remaining > 0 {
        // (Batches sent as columns are bounded by the bytes of their rows, so the table
        // need not add up the bytes of each item's chunks.)
        let gathering = columns.as_deref().and_then(|c| c.max_items(&request.table));
        let (max_items, max_bytes) = match gathering {
            Some(items) => (remaining.min(items), usize::MAX),
            None => (remaining.min(MAX_BATCH_ITEMS), MAX_BATCH_BYTES),
        };
        // (A client that goes away drops this handler with its response stream; the checks
        // on `tx` matter only if the handler ever runs apart from it.)
        let rows = gathering.is_some();
        let drawn = sample_waiting(
            &table,
            max_items,
            max_bytes,
            rows,
            timeout,
            tx.closed(),
            || tx.is_closed(),
        )
        .await?;
        let batch = match drawn {
            Draw::Items(batch) => batch,
            Draw::Columns(batch) => {
                remaining -= batch.info.len();
                let columnar = columns.as_deref_mut().expect("rows are drawn for columns");
                let (response, sample_bytes) = as_columns(batch, ring);
                columnar.last = Some((request.table.clone(), Some(sample_bytes)));
                send(response, tx).await?;
                continue;
            }
        };
        let batch = tables.resident(&table, batch)?;
        remaining -= batch.len();
        if let Some(columnar) = columns.as_deref_mut().filter(|_| gathering.is_some()) {
            let response = gathered(&batch, columnar, ring);
            let sample_bytes = response.as_ref().map(|r| r.1);
            columnar.last = Some((request.table.clone(), sample_bytes));
            if let Some((response, _)) = response {
                send(response, tx).await?;
                continue;
            }
        }
        send_batch(batch, tx, ring).await?;
    }
    Ok(())
}

/// Draws up to `max_items` items of `table` (about `max_bytes` of chunks at most), as rows
/// when `rows` and the table keeps them; `None` when the rate limiter allows none.
fn draw(table: &Table, max_items: usize, max_bytes: usize, rows: bool) -> Option<Draw> {
    let draw = match rows.then(|| table.try_sample_rows(max_items)).flatten() {
        Some(draw) => draw,
        None => Draw::Items(table.try_sample(max_items, max_bytes)),
    };
    match &draw {
        Draw::Columns(batch) if batch.info.is_empty() => None,
        Draw::Items(items) if items.is_empty() => None,
        _ => Some(draw),
    }
}

/// Samples a batch of up to `max_items` items of `table` (about `max_bytes` of chunks at
/// most; as rows when `rows` and the table keeps them), waiting while the rate limiter
/// blocks: at most `timeout`, then DEADLINE_EXCEEDED. Stops (`Err(None)`) once the caller
/// has gone: `is_gone()` holds or `gone` completes.
pub(crate) async fn sample_waiting(
    table: &Table,
    max_items: usize,
    max_bytes: usize,
    rows: bool,
    timeout: Option<Duration>,
    gone: impl std::future::Future<Output = ()>,
    is_gone: impl Fn() -> bool,
) -> Result<Draw, Option<Status>> {
    // Most calls find items: they register for the table's changes only once one did not.
    if is_gone() {
        return Err(None);
    }
    if let Some(drawn) = draw(table, max_items, max_bytes, rows) {
        return Ok(drawn);
    }
    if timeout == Some(Duration::ZERO) {
        // Nothing to wait for: not counted as a call waiting on the rate limiter either.
        return Err(Some(Status::deadline_exceeded(RATE_LIMITER_TIMEOUT)));
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    tokio::pin!(gone);
    let mut _waiting = None;
    loop {
        // Registered before trying again, so a change after this attempt wakes the wait.
        let notified = table.changed().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // A caller that has gone away must not take items it will never receive.
        if is_gone() {
            return Err(None);
        }
        if let Some(drawn) = draw(table, max_items, max_bytes, rows) {
            return Ok(drawn);
        }
        _waiting.get_or_insert_with(|| table.waiting(Waiter::Sample));
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = notified => {}
            _ = expired => return Err(Some(Status::deadline_exceeded(RATE_LIMITER_TIMEOUT))),
            _ = &mut gone => return Err(None),
        }
    }
}

/// Streams a batch; a sample's chunks may be split over several entries (and responses): the
/// first entry carries `info`, the last has `end_of_sequence`. With a ring, large chunks' bytes
/// go into it when they fit.
async fn send_batch(
    batch: Vec<SampledItem>,
    tx: &Tx,
    ring: &mut Option<RingWriter>,
) -> Result<(), Option<Status>> {
    let mut response = SampleStreamResponse::default();
    let mut bytes = 0usize;
    for sample in batch {
        let mut entry = SampleEntry {
            info: Some(sample.info()),
            data: Vec::with_capacity(sample.item.chunks().len()),
            end_of_sequence: false,
        };
        for chunk in sample.item.chunks() {
            if bytes > 0 && bytes + chunk.byte_size() > MAX_RESPONSE_BYTES {
                response.entries.push(std::mem::take(&mut entry));
                send(std::mem::take(&mut response), tx).await?;
                bytes = 0;
            }
            bytes += chunk.byte_size();
            entry.data.push(to_send(chunk.data(), ring));
        }
        entry.end_of_sequence = true;
        response.entries.push(entry);
        if bytes >= MAX_RESPONSE_BYTES {
            send(std::mem::take(&mut response), tx).await?;
            bytes = 0;
        }
    }
    if !response.entries.is_empty() {
        send(response, tx).await?;
    }
    Ok(())
}

/// The response carrying `batch` as columns (large ones through the ring when it has room),
/// and its bytes per sample; `None` when its items cannot be gathered so (strings, delta
/// encoding, items of different shapes, malformed data) or their rows are over
/// [`MAX_COLUMNS_BYTES`]: they are sent as entries, and the client says what is wrong with
/// them if anything is.
fn gathered(
    batch: &[SampledItem],
    columnar: &mut Columnar,
    ring: &mut Option<RingWriter>,
) -> Option<(SampleStreamResponse, usize)> {
    let held: Vec<HeldSample> = batch.iter().cloned().map(HeldSample::from).collect();
    let gathered = gather(&held, &mut columnar.cache).ok().flatten()?;
    let bytes: usize = gathered.columns.iter().map(|c| c.data.len()).sum();
    if bytes > MAX_COLUMNS_BYTES {
        return None;
    }
    Some(as_columns(gathered, ring))
}

/// The response carrying `gathered` as columns (large ones through the ring when it has
/// room), and its bytes per sample.
fn as_columns(gathered: Batch, ring: &mut Option<RingWriter>) -> (SampleStreamResponse, usize) {
    let n = gathered.info.len();
    let bytes: usize = gathered.columns.iter().map(|c| c.data.len()).sum();
    let mut batch = SampleBatch::from(gathered);
    for column in &mut batch.columns {
        into_ring(
            &mut column.data,
            &mut column.shm_position,
            &mut column.shm_length,
            ring,
        );
    }
    let response = SampleStreamResponse {
        entries: Vec::new(),
        batch: Some(batch),
    };
    (response, bytes / n.max(1))
}

/// `chunk` (a stored chunk's wire form, without ring fields of its own: those are this
/// stream's to set) as sent (see [`into_ring`]).
fn to_send(mut chunk: ChunkData, ring: &mut Option<RingWriter>) -> ChunkData {
    into_ring(
        &mut chunk.data,
        &mut chunk.shm_position,
        &mut chunk.shm_length,
        ring,
    );
    chunk
}

/// Moves `data` (a chunk's payload or a column's rows) into the client's ring when it is
/// large and fits, setting where it went (`position`, `length`); else leaves it inline.
fn into_ring(
    data: &mut Bytes,
    position: &mut u64,
    length: &mut u64,
    ring: &mut Option<RingWriter>,
) {
    let Some(ring) = ring.as_mut().filter(|_| data.len() >= MIN_CHUNK_BYTES) else {
        return;
    };
    if let Some(at) = ring.put(data) {
        (*position, *length) = (at, data.len() as u64);
        *data = Bytes::new();
    }
}

async fn send(response: SampleStreamResponse, tx: &Tx) -> Result<(), Option<Status>> {
    tx.send(Ok(response)).await.map_err(|_| None)
}
