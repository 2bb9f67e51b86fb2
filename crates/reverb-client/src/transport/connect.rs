//! How a client's channel opens connections: TCP (no Nagle), guarded against a peer that
//! accepts the connection and then says nothing. Every HTTP/2 server answers the client's
//! connection preface with a SETTINGS frame at once; a peer that has sent no byte
//! [`SILENCE`] after the client first wrote is not serving gRPC (a hung process, a port
//! taken by something else), so its connection fails, and with it every call on it, with
//! UNAVAILABLE instead of waiting forever.

use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How long a new connection's peer may stay silent after the client first wrote.
pub const SILENCE: Duration = Duration::from_secs(10);

/// The error a silent peer's connection fails with (inside an `io::Error`).
#[derive(Debug)]
pub struct Silent;

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server accepted the connection but sent nothing for {}s (is a Reverb server \
             listening there?)",
            SILENCE.as_secs()
        )
    }
}

impl std::error::Error for Silent {}

/// Whether `error` (or what caused it) is a silent peer's. (By its text: the HTTP/2 layer
/// keeps an I/O error's kind and message, not the error itself.)
pub fn is_silent(error: &(dyn std::error::Error + 'static)) -> bool {
    let silent = Silent.to_string();
    let mut source = Some(error);
    while let Some(e) = source {
        if e.is::<Silent>() || e.to_string() == silent {
            return true;
        }
        source = e.source();
    }
    false
}

/// Opens TCP connections for a channel (a `tower` service from URI to connection).
#[derive(Clone, Debug, Default)]
pub struct Connector;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Guarded>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host"))?;
            // `[::1]` names an IPv6 address.
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(80);
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(Guarded {
                stream,
                heard: false,
                silence: None,
            }))
        })
    }
}

/// A connection that fails once its peer has been silent for [`SILENCE`] after the first
/// write (and never after it first heard from the peer).
#[derive(Debug)]
pub struct Guarded {
    stream: TcpStream,
    heard: bool,
    silence: Option<Pin<Box<Sleep>>>,
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let me = &mut *self;
        let read = Pin::new(&mut me.stream).poll_read(cx, buf);
        if me.heard {
            return read;
        }
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                me.heard = true;
                me.silence = None;
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                // Polling the timer also wakes this read when it fires.
                let expired = me
                    .silence
                    .as_mut()
                    .is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
                if expired {
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, Silent)))
                } else {
                    Poll::Pending
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if !me.heard && me.silence.is_none() {
            me.silence = Some(Box::pin(tokio::time::sleep_until(Instant::now() + SILENCE)));
        }
        Pin::new(&mut me.stream).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if !me.heard && me.silence.is_none() {
            me.silence = Some(Box::pin(tokio::time::sleep_until(Instant::now() + SILENCE)));
        }
        Pin::new(&mut me.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
