//! `reverb._native`: the Python face of the engine, server and client.
//!
//! Python never sees gRPC: it hands numpy buffers in and gets numpy buffers back. Every
//! blocking call releases the GIL and wakes every 100 ms to let Ctrl-C through (`blocking`).
//! One module per concern: `errors` (client errors as `reverb.errors` classes), `numpy`
//! (arrays in and out), `server` (tables and servers), `client`, `writer`, `history` (the
//! trajectory writer's history and item columns), `layout` (steps flattened natively),
//! `structured_writer`, `sampler`, `inproc_abi` (the C ABI the TensorFlow kernels sample this
//! process's servers through), and `malloc` (glibc's thresholds for big buffers, set on import).

mod batch_writer;
mod blocking;
mod checkpoint_reader;
mod client;
mod column;
mod errors;
mod history;
mod inproc_abi;
mod layout;
mod malloc;
mod numpy;
mod sampler;
mod schedule;
mod server;
mod signature;
mod structured_writer;
mod table_info;
mod tables;
mod writer;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Servers of this process keep their tables' big indexes on huge pages where the kernel
/// allows it (see `reverb_server::alloc`).
#[global_allocator]
static ALLOCATOR: reverb_server::HugePageAlloc = reverb_server::HugePageAlloc;

/// Serialized `FileDescriptorSet` of the wire protocol (for Python message classes).
#[pyfunction]
fn descriptor_set<'py>(py: Python<'py>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, reverb_proto::FILE_DESCRIPTOR_SET)
}

/// Whether importing this module set glibc's malloc thresholds (see `malloc`).
#[pyfunction]
fn _malloc_tuned() -> bool {
    malloc::tune()
}

/// Chunks this library's samplers received through shared memory (tests check the path).
#[pyfunction]
fn _shm_chunks_received() -> u64 {
    reverb_client::transport::shm::chunks_received()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    malloc::tune();
    m.add_class::<server::PySelector>()?;
    m.add_class::<server::PyRateLimiter>()?;
    m.add_class::<server::PyTable>()?;
    m.add_class::<server::PyServer>()?;
    m.add_class::<client::PyClient>()?;
    m.add_class::<batch_writer::PyBatchWriter>()?;
    m.add_class::<writer::PyTrajectoryWriter>()?;
    m.add_class::<writer::PyAppendError>()?;
    m.add_class::<column::PyCellRef>()?;
    m.add_class::<column::PyTrajectoryColumn>()?;
    m.add_class::<history::PyColumnHistory>()?;
    m.add_class::<layout::PyStepLayout>()?;
    m.add_class::<layout::PyStepColumns>()?;
    m.add_class::<structured_writer::PyStructuredWriter>()?;
    m.add_class::<schedule::PySchedule>()?;
    m.add_class::<sampler::PySampler>()?;
    m.add_class::<checkpoint_reader::PyCheckpointReader>()?;
    m.add_class::<checkpoint_reader::PyCheckpointItems>()?;
    m.add_function(wrap_pyfunction!(client::server_info_all, m)?)?;
    m.add_function(wrap_pyfunction!(client::connect_wait_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(client::sample_shards, m)?)?;
    m.add_function(wrap_pyfunction!(client::key_shard, m)?)?;
    m.add("MAX_SHARDS", reverb_client::shards::MAX_SHARDS)?;
    m.add_function(wrap_pyfunction!(descriptor_set, m)?)?;
    m.add_class::<signature::PyTableSignature>()?;
    m.add_class::<table_info::PyTableInfo>()?;
    m.add_function(wrap_pyfunction!(signature::table_signature, m)?)?;
    m.add_function(wrap_pyfunction!(signature::tf_dtype_name, m)?)?;
    m.add_function(wrap_pyfunction!(inproc_abi::inproc_port, m)?)?;
    m.add_function(wrap_pyfunction!(_shm_chunks_received, m)?)?;
    m.add_function(wrap_pyfunction!(_malloc_tuned, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
