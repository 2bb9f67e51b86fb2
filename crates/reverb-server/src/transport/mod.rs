//! How clients of this process reach the tables besides the gRPC service (`service.rs`):
//! `inproc` serves them through `reverb_proto::inproc::Service`, with the stream handlers the
//! gRPC service uses (`insert_stream`, `sample_stream`).

pub(crate) mod inproc;
