//! The trajectory writer: per-column chunking of appended steps (`columns.rs`), items built
//! from column history and queued until their chunks are finalized (`pending.rs`), vectorised
//! writers' envs (`envs.rs`), and a background insert stream with confirmations and
//! back-pressure (`stream.rs`). Every writer of the Python API (`TrajectoryWriter`,
//! `VectorTrajectoryWriter`, `Client.insert`) is this one; the structured writer
//! (`structured.rs`) drives one with the configs of `patterns.rs`.
//!
//! Every column keeps its last `num_keep_alive_refs` cells alive. An item is sent once every
//! chunk it references is finalized; items leave in creation order.

pub mod batches;
mod columns;
mod envs;
mod episodes;
mod insert;
pub mod patterns;
mod pending;
pub mod runs;
pub mod scalars;
pub mod schedule;
mod stream;
mod structured;

pub use envs::Steps;
pub use insert::Inserter;
pub use structured::StructuredWriter;

use crate::signature::{check_item, table_signatures, Spec};
use crate::tensor::{AsView, Tensor, TensorView};
use crate::{runtime, writer_runtime, Client, ClientError, Result};
use columns::{check_lengths, Columns, Row};
use episodes::Envs;
use pending::{build_item, Pending};
use reverb_proto::{KeyHashMap, TableInfo};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream::{Outgoing, Shared};
use tokio::sync::mpsc;
use tonic::Code;

/// Settings of a writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Cells each column keeps referenceable (the reference's `num_keep_alive_refs`).
    pub num_keep_alive_refs: usize,
    /// Rows per chunk; `None` picks `num_keep_alive_refs`, shortened for big rows (about 16 KiB
    /// per chunk).
    pub max_chunk_length: Option<usize>,
    /// Items sent but not yet confirmed before `create_item` waits (back-pressure).
    pub max_in_flight_items: usize,
    /// How long to keep reconnecting after the server becomes unavailable.
    pub reconnect_timeout: Duration,
    /// Delta-encode integer columns along time before compressing.
    pub delta_encode: bool,
    /// Check every item against its table's signature before it is queued (the reference's
    /// `validate_items`): an unknown table or a mismatch fails `create_item` and nothing is
    /// queued. The signatures come from the server (see [`TrajectoryWriter::set_tables`]).
    pub validate_items: bool,
    /// With `validate_items`: an item of a table whose signature is not known yet is queued
    /// and checked once [`TrajectoryWriter::set_tables`] gives it, before it is sent, instead
    /// of `create_item` asking the server and waiting. The caller fetches the tables (without
    /// holding anyone up); until then `flush` reports not done, and a refused item fails the
    /// call that finds it (it is dropped, the items after it stay queued).
    pub defer_checks: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            num_keep_alive_refs: 1,
            max_chunk_length: None,
            max_in_flight_items: 1024,
            reconnect_timeout: Duration::from_secs(60),
            delta_encode: false,
            validate_items: false,
            defer_checks: false,
        }
    }
}

/// One column of an item: the cells `(column, step)` it concatenates, squeezed or not.
#[derive(Debug, Clone)]
pub struct ItemColumn {
    /// `(writer column, episode step)` of each row, in order.
    pub refs: Vec<(usize, u64)>,
    /// Drop the leading dimension (exactly one ref).
    pub squeeze: bool,
}

/// What went wrong in an append, with the column it concerns (so callers can name its path).
#[derive(Debug, Clone, PartialEq)]
pub enum AppendError {
    /// The column already has a value in the open step.
    AlreadySet(usize),
    /// The value's dtype or shape differs from the column's first value.
    Mismatch {
        /// Column index.
        column: usize,
        /// `(dtype, row shape)` the column holds.
        expected: (i32, Vec<i64>),
        /// `(dtype, row shape)` that was passed.
        got: (i32, Vec<i64>),
    },
    /// Anything else.
    Other(ClientError),
}

