//! The background insert stream of a trajectory writer: sends each chunk once, then items with
//! `keep_chunk_keys`; counts confirmations; on UNAVAILABLE/CANCELLED reconnects with backoff
//! and resends every unconfirmed item (the server treats a re-sent key as a priority update).
//! Each connection is an insert stream of the server as the client reaches it ([`session`]:
//! over gRPC, or to a server of this process).
//!
//! An item the server refuses (an unknown table, data it cannot store) or that is too large
//! for one message is dropped and its error reported once ([`Progress::rejection`]); the
//! stream goes on with the next items. A request of several items that fails is resent one
//! item per request, so only the item at fault is dropped.

use crate::transport::InsertStream;
use crate::{Client, ClientError};
use bytes::Bytes;
use prost::Message;
use reverb_proto::{ChunkData, InsertStreamRequest, KeySet, PrioritizedItem};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tonic::Code;

/// An item ready to go: every chunk it references is finalized.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub key: u64,
    /// Its `PrioritizedItem` message, encoded.
    pub item: Bytes,
    pub chunks: Vec<Arc<ChunkData>>,
    /// Chunks the server must keep after this item (still referenced by the writer).
    pub keep: Arc<Vec<u64>>,
    /// The payload bytes of the chunks no item handed to the stream before carried.
    pub new_bytes: usize,
}

impl Outgoing {
    /// The payload bytes of the chunks the item carries.
    pub fn payload(&self) -> usize {
        self.chunks.iter().map(|c| c.data.len()).sum()
    }
}

/// What the stream task reports to the writer.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Items the server stored.
    pub confirmed: u64,
    /// Items dropped because they were refused.
    pub rejected: u64,
    /// Why the stream stopped for good: every later call fails with it.
    pub error: Option<ClientError>,
    /// Why the last item was refused, until a call reports it.
    pub rejection: Option<ClientError>,
    /// The transient error (a broken connection, a server short of memory or disk) the
    /// stream is retrying after, until the server confirms again: a call that times out
    /// meanwhile says it.
    pub retrying: Option<ClientError>,
}

impl Progress {
    /// Items no longer in flight.
    pub fn settled(&self) -> u64 {
        self.confirmed + self.rejected
    }

    /// The error a call reports now: the stream's, or a refusal (reported once).
    pub fn take_error(&mut self) -> Option<ClientError> {
        match &self.error {
            Some(e) => Some(e.clone()),
            None => self.rejection.take(),
        }
    }

    fn reject(&mut self, error: ClientError) {
        self.rejected += 1;
        self.rejection = Some(error);
    }
}

/// Progress plus a condvar the writer waits on.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub progress: Mutex<Progress>,
    pub changed: Condvar,
    /// Number of callers waiting for everything to be sent (flush, end_episode, close):
    /// while non-zero, the stream sends at once instead of lingering.
    pub urgent: AtomicUsize,
    /// Cuts a linger short.
    pub wake: Notify,
    /// Items handed to the stream and not yet taken into a request.
    pub queued: AtomicUsize,
    /// The chunk payload those items carry first (`Outgoing::new_bytes`).
    queued_bytes: AtomicUsize,
    /// Bumped (under the lock) by every update the stream makes to `progress`.
    version: AtomicU64,
    /// Callers asleep on `changed` (counted under the lock before they sleep), so that an
    /// update nobody waits for costs no wake-up call.
    sleepers: AtomicUsize,
}

impl Shared {
    /// Counts an item about to be handed to the stream, the first to carry `bytes` of chunk
    /// payload (counted before it is sent, so the stream's counts never go below zero). Returns
    /// whether half the in-flight `window`, or [`LINGER_BYTES`], then waits in the queue:
    /// the caller calls `send_now` once the item is sent, and the stream sends at once
    /// rather than lingering. One half travels while the other fills, so a small window
    /// (the legacy writer's 25) keeps the server busy; and big steps (frames), whose
    /// per-item costs a linger would not save much of, reach the server while the writer
    /// makes the next ones instead of in bursts.
    pub fn queue_one(&self, window: usize, bytes: usize) -> bool {
        let items = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        let before = self.queued_bytes.fetch_add(bytes, Ordering::SeqCst);
        items == window.div_ceil(2) || (before < LINGER_BYTES && before + bytes >= LINGER_BYTES)
    }

