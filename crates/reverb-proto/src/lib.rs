//! Wire types of the Reverb protocol (package `deepmind.reverb`) and the subset of TensorFlow's
//! tensor messages it carries. Generated from `proto/` at build time. With the `service`
//! feature, also the contract between a client and a server: the gRPC stubs and the
//! in-process service a server of the same process offers ([`inproc`]), whose sampled items
//! are read where the server holds them ([`held`]).

#[cfg(feature = "service")]
pub mod codec;
pub mod encoded;
pub mod gather;
pub mod held;
#[cfg(feature = "service")]
pub mod inproc;
pub mod payload;
pub mod process;
pub mod shm;
#[cfg(feature = "service")]
pub mod tls;

/// TensorFlow's TensorProto, TensorShapeProto and DataType (the subset chunks carry).
// (Lints are allowed on the generated modules only: their code is prost's.)
#[allow(clippy::all, missing_docs)]
pub mod tensorflow {
    include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));

    impl TensorShapeProto {
        /// A shape of known rank and dimensions.
        pub fn of(dims: &[i64]) -> Self {
            Self {
                dim: dims
                    .iter()
                    .map(|&size| tensor_shape_proto::Dim {
                        size,
                        name: String::new(),
                    })
                    .collect(),
                unknown_rank: false,
            }
        }
    }
}

/// Package `deepmind`.
pub mod deepmind {
    /// Reverb's messages and the `ReverbService` client and server stubs.
    #[allow(clippy::all, missing_docs)]
    pub mod reverb {
        include!(concat!(env!("OUT_DIR"), "/deepmind.reverb.rs"));
    }
}

pub use deepmind::reverb::*;
pub use encoded::{decode_item, encode_item, InsertStreamRequest};

/// Serialized `FileDescriptorSet` of every file in `proto/` (with imports), so Python can build
/// real protobuf message classes without protoc.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));

/// A hash map from item or chunk keys, hashed with foldhash (randomly seeded per map): a few
/// nanoseconds per key where the standard SipHash takes about 20, for the maps and sets of
/// keys built and searched on every request and insert. Keys come from clients, who do not
/// know the seed; foldhash does not claim to withstand one who times many inserts to find
/// colliding keys (nor does the reference's hashing), which needs access to the server.
pub type KeyHashMap<V> = std::collections::HashMap<u64, V, foldhash::fast::RandomState>;
/// A set of item or chunk keys, hashed as [`KeyHashMap`].
pub type KeySet = std::collections::HashSet<u64, foldhash::fast::RandomState>;

/// Asks the CPU to load the cache line at `at` ahead of its use (a hint: nothing is read,
/// and an address that is not mapped is ignored). Walks over many items issue these level by
/// level, so that their cache misses are served together instead of one after another.
#[inline(always)]
pub fn prefetch<T: ?Sized>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch neither reads nor writes memory and never faults, whatever the
    // address; SSE, which it needs, is part of every x86_64 CPU.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at as *const u8 as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Largest message a client sends or a server accepts when nothing says otherwise (1 GiB).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 1 << 30;

/// The largest message a client sends or a server accepts: `REVERB_MAX_MESSAGE_BYTES` when it
/// is set to a positive number of bytes, else [`DEFAULT_MAX_MESSAGE_SIZE`]. Clients and
/// servers should agree: a server refuses a larger message at the transport.
pub fn max_message_size() -> usize {
    std::env::var("REVERB_MAX_MESSAGE_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_MAX_MESSAGE_SIZE)
}

/// `REVERB_AUTH_TOKEN` when it is set and not empty: the token servers require and clients
/// send when none is given to them.
pub fn env_auth_token() -> Option<String> {
    std::env::var("REVERB_AUTH_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
}
