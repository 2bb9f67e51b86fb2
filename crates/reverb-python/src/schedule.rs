//! `_native.PatternSchedule`: the configs of a `PatternDataset` checked once, in Rust, and
//! what its `tf.data` program needs of them (rows to keep per leaf, where trajectories lie in
//! them, the leaves data conditions read). The per-step rule runs in the TensorFlow kernel
//! `ReverbRsPatternStep`, from the same `reverb_client::writer::schedule`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use reverb_client::writer::patterns::decode_configs;
use reverb_client::writer::schedule::Schedule;
use std::collections::BTreeMap;

/// A trajectory column's place in its leaf's kept rows: `(leaf, first, length, step, squeeze)`.
type SliceTuple = (usize, usize, usize, usize, bool);

/// Checked `PatternDataset` configs.
#[pyclass(name = "PatternSchedule", module = "reverb._native", frozen)]
pub struct PySchedule(Schedule);

#[pymethods]
impl PySchedule {
    /// Checks `configs` (serialized `StructuredWriterConfig`s) for steps of `num_leaves`
    /// leaves; ValueError says what is wrong, as the reference words it.
    #[new]
    fn new(
        configs: Vec<Vec<u8>>,
        num_leaves: usize,
        respect_episode_boundaries: bool,
    ) -> PyResult<Self> {
        let configs = decode_configs(&configs).map_err(PyValueError::new_err)?;
        Schedule::new(&configs, num_leaves, respect_episode_boundaries)
            .map(Self)
            .map_err(PyValueError::new_err)
    }

    /// Rows to keep of each leaf trajectories take (leaf -> rows).
    #[getter]
    fn history(&self) -> BTreeMap<usize, usize> {
        self.0.history().clone()
    }

    /// Leaves data conditions read, in the order the kernel takes them.
    #[getter]
    fn data_leaves(&self) -> Vec<usize> {
        self.0.data_leaves().to_vec()
    }

    /// Length of the state the kernel carries from step to step.
    #[getter]
    fn state_len(&self) -> usize {
        self.0.state_len()
    }

    /// Where config `c`'s trajectory columns lie in the kept rows: per column `(leaf, first,
    /// length, step, squeeze)`.
    fn slices(&self, c: usize) -> PyResult<Vec<SliceTuple>> {
        if c >= self.0.len() {
            return Err(PyValueError::new_err(format!(
                "config {c} of {}",
                self.0.len()
            )));
        }
        Ok(self
            .0
            .slices(c)
            .into_iter()
            .map(|s| (s.leaf, s.first, s.length, s.step, s.squeeze))
            .collect())
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}