    /// Cuts the stream's linger short.
    pub fn send_now(&self) {
        self.wake.notify_one();
    }

    /// Marks the start of a wait for everything to be sent; the guard ends it.
    pub fn urgent(&self) -> UrgentGuard<'_> {
        self.urgent.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_one();
        UrgentGuard(self)
    }
}

/// Ends an urgent period on drop.
pub(crate) struct UrgentGuard<'a>(&'a Shared);

impl Drop for UrgentGuard<'_> {
    fn drop(&mut self) {
        self.0.urgent.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long the stream waits for more items before sending a small batch: per-item work on
/// both ends is then paid per batch. Flushes skip it.
const LINGER: Duration = Duration::from_micros(500);

/// Queued chunk payload that cuts a linger short.
const LINGER_BYTES: usize = 64 << 10;

/// How long a writer waiting for confirmations watches for them before it sleeps.
pub(super) const SPIN: Duration = Duration::from_micros(150);

impl Shared {
    pub(super) fn update(&self, f: impl FnOnce(&mut Progress)) {
        let mut progress = self.progress.lock().unwrap();
        f(&mut progress);
        self.version.fetch_add(1, Ordering::SeqCst);
        drop(progress);
        // A caller that went to sleep before this update counted itself under the lock
        // (taken above after it, or it would have seen the new version and not slept).
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    /// Waits (giving up the lock) until the progress changes or `wait` passes, and locks it
    /// again. Watches for a change for up to `spin` (at most `wait`) first, yielding the CPU:
    /// a confirmation usually comes within a round trip, and a sleeping thread costs the
    /// stream a wake-up (tens of microseconds on a busy or virtual machine).
    pub fn wait_change<'a>(
        &'a self,
        progress: MutexGuard<'a, Progress>,
        wait: Duration,
        spin: Duration,
    ) -> MutexGuard<'a, Progress> {
        let seen = self.version.load(Ordering::SeqCst);
        drop(progress);
        let start = Instant::now();
        let spin = spin.min(wait);
        while start.elapsed() < spin {
            if self.version.load(Ordering::SeqCst) != seen {
                return self.progress.lock().unwrap();
            }
            std::thread::yield_now();
        }
        let progress = self.progress.lock().unwrap();
        if self.version.load(Ordering::SeqCst) != seen {
            return progress;
        }
        let left = wait.saturating_sub(start.elapsed());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let progress = self.changed.wait_timeout(progress, left).unwrap().0;
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        progress
    }
}

/// Most bytes of chunk payload batched into one request.
const MAX_REQUEST_BYTES: usize = 4 << 20;

pub(crate) async fn run(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    shared: Arc<Shared>,
    max_in_flight: usize,
    reconnect_timeout: Duration,
) {
    let mut unconfirmed: VecDeque<Outgoing> = VecDeque::new();
    let mut input_closed = false;
    let mut backoff = Duration::from_millis(1);
    let mut failing_since: Option<Instant> = None;
    loop {
        if input_closed && unconfirmed.is_empty() {
            return;
        }
        let confirmed_before = shared.progress.lock().unwrap().confirmed;
        // Items of the request that failed (0 when the failure was not an answer to one).
        let mut failed_request = 0;
        let result = session(
            &client,
            &mut rx,
            &shared,
            &mut unconfirmed,
            &mut input_closed,
            max_in_flight,
            &mut failed_request,
        )
        .await;
        if shared.progress.lock().unwrap().confirmed > confirmed_before {
            // The connection worked for a while: the reconnect window starts afresh.
            failing_since = None;
            backoff = Duration::from_millis(1);
        }
        match result {
            Ok(()) => return,
            // Transient: the connection broke, or the server is short of memory for now.
            Err(e)
                if matches!(
                    e.code,
                    Code::Unavailable | Code::Cancelled | Code::ResourceExhausted
                ) =>
            {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > reconnect_timeout {
                    let message = format!(
                        "Gave up reconnecting to {} after {:.0}s: {}",
                        client.address(),
                        reconnect_timeout.as_secs_f64(),
                        e.message
                    );
                    shared.update(|p| p.error = Some(ClientError::new(Code::Unavailable, message)));
                    return;
                }
                shared.update(|p| p.retrying = Some(e));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            // The server refused the only item of a request: drop it, report it, go on.
            Err(e) if failed_request == 1 && refuses_item(e.code) => {
                unconfirmed.pop_front();
                shared.update(|p| p.reject(e));
            }
            // A request of several items was refused: resend them one per request (as every
            // new session does) to find the one at fault.
            Err(e) if failed_request > 1 && refuses_item(e.code) => {}
            Err(e) => {
                shared.update(|p| p.error = Some(e));
                return;
            }
        }
    }
}

/// Whether a server's answer refuses the item(s) of a request (an unknown table, data it
/// cannot store, a message over its limit), rather than the whole stream (a wrong token, an
/// unsupported call), which fails the writer.
pub(crate) fn refuses_item(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition | Code::OutOfRange
    )
}

