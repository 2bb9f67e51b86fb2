//! `reverb._native.StructuredWriter`: the native half of `reverb.StructuredWriter`. Configs
//! are evaluated natively after every append; Python only flattens the step.

use crate::blocking::{deadline_ms, locked, with_views};
use crate::client::PyClient;
use crate::errors::IntoPyResult;
use crate::numpy::{to_array, Array};
use crate::tables::{TablesFetch, TABLES_GRACE};
use crate::writer::{append_error, PyAppendError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use reverb_client::writer::patterns::decode_configs;
use reverb_client::writer::{StructuredWriter, TrajectoryWriter, WriterOptions, TABLES_TIMEOUT};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Native half of `reverb.StructuredWriter`. Calls from several threads are serialized.
#[pyclass(name = "StructuredWriter", module = "reverb._native", frozen)]
pub(crate) struct PyStructuredWriter {
    inner: Mutex<StructuredWriter>,
    /// Which leaves of a step some config reads (the others are never converted).
    used: Vec<bool>,
    /// The server's tables (the configs' tables and signatures), fetched in the background:
    /// items made before they come are checked when they come, before they are sent.
    tables: TablesFetch,
}

#[pymethods]
impl PyStructuredWriter {
    /// A writer applying `configs` (serialized `StructuredWriterConfig`s); ValueError naming
    /// the config when one is malformed.
    #[new]
    #[pyo3(signature = (client, configs, *, max_in_flight_items=1024, reconnect_timeout=60.0))]
    fn new(
        py: Python<'_>,
        client: &PyClient,
        configs: Vec<Vec<u8>>,
        max_in_flight_items: usize,
        reconnect_timeout: f64,
    ) -> PyResult<Self> {
        if !(reconnect_timeout.is_finite() && reconnect_timeout >= 0.0) {
            return Err(PyValueError::new_err(
                "reconnect_timeout must be a number of seconds >= 0",
            ));
        }
        let configs = decode_configs(&configs).map_err(PyValueError::new_err)?;
        let options = WriterOptions {
            max_in_flight_items,
            reconnect_timeout: Duration::from_secs_f64(reconnect_timeout),
            ..WriterOptions::default()
        };
        let writer = TrajectoryWriter::new(client.fresh(py), options).py()?;
        let writer = StructuredWriter::new(writer, &configs).py()?;
        let used = (0..writer.width()).map(|i| writer.uses(i)).collect();
        Ok(Self {
            inner: Mutex::new(writer),
            used,
            tables: TablesFetch::new(TABLES_TIMEOUT, TABLES_GRACE),
        })
    }

    /// Appends the flattened step `values` (`None` where the step has no value); with
    /// `partial` the step stays open. Returns None, or an `AppendError` naming the rejected
    /// leaf.
    #[pyo3(signature = (values, partial=false))]
    fn append(
        &self,
        py: Python<'_>,
        values: Vec<Bound<'_, PyAny>>,
        partial: bool,
    ) -> PyResult<Option<Py<PyAppendError>>> {
        self.tables.before_items(py, &self.inner)?;
        let arrays = values
            .iter()
            .enumerate()
            .map(|(i, v)| match self.used.get(i) {
                Some(true) if !v.is_none() => to_array(py, v).map(Some),
                _ => Ok(None),
            })
            .collect::<PyResult<Vec<_>>>()?;
        // The leaves with values, in order; `present` says which leaf each one is.
        let present: Vec<bool> = arrays.iter().map(Option::is_some).collect();
        let given: Vec<Array<'_>> = arrays.into_iter().flatten().collect();
        let appended = with_views(py, &self.inner, &given, |w, views| {
            let mut views = views.iter().copied();
            let values = present
                .iter()
                .map(|&p| if p { views.next() } else { None })
                .collect();
            w.append(values, partial)
        });
        match appended {
            Ok(true) => Ok(None),
            Ok(false) => {
                self.tables
                    .wait_locked(py, &self.inner, None, "append", |w, until| {
                        w.writer().send_ready(until)
                    })?;
                Ok(None)
            }
            Err(e) => append_error(py, e),
        }
    }

    /// Sends everything and waits until at most `block_until_num_items` are unconfirmed.
    #[pyo3(signature = (block_until_num_items=0, timeout_ms=None))]
    fn flush(
        &self,
        py: Python<'_>,
        block_until_num_items: u64,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline_ms(timeout_ms)?;
        self.tables
            .wait_locked(py, &self.inner, deadline, "flush", |w, until| {
                w.writer().flush(block_until_num_items, until)
            })
    }

    /// Applies the end-of-episode configs, ends the episode and waits until every item is
    /// confirmed (on a timeout the new episode has begun all the same).
    #[pyo3(signature = (clear_buffers=true, timeout_ms=None))]
    fn end_episode(
        &self,
        py: Python<'_>,
        clear_buffers: bool,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline_ms(timeout_ms)?;
        locked(py, &self.inner, |w| w.end_episode(clear_buffers)).py()?;
        self.tables
            .wait_locked(py, &self.inner, deadline, "end_episode", |w, until| {
                w.writer().flush(0, until)
            })
    }

    /// Whether a partial step is open.
    #[getter]
    fn step_is_open(&self, py: Python<'_>) -> bool {
        locked(py, &self.inner, |w| w.step_is_open())
    }

    /// Items created and not yet confirmed.
    fn unconfirmed(&self, py: Python<'_>) -> u64 {
        locked(py, &self.inner, |w| w.writer().unconfirmed())
    }

    /// Stops the writer's stream (items waiting for the server's tables get a second for
    /// them, as ready items get one to be sent).
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let mut w = self.inner.lock().unwrap();
            if w.awaiting_tables() {
                let until = Instant::now() + Duration::from_secs(1);
                self.tables.last_chance(&mut *w, until);
            }
            w.writer().close();
        });
    }
}
