//! A running gRPC server on its own tokio runtime: start on a chosen or free port, stop cleanly.

use crate::auth::TokenCheck;
use crate::budget::{Budget, Budgeted};
use crate::checkpointer::Checkpointer;
use crate::metrics;
use crate::tls::ServerTls;
use crate::transport::inproc::{InProcServer, Stopped};
use crate::ReverbServiceImpl;
use futures::StreamExt;
use reverb_core::{ChunkStore, Journal, Table};
use reverb_proto::reverb_service_server::ReverbServiceServer;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// Address to listen on (an IP address or a host name); `None` listens on every
    /// interface, as the reference does.
    pub host: Option<String>,
    /// When set, only calls carrying this token are served (see `auth`); by default
    /// `REVERB_AUTH_TOKEN`'s value when it is set and not empty.
    pub auth_token: Option<String>,
    /// Serve over TLS with these settings (see [`ServerTls::from_env`] for the environment's).
    pub tls: Option<ServerTls>,
    /// Worker threads of the server's runtime.
    pub worker_threads: usize,
    /// Largest message accepted or sent (bytes).
    pub max_message_size: usize,
    /// Most bytes of messages still arriving one connection may make the server hold
    /// (see `budget`); `None`: twice `max_message_size`.
    pub max_pending_bytes_per_connection: Option<usize>,
    /// Most bytes of messages still arriving all connections together may make the server
    /// hold; `None`: four times `max_message_size`.
    pub max_pending_bytes: Option<usize>,
    /// Saves checkpoints, and restores the latest one when the server starts.
    pub checkpointer: Option<Arc<Checkpointer>>,
    /// Serves Prometheus metrics over HTTP on this port (0 picks a free one; on `host`).
    pub metrics_port: Option<u16>,
    /// Writes one line per table to stderr this often.
    pub log_stats_every: Option<Duration>,
    /// Keeps chunk payloads and a journal of the tables on disk (see [`StorageOptions`]).
    pub storage: Option<StorageOptions>,
}