/// One connection (an insert stream of [`Client::server`]). Returns Ok when the writer closed
/// and everything is confirmed. On an error answering a request, `failed_request` is the
/// number of items it held.
async fn session(
    client: &Client,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    shared: &Shared,
    unconfirmed: &mut VecDeque<Outgoing>,
    input_closed: &mut bool,
    max_in_flight: usize,
    failed_request: &mut usize,
) -> Result<(), ClientError> {
    let stream = client.server().insert_stream();
    let mut sender = Sender {
        limit: stream.max_request_bytes(),
        stream,
        sent_chunks: KeySet::default(),
        in_flight: VecDeque::new(),
    };
    let result = async {
        // Re-send what the previous connection did not confirm, in order, one item per
        // request.
        for o in std::mem::take(unconfirmed) {
            sender.send(vec![o], unconfirmed, shared).await?;
        }
        loop {
            if *input_closed && unconfirmed.is_empty() {
                return Ok(());
            }
            // Confirmations first: they free the writer's in-flight window (a server of this
            // process has confirmed a request by the time `send` returns).
            tokio::select! {
                biased;
                keys = sender.stream.confirmed() => {
                    let keys = keys?.ok_or_else(|| {
                        ClientError::new(Code::Unavailable, "the server closed the insert stream")
                    })?;
                    sender.retire(&keys);
                    confirm(shared, unconfirmed, keys);
                }
                next = rx.recv(), if !*input_closed => match next {
                    None => *input_closed = true,
                    Some(first) => {
                        linger(shared).await;
                        let batch = take_batch(first, rx, max_in_flight, shared);
                        sender.send(batch, unconfirmed, shared).await?;
                    }
                },
            }
        }
    }
    .await;
    if result.is_err() {
        *failed_request = sender.in_flight.front().map_or(0, Vec::len);
    }
    result
}

/// Sends requests on one insert stream.
struct Sender {
    stream: Box<dyn InsertStream>,
    /// Chunks the server holds for this stream.
    sent_chunks: KeySet,
    /// Keys of the items of each request sent and not confirmed yet, oldest first.
    in_flight: VecDeque<Vec<u64>>,
    /// Largest request the stream may carry (`None`: no limit).
    limit: Option<usize>,
}

impl Sender {
    /// Takes confirmed keys off the requests in flight (a server may confirm a request's
    /// items in several answers), dropping requests fully confirmed.
    fn retire(&mut self, keys: &[u64]) {
        let keys: KeySet = keys.iter().copied().collect();
        let mut left = keys.len();
        for request in self.in_flight.iter_mut() {
            if left == 0 {
                break;
            }
            let before = request.len();
            request.retain(|k| !keys.contains(k));
            left = left.saturating_sub(before - request.len());
        }
        self.in_flight.retain(|r| !r.is_empty());
    }

