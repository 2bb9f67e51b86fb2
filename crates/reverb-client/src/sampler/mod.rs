//! A prefetching sampler: background workers keep `max_in_flight_samples_per_worker` samples
//! requested from one table, and queue them for a consumer that takes batches. Feeds the
//! numpy / PyTorch iterators and the TensorFlow kernels.
//! `pump` is the one loop that takes samples off a stream of whatever transport reaches a
//! server; `server` samples one server (each worker pumping one stream into the queue);
//! `shards` several, drawing each sample from a shard chosen by its weight; `batch` stacks
//! samples into columns (`gather`: from the chunks a server of this process holds);
//! `one_shot` has the one-shot calls, which pump the samples they ask for into a vector
//! (`Client::sample`, and `sample_shards`, one batch of samples from several servers:
//! `ShardedClient.sample`).

mod batch;
mod gather;
mod one_shot;
mod pump;
mod server;
mod shards;

pub use batch::{stack, stack_planned, Batch};
pub use gather::DecodedCache;
pub use one_shot::{sample_shards, ShardSamples};
pub use shards::ShardWatch;

use crate::{Client, ClientError, Result, Sampled};
use server::ServerSampler;
use shards::ShardedSampler;
use std::time::Duration;

/// Settings of a sampler (the reference's `Sampler::Options`).
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// Samples each worker keeps requested.
    pub max_in_flight_samples_per_worker: usize,
    /// Worker count (each with its own stream); 0 picks [`AUTO_WORKERS`].
    pub num_workers: usize,
    /// Total samples to return; `None` for unlimited.
    pub max_samples: Option<u64>,
    /// Ends the stream (cleanly) when the table's rate limiter blocks this long.
    pub rate_limiter_timeout: Option<Duration>,
    /// Offer a server on this host a shared-memory ring for chunk bytes (see [`crate::transport::shm`]).
    pub shared_memory: bool,
    /// Ask servers for batches as columns (rows that only [`stack`] takes: for samplers
    /// whose consumer stacks every batch).
    pub columnar: bool,
}

/// Workers when none are asked for: one per client runtime thread, so decoding runs on both.
pub const AUTO_WORKERS: usize = 2;
/// A running sampler of one server or of several (shards). Dropping it stops the workers.
pub struct Sampler {
    inner: Inner,
}

enum Inner {
    Server(ServerSampler),
    Shards(Box<ShardedSampler>),
}
impl Sampler {
    /// Starts the workers.
    pub fn new(client: Client, table: &str, options: SamplerOptions) -> Result<Self> {
        Ok(Self {
            inner: Inner::Server(ServerSampler::new(client, table, options)?),
        })
    }

    /// Samples `table` over all of `clients`' servers, each sample from a shard drawn in
    /// proportion to its weight, with its probability and table size made global (see
    /// [`crate::shards`]). One client is the same as [`Sampler::new`].
    pub fn sharded(mut clients: Vec<Client>, table: &str, options: SamplerOptions) -> Result<Self> {
        let inner = match clients.len() {
            0 => return Err(ClientError::invalid("a sampler needs at least one server")),
            1 => Inner::Server(ServerSampler::new(clients.remove(0), table, options)?),
            _ => Inner::Shards(Box::new(ShardedSampler::new(clients, table, options)?)),
        };
        Ok(Self { inner })
    }

    /// Takes `n` samples, waiting at most `wait` in all. Returns fewer at the end of the
    /// stream; `Ok(None)` when the wait passed first (samples that did arrive are kept for the
    /// next call); an empty vector once the stream has ended.
    pub async fn next(&mut self, n: usize, wait: Duration) -> Result<Option<Vec<Sampled>>> {
        self.take(n, wait, true).await
    }

    /// Like [`Sampler::next`], but once the first sample is there it takes only the samples
    /// already queued (at most `n`) instead of waiting for `n`.
    pub async fn next_ready(&mut self, n: usize, wait: Duration) -> Result<Option<Vec<Sampled>>> {
        self.take(n, wait, false).await
    }

    async fn take(&mut self, n: usize, wait: Duration, fill: bool) -> Result<Option<Vec<Sampled>>> {
        if n == 0 {
            return Err(ClientError::invalid(
                "a sampler call must ask for >= 1 sample",
            ));
        }
        match &mut self.inner {
            Inner::Server(s) => s.take(n, wait, fill).await,
            Inner::Shards(s) => s.take(n, wait, fill).await,
        }
    }

    /// Which shards cannot be reached (`None` for a sampler of one server).
    pub fn watch(&self) -> Option<shards::ShardWatch> {
        match &self.inner {
            Inner::Server(_) => None,
            Inner::Shards(s) => Some(s.watch()),
        }
    }
}
