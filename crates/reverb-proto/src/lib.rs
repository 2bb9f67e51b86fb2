//! Wire types of the Reverb protocol (package `deepmind.reverb`) and the subset of TensorFlow's
//! tensor messages it carries. Generated from `proto/` at build time.

#![allow(clippy::all, missing_docs)]

pub mod codec;
pub mod shm;

/// TensorFlow's TensorProto, TensorShapeProto and DataType (the subset chunks carry).
pub mod tensorflow {
    include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));
}

/// Package `deepmind`.
pub mod deepmind {
    /// Reverb's messages and the `ReverbService` client and server stubs.
    pub mod reverb {
        include!(concat!(env!("OUT_DIR"), "/deepmind.reverb.rs"));
    }
}

pub use deepmind::reverb::*;

/// Serialized `FileDescriptorSet` of every file in `proto/` (with imports), so Python can build
/// real protobuf message classes without protoc.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));