    /// Sends `batch` as one request, or one request per item when that would be too large;
    /// an item too large on its own is rejected instead of sent. Sent items join
    /// `unconfirmed`.
    async fn send(
        &mut self,
        batch: Vec<Outgoing>,
        unconfirmed: &mut VecDeque<Outgoing>,
        shared: &Shared,
    ) -> Result<(), ClientError> {
        let req = request(&batch, &self.sent_chunks);
        if let Some(limit) = self.limit {
            let size = req.encoded_len();
            if size > limit {
                if batch.len() > 1 {
                    for o in batch {
                        Box::pin(self.send(vec![o], unconfirmed, shared)).await?;
                    }
                    return Ok(());
                }
                let table = PrioritizedItem::decode(batch[0].item.clone())
                    .map(|item| item.table)
                    .unwrap_or_default();
                let message = format!(
                    "Item {} for table '{table}' is {size} bytes once encoded, more than the {limit} \
                     bytes a message may hold (REVERB_MAX_MESSAGE_BYTES); it was not sent",
                    batch[0].key
                );
                shared.update(|p| p.reject(ClientError::invalid(message)));
                return Ok(());
            }
        }
        sent(&req, &mut self.sent_chunks);
        self.in_flight
            .push_back(batch.iter().map(|o| o.key).collect());
        unconfirmed.extend(batch);
        self.stream.send(req).await
    }
}

/// `first` and what else is queued, up to `max_items` items or about `MAX_REQUEST_BYTES` of
/// chunk payload: one request's worth.
fn take_batch(
    first: Outgoing,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    max_items: usize,
    shared: &Shared,
) -> Vec<Outgoing> {
    let (mut bytes, mut new_bytes) = (first.payload(), first.new_bytes);
    let mut batch = vec![first];
    while bytes < MAX_REQUEST_BYTES && batch.len() < max_items {
        match rx.try_recv() {
            Ok(o) => {
                bytes += o.payload();
                new_bytes += o.new_bytes;
                batch.push(o);
            }
            Err(_) => break,
        }
    }
    shared.queued.fetch_sub(batch.len(), Ordering::SeqCst);
    shared.queued_bytes.fetch_sub(new_bytes, Ordering::SeqCst);
    batch
}

/// Waits a little for more items unless someone waits for everything to be sent or
/// [`LINGER_BYTES`] wait already (a request could not take them all).
async fn linger(shared: &Shared) {
    if shared.urgent.load(Ordering::SeqCst) == 0
        && shared.queued_bytes.load(Ordering::SeqCst) < LINGER_BYTES
    {
        tokio::select! {
            _ = tokio::time::sleep(LINGER) => {}
            _ = shared.wake.notified() => {}
        }
    }
}

/// Takes confirmed keys off `unconfirmed` and reports them. (Servers confirm in the order
/// items were sent, so each key is usually the front one.)
fn confirm(shared: &Shared, unconfirmed: &mut VecDeque<Outgoing>, keys: Vec<u64>) {
    let mut n = 0;
    for key in keys {
        let found = if unconfirmed.front().is_some_and(|o| o.key == key) {
            Some(0)
        } else {
            unconfirmed.iter().position(|o| o.key == key)
        };
        if let Some(pos) = found {
            unconfirmed.remove(pos);
            n += 1;
        }
    }
    shared.update(|p| {
        p.confirmed += n;
        p.retrying = None;
    });
}

/// Builds one request: chunks not yet on the server, the items, and what to keep.
fn request(batch: &[Outgoing], sent_chunks: &KeySet) -> InsertStreamRequest {
    let mut chunks: Vec<ChunkData> = Vec::new();
    let mut added = KeySet::default();
    for o in batch {
        for c in &o.chunks {
            if !sent_chunks.contains(&c.chunk_key) && added.insert(c.chunk_key) {
                chunks.push(ChunkData::clone(c));
            }
        }
    }
    let keep: Vec<u64> = batch.last().map(|o| o.keep.to_vec()).unwrap_or_default();
    InsertStreamRequest {
        chunks,
        items: batch.iter().map(|o| o.item.clone()).collect(),
        keep_chunk_keys: keep,
        item_runs: Vec::new(),
    }
}

