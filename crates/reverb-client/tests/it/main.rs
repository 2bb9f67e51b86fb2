//! The reverb-client integration tests, one binary (one link of the whole dependency graph
//! instead of one per file): each module is one of the former test files, `common` their
//! shared helpers.

mod auth;
mod common;
mod malformed_input;
mod roundtrip;
mod sampler;
mod sharded_sample;
mod silent_server;
mod tls;
mod writer;
mod writer_stream;