/// Writes trajectories to one server. Not `Sync`: wrap it in a mutex to share it.
pub struct TrajectoryWriter {
    client: Client,
    options: WriterOptions,
    columns: Columns,
    /// The episodes being written (one for a plain writer).
    envs: Envs,
    /// Index of the open step since the writer was created (cells are keyed by it).
    step: u64,
    step_open: bool,
    pending: Pending,
    tx: Option<mpsc::UnboundedSender<Outgoing>>,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
    sent: u64,
    /// When the last step closed, and whether steps come slower than [`SLOW_STEP`].
    last_step_at: Option<Instant>,
    slow_steps: bool,
    /// With `validate_items`: the flat signature of each table the server had when asked.
    signatures: HashMap<String, Option<Vec<Spec>>>,
    /// `set_tables` ran since the last signature check: a table missing from them is
    /// unknown to the server, not asked about again by that check.
    tables_just_set: bool,
    /// With `defer_checks`: queued items whose table's signature was not known when they
    /// were created, by key, with their table and their columns' dtypes and shapes.
    unchecked: KeyHashMap<Unchecked>,
    /// `set_tables` has run: `signatures` holds every table of the server.
    tables_loaded: bool,
}

/// What the front item of the queue may do (see `TrajectoryWriter::check_front`).
enum Front {
    /// Leave (checked, or never needing a check).
    Ready,
    /// Wait for its table's signature.
    Waits,
    /// It was refused and dropped.
    Dropped,
}

/// An item queued before its table's signature was known: its table, and its columns' dtypes
/// and shapes (taken when it was created: its cells may expire before the check).
type Unchecked = (String, Vec<(i32, Vec<i64>)>);

/// How long the first item of a table waits for the server's list of tables (with
/// `validate_items`), unless its call has an earlier deadline.
pub const TABLES_TIMEOUT: Duration = Duration::from_secs(60);

/// Steps that come slower than this (fewer than 10k a second: environments and policies in
/// the loop) send each item as soon as it is created: the open chunks of automatically sized
/// columns it references are finalized early, as the reference's auto-tuned chunker starts
/// with chunks of one step. Faster writers fill their chunks (fewer, larger chunks), and
/// their items leave when the chunks fill, a step or two later.
const SLOW_STEP: Duration = Duration::from_micros(100);

impl TrajectoryWriter {
    /// A writer sending to `client`'s server.
    pub fn new(client: Client, options: WriterOptions) -> Result<Self> {
        check_lengths(options.num_keep_alive_refs, options.max_chunk_length)?;
        let shared = Arc::new(Shared::default());
        // Unbounded, but `pump` keeps at most `max_in_flight_items` unconfirmed.
        let (tx, rx) = mpsc::unbounded_channel();
        // Its requests go over the client's writer connection, on the writers' runtime.
        let client = client.for_writers()?;
        let task = writer_runtime().spawn(stream::run(
            client.clone(),
            rx,
            shared.clone(),
            options.max_in_flight_items.max(1),
            options.reconnect_timeout,
        ));
        let columns = Columns::new(
            options.num_keep_alive_refs,
            options.max_chunk_length,
            options.delta_encode,
        );
        Ok(Self {
            client,
            options,
            columns,
            envs: Envs::new(1),
            step: 0,
            step_open: false,
            pending: Pending::default(),
            tx: Some(tx),
            task,
            shared,
            sent: 0,
            last_step_at: None,
            slow_steps: true,
            signatures: HashMap::new(),
            tables_just_set: false,
            unchecked: KeyHashMap::default(),
            tables_loaded: false,
        })
    }

    /// Notes that `n` steps closed now (see [`SLOW_STEP`]).
    fn steps_closed(&mut self, n: u64) {
        let now = Instant::now();
        let per_step = n.max(1).min(u32::MAX as u64) as u32;
        self.slow_steps = self
            .last_step_at
            .is_none_or(|t| now.duration_since(t) > SLOW_STEP * per_step);
        self.last_step_at = Some(now);
    }

