//! `Client`: unary calls, one-shot inserts and batched sampling, each bounded by a deadline.
//! Each call goes over gRPC, or straight to the server when it runs in this process
//! (`transport::inproc`), with the same semantics.

use crate::sample::{assemble, plan, PartialSample, Sample};
use crate::shards;
use crate::tensor::{encode_chunk, Tensor};
use crate::transport::channel::AuthChannel;
use crate::transport::connect::{is_silent, Connector};
use crate::transport::grpc::{self, KeptStream, KeptStreams, SampleResponses};
use crate::transport::inproc;
use crate::transport::tls::Tls;
use crate::{runtime, writer_runtime, ClientError, Result};
use prost::Message;
use reverb_proto::flat_trajectory::{ChunkSlice, Column};
use reverb_proto::inproc::Service;
use reverb_proto::reverb_service_client::ReverbServiceClient;
use reverb_proto::*;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::Endpoint;
use tonic::Code;

/// A connection to one server. Cheap to clone; connects lazily and reconnects as needed.
#[derive(Clone)]
pub struct Client {
    address: String,
    pub(crate) stub: ReverbServiceClient<AuthChannel>,
    /// The connection (shared by clones) and the token sent on it.
    channel: AuthChannel,
    /// The auth token sent with every call.
    auth_token: Option<String>,
    /// TLS settings of the connection (none: plain TCP).
    tls: Option<Arc<Tls>>,
    /// The port, when `address` names this host and calls may skip gRPC for a server of
    /// this process.
    inproc_port: Option<u16>,
    /// Whether the server was reached yet (shared by clones).
    reach: Arc<Reach>,
    /// Largest message sent or accepted.
    max_message_size: usize,
    /// The shard index item keys written through this client carry (a client of a
    /// `ShardedClient`; see [`crate::shards`]).
    key_shard: Option<u8>,
    /// `SampleStream` calls of this connection kept open between [`Client::sample`] calls
    /// (shared by clones).
    kept_streams: Arc<KeptStreams>,
    /// The connection of this client's writers, on [`crate::writer_runtime`] (made on first
    /// use; shared by clones).
    writer_connection: Arc<OnceLock<tonic::transport::Channel>>,
}

/// How long calls without a timeout wait, in all, for a server that cannot be reached
/// (actors and learners are often started before their replay server);
/// `REVERB_CONNECT_WAIT_SECONDS` overrides it.
pub const CONNECT_WAIT: Duration = Duration::from_secs(60);

/// Whether the server can be reached, as this client last saw it (shared by clones). Until
/// the first call, and after a call failed to connect, the next calls first wait for the
/// server to accept connections, as the reference's (gRPC `wait_for_ready`) do.
#[derive(Default)]
struct Reach {
    up: AtomicBool,
    /// When waiting began: calls without a timeout share one [`CONNECT_WAIT`] from there.
    down_since: Mutex<Option<Instant>>,
    /// The server has answered a call of this client (so it does not serve TLS to a plain
    /// client, or the reverse).
    answered: AtomicBool,
}

/// How long calls without a timeout wait for a server that cannot be reached:
/// `REVERB_CONNECT_WAIT_SECONDS`, else [`CONNECT_WAIT`]. Reads the environment: call it where
/// that cannot race with a write to it (not on the client runtime's threads).
pub fn connect_wait() -> Duration {
    parse_connect_wait(std::env::var("REVERB_CONNECT_WAIT_SECONDS").ok().as_deref())
}

/// `REVERB_CONNECT_WAIT_SECONDS` as a duration ([`CONNECT_WAIT`] when unset or invalid).
fn parse_connect_wait(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| *v >= 0.0)
        // Huge values (or inf) mean "a very long time": capped at a century.
        .map_or(CONNECT_WAIT, |v| {
            Duration::try_from_secs_f64(v.min(100.0 * 365.0 * 86_400.0)).unwrap_or(CONNECT_WAIT)
        })
}

/// Attempts of one call that could not connect, at most (each after the server accepted a
/// probe again; a server that keeps dropping connections ends the call).
const MAX_CONNECT_TRIES: u32 = 20;

