//! Wire types of the Reverb protocol (package `deepmind.reverb`) and the subset of TensorFlow's
//! tensor messages it carries. Generated from `proto/` at build time. With the `service`
//! feature, also the contract between a client and a server: the gRPC stubs and the
//! in-process service a server of the same process offers ([`inproc`]).

#![allow(clippy::all, missing_docs)]

#[cfg(feature = "service")]
pub mod codec;
#[cfg(feature = "service")]
pub mod inproc;
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