/// Where and how a server keeps its tables on disk: chunk payloads in a log behind a cache of
/// `cache_bytes` (`reverb_core::chunk_store`), every change of the tables in a journal synced
/// every `sync_interval` (`reverb_core::journal`). A server starting on a directory that has
/// a journal serves what it held (and loads no checkpoint).
#[derive(Debug, Clone)]
pub struct StorageOptions {
    /// The directory (created if missing; one server at a time).
    pub dir: std::path::PathBuf,
    /// The bound of the payload cache, in bytes.
    pub cache_bytes: usize,
    /// How often the journal is synced: a change older than this survives a crash.
    pub sync_interval: Duration,
    /// Confirm inserts only once they are on disk (a sync per confirmation, shared by the
    /// inserts waiting at once).
    pub sync_always: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            port: 0,
            host: None,
            auth_token: reverb_proto::env_auth_token(),
            tls: None,
            worker_threads: 2,
            max_message_size: reverb_proto::max_message_size(),
            max_pending_bytes_per_connection: None,
            max_pending_bytes: None,
            checkpointer: None,
            metrics_port: None,
            log_stats_every: None,
            storage: None,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// The tables or options are not valid (e.g. two tables with one name).
    InvalidConfig(String),
    /// The checkpoint to restore could not be read.
    Checkpoint(String),
    /// The port could not be bound, or the runtime could not start.
    Io(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InvalidConfig(m) | Self::Checkpoint(m) | Self::Io(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StartError {}

/// A serving server. Dropping it stops it. All methods take `&self`, so one thread may
/// `wait` while another calls `stop`.
pub struct Server {
    port: u16,
    metrics_port: Option<u16>,
    service: ReverbServiceImpl,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    /// The in-process service registered for this server.
    inproc: Arc<dyn reverb_proto::inproc::Service>,
    /// Ends the in-process service's calls and waits.
    stop_inproc: tokio::sync::watch::Sender<bool>,
    finished: Arc<(Mutex<bool>, Condvar)>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    /// The chunk store and journal of a server keeping its tables on disk.
    storage: Mutex<Option<(Arc<ChunkStore>, Arc<Journal>)>>,
}

fn bind(host: Option<&str>, port: u16) -> std::io::Result<TcpListener> {
    match host {
        // Every address the name resolves to, in order, until one binds.
        Some(host) => TcpListener::bind((host, port)),
        // Dual-stack [::] serves both localhost spellings; fall back to IPv4 where IPv6 is
        // off.
        None => TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
            .or_else(|_| TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))),
    }
}

/// A storage directory's store and journal while a server starts: closed (the directory
/// released) if the start fails.
struct Opened(Option<(Arc<ChunkStore>, Arc<Journal>)>);

impl Opened {
    /// The store and journal, for a server that started.
    fn disarm(mut self) -> Option<(Arc<ChunkStore>, Arc<Journal>)> {
        self.0.take()
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some((store, journal)) = self.0.take() {
            journal.close();
            store.close();
        }
    }
}

/// Opens the storage directory and restores the tables from its journal: the store, the
/// journal (not yet attached), and whether the directory had a journal.
fn open_storage(
    options: &StorageOptions,
    tables: &[Arc<Table>],
) -> Result<(Arc<ChunkStore>, Arc<Journal>, bool), StartError> {
    let store = ChunkStore::open(&options.dir, options.cache_bytes)
        .map_err(|e| StartError::Io(e.to_string()))?;
    let (journal, mut recovery) = Journal::open(&options.dir, store.clone(), options.sync_interval)
        .map_err(|e| {
            StartError::Io(format!(
                "Could not read the journal in {}: {e}",
                options.dir.display()
            ))
        })?;
    let unknown: Vec<&String> = recovery
        .tables
        .keys()
        .filter(|name| !tables.iter().any(|t| t.name() == name.as_str()))
        .collect();
    if !unknown.is_empty() {
        return Err(StartError::InvalidConfig(format!(
            "The storage directory {} holds tables {unknown:?} this server is not configured \
             with; configure them (or use another directory)",
            options.dir.display()
        )));
    }
    for table in tables {
        if let Some(snapshot) = recovery.tables.remove(table.name()) {
            table.restore(snapshot).map_err(|e| {
                StartError::InvalidConfig(format!(
                    "Could not restore table '{}' from {}: {e}",
                    table.name(),
                    options.dir.display()
                ))
            })?;
        }
    }
    if recovery.dropped_items > 0 || recovery.torn_bytes > 0 {
        eprintln!(
            "reverb server: {}: {} items left out (their data did not reach the disk whole), \
             {} bytes of an unfinished write cut off the journal",
            options.dir.display(),
            recovery.dropped_items,
            recovery.torn_bytes
        );
    }
    Ok((store, journal, recovery.found))
}

impl Server {
    /// Starts serving `tables`.
    pub fn start(tables: Vec<Arc<Table>>, options: ServerOptions) -> Result<Self, StartError> {
        let mut service =
            ReverbServiceImpl::new(tables.clone()).map_err(StartError::InvalidConfig)?;
        let (storage, recovered) = match &options.storage {
            None => (Opened(None), false),
            Some(o) => {
                let (store, journal, recovered) = open_storage(o, &tables)?;
                (Opened(Some((store, journal))), recovered)
            }
        };
        if let Some((store, journal)) = &storage.0 {
            let always = options.storage.as_ref().is_some_and(|o| o.sync_always);
            service = service.with_storage(store.clone(), journal.clone(), always);
        }
        if let Some(checkpointer) = &options.checkpointer {
            // (A directory's journal is newer than any checkpoint.)
            if !recovered {
                checkpointer
                    .load_latest(&tables, storage.0.as_ref().map(|s| &s.0))
                    .map_err(StartError::Checkpoint)?;
            }
            service = service.with_checkpointer(checkpointer.clone());
        }
        if let Some((_, journal)) = &storage.0 {
            journal.attach(&tables).map_err(|e| {
                StartError::Io(format!(
                    "Could not start the journal in {}: {e}",
                    options.storage.as_ref().expect("set").dir.display()
                ))
            })?;
        }
        if let Some(token) = &options.auth_token {
            if http::HeaderValue::try_from(format!("Bearer {token}")).is_err() {
                return Err(StartError::InvalidConfig(
                    "An auth token must be printable ASCII".into(),
                ));
            }
        }
        let io = |e: std::io::Error| StartError::Io(e.to_string());
        let listener =
            bind(options.host.as_deref(), options.port).map_err(|e| match &options.host {
                Some(host) => StartError::Io(format!(
                    "Could not listen on {host} port {}: {e}",
                    options.port
                )),
                None => StartError::Io(format!("Could not listen on port {}: {e}", options.port)),
            })?;
        let port = listener.local_addr().map_err(io)?.port();
        let listener_ip = listener.local_addr().map_err(io)?.ip();
        listener.set_nonblocking(true).map_err(io)?;
        let metrics_listener = match options.metrics_port {
            Some(p) => {
                let l = bind(options.host.as_deref(), p).map_err(|e| {
                    StartError::Io(format!("Could not listen on metrics port {p}: {e}"))
                })?;
                l.set_nonblocking(true).map_err(io)?;
                Some(l)
            }
            None => None,
        };
        let metrics_port = match &metrics_listener {
            Some(l) => Some(l.local_addr().map_err(io)?.port()),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.worker_threads.max(1))
            .thread_name("reverb-server")
            .enable_all()
            .build()
            .map_err(|e| StartError::Io(format!("Could not start the server runtime: {e}")))?;
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let finished = Arc::new((Mutex::new(false), Condvar::new()));
        let token_check = TokenCheck::new(options.auth_token.as_deref());
        let svc = Budgeted::new(
            InterceptedService::new(
                ReverbServiceServer::new(service.clone())
                    .max_decoding_message_size(options.max_message_size)
                    .max_encoding_message_size(options.max_message_size),
                token_check.clone(),
            ),
            Budget::new(
                options
                    .max_pending_bytes_per_connection
                    .unwrap_or(options.max_message_size.saturating_mul(2)),
                options
                    .max_pending_bytes
                    .unwrap_or(options.max_message_size.saturating_mul(4)),
            ),
        );
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &options.tls {
            builder = builder
                .tls_config(tls.config())
                .map_err(|e| StartError::InvalidConfig(format!("Invalid TLS settings: {e}")))?;
        }
        let done = finished.clone();
        runtime.spawn(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                let incoming = TcpListenerStream::new(listener).map(|conn| {
                    conn.inspect(|stream| {
                        let _ = stream.set_nodelay(true);
                    })
                });
                // Large HTTP/2 windows and frames for big chunks (hyper's server defaults are a
                // 1 MiB window and 16 KiB frames).
                let _ = builder
                    .initial_stream_window_size(16 << 20)
                    .initial_connection_window_size(64 << 20)
                    .max_frame_size(1 << 20)
                    // Resets are how clients stop streams early (a sampler that has enough,
                    // a writer that is done): a busy server must not take many of them for
                    // a rapid-reset attack and close a client's connection. The bounds stay
                    // (an attacker's connection is still closed), far above h2's defaults.
                    .http2_max_pending_accept_reset_streams(Some(4096))
                    .http2_max_local_error_reset_streams(Some(65536))
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = shutdown_rx.await;
                    })
                    .await;
            }
            *done.0.lock().unwrap() = true;
            done.1.notify_all();
        });
        if let Some(listener) = metrics_listener {
            let (tables, streams) = (service.tables().clone(), service.streams().clone());
            runtime.spawn(async move {
                if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                    metrics::serve(listener, tables, streams).await;
                }
            });
        }
        if let Some(every) = options.log_stats_every.filter(|d| !d.is_zero()) {
            let tables = service.tables().clone();
            runtime.spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    for line in metrics::summary(&tables) {
                        eprintln!("reverb server port {port}: {line}");
                    }
                }
            });
        }
        if let Some((store, _)) = storage.0.clone() {
            // Dropped chunks' payloads are forgotten here, every second, off the runtime's
            // workers (forgetting may compact a segment).
            runtime.spawn(async move {
                let mut ticks = tokio::time::interval(Duration::from_secs(1));
                // (After a slow tick, the next a second later: not at once to catch up.)
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    ticks.tick().await;
                    let store = store.clone();
                    let _ = tokio::task::spawn_blocking(move || store.maintain()).await;
                }
            });
        }
        let (stop_inproc, stopped) = Stopped::new();
        let inproc: Arc<dyn reverb_proto::inproc::Service> =
            Arc::new(InProcServer::new(service.clone(), stopped, token_check));
        // Clients of this process reach the server directly only when they would reach it
        // through the loopback (`localhost:port`): a server bound to another address leaves
        // `localhost:port` to whoever serves it there.
        let bound = listener_ip;
        if bound.is_unspecified() || bound.is_loopback() {
            reverb_proto::inproc::register(port, inproc.clone());
        }
        Ok(Self {
            port,
            metrics_port,
            service,
            shutdown: Mutex::new(Some(shutdown_tx)),
            inproc,
            stop_inproc,
            finished,
            runtime: Mutex::new(Some(runtime)),
            storage: Mutex::new(storage.disarm()),
        })
    }

    /// The port being served.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port metrics are served on, if any.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics_port
    }

    /// The service (and through it the tables).
    pub fn service(&self) -> &ReverbServiceImpl {
        &self.service
    }

    /// Blocks until the server has stopped or `timeout` passes; returns whether it stopped.
    pub fn wait(&self, timeout: Duration) -> bool {
        let (lock, cvar) = &*self.finished;
        let guard = lock.lock().unwrap();
        let (guard, _) = cvar
            .wait_timeout_while(guard, timeout, |stopped| !*stopped)
            .unwrap();
        *guard
    }

    /// Stops accepting, ends open streams and shuts the runtime down (bounded to ~1 s).
    pub fn stop(&self) {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            reverb_proto::inproc::unregister(self.port, &self.inproc);
            self.stop_inproc.send_replace(true);
            let _ = tx.send(());
        }
        let runtime = self.runtime.lock().unwrap().take();
        if let Some(runtime) = runtime {
            // Open streams (writers' insert streams stay open; samplers may be blocked on a
            // rate limiter) would keep a graceful shutdown waiting: give in-flight calls a
            // moment, then drop every remaining task.
            self.wait(Duration::from_millis(50));
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        // The last changes reach the journal; the directory is released for the next server.
        if let Some((store, journal)) = self.storage.lock().unwrap().take() {
            journal.close();
            store.close();
        }
        let (lock, cvar) = &*self.finished;
        *lock.lock().unwrap() = true;
        cvar.notify_all();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