/// Whether a status is a connection that could not be made (nothing was sent). A silent
/// server's is not: it accepted the connection, and trying again would only wait again.
fn is_connect_failure(status: &tonic::Status) -> bool {
    use std::error::Error;
    use std::io::ErrorKind;
    if is_silent(status) {
        return false;
    }
    let mut source = status.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::NotFound
                    | ErrorKind::AddrNotAvailable
                    | ErrorKind::TimedOut
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            );
        }
        let text = e.to_string();
        // (A request the transport dropped unsent because its connection went away, e.g. a
        // server killed since the last call, is "canceled": nothing reached the server. So
        // is one whose new connection a TLS server closed at once: retried, it fails the
        // same way and keeps its TLS hint.)
        if text.starts_with("tcp connect error")
            || text.starts_with("dns error")
            || text.starts_with("operation was canceled")
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// The generated stub over `channel`, with the message limit.
fn stub(channel: &AuthChannel, max_message_size: usize) -> ReverbServiceClient<AuthChannel> {
    ReverbServiceClient::new(channel.clone())
        .max_decoding_message_size(max_message_size)
        .max_encoding_message_size(max_message_size)
}

const HTTP2_STREAM_WINDOW: u32 = 16 << 20;
const HTTP2_CONNECTION_WINDOW: u32 = 64 << 20;
const HTTP2_MAX_FRAME: u32 = 1 << 20;

/// A lazy connection to `address` (over TLS with `tls`, else plain TCP) whose tasks run on
/// `runtime`.
fn connection(
    address: &str,
    tls: Option<&Tls>,
    runtime: &tokio::runtime::Runtime,
) -> Result<tonic::transport::Channel> {
    let rest = address.split_once("://");
    let uri = match (rest, tls) {
        (Some(("https", _)), None) => {
            return Err(ClientError::invalid(format!(
                "The address '{address}' asks for TLS, but no authority to check the server \
                 with was given (tls_ca, or the REVERB_TLS_CA environment variable)"
            )))
        }
        (Some((_, rest)), Some(_)) => format!("https://{rest}"),
        (None, Some(_)) => format!("https://{address}"),
        (Some(_), None) => address.to_string(),
        (None, None) => format!("http://{address}"),
    };
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|e| ClientError::invalid(format!("Invalid server address '{address}': {e}")))?
        .connect_timeout(Duration::from_secs(5))
        // Large HTTP/2 windows and frames: samples and chunks are big, and hyper's defaults
        // (2 MiB stream window, 16 KiB frames) stall a stream of 2 MiB sample responses.
        .initial_stream_window_size(HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
        .max_frame_size(HTTP2_MAX_FRAME)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.config())
            .map_err(|e| ClientError::invalid(format!("Invalid TLS settings: {e}")))?;
    }
    let _guard = runtime.enter();
    Ok(endpoint.connect_with_connector_lazy(Connector))
}

impl Client {
    /// A client for `address` (`host:port`, optionally with a scheme), over TLS when
    /// `REVERB_TLS_CA` names an authority ([`Tls::from_env`]). Does not connect yet.
    pub fn new(address: &str) -> Result<Self> {
        let tls = Tls::from_env()
            .map_err(|e| ClientError::invalid(format!("The REVERB_TLS_* settings: {e}")))?;
        let connection = connection(address, tls.as_ref(), runtime())?;
        let auth_token = reverb_proto::env_auth_token();
        let channel = AuthChannel::new(connection, auth_token.as_deref())
            .map_err(|e| ClientError::invalid(format!("REVERB_AUTH_TOKEN cannot be used: {e}")))?;
        let max_message_size = reverb_proto::max_message_size();
        Ok(Self {
            address: address.to_string(),
            stub: stub(&channel, max_message_size),
            channel,
            auth_token,
            tls: tls.map(Arc::new),
            inproc_port: inproc::loopback_port(address),
            reach: Arc::default(),
            max_message_size,
            key_shard: None,
            kept_streams: Arc::default(),
            writer_connection: Arc::default(),
        })
    }

    /// This client over the connection its writers share: one of its own, whose tasks run
    /// on the writers' runtime ([`crate::writer_runtime`]), made on first use. A writer's
    /// requests and answers then pass between tasks of one runtime, not between those of
    /// the runtime samplers share.
    pub fn for_writers(&self) -> Result<Self> {
        let connection = match self.writer_connection.get() {
            Some(c) => c.clone(),
            None => {
                let fresh = connection(&self.address, self.tls.as_deref(), writer_runtime())?;
                // (Two first writers at once: both use the one that was set.)
                self.writer_connection.get_or_init(|| fresh).clone()
            }
        };
        let token = self.auth_token.clone();
        self.clone().over(connection, token.as_deref())
    }

