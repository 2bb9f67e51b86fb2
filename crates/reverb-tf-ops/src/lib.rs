//! Reverb's TensorFlow kernels, written only against TensorFlow's stable C API: one build loads
//! in every supported TensorFlow (2.15 to 2.21) through `tf.load_op_library`. No TensorFlow is
//! needed to build (see build.rs). The ops are private: `reverb.TrajectoryDataset`,
//! `reverb.TimestepDataset` and `reverb.TFClient` wrap them.

mod client_ops;
mod dataset;
mod ffi;
mod inproc;
mod kernel;
mod samples;

use kernel::{register_kernel, register_op, Kernel};

/// Chunks this library's samplers received through shared memory (the tests check, through
/// `ctypes`, that the kernels' samples took the ring).
#[no_mangle]
pub extern "C" fn reverb_tf_shm_chunks_received() -> u64 {
    reverb_client::transport::shm::chunks_received()
}

fn register<K: Kernel>(op: &str, inputs: &[&str], outputs: &[&[&str]], attrs: &[&str]) {
    if let Err(e) = register_op(op, inputs, outputs, attrs).and_then(|_| register_kernel::<K>(op)) {
        eprintln!(
            "reverb: could not register TensorFlow op {op}: {}",
            e.message
        );
    }
}

extern "C" fn register_all() {
    use client_ops::*;
    let _ = std::panic::catch_unwind(|| {
        register::<dataset::DatasetSample>(
            dataset::OP,
            dataset::INPUTS,
            dataset::OUTPUTS,
            dataset::ATTRS,
        );
        register::<ClientSample>(sample::OP, sample::INPUTS, sample::OUTPUTS, sample::ATTRS);
        register::<ClientInsert>(insert::OP, insert::INPUTS, insert::OUTPUTS, insert::ATTRS);
        register::<ClientUpdatePriorities>(
            update_priorities::OP,
            update_priorities::INPUTS,
            update_priorities::OUTPUTS,
            update_priorities::ATTRS,
        );
    });
}

/// Registers the ops and kernels when TensorFlow loads the library (`tf.load_op_library` collects
/// the ops registered while it loads), as a C++ static initializer would.
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = register_all;
