//! The three ways a client reaches a server, chosen per call with the same semantics:
//! - `grpc`: the wire protocol (tonic; the `SampleStream` call decoded by hand from the
//!   received frames);
//! - `shm`: a shared-memory ring a sampler offers a server on the same host, where big
//!   sampled chunks arrive as positions instead of bytes on the socket;
//! - `inproc`: a server of this process, called directly (`reverb_proto::inproc`), or
//!   through the C ABI of the library holding it (the TensorFlow kernels).
//!
//! gRPC connections are plain TCP, or TLS (`tls`) when the client is given an authority
//! to check the server with.

pub mod channel;
pub mod connect;
pub mod grpc;
pub mod inproc;
pub mod shm;
pub mod tls;
