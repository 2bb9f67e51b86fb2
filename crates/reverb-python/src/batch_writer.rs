//! `reverb._native.BatchWriter`: the batch writer of `Client.batch_writer` (see
//! `reverb_client::writer::batches`).

use crate::blocking::{deadline_ms, run_for};
use crate::client::{float64_priorities, step_requests, PyClient};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use reverb_client::writer::batches::BatchWriter;
use reverb_client::{Client, ClientError};
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// Batches of steps inserted as items, several in flight.
#[pyclass(name = "BatchWriter", module = "reverb._native", frozen)]
pub(crate) struct PyBatchWriter {
    client: Client,
    /// (A tokio lock: calls hold it across awaits, on the client runtime.)
    writer: Arc<Mutex<BatchWriter>>,
}

impl PyBatchWriter {
    /// Runs `f` on the locked writer, on this thread for a server of this process, else on
    /// the client runtime; waiting for the lock ends at `deadline` too.
    fn with_writer<T, F, Fut>(&self, py: Python<'_>, deadline: Option<Instant>, f: F) -> PyResult<T>
    where
        T: Send + 'static,
        F: FnOnce(OwnedMutexGuard<BatchWriter>) -> Fut + Send + 'static,
        Fut: Future<Output = reverb_client::Result<T>> + Send + 'static,
    {
        let writer = self.writer.clone();
        let fut = async move {
            let locked = writer.lock_owned();
            let guard = match deadline {
                None => locked.await,
                Some(d) => tokio::time::timeout_at(d.into(), locked)
                    .await
                    .map_err(|_| {
                        ClientError::deadline(
                            "Timeout exceeded: another call of this batch writer held it",
                        )
                    })?,
            };
            f(guard).await
        };
        run_for(py, &self.client, fut)
    }
}

#[pymethods]
impl PyBatchWriter {
    #[new]
    fn new(client: PyRef<'_, PyClient>, max_in_flight_items: usize) -> Self {
        let client = client.inner.clone();
        Self {
            writer: Arc::new(Mutex::new(BatchWriter::new(
                client.clone(),
                max_in_flight_items,
            ))),
            client,
        }
    }

    /// Sends N steps (`values`: leaves with a leading dimension N) as N items per `(table,
    /// float64 priority bytes)`, as `Client.insert_steps` stores them; returns once they are
    /// sent and the items in flight are within the writer's bound. False (nothing sent) when
    /// the server does not take item runs (the reference's servers).
    #[pyo3(signature = (values, priorities, timeout_ms=None))]
    fn insert_steps(
        &self,
        py: Python<'_>,
        values: Vec<Bound<'_, PyAny>>,
        priorities: Vec<(String, Bound<'_, PyBytes>)>,
        timeout_ms: Option<i64>,
    ) -> PyResult<bool> {
        let priorities = float64_priorities(priorities)?;
        let deadline = deadline_ms(timeout_ms)?;
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let client = self.client.clone();
        let takes_runs = run_for(py, &self.client, async move {
            client.takes_item_runs(timeout).await
        })?;
        if !takes_runs {
            return Ok(false);
        }
        let requests = step_requests(py, &self.client, &values, &priorities)?;
        self.with_writer(py, deadline, move |mut w| async move {
            w.insert(requests, deadline).await
        })?;
        Ok(true)
    }

    /// Waits until at most `block_until_num_items` items are unconfirmed.
    #[pyo3(signature = (block_until_num_items=0, timeout_ms=None))]
    fn flush(
        &self,
        py: Python<'_>,
        block_until_num_items: usize,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline_ms(timeout_ms)?;
        self.with_writer(py, deadline, move |mut w| async move {
            w.flush(block_until_num_items, deadline).await
        })
    }

    /// Items sent and not confirmed yet.
    fn num_unconfirmed(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_writer(py, None, |w| async move { Ok(w.unconfirmed()) })
    }

    /// Closes the writer's stream; items not confirmed may be lost.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.with_writer(py, None, |mut w| async move {
            w.close();
            Ok(())
        })
    }
}