    /// This client over `connection`, sending `token` with every call: a stub and kept
    /// streams of its own.
    fn over(mut self, connection: tonic::transport::Channel, token: Option<&str>) -> Result<Self> {
        self.channel = AuthChannel::new(connection, token)
            .map_err(|e| ClientError::invalid(format!("Invalid auth_token: {e}")))?;
        self.auth_token = token.map(str::to_string);
        self.stub = stub(&self.channel, self.max_message_size);
        self.kept_streams = Arc::default();
        Ok(self)
    }

    /// This client writing items whose keys name shard `shard` (see [`crate::shards`]).
    pub fn with_key_shard(mut self, shard: Option<usize>) -> Result<Self> {
        self.key_shard = match shard {
            Some(s) if s >= shards::MAX_SHARDS => {
                return Err(ClientError::invalid(format!(
                    "A sharded client has at most {} shards (shard index {s})",
                    shards::MAX_SHARDS
                )))
            }
            s => s.map(|s| s as u8),
        };
        Ok(self)
    }

    /// A fresh random key for an item written through this client: naming its shard (a
    /// client of a sharded client's shard), else never looking as if it did.
    pub fn new_item_key(&self) -> u64 {
        loop {
            let random = rand::random();
            match self.key_shard {
                Some(shard) => return shards::tag_key(random, shard),
                None if shards::key_shard(random).is_none() => return random,
                None => {}
            }
        }
    }

    /// This client over a new connection with these TLS settings (`None`: plain TCP).
    pub fn with_tls(self, tls: Option<Tls>) -> Result<Self> {
        let connection = connection(&self.address, tls.as_ref(), runtime())?;
        let token = self.auth_token.clone();
        let mut client = self.over(connection, token.as_deref())?;
        client.tls = tls.map(Arc::new);
        client.reach = Arc::default();
        client.writer_connection = Arc::default();
        Ok(client)
    }

    /// This client sending `token` with every call instead (`None`: no token), over the same
    /// connection.
    pub fn with_auth_token(self, token: Option<&str>) -> Result<Self> {
        let connection = self.channel.connection();
        self.over(connection, token)
    }

    /// The largest message this client sends or accepts ([`reverb_proto::max_message_size`]).
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// Waits until the server accepts a TCP connection, unless this client's last call
    /// reached it: at most `timeout` (then DEADLINE_EXCEEDED for the call `what`), or without
    /// one what is left of [`CONNECT_WAIT`] since waiting began (then UNAVAILABLE).
    pub async fn wait_reachable(&self, what: &str, timeout: Option<Duration>) -> Result<()> {
        self.wait_until(what, timeout, timeout.map(|t| Instant::now() + t))
            .await
    }

