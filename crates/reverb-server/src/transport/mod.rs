//! How clients reach the tables besides the gRPC service (`service.rs`): `shm` writes sampled
//! chunk bytes into a ring a client on this host offers; `inproc` serves clients of this
//! process through `reverb_proto::inproc::Service`.

pub(crate) mod inproc;
pub(crate) mod shm;
