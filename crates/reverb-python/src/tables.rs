//! The server's tables (their signatures), fetched in the background for writers that check
//! items against them: items created before the answer are queued and checked when it comes,
//! before they are sent, so no call waits longer than its own timeout for the tables.

use crate::blocking::{locked, slices, wait_locked};
use crate::errors::IntoPyResult;
use pyo3::prelude::*;
use reverb_client::writer::{StructuredWriter, TrajectoryWriter};
use reverb_client::{runtime, Client, ClientError};
use reverb_proto::TableInfo;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tonic::Code;

/// How long the call that starts a fetch waits for it: a server that answers within it has
/// the first items checked at once (their errors raised by that call), a slower or silent
/// one has them checked when the tables come (their errors raised by a later call).
pub(crate) const TABLES_GRACE: Duration = Duration::from_millis(500);

/// A writer that takes the server's tables.
pub(crate) trait TakesTables: Send {
    /// Whether it still needs them.
    fn tables_unknown(&self) -> bool;
    /// Its client (which asks the server).
    fn client(&mut self) -> &Client;
    /// Hands it the answer.
    fn set_tables(&mut self, infos: &[TableInfo]) -> reverb_client::Result<()>;
    /// Whether queued items wait for the tables.
    fn awaiting_tables(&self) -> bool;
    /// What its insert stream is retrying after, if anything.
    fn retrying(&self) -> Option<reverb_client::ClientError>;
}

impl TakesTables for TrajectoryWriter {
    fn tables_unknown(&self) -> bool {
        TrajectoryWriter::tables_unknown(self)
    }
    fn client(&mut self) -> &Client {
        TrajectoryWriter::client(self)
    }
    fn set_tables(&mut self, infos: &[TableInfo]) -> reverb_client::Result<()> {
        TrajectoryWriter::set_tables(self, infos)
    }
    fn awaiting_tables(&self) -> bool {
        TrajectoryWriter::awaiting_tables(self)
    }
    fn retrying(&self) -> Option<reverb_client::ClientError> {
        TrajectoryWriter::retrying(self)
    }
}

impl TakesTables for StructuredWriter {
    fn tables_unknown(&self) -> bool {
        !self.knows_tables()
    }
    fn client(&mut self) -> &Client {
        self.writer().client()
    }
    fn set_tables(&mut self, infos: &[TableInfo]) -> reverb_client::Result<()> {
        StructuredWriter::set_tables(self, infos)
    }
    fn awaiting_tables(&self) -> bool {
        StructuredWriter::awaiting_tables(self)
    }
    fn retrying(&self) -> Option<reverb_client::ClientError> {
        StructuredWriter::retrying(self)
    }
}

/// Where the fetch of the server's tables stands.
#[derive(Default)]
enum Fetch {
    #[default]
    Idle,
    Running(tokio::task::JoinHandle<reverb_client::Result<Vec<TableInfo>>>),
    /// Finished, its answer not handed to the writer yet.
    Done(reverb_client::Result<Vec<TableInfo>>),
}

impl Fetch {
    /// Waits for a running fetch until `until` at the latest.
    fn wait(&mut self, until: Instant) {
        if let Fetch::Running(handle) = self {
            let until = tokio::time::Instant::from_std(until);
            let joined =
                runtime().block_on(async { tokio::time::timeout_at(until, &mut *handle).await });
            if let Ok(joined) = joined {
                *self = Fetch::Done(joined.unwrap_or_else(|e| {
                    Err(ClientError::new(
                        Code::Internal,
                        format!("Fetching the tables: {e}"),
                    ))
                }));
            }
        }
    }
}

/// One writer's fetch of the server's tables.
pub(crate) struct TablesFetch {
    fetch: Mutex<Fetch>,
    /// How long the server may take to answer.
    timeout: Duration,
    /// How long the call that starts a fetch waits for it.
    first_wait: Duration,
}

impl TablesFetch {
    pub(crate) fn new(timeout: Duration, first_wait: Duration) -> Self {
        Self {
            fetch: Mutex::new(Fetch::Idle),
            timeout,
            first_wait,
        }
    }

    /// With the tables unknown: starts fetching them (unless a fetch runs), or hands the
    /// writer those a finished fetch got; with `until`, waits for a running fetch until then
    /// first. A failed fetch is this call's error; the next call fetches again. Returns
    /// whether it started a fetch.
    pub(crate) fn poll(
        &self,
        w: &mut impl TakesTables,
        until: Option<Instant>,
    ) -> reverb_client::Result<bool> {
        if !w.tables_unknown() {
            return Ok(false);
        }
        let mut fetch = self.fetch.lock().unwrap();
        if let Fetch::Idle = *fetch {
            let client = w.client().clone();
            let timeout = self.timeout;
            *fetch = Fetch::Running(
                runtime().spawn(async move { client.server_info(Some(timeout)).await }),
            );
            return Ok(true);
        }
        match &*fetch {
            Fetch::Running(handle) if handle.is_finished() => fetch.wait(Instant::now()),
            Fetch::Running(_) => {
                if let Some(until) = until {
                    fetch.wait(until);
                }
            }
            _ => {}
        }
        if let Fetch::Done(_) = *fetch {
            let Fetch::Done(answer) = std::mem::take(&mut *fetch) else {
                unreachable!("matched above");
            };
            w.set_tables(&answer?)?;
        }
        Ok(false)
    }

    /// Waits as [`wait_locked`] on `writer`, handing it the server's tables when they come
    /// (queued items may wait for them).
    pub(crate) fn wait_locked<W: TakesTables>(
        &self,
        py: Python<'_>,
        writer: &Mutex<W>,
        deadline: Option<Instant>,
        what: &str,
        mut step: impl FnMut(&mut W, Option<Instant>) -> reverb_client::Result<bool> + Send,
    ) -> PyResult<()> {
        wait_locked(py, writer, deadline, what, W::retrying, |w, until| {
            // Items waiting for the tables: wait for them (not spin) within this slice.
            let wait = w.awaiting_tables().then_some(until).flatten();
            self.poll(w, wait)?;
            step(w, until)
        })
    }

    /// When the writer closes with items waiting for the tables: gives them until `until`
    /// (starting a fetch when none runs, e.g. after one failed). Errors are dropped: those
    /// items are dropped with the writer.
    pub(crate) fn last_chance(&self, w: &mut impl TakesTables, until: Instant) {
        if let Ok(true) = self.poll(w, Some(until)) {
            let _ = self.poll(w, Some(until));
        }
    }

    /// Before a call that creates items: polls the fetch, and when that started it, waits for
    /// it up to `first_wait` (without the GIL) and polls again. Only the call that starts a
    /// fetch waits; later ones queue their items.
    pub(crate) fn before_items<W: TakesTables>(
        &self,
        py: Python<'_>,
        writer: &Mutex<W>,
    ) -> PyResult<()> {
        if locked(py, writer, |w| self.poll(w, None)).py()? {
            let until = Instant::now() + self.first_wait;
            slices(py, Some(until), |until| {
                let mut fetch = self.fetch.lock().unwrap();
                fetch.wait(until);
                (!matches!(*fetch, Fetch::Running(_))).then_some(())
            })?;
            locked(py, writer, |w| self.poll(w, None)).py()?;
        }
        Ok(())
    }
}