/// Records what the server holds once it has handled `req`: exactly the kept chunks.
fn sent(req: &InsertStreamRequest, sent_chunks: &mut KeySet) {
    sent_chunks.extend(req.chunks.iter().map(|c| c.chunk_key));
    let kept: KeySet = req.keep_chunk_keys.iter().copied().collect();
    sent_chunks.retain(|k| kept.contains(k));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wait_change` returns once a change comes, whether while it watches or while it
    /// sleeps, and after `wait` when none comes.
    #[test]
    fn wait_change_sees_changes_early_and_late() {
        let shared = Arc::new(Shared::default());
        for (round, delay) in [Duration::ZERO, SPIN * 4].into_iter().enumerate() {
            let updater = {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    shared.update(|p| {
                        p.confirmed += 1;
                        p.retrying = None;
                    });
                })
            };
            let start = Instant::now();
            let mut progress = shared.progress.lock().unwrap();
            while progress.confirmed <= round as u64 {
                progress = shared.wait_change(progress, Duration::from_secs(10), SPIN);
            }
            drop(progress);
            assert!(start.elapsed() < Duration::from_secs(5), "{delay:?}");
            updater.join().unwrap();
        }
        let start = Instant::now();
        let progress = shared.wait_change(shared.progress.lock().unwrap(), SPIN * 3, SPIN);
        assert_eq!(progress.confirmed, 2);
        assert!(start.elapsed() >= SPIN * 3);
    }

    /// How long the stream lingers now.
    async fn lingered(shared: &Shared) -> Duration {
        let start = tokio::time::Instant::now();
        linger(shared).await;
        start.elapsed()
    }

    fn outgoing() -> Outgoing {
        Outgoing {
            key: 0,
            item: Bytes::new(),
            chunks: Vec::new(),
            keep: Arc::new(Vec::new()),
            new_bytes: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn half_a_window_queued_cuts_the_linger_short() {
        let shared = Shared::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for round in 0..3 {
            // One item of a window of 4 queued: the stream lingers for more.
            assert!(!shared.queue_one(4, 0));
            tx.send(outgoing()).unwrap();
            // (The timer wheel rounds the linger up to its 1 ms tick.)
            assert!(lingered(&shared).await >= LINGER, "round {round}");
            // The second is half the window: the stream sends at once.
            assert!(shared.queue_one(4, 0));
            tx.send(outgoing()).unwrap();
            shared.send_now();
            assert_eq!(lingered(&shared).await, Duration::ZERO, "round {round}");
            // Taking them into a request empties the count, so the next round starts afresh.
            let first = rx.recv().await.unwrap();
            assert_eq!(take_batch(first, &mut rx, 4, &shared).len(), 2);
            assert_eq!(shared.queued.load(Ordering::SeqCst), 0);
        }
    }

    /// Items whose chunks add up to `LINGER_BYTES` cut the linger short too, whatever the
    /// window; the count starts afresh once they are taken.
    #[tokio::test(start_paused = true)]
    async fn big_payloads_queued_cut_the_linger_short() {
        let shared = Shared::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let with_payload = |bytes: usize| {
            let mut o = outgoing();
            o.chunks.push(Arc::new(ChunkData {
                data: vec![0; bytes].into(),
                ..Default::default()
            }));
            o.new_bytes = bytes;
            o
        };
        for round in 0..2 {
            let small = with_payload(LINGER_BYTES / 2 - 1);
            assert!(!shared.queue_one(1024, small.new_bytes));
            tx.send(small).unwrap();
            assert!(lingered(&shared).await >= LINGER, "round {round}");
            let big = with_payload(LINGER_BYTES / 2 + 1);
            assert!(shared.queue_one(1024, big.new_bytes), "round {round}");
            tx.send(big).unwrap();
            // Until a request takes them, they keep the stream from lingering.
            assert_eq!(lingered(&shared).await, Duration::ZERO, "round {round}");
            let first = rx.recv().await.unwrap();
            assert_eq!(take_batch(first, &mut rx, 1024, &shared).len(), 2);
            assert_eq!(shared.queued_bytes.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn a_batch_holds_at_most_max_items() {
        let shared = Shared::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for _ in 0..5 {
            assert!(!shared.queue_one(1024, 0));
            tx.send(outgoing()).unwrap();
        }
        let first = rx.try_recv().unwrap();
        assert_eq!(take_batch(first, &mut rx, 3, &shared).len(), 3);
        assert_eq!(shared.queued.load(Ordering::SeqCst), 2);
    }
}