    /// A slow writer's queued items leave now: the open auto-sized chunks they reference
    /// are finalized (see [`SLOW_STEP`]).
    fn ship_promptly(&mut self) {
        if self.slow_steps {
            self.finalize_for_pending(true);
        }
    }

    /// Full steps appended since the episode began.
    pub fn episode_steps(&self) -> u64 {
        self.step - self.envs.get(0).start
    }

    /// The writer-wide step index where the current episode began. Cells are addressed by
    /// writer-wide step: episode step `i` is `episode_start() + i`.
    pub fn episode_start(&self) -> u64 {
        self.envs.get(0).start
    }

    /// Whether a partial step is open.
    pub fn step_is_open(&self) -> bool {
        self.step_open
    }

    /// `(dtype, row shape)` of a column (a field, in every env, of a vectorised writer),
    /// once it has a value.
    pub fn column_spec(&self, column: usize) -> Option<(i32, Vec<i64>)> {
        self.columns.spec(self.envs.column(column, 0))
    }

    /// Overrides keep-alive and chunk length of one column (a field, in every env, of a
    /// vectorised writer), before or after it first appears; an existing open chunk is
    /// finalized first.
    pub fn configure(
        &mut self,
        column: usize,
        num_keep_alive_refs: usize,
        max_chunk_length: Option<usize>,
    ) -> Result<()> {
        check_lengths(num_keep_alive_refs, max_chunk_length)?;
        self.check_error()?;
        for env in 0..self.envs.len() {
            let episode = self.envs.get(env);
            self.columns.configure(
                self.envs.column(column, env),
                num_keep_alive_refs,
                max_chunk_length,
                episode,
            );
        }
        Ok(())
    }