    /// [`Client::wait_reachable`] until `deadline` (`timeout` is the call's, for messages).
    async fn wait_until(
        &self,
        what: &str,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Result<()> {
        if self.reach.up.load(Ordering::Relaxed) {
            return Ok(());
        }
        let Some(target) = authority(&self.address) else {
            self.reach.up.store(true, Ordering::Relaxed);
            return Ok(());
        };
        let start = Instant::now();
        let until = match deadline {
            Some(d) => d,
            None => {
                let since = *self.reach.down_since.lock().unwrap().get_or_insert(start);
                since
                    .checked_add(connect_wait())
                    .unwrap_or(since + Duration::from_secs(100 * 365 * 86_400))
            }
        };
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(
                left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
                tokio::net::TcpStream::connect(target),
            );
            let why = match attempt.await {
                Ok(Ok(_)) => {
                    *self.reach.down_since.lock().unwrap() = None;
                    self.reach.up.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "connecting timed out".to_string(),
            };
            let now = Instant::now();
            if now >= until {
                return Err(match timeout {
                    Some(t) => ClientError::deadline(format!(
                        "{} (the server could not be reached: {why})",
                        self.expired(what, t).message
                    )),
                    None => ClientError::new(
                        Code::Unavailable,
                        format!(
                            "Server at {} is unavailable: it could not be reached within {:.0}s \
                             ({why})",
                            self.address,
                            connect_wait().as_secs_f64()
                        ),
                    ),
                });
            }
            tokio::time::sleep(backoff.min(until - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// The same client, allowed (the default) or not to reach a server of this process
    /// without gRPC.
    pub fn with_inproc(mut self, allowed: bool) -> Self {
        self.inproc_port = allowed
            .then(|| inproc::loopback_port(&self.address))
            .flatten();
        self
    }

    /// A client like this one (address, token, limits) over a connection of its own.
    pub fn reconnected(&self) -> Result<Self> {
        Self::new(&self.address)?
            .with_tls(self.tls.as_deref().cloned())?
            .with_auth_token(self.auth_token.as_deref())?
            .with_max_message_size(self.max_message_size)
            .with_inproc(self.inproc_port.is_some())
            .with_key_shard(self.key_shard.map(usize::from))
    }

    /// This client with another message limit (see [`Client::max_message_size`]).
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self.stub = stub(&self.channel, bytes);
        self.kept_streams = Arc::default();
        self
    }

    /// The server `address` names, when it runs in this process and in-process calls are
    /// allowed (looked up on each call: a server may start or stop at any time).
    pub fn inproc(&self) -> Option<Arc<dyn Service>> {
        reverb_proto::inproc::lookup(self.inproc_port?)
            .filter(|server| server.accepts(self.auth_token.as_deref()))
    }

    /// An error of a server of this process.
    pub(crate) fn inproc_status(&self, status: tonic::Status) -> ClientError {
        ClientError::from_inproc(status, &self.address)
    }

    /// Starts a `SampleStream` call sending what `requests` yields (see [`grpc`]).
    pub(crate) async fn sample_stream(
        &self,
        requests: mpsc::Receiver<SampleStreamRequest>,
        metadata: MetadataMap,
    ) -> std::result::Result<SampleResponses, tonic::Status> {
        let requests = ReceiverStream::new(requests);
        grpc::sample_stream(
            self.channel.clone(),
            requests,
            metadata,
            self.max_message_size,
        )
        .await
    }

    /// The address given at construction.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A client error from a gRPC status; a connection that could not be made makes the
    /// next calls wait for the server.
    pub(crate) fn status(&self, status: tonic::Status) -> ClientError {
        let unsent = is_connect_failure(&status);
        if unsent {
            self.reach.up.store(false, Ordering::Relaxed);
        }
        let mut error = ClientError::from_status(status.clone(), &self.address);
        error.unsent = unsent;
        if let Some(hint) = self.tls_hint(&status) {
            error.message = format!("{} ({hint})", error.message);
        }
        error
    }

    /// What may be wrong when a connection failed the way a TLS mismatch makes it fail
    /// (the transport says only that the connection closed, or that its first bytes were
    /// not TLS).
    fn tls_hint(&self, status: &tonic::Status) -> Option<&'static str> {
        use std::error::Error;
        let mut causes = Vec::new();
        let mut source = status.source();
        while let Some(e) = source {
            causes.push(e.to_string());
            source = e.source();
        }
        // A request dropped unsent by a connection that went away, to a server that has
        // answered this client before: a server that stopped, not a TLS mismatch.
        if self.reach.answered.load(Ordering::Relaxed)
            && causes
                .iter()
                .any(|c| c.starts_with("operation was canceled"))
        {
            return None;
        }
        let closed = causes.iter().any(|c| {
            c == "connection closed" || c.contains("broken pipe") || c.contains("reset by peer")
        });
        // A TLS server's answer to a plain HTTP/2 preface is not HTTP/2.
        let garbled = causes.iter().any(|c| c.contains("http2 error"));
        match self.tls.as_deref() {
            None if closed || garbled => Some(
                "if the server serves TLS, give the client the authority of its certificate \
                 with tls_ca or REVERB_TLS_CA",
            ),
            Some(_) if causes.iter().any(|c| c.contains("InvalidContentType")) => {
                Some("the server did not answer in TLS: does it serve TLS?")
            }
            Some(tls)
                if !tls.has_client_certificate()
                    && (closed || causes.iter().any(|c| c.contains("CertificateRequired"))) =>
            {
                Some(
                    "the server closed the connection: if it requires client certificates, give \
                 the client one with tls_cert and tls_key",
                )
            }
            _ => None,
        }
    }

    /// Waits for the server (see [`Client::wait_reachable`]), then runs one `attempt` of the
    /// call, failing with DEADLINE_EXCEEDED once `timeout` passes. An attempt that could not
    /// connect (nothing was sent: the server went away since the last call) waits for the
    /// server again and is retried, within the same deadline.
    async fn with_deadline<T, F, Fut>(
        &self,
        what: &str,
        timeout: Option<Duration>,
        attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.with_deadline_at(what, timeout, deadline, attempt)
            .await
    }

    /// [`Client::with_deadline`] for a call whose `timeout` started earlier: it ends at
    /// `deadline` (`timeout` after the call began).
    async fn with_deadline_at<T, F, Fut>(
        &self,
        what: &str,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        for tries in 1.. {
            self.wait_until(what, timeout, deadline).await?;
            let result = match (timeout, deadline) {
                (Some(t), Some(d)) => tokio::time::timeout_at(d, attempt())
                    .await
                    .unwrap_or_else(|_| Err(self.expired(what, t))),
                _ => attempt().await,
            };
            // Only an attempt whose request never reached the server is tried again (a
            // failure of another call on the same connection says nothing about this one).
            let unsent = matches!(&result, Err(e) if e.unsent);
            if result.is_ok() {
                self.reach.answered.store(true, Ordering::Relaxed);
            }
            if !unsent || tries >= MAX_CONNECT_TRIES {
                return result;
            }
        }
        unreachable!("the loop returns")
    }

    /// DEADLINE_EXCEEDED for a call (`what`) that did not finish within `timeout`.
    pub fn expired(&self, what: &str, timeout: Duration) -> ClientError {
        ClientError::deadline(format!(
            "Deadline Exceeded: {what} on {} did not finish within {:.3}s",
            self.address,
            timeout.as_secs_f64()
        ))
    }

    /// `ServerInfo`: every table's `TableInfo`.
    pub async fn server_info(&self, timeout: Option<Duration>) -> Result<Vec<TableInfo>> {
        if let Some(server) = self.inproc() {
            let info = server.server_info().map_err(|s| self.inproc_status(s))?;
            return Ok(info.table_info);
        }
        self.with_deadline("ServerInfo", timeout, || {
            let mut stub = self.stub.clone();
            async move {
                let response = stub
                    .server_info(ServerInfoRequest {})
                    .await
                    .map_err(|s| self.status(s))?;
                Ok(response.into_inner().table_info)
            }
        })
        .await
    }

    /// `MutatePriorities`: deletes, then updates; unknown keys are ignored by the server.
    pub async fn mutate_priorities(
        &self,
        table: &str,
        updates: Vec<(u64, f64)>,
        deletes: Vec<u64>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        if let Some(server) = self.inproc() {
            return server
                .mutate_priorities(table, &updates, &deletes)
                .map_err(|s| self.inproc_status(s));
        }
        let request = MutatePrioritiesRequest {
            table: table.to_string(),
            updates: updates
                .into_iter()
                .map(|(key, priority)| KeyWithPriority { key, priority })
                .collect(),
            delete_keys: deletes,
        };
        self.with_deadline("MutatePriorities", timeout, || {
            let (mut stub, request) = (self.stub.clone(), request.clone());
            async move {
                stub.mutate_priorities(request)
                    .await
                    .map_err(|s| self.status(s))?;
                Ok(())
            }
        })
        .await
    }

    /// `Reset`: empties a table.
    pub async fn reset(&self, table: &str, timeout: Option<Duration>) -> Result<()> {
        if let Some(server) = self.inproc() {
            return server.reset(table).map_err(|s| self.inproc_status(s));
        }
        let request = ResetRequest {
            table: table.to_string(),
        };
        self.with_deadline("Reset", timeout, || {
            let (mut stub, request) = (self.stub.clone(), request.clone());
            async move {
                stub.reset(request).await.map_err(|s| self.status(s))?;
                Ok(())
            }
        })
        .await
    }

    /// `Checkpoint`: returns the path the server wrote.
    pub async fn checkpoint(&self, timeout: Option<Duration>) -> Result<String> {
        if let Some(server) = self.inproc() {
            return self
                .with_deadline("Checkpoint", timeout, || async {
                    server.checkpoint().await.map_err(|s| self.inproc_status(s))
                })
                .await;
        }
        self.with_deadline("Checkpoint", timeout, || {
            let mut stub = self.stub.clone();
            async move {
                let response = stub
                    .checkpoint(CheckpointRequest {})
                    .await
                    .map_err(|s| self.status(s))?;
                Ok(response.into_inner().checkpoint_path)
            }
        })
        .await
    }

    /// Inserts one step (`columns`, each without a batch dimension) as one item per
    /// `(table, priority)`; the items share the step's chunks. Returns the item keys once the
    /// server has confirmed them all.
    pub async fn insert_step(
        &self,
        columns: Vec<Tensor>,
        priorities: Vec<(String, f64)>,
        timeout: Option<Duration>,
    ) -> Result<Vec<u64>> {
        if priorities.is_empty() {
            return Err(ClientError::invalid("priorities must not be empty"));
        }
        if columns.is_empty() {
            return Err(ClientError::invalid(
                "data must contain at least one tensor",
            ));
        }
        let episode_id: u64 = rand::random();
        let range = SequenceRange {
            episode_id,
            start: 0,
            end: 0,
            sparse: false,
        };
        let mut chunks = Vec::with_capacity(columns.len());
        let mut trajectory_columns = Vec::with_capacity(columns.len());
        for mut column in columns {
            column.shape.insert(0, 1);
            let key: u64 = rand::random();
            chunks.push(encode_chunk(key, range, std::slice::from_ref(&column)));
            trajectory_columns.push(Column {
                chunk_slices: vec![ChunkSlice {
                    chunk_key: key,
                    offset: 0,
                    length: 1,
                    index: 0,
                }],
                squeeze: false,
            });
        }
        let trajectory = FlatTrajectory {
            columns: trajectory_columns,
        };
        let items: Vec<PrioritizedItem> = priorities
            .into_iter()
            .map(|(table, priority)| PrioritizedItem {
                key: self.new_item_key(),
                table,
                priority,
                flat_trajectory: Some(trajectory.clone()),
                ..Default::default()
            })
            .collect();
        let keys: Vec<u64> = items.iter().map(|i| i.key).collect();
        let request = InsertStreamRequest {
            chunks,
            items: items.iter().map(encode_item).collect(),
            keep_chunk_keys: Vec::new(),
        };
        self.send_requests(vec![request], keys.iter().copied().collect(), timeout)
            .await?;
        Ok(keys)
    }

    /// Sends requests on one `InsertStream` and waits until every item is confirmed. Every
    /// item must be an encoded `PrioritizedItem` (else INVALID_ARGUMENT, nothing sent).
    pub async fn insert_requests(
        &self,
        requests: Vec<InsertStreamRequest>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let mut keys = reverb_proto::KeySet::default();
        for item in requests.iter().flat_map(|r| r.items.iter()) {
            let item = PrioritizedItem::decode(item.clone()).map_err(|e| {
                ClientError::invalid(format!("An item is not a PrioritizedItem message: {e}"))
            })?;
            keys.insert(item.key);
        }
        self.send_requests(requests, keys, timeout).await
    }

    /// [`Client::insert_requests`] of items with these `keys`.
    async fn send_requests(
        &self,
        requests: Vec<InsertStreamRequest>,
        keys: reverb_proto::KeySet,
        timeout: Option<Duration>,
    ) -> Result<()> {
        if let Some(server) = self.inproc() {
            return self
                .with_deadline("InsertStream", timeout, || {
                    let (server, requests) = (server.clone(), requests.clone());
                    async move {
                        let mut stream = server.insert_stream();
                        for request in requests {
                            stream
                                .insert(request)
                                .await
                                .map_err(|s| self.inproc_status(s))?;
                        }
                        Ok(())
                    }
                })
                .await;
        }
        self.with_deadline("InsertStream", timeout, || {
            let (mut stub, requests, mut pending) =
                (self.stub.clone(), requests.clone(), keys.clone());
            async move {
                let (tx, rx) = mpsc::channel(requests.len().max(1));
                for r in requests {
                    tx.send(r)
                        .await
                        .expect("channel has room for every request");
                }
                // Keep the request side open until all confirmations arrive.
                let mut responses = stub
                    .insert_stream(ReceiverStream::new(rx))
                    .await
                    .map_err(|s| self.status(s))?
                    .into_inner();
                while !pending.is_empty() {
                    match responses.message().await.map_err(|s| self.status(s))? {
                        Some(r) => r.keys.iter().for_each(|k| {
                            pending.remove(k);
                        }),
                        None => {
                            return Err(ClientError::new(
                                Code::Internal,
                                format!(
                            "Server at {} closed the insert stream before confirming every item",
                            self.address
                        ),
                            ))
                        }
                    }
                }
                drop(tx);
                Ok(())
            }
        })
        .await
    }

    /// Samples `num_samples` items from `table` on one stream. `rate_limiter_timeout` bounds
    /// each wait for the rate limiter on the server; `timeout` bounds the whole call.
    pub async fn sample(
        &self,
        table: &str,
        num_samples: usize,
        rate_limiter_timeout: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Result<Vec<Sample>> {
        match self
            .sample_partial(table, num_samples, rate_limiter_timeout, timeout)
            .await?
        {
            (samples, None) => Ok(samples),
            (_, Some(e)) => Err(e),
        }
    }

    /// Like [`Client::sample`], but when the call fails part-way it returns the samples that
    /// arrived complete together with the error: samples taken from a table are never lost.
    pub async fn sample_partial(
        &self,
        table: &str,
        num_samples: usize,
        rate_limiter_timeout: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Result<(Vec<Sample>, Option<ClientError>)> {
        if num_samples == 0 {
            return Err(ClientError::invalid("num_samples must be >= 1"));
        }
        if let Some(server) = self.inproc() {
            return self
                .sample_inproc(&*server, table, num_samples, rate_limiter_timeout, timeout)
                .await;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let request = sample_request(table, num_samples, rate_limiter_timeout);
        let expired = || self.expired("SampleStream", timeout.unwrap_or_default());
        // A call kept open by an earlier sample call serves this one when there is one: one
        // round trip, no call to open. It was checked to be alive before the request went.
        let mut reuse = true;
        let (samples, failure) = loop {
            let kept = match reuse.then(|| self.kept_streams.take()).flatten() {
                Some(kept) if kept.requests.try_send(request.clone()).is_ok() => Some(kept),
                _ => None,
            };
            let reused = kept.is_some();
            let mut stream = match kept {
                Some(kept) => kept,
                // Opening the stream waits for the server and is retried as unary calls are
                // (an attempt that never reached the server sampled nothing). Once the
                // stream is open, a failure ends the call.
                None => {
                    // (A reopened call keeps the deadline the first attempt started.)
                    self.with_deadline_at("SampleStream", timeout, deadline, || {
                        let request = request.clone();
                        async move {
                            let (requests, rx) = mpsc::channel(1);
                            requests.send(request).await.expect("room for one request");
                            let responses = self
                                .sample_stream(rx, MetadataMap::new())
                                .await
                                .map_err(|s| self.status(s))?;
                            Ok(KeptStream {
                                requests,
                                responses,
                            })
                        }
                    })
                    .await?
                }
            };
            let responses = &mut stream.responses;
            let mut samples = Vec::with_capacity(num_samples);
            let mut partial = PartialSample::default();
            let mut failure = None;
            let (mut answered, mut cut_off) = (false, false);
            while samples.len() < num_samples {
                let next = match deadline {
                    Some(d) => match tokio::time::timeout_at(d, responses.message()).await {
                        Ok(r) => r,
                        Err(_) => {
                            failure = Some(expired());
                            break;
                        }
                    },
                    None => responses.message().await,
                };
                let response = match next {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        cut_off = true;
                        failure = Some(ClientError::new(
                            Code::Internal,
                            format!("Server at {} ended the sample stream early", self.address),
                        ));
                        break;
                    }
                    Err(status) => {
                        cut_off = matches!(
                            status.code(),
                            Code::Unavailable | Code::Cancelled | Code::Unknown
                        );
                        failure = Some(self.status(status));
                        break;
                    }
                };
                answered = true;
                for entry in response.entries {
                    if let Some(sample) = partial.add(entry)? {
                        samples.push(sample);
                    }
                }
            }
            // A kept call whose connection ended before it answered (the server stopping or
            // restarting meanwhile) served none of this request: open a fresh call, which
            // waits for the server as a first call does.
            if reused && cut_off && !answered {
                reuse = false;
                continue;
            }
            // A call served in full is kept for the next one; one that failed part-way (or
            // timed out with a request still being served) is dropped, which resets it.
            if failure.is_none() && !partial.started() {
                self.kept_streams.give_back(stream);
            }
            break (samples, failure);
        };
        // Every sample that decodes is returned (they left the table), with the first error.
        let mut decoded = Vec::with_capacity(samples.len());
        let mut undecodable = None;
        for (info, chunks) in samples {
            match assemble(info, &chunks) {
                Ok(sample) => decoded.push(sample),
                Err(e) => undecodable = undecodable.or(Some(e)),
            }
        }
        Ok((decoded, undecodable.or(failure)))
    }

    /// [`Client::sample_partial`] from a server of this process: batches until `num_samples`
    /// arrived, each waiting at most `rate_limiter_timeout` for the rate limiter.
    async fn sample_inproc(
        &self,
        server: &dyn Service,
        table: &str,
        num_samples: usize,
        rate_limiter_timeout: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Result<(Vec<Sample>, Option<ClientError>)> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut samples = Vec::with_capacity(num_samples);
        while samples.len() < num_samples {
            let call = server.sample(table, num_samples - samples.len(), rate_limiter_timeout);
            let got = match deadline {
                Some(d) => match tokio::time::timeout_at(d, call).await {
                    Ok(got) => got,
                    Err(_) => {
                        let e = self.expired("SampleStream", timeout.unwrap_or_default());
                        return Ok((samples, Some(e)));
                    }
                },
                None => call.await,
            };
            match got {
                Ok(batch) => {
                    // (Samples taken from the table are all returned, with the first error.)
                    let mut failure = None;
                    for s in batch {
                        match plan(s.info, &s.chunks).and_then(|p| p.assemble()) {
                            Ok(sample) => samples.push(sample),
                            Err(e) => failure = failure.or(Some(e)),
                        }
                    }
                    if failure.is_some() {
                        return Ok((samples, failure));
                    }
                }
                Err(status) => return Ok((samples, Some(self.inproc_status(status)))),
            }
        }
        Ok((samples, None))
    }
}

/// `host:port` of an address (`host:port`, or with a scheme such as `http://`), when it
/// has a port.
fn authority(address: &str) -> Option<&str> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse::<u16>().ok().map(|_| authority)
}

/// A `SampleStreamRequest`; `None` waits for the rate limiter forever.
pub(crate) fn sample_request(
    table: &str,
    num_samples: usize,
    rate_limiter_timeout: Option<Duration>,
) -> SampleStreamRequest {
    SampleStreamRequest {
        table: table.to_string(),
        num_samples: num_samples as i64,
        rate_limiter_timeout: Some(Timeout {
            milliseconds: rate_limiter_timeout.map_or(-1, |t| t.as_millis().max(1) as i64),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_host_and_port_without_scheme_or_path() {
        assert_eq!(authority("localhost:80"), Some("localhost:80"));
        assert_eq!(authority("http://[::1]:9000/x"), Some("[::1]:9000"));
        assert_eq!(authority("localhost"), None);
        assert_eq!(authority("host:notaport"), None);
    }

    #[test]
    fn the_connect_wait_setting_never_overflows() {
        assert_eq!(parse_connect_wait(None), CONNECT_WAIT);
        assert_eq!(parse_connect_wait(Some("2.5")), Duration::from_millis(2500));
        assert_eq!(parse_connect_wait(Some("-1")), CONNECT_WAIT);
        assert_eq!(parse_connect_wait(Some("nonsense")), CONNECT_WAIT);
        for huge in ["1e300", "inf"] {
            let wait = parse_connect_wait(Some(huge));
            assert!(
                wait >= Duration::from_secs(86_400 * 365),
                "{huge}: {wait:?}"
            );
            assert!(Instant::now().checked_add(wait).is_some());
        }
    }

    #[test]
    fn a_call_to_no_server_waits_until_its_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = Client::new(&format!("127.0.0.1:{port}")).unwrap();
        let start = std::time::Instant::now();
        let e = runtime()
            .block_on(client.server_info(Some(Duration::from_millis(300))))
            .unwrap_err();
        assert_eq!(e.code, Code::DeadlineExceeded, "{}", e.message);
        assert!(e.message.contains("could not be reached"), "{}", e.message);
        assert!(start.elapsed() >= Duration::from_millis(290));
        // A refused connection is recognised as one (the next calls wait again).
        let status = runtime()
            .block_on(client.stub.clone().server_info(ServerInfoRequest {}))
            .unwrap_err();
        assert!(is_connect_failure(&status), "{status:?}");
    }
}
