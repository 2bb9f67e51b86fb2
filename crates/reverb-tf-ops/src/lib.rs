//! Reverb's TensorFlow kernels, written only against TensorFlow's stable C API: one build loads
//! in every supported TensorFlow (2.15 to 2.21) through `tf.load_op_library`. No TensorFlow is
//! needed to build (see build.rs). The ops are private: `reverb.TrajectoryDataset`,
//! `reverb.TimestepDataset` and `reverb.TFClient` wrap them.

mod client_ops;
mod dataset;
mod ffi;
mod inproc;
mod kernel;
mod pattern;
mod samples;

use kernel::{register_kernel, register_op, Kernel};

/// Chunks this library's samplers received through shared memory (the tests check, through
/// `ctypes`, that the kernels' samples took the ring).
#[no_mangle]
pub extern "C" fn reverb_tf_shm_chunks_received() -> u64 {
    reverb_client::transport::shm::chunks_received()
}

fn register<K: Kernel>(
    op: &str,
    inputs: &[&str],
    outputs: &[&[&str]],
    attrs: &[&str],
    stateful: bool,
) {
    let registered = register_op(op, inputs, outputs, attrs, stateful);
    if let Err(e) = registered.and_then(|_| register_kernel::<K>(op)) {
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
            true,
        );
        register::<ClientSample>(
            sample::OP,
            sample::INPUTS,
            sample::OUTPUTS,
            sample::ATTRS,
            true,
        );
        register::<ClientInsert>(
            insert::OP,
            insert::INPUTS,
            insert::OUTPUTS,
            insert::ATTRS,
            true,
        );
        register::<ClientUpdatePriorities>(
            update_priorities::OP,
            update_priorities::INPUTS,
            update_priorities::OUTPUTS,
            update_priorities::ATTRS,
            true,
        );
        // A pure function of its inputs: TensorFlow may fold it and tf.data may checkpoint
        // the iterators of datasets using it.
        register::<pattern::PatternStep>(
            pattern::OP,
            pattern::INPUTS,
            pattern::OUTPUTS,
            pattern::ATTRS,
            false,
        );
    });
}

/// Registers the ops and kernels when TensorFlow loads the library (`tf.load_op_library` collects
/// the ops registered while it loads), as a C++ static initializer would.
#[used]
#[link_section = ".init_array"]
static REGISTER: extern "C" fn() = register_all;
