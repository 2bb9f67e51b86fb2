//! The seam between a client and the server it calls: [`Server`], what a client asks of a
//! server (with the semantics of the RPCs of the same names), written once for each way a
//! client reaches one:
//! - `grpc`: the wire protocol (tonic; the `SampleStream` call decoded by hand from the
//!   received frames), optionally with a shared-memory ring (`shm`) a sampler offers a server
//!   on the same host, where big sampled chunks arrive as positions instead of bytes;
//! - `inproc`: a server of this process, called directly (`reverb_proto::inproc`), or
//!   through the C ABI of the library holding it (`inproc::abi`: the TensorFlow kernels).
//!
//! [`crate::Client::server`] picks one when a call or a stream opens (a server of this
//! process may start or stop at any time); callers (unary calls, writers, samplers) do not
//! know which one they hold. Connection setup (`channel`, `connect`, `tls`) is gRPC's.

pub mod channel;
pub mod connect;
pub mod grpc;
pub mod inproc;
pub mod shm;
pub mod tls;

use crate::{Result, Sampled};
use reverb_proto::{InsertStreamRequest, ServerInfoResponse};
use std::time::Duration;
use tokio::time::Instant;

pub use reverb_proto::inproc::BoxFuture;

/// What a client asks of one server. Every error is a [`crate::ClientError`] naming the
/// server; one whose request never reached the server is marked so (`unsent`), and the
/// caller may try it again.
pub(crate) trait Server: Send + Sync {
    /// Waits until the server can be called, at most until `deadline` (`timeout` is the
    /// call's, `what` its name, for messages): a server of this process can be at once.
    fn ready<'a>(
        &'a self,
        _what: &'a str,
        _timeout: Option<Duration>,
        _deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// How long a sampler whose stream broke keeps opening it again (backoff doubling from
    /// 1 ms while below this): about a second for a connection, twice that for a server of
    /// this process (a stop itself may take a second; a restarted one is found on its port).
    fn reconnect_window(&self) -> Duration;

    /// Every table's info, and what the server understands beyond the reference's protocol
    /// (`ServerInfo`).
    fn server_info(&self) -> BoxFuture<'_, Result<ServerInfoResponse>>;

    /// Deletes `deletes`, then updates priorities (`MutatePriorities`); unknown keys are
    /// ignored.
    fn mutate_priorities<'a>(
        &'a self,
        table: &'a str,
        updates: &'a [(u64, f64)],
        deletes: &'a [u64],
    ) -> BoxFuture<'a, Result<()>>;

    /// Empties a table (`Reset`).
    fn reset<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<()>>;

    /// Saves a checkpoint and returns its path (`Checkpoint`).
    fn checkpoint(&self) -> BoxFuture<'_, Result<String>>;

    /// Opens an insert stream (`InsertStream`).
    fn insert_stream(&self) -> Box<dyn InsertStream>;

    /// Opens a sample stream (`SampleStream`) asking for `n` samples of `table` (see
    /// [`SampleStream::request`]). Some servers answer a call only once it has a request.
    fn sample_stream(
        &self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
        options: SampleStreamOptions,
    ) -> BoxFuture<'_, Result<Box<dyn SampleStream>>>;
}

/// One insert stream: requests go out in order; the server confirms their items' keys in
/// the order it stored them.
pub(crate) trait InsertStream: Send {
    /// The largest request the stream carries, in encoded bytes (`None`: no limit).
    fn max_request_bytes(&self) -> Option<usize>;

    /// Sends one request (chunks, then items, then `keep_chunk_keys`); its keys come from
    /// [`InsertStream::confirmed`].
    fn send(&mut self, request: InsertStreamRequest) -> BoxFuture<'_, Result<()>>;

    /// The keys the server confirmed next; waits until there are some (for ever while
    /// nothing is in flight, unless the stream fails); `None` once the server ended the
    /// stream. Cancel-safe: dropping the future loses nothing.
    fn confirmed(&mut self) -> BoxFuture<'_, Result<Option<Vec<u64>>>>;
}

/// How a sample stream opens.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SampleStreamOptions {
    /// Offer a server on this host a shared-memory ring of this many bytes for chunk bytes
    /// (gRPC only; see [`shm`]).
    pub ring_bytes: Option<usize>,
    /// The stream serves one-shot calls: it is left open for the next once everything it
    /// was asked for arrived, and may be one an earlier call left open (gRPC only).
    pub one_shot: bool,
    /// Open a new call even when one is kept open.
    pub fresh: bool,
    /// Ask for batches as columns ([`crate::Sampled::Row`]): a gRPC server gathers them, a
    /// server of this process hands over those of tables that keep their items' rows (and
    /// the others' items in place).
    pub columnar: bool,
}

/// One sample stream: requests for samples go out, samples come back in order ([`Sampled`]):
/// held in place by a server of this process, or checked and sized with their columns still
/// compressed.
pub(crate) trait SampleStream: Send {
    /// Asks for `n` more samples of `table`, each waiting for the table's rate limiter at
    /// most `rate_limiter_timeout` (for ever when `None`; then the stream fails with
    /// DEADLINE_EXCEEDED).
    fn request(
        &mut self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
    ) -> Result<()>;

    /// Whether asking for more samples costs nothing (a server of this process): a sampler
    /// then keeps its whole window asked for, instead of asking again once half of it
    /// arrived (one request message for many samples).
    fn requests_are_free(&self) -> bool {
        false
    }

    /// The samples that arrived next (at least one), each checked on its own: a sample that
    /// cannot be decoded is an error in its place, and the stream goes on. An error of the
    /// call ends the stream. Cancel-safe, but for the C ABI's (a batch being taken when the
    /// future is dropped is lost: only samplers use it, which drop it once their consumer
    /// has gone).
    fn next(&mut self) -> BoxFuture<'_, Result<Vec<Result<Sampled>>>>;
}