    /// The stream's error, or (once) why the server refused an item.
    fn check_error(&self) -> Result<()> {
        match self.shared.progress.lock().unwrap().take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Appends values `(column, row)` to the open step; closes the step unless `partial`.
    /// Checks everything first: a failed append changes nothing.
    pub fn append<V: AsView>(
        &mut self,
        values: Vec<(usize, V)>,
        partial: bool,
    ) -> std::result::Result<(), AppendError> {
        self.check_error().map_err(AppendError::Other)?;
        let values = views(&values);
        let rows = values.iter().map(|(column, value)| Row {
            name: *column,
            column: *column,
            dtype: value.dtype,
            shape: value.shape,
        });
        self.columns
            .check_rows(rows, self.step_open.then_some(self.step))?;
        for (_, value) in values
            .iter()
            .filter(|(_, v)| v.dtype == crate::tensor::DT_STRING)
        {
            let n = value.shape.iter().map(|&d| d.max(0) as usize).product();
            crate::tensor::decode_strings(value.data, n)
                .map_err(|e| AppendError::Other(ClientError::invalid(e.message)))?;
        }
        let step = self.step;
        for (column, value) in values {
            self.columns.push_row(
                column,
                step,
                value.dtype,
                value.shape,
                value.data,
                &self.envs,
            );
        }
        if partial {
            self.step_open = true;
        } else {
            self.step_open = false;
            self.step += 1;
            self.steps_closed(1);
        }
        Ok(())
    }

    /// Appends `n` full steps at once: each value has a leading dimension of `n`.
    pub fn append_steps<V: AsView>(
        &mut self,
        values: Vec<(usize, V)>,
    ) -> std::result::Result<u64, AppendError> {
        let values = views(&values);
        if self.step_open {
            return Err(AppendError::Other(ClientError::invalid(
                "append_steps needs a closed step; finish the partial step first",
            )));
        }
        if values
            .iter()
            .any(|(_, v)| v.dtype == crate::tensor::DT_STRING)
        {
            return Err(AppendError::Other(ClientError::unimplemented(
                "append_steps does not take string values yet: append them one step at a time",
            )));
        }
        let n = match values.first() {
            None => return Ok(0),
            Some((_, v)) => v.shape.first().copied().unwrap_or(-1),
        };
        if n < 0
            || values
                .iter()
                .any(|(_, v)| v.shape.first().copied() != Some(n))
        {
            return Err(AppendError::Other(ClientError::invalid(
                "append_steps needs every value to have the same leading (step) dimension",
            )));
        }
        let rows = values.iter().map(|(column, value)| Row {
            name: *column,
            column: *column,
            dtype: value.dtype,
            shape: &value.shape[1..],
        });
        self.columns.check_rows(rows, None)?;
        for t in 0..n as usize {
            let step = self.step;
            for (column, value) in &values {
                let row_bytes = value.row_bytes();
                let row = &value.data[t * row_bytes..(t + 1) * row_bytes];
                self.columns.push_row(
                    *column,
                    step,
                    value.dtype,
                    &value.shape[1..],
                    row,
                    &self.envs,
                );
            }
            self.step += 1;
        }
        self.steps_closed(n as u64);
        Ok(n as u64)
    }

    /// The row of a cell as a tensor (for `TrajectoryColumn.numpy()`); `None` when expired.
    pub fn read_cell(&self, column: usize, step: u64) -> Result<Option<Tensor>> {
        self.columns.read_cell(column, step)
    }

    /// Which of `steps` of `column` are still referenceable.
    pub fn alive(&self, column: usize, steps: &[u64]) -> Vec<bool> {
        self.columns.alive(column, steps)
    }

    /// Creates an item in `table`. It is sent once the chunks it references are finalized.
    /// Returns its key. May wait (up to `deadline`) when too many items are unconfirmed;
    /// returns `Ok((key, false))` if it had to stop waiting (the item is queued regardless).
    pub fn create_item(
        &mut self,
        table: &str,
        priority: f64,
        columns: &[ItemColumn],
        deadline: Option<Instant>,
    ) -> Result<(u64, bool)> {
        self.check_error()?;
        let key = self.queue_item(table, priority, columns)?;
        self.ship_promptly();
        let done = self.pump(deadline)?;
        Ok((key, done))
    }

    /// Checks an item and queues it (it leaves with the next `pump`); returns its key.
    fn queue_item(&mut self, table: &str, priority: f64, columns: &[ItemColumn]) -> Result<u64> {
        let key = self.client.new_item_key();
        let item = build_item(key, table, priority, columns, &self.columns)?;
        self.check_or_defer(table, &[(key, columns)])?;
        self.pending.push(item);
        Ok(key)
    }

    /// With `validate_items`, checks items (by key) against `table`'s signature, or, with
    /// `defer_checks` while the server's tables are not known yet, keeps what their check
    /// needs so they are checked before they are sent.
    fn check_or_defer(&mut self, table: &str, items: &[(u64, &[ItemColumn])]) -> Result<()> {
        if self.options.validate_items && self.options.defer_checks && !self.tables_loaded {
            for &(key, columns) in items {
                self.defer_check(key, table, columns);
            }
            return Ok(());
        }
        let columns: Vec<&[ItemColumn]> = items.iter().map(|&(_, c)| c).collect();
        self.check_signature(table, &columns)
    }

    /// Keeps what the check of item `key` against `table`'s signature needs: it is checked
    /// before it is sent, once [`Self::set_tables`] gave the tables.
    fn defer_check(&mut self, key: u64, table: &str, columns: &[ItemColumn]) {
        let shapes = columns
            .iter()
            .filter_map(|c| self.item_column_spec(c))
            .collect();
        self.unchecked.insert(key, (table.to_owned(), shapes));
    }

    /// Queues an item (sent by the next call that sends) to be checked against its table's
    /// signature before it is sent, once [`Self::set_tables`] gives the server's tables: for
    /// callers that check items themselves once they know the tables (the structured writer)
    /// and must not wait for them. Returns its key.
    pub fn queue_item_deferred(
        &mut self,
        table: &str,
        priority: f64,
        columns: &[ItemColumn],
    ) -> Result<u64> {
        let key = self.client.new_item_key();
        let item = build_item(key, table, priority, columns, &self.columns)?;
        self.defer_check(key, table, columns);
        self.pending.push(item);
        Ok(key)
    }

    /// Whether, with `validate_items`, the server's tables are not known yet (see
    /// [`Self::set_tables`]).
    pub fn tables_unknown(&self) -> bool {
        self.options.validate_items && !self.tables_loaded
    }

    /// Whether queued items wait for their tables' signatures (see
    /// [`WriterOptions::defer_checks`]).
    pub fn awaiting_tables(&self) -> bool {
        !self.unchecked.is_empty()
    }

    /// Checks the front item if it was queued unchecked. A refused item is dropped, its error
    /// kept for the next call to report (as a refusal by the server is: before that call
    /// changes anything).
    fn check_front(&mut self) -> Front {
        let Some(key) = self.pending.front_key() else {
            return Front::Ready;
        };
        let Some((table, shapes)) = self.unchecked.get(&key) else {
            return Front::Ready;
        };
        let refused = match self.signatures.get(table) {
            Some(Some(specs)) => check_item(table, specs, shapes).err(),
            Some(None) => None,
            // The server's tables are known and this one is not among them.
            None if self.tables_loaded => Some(self.unknown_table(table)),
            None => return Front::Waits,
        };
        self.unchecked.remove(&key);
        match refused {
            None => Front::Ready,
            Some(e) => {
                self.pending.pop();
                self.shared.update(|p| p.rejection = Some(e));
                Front::Dropped
            }
        }
    }

    /// The error for an item of `table`, which the server's tables do not include.
    fn unknown_table(&self, table: &str) -> ClientError {
        let mut names: Vec<&str> = self.signatures.keys().map(String::as_str).collect();
        names.sort_unstable();
        ClientError::new(
            Code::NotFound,
            format!(
                "Unable to create item in table '{table}': the server at {} has no such table. \
                 Available tables: [{}]",
                self.client.address(),
                names.join(", ")
            ),
        )
    }

    /// Whether `create_item` into `table` needs the server's tables first (see
    /// [`Self::set_tables`]); without it, `create_item` asks the server itself.
    pub fn needs_tables(&self, table: &str) -> bool {
        self.options.validate_items && !self.signatures.contains_key(table)
    }

    /// Takes the tables' signatures from a `ServerInfo` answer (with `validate_items`).
    pub fn set_tables(&mut self, infos: &[TableInfo]) -> Result<()> {
        self.signatures = table_signatures(infos)?;
        self.tables_just_set = true;
        self.tables_loaded = true;
        Ok(())
    }

    /// With `validate_items`, checks items of `table` (their columns, which reference cells
    /// that exist) against its signature; asks the server for its tables when `table` is
    /// not known yet.
    fn check_signature(&mut self, table: &str, items: &[&[ItemColumn]]) -> Result<()> {
        if !self.options.validate_items {
            return Ok(());
        }
        // (A caller that just gave the tables, e.g. after a wait within its own timeout and
        // without Python's GIL, is not made to wait for them again here.)
        // (With `defer_checks` the caller fetches the tables: nothing waits here.)
        if self.needs_tables(table) && !self.tables_just_set && !self.options.defer_checks {
            self.load_tables()?;
        }
        self.tables_just_set = false;
        let Some(entry) = self.signatures.get(table) else {
            return Err(self.unknown_table(table));
        };
        let Some(specs) = entry else {
            return Ok(());
        };
        for columns in items {
            let shapes: Vec<(i32, Vec<i64>)> = columns
                .iter()
                .filter_map(|c| self.item_column_spec(c))
                .collect();
            check_item(table, specs, &shapes)?;
        }
        Ok(())
    }

    /// `(dtype, shape)` of an item column: its rows' spec with the number of rows in front,
    /// or without it when squeezed; `None` until the column it references has a value.
    fn item_column_spec(&self, column: &ItemColumn) -> Option<(i32, Vec<i64>)> {
        let (dtype, row) = self.columns.spec(column.refs.first()?.0)?;
        if column.squeeze {
            return Some((dtype, row));
        }
        let rows = column.refs.len() as i64;
        Some((dtype, std::iter::once(rows).chain(row).collect()))
    }

    /// Asks the server for its tables (at most [`TABLES_TIMEOUT`]). Callers that must not
    /// block here (e.g. while holding Python's GIL) call [`Self::set_tables`] first.
    fn load_tables(&mut self) -> Result<()> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(ClientError::new(
                Code::FailedPrecondition,
                "A validating writer used from async code needs set_tables() before its first \
                 item of a table",
            ));
        }
        let client = self.client.clone();
        let infos =
            runtime().block_on(async move { client.server_info(Some(TABLES_TIMEOUT)).await })?;
        self.set_tables(&infos)
    }

    /// Sends ready items from the front of the queue. Returns false if it stopped at
    /// `deadline` because the in-flight window is full.
    fn pump(&mut self, deadline: Option<Instant>) -> Result<bool> {
        let window = self.options.max_in_flight_items.max(1) as u64;
        // Computed once per call: a superset of what each item sent here needs kept (the
        // chunks of items still queued included), which the next request trims.
        let mut keep: Option<Arc<Vec<u64>>> = None;
        while self.pending.front_ready() == Some(true) {
            match self.check_front() {
                Front::Ready => {}
                Front::Dropped => continue,
                // Items waiting for their tables count against the window too: a producer
                // faster than the server's answer waits instead of queueing without bound.
                Front::Waits => return Ok(self.unchecked.len() < window as usize),
            }
            // Wait for room in the in-flight window; confirmations (which make room) notify.
            {
                // (Only the stream's failure stops here: a refusal of an earlier item is
                // reported by the next call, before it changes anything.)
                let mut progress = self.shared.progress.lock().unwrap();
                loop {
                    if let Some(e) = &progress.error {
                        return Err(e.clone());
                    }
                    if self.sent - progress.settled() < window {
                        break;
                    }
                    // The window is full: the stream must send at once, not linger for more.
                    let _urgent = self.shared.urgent();
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Ok(false);
                    }
                    let wait = deadline.map_or(Duration::from_millis(100), |d| d - now);
                    progress = self.shared.wait_change(progress, wait, stream::SPIN);
                }
            }
            let keep = match &keep {
                Some(k) => k.clone(),
                None => keep
                    .insert(Arc::new(self.pending.keep_keys(&self.columns)))
                    .clone(),
            };
            let (key, item, slots) = self.pending.pop().expect("front exists");
            let mut new_bytes = 0;
            let chunks = slots
                .iter()
                .map(|s| {
                    let data = s.data.get().expect("finalized").clone();
                    if !s.queued.swap(true, Ordering::Relaxed) {
                        new_bytes += data.data.len();
                    }
                    data
                })
                .collect();
            let tx = self.tx.as_ref().ok_or_else(|| {
                ClientError::new(Code::FailedPrecondition, "The writer is closed")
            })?;
            let outgoing = Outgoing {
                key,
                item,
                chunks,
                keep,
                new_bytes,
            };
            let send_now = self.shared.queue_one(window as usize, new_bytes);
            if tx.send(outgoing).is_err() {
                self.check_error()?;
                return Err(ClientError::new(
                    Code::Internal,
                    "The writer's insert stream stopped",
                ));
            }
            if send_now {
                self.shared.send_now();
            }
            self.sent += 1;
        }
        Ok(true)
    }

    /// Sends queued items that are ready, waiting up to `deadline` for room in the in-flight
    /// window. Returns false if items ready to send remain.
    pub fn send_ready(&mut self, deadline: Option<Instant>) -> Result<bool> {
        self.check_error()?;
        self.ship_promptly();
        self.pump(deadline)
    }

    /// Finalizes the open chunks that queued items wait for (only those of automatically
    /// sized columns if `auto_only`), so they can be sent.
    fn finalize_for_pending(&mut self, auto_only: bool) {
        let waiting = self.pending.waiting_for();
        if waiting.is_empty() {
            return;
        }
        for column in self.columns.open_in(&waiting) {
            if auto_only && !self.columns.auto_length(column) {
                continue;
            }
            let env = self.envs.of_column(column);
            self.columns.finalize(column, env);
        }
    }

    /// The transient error (a broken connection, a server short of memory or disk) the
    /// insert stream is retrying after, if it is: what a call that times out says.
    pub fn retrying(&self) -> Option<ClientError> {
        self.shared.progress.lock().unwrap().retrying.clone()
    }

    /// Items the server confirmed since the writer was made.
    pub fn confirmed(&self) -> u64 {
        self.shared.progress.lock().unwrap().confirmed
    }

    /// Items created but not yet confirmed by the server.
    pub fn unconfirmed(&self) -> u64 {
        self.sent + self.pending.len() as u64 - self.shared.progress.lock().unwrap().settled()
    }

    /// Sends every queued item and waits until at most `block_until_num_items` are
    /// unconfirmed. Returns false if `deadline` passed first.
    pub fn flush(&mut self, block_until_num_items: u64, deadline: Option<Instant>) -> Result<bool> {
        self.check_error()?;
        let shared = self.shared.clone();
        let _urgent = shared.urgent();
        self.finalize_for_pending(false);
        if !self.pump(deadline)? || self.awaiting_tables() {
            return Ok(false);
        }
        // Watching costs a CPU the stream and (on this host) the server need: a flush that
        // waits for many items watches only for its first round trip's worth, then sleeps.
        let watch_until = Instant::now() + stream::SPIN;
        loop {
            let mut progress = self.shared.progress.lock().unwrap();
            if let Some(e) = progress.take_error() {
                return Err(e);
            }
            if self.sent - progress.settled() <= block_until_num_items {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let wait = deadline.map_or(Duration::from_millis(100), |d| d - now);
            let spin = watch_until.saturating_duration_since(now);
            drop(self.shared.wait_change(progress, wait, spin));
        }
    }

    /// Ends the episode: finalizes every chunk (so every item can be sent) and starts a new
    /// episode; `clear_buffers` drops the history (all refs expire). Does not wait: `flush`
    /// waits for the items.
    pub fn end_episode(&mut self, clear_buffers: bool) {
        for column in 0..self.columns.len() {
            let env = self.envs.of_column(column);
            self.columns.finalize(column, env);
        }
        if self.step_open {
            self.step += 1;
        }
        self.envs.restart_all(self.step);
        self.step_open = false;
        if clear_buffers {
            for column in 0..self.columns.len() {
                self.columns.clear_cells(column);
            }
        }
    }

    /// Stops the insert stream (after sending what is queued and ready). Items waiting for
    /// unfinalized chunks are dropped, as in the reference.
    pub fn close(&mut self) {
        let shared = self.shared.clone();
        let _urgent = shared.urgent();
        let _ = self.pump(Some(Instant::now() + Duration::from_secs(1)));
        self.pending.clear();
        self.unchecked.clear();
        self.tx = None;
    }

    /// Whether the insert stream has failed for good (every call will return its error).
    pub fn failed(&self) -> bool {
        self.shared.progress.lock().unwrap().error.is_some()
    }

    /// Stops at once: drops queued items and cancels the insert stream, so items the server
    /// has not stored yet (e.g. waiting on a full table) are never stored.
    pub fn abort(&mut self) {
        self.pending.clear();
        self.unchecked.clear();
        self.tx = None;
        self.task.abort();
    }

    /// The client this writer sends through.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The views of appended values.
fn views<V: AsView>(values: &[(usize, V)]) -> Vec<(usize, TensorView<'_>)> {
    values.iter().map(|(c, v)| (*c, v.view())).collect()
}

impl Drop for TrajectoryWriter {
    fn drop(&mut self) {
        self.tx = None;
    }
}
