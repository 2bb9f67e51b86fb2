//! `Client`: a connection to one server (made lazily, shared by clones) and the calls made on
//! it. `calls` has the calls (but sampling: `sampler`), each bounded by a deadline and
//! written once against the server as [`Client::server`] reaches it (over gRPC, or straight
//! to a server of this process: `transport`), with the same semantics; `reach` waits for a
//! server that cannot be reached yet and turns what the transport reports into errors.

mod calls;
pub(crate) use calls::closed;
mod reach;

pub use reach::connect_wait;

use crate::shards;
use crate::transport::channel::AuthChannel;
use crate::transport::connect::Connector;
use crate::transport::grpc::{Grpc, KeptStreams};
use crate::transport::inproc;
use crate::transport::tls::Tls;
use crate::transport::Server;
use crate::{runtime, writer_runtime, ClientError, Result};
use reach::Reach;
use reverb_proto::inproc::Service;
use reverb_proto::reverb_service_client::ReverbServiceClient;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tonic::transport::Endpoint;

/// A connection to one server. Cheap to clone; connects lazily and reconnects as needed.
#[derive(Clone)]
pub struct Client {
    address: String,
    pub(crate) stub: ReverbServiceClient<AuthChannel>,
    /// The connection (shared by clones) and the token sent on it.
    pub(crate) channel: AuthChannel,
    /// The auth token sent with every call.
    auth_token: Option<String>,
    /// TLS settings of the connection (none: plain TCP).
    tls: Option<Arc<Tls>>,
    /// The port, when `address` names this host and calls may skip gRPC for a server of
    /// this process.
    inproc_port: Option<u16>,
    /// A server of this process held by another library, sampled through its C ABI
    /// ([`Client::with_inproc_abi`]).
    inproc_abi: Option<inproc::abi::Exported>,
    /// Whether the server was reached yet (shared by clones).
    reach: Arc<Reach>,
    /// Largest message sent or accepted.
    max_message_size: usize,
    /// The shard index item keys written through this client carry (a client of a
    /// `ShardedClient`; see [`crate::shards`]).
    key_shard: Option<u8>,
    /// `SampleStream` calls of this connection kept open between [`Client::sample`] calls
    /// (shared by clones).
    pub(crate) kept_streams: Arc<KeptStreams>,
    /// The connection of this client's writers, on [`crate::writer_runtime`] (made on first
    /// use; shared by clones).
    writer_connection: Arc<OnceLock<tonic::transport::Channel>>,
    /// Whether the server takes item runs, once asked (shared by clones; see
    /// [`Client::takes_item_runs`]).
    pub(crate) takes_runs: Arc<OnceLock<bool>>,
    /// The insert stream [`Client::insert_requests`] left open for the next one-shot insert
    /// (nothing in flight on it; shared by clones).
    pub(crate) kept_insert:
        Arc<parking_lot::Mutex<Option<Box<dyn crate::transport::InsertStream>>>>,
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
            inproc_abi: None,
            reach: Arc::default(),
            max_message_size,
            key_shard: None,
            kept_streams: Arc::default(),
            writer_connection: Arc::default(),
            takes_runs: Arc::default(),
            kept_insert: Arc::default(),
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
        self.kept_insert = Arc::default();
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

    /// The same client, allowed (the default) or not to reach a server of this process
    /// without gRPC.
    pub fn with_inproc(mut self, allowed: bool) -> Self {
        self.inproc_port = allowed
            .then(|| inproc::loopback_port(&self.address))
            .flatten();
        self.kept_insert = Arc::default();
        self
    }

    /// A client like this one (address, token, limits) over a connection of its own.
    pub fn reconnected(&self) -> Result<Self> {
        Self::new(&self.address)?
            .with_tls(self.tls.as_deref().cloned())?
            .with_auth_token(self.auth_token.as_deref())?
            .with_max_message_size(self.max_message_size)
            .with_inproc(self.inproc_port.is_some())
            .with_inproc_abi(self.inproc_abi)
            .with_key_shard(self.key_shard.map(usize::from))
    }

    /// This client with another message limit (see [`Client::max_message_size`]).
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self.stub = stub(&self.channel, bytes);
        self.kept_streams = Arc::default();
        self.kept_insert = Arc::default();
        self
    }

    /// The server `address` names, when it runs in this process and in-process calls are
    /// allowed (looked up on each call: a server may start or stop at any time).
    pub fn inproc(&self) -> Option<Arc<dyn Service>> {
        reverb_proto::inproc::lookup(self.inproc_port?)
            .filter(|server| server.accepts(self.auth_token.as_deref()))
    }

    /// The server `address` names, as this client reaches it now: in this process when it
    /// runs here (directly, or through the C ABI of the library holding it), else over
    /// gRPC. Chosen when a call or a stream opens: a server of this process may start or
    /// stop at any time.
    pub(crate) fn server(&self) -> Box<dyn Server> {
        if let Some(exported) = self.inproc_abi {
            return Box::new(inproc::Abi {
                exported,
                grpc: Grpc::new(self.clone()),
            });
        }
        match (self.inproc(), self.inproc_port) {
            (Some(service), Some(port)) => Box::new(inproc::InProc::new(
                service,
                port,
                self.auth_token.as_deref(),
                &self.address,
            )),
            _ => Box::new(Grpc::new(self.clone())),
        }
    }

    /// This client sampling a server of this process held by another library (the Python
    /// extension, seen from the TensorFlow kernels) through that library's C ABI; its other
    /// calls go over gRPC. (A server in this library's registry is found without it:
    /// [`Client::inproc`].)
    pub fn with_inproc_abi(mut self, exported: Option<inproc::abi::Exported>) -> Self {
        self.inproc_abi = exported;
        self
    }

    /// The address given at construction.
    pub fn address(&self) -> &str {
        &self.address
    }
}
