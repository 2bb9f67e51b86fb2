//! The reverb-server integration tests, one binary (one link of the whole dependency graph
//! instead of one per file): each module is one of the former test files, `common` their
//! shared helpers.

mod common;
mod insert_stream;
mod sample_stream;
mod service;
