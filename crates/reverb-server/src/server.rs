//! A running gRPC server on its own tokio runtime: start on a chosen or free port, stop cleanly.

use crate::ReverbServiceImpl;
use futures::StreamExt;
use reverb_core::Table;
use reverb_proto::reverb_service_server::ReverbServiceServer;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;

/// Settings of a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// Worker threads of the server's runtime.
    pub worker_threads: usize,
    /// Largest message accepted or sent (bytes).
    pub max_message_size: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            port: 0,
            worker_threads: 2,
            max_message_size: 1 << 30,
        }
    }
}

/// A serving server. Dropping it stops it.
pub struct Server {
    port: u16,
    service: ReverbServiceImpl,
    shutdown: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<Result<(), String>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

fn bind(port: u16) -> std::io::Result<TcpListener> {
    // Dual-stack [::] serves both localhost spellings; fall back to IPv4 where IPv6 is off.
    TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        .or_else(|_| TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))))
}

impl Server {
    /// Starts serving `tables`.
    pub fn start(tables: Vec<Arc<Table>>, options: ServerOptions) -> Result<Self, String> {
        let service = ReverbServiceImpl::new(tables)?;
        let listener = bind(options.port)
            .map_err(|e| format!("Could not listen on port {}: {e}", options.port))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.worker_threads.max(1))
            .thread_name("reverb-server")
            .enable_all()
            .build()
            .map_err(|e| format!("Could not start the server runtime: {e}"))?;
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let svc = ReverbServiceServer::new(service.clone())
            .max_decoding_message_size(options.max_message_size)
            .max_encoding_message_size(options.max_message_size);
        runtime.spawn(async move {
            let result = async {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let incoming = TcpListenerStream::new(listener).map(|conn| {
                    conn.inspect(|stream| {
                        let _ = stream.set_nodelay(true);
                    })
                });
                tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = shutdown_rx.await;
                    })
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))
            }
            .await;
            let _ = done_tx.send(result.map_err(|e| e.to_string()));
        });
        Ok(Self {
            port,
            service,
            shutdown: Some(shutdown_tx),
            done: Some(done_rx),
            runtime: Some(runtime),
        })
    }

    /// The port being served.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The service (and through it the tables).
    pub fn service(&self) -> &ReverbServiceImpl {
        &self.service
    }

    /// Blocks until the server stops or `timeout` passes; `Ok(true)` when it stopped.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool, String> {
        let Some(done) = self.done.as_mut() else {
            return Ok(true);
        };
        let Some(runtime) = self.runtime.as_ref() else {
            return Ok(true);
        };
        let outcome = runtime.block_on(async {
            match timeout {
                Some(t) => tokio::time::timeout(t, done).await.ok(),
                None => Some(done.await),
            }
        });
        match outcome {
            None => Ok(false),
            Some(result) => {
                self.done = None;
                result.unwrap_or(Ok(())).map(|_| true)
            }
        }
    }

    /// Stops accepting, ends open streams and shuts the runtime down (bounded to ~1 s).
    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            // Streams blocked on a rate limiter would keep a graceful shutdown waiting: give it
            // a moment, then drop every remaining task.
            if let Some(done) = self.done.take() {
                let _ = runtime.block_on(async {
                    tokio::time::timeout(Duration::from_millis(200), done).await
                });
            }
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
