//! Waiting for a server that cannot be reached yet (actors and learners are often started
//! before their replay server), deadlines, retries of attempts that never reached the
//! server, and the errors a call reports.

use super::Client;
use crate::transport::connect::is_silent;
use crate::transport::Server;
use crate::{ClientError, Result};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;

/// How long calls without a timeout wait, in all, for a server that cannot be reached
/// (actors and learners are often started before their replay server);
/// `REVERB_CONNECT_WAIT_SECONDS` overrides it.
pub const CONNECT_WAIT: Duration = Duration::from_secs(60);

/// Whether the server can be reached, as this client last saw it (shared by clones). Until
/// the first call, and after a call failed to connect, the next calls first wait for the
/// server to accept connections, as the reference's (gRPC `wait_for_ready`) do.
#[derive(Default)]
pub(super) struct Reach {
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

/// `host:port` of an address (`host:port`, or with a scheme such as `http://`), when it
/// has a port.
fn authority(address: &str) -> Option<&str> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse::<u16>().ok().map(|_| authority)
}

impl Client {
    /// Waits until the server accepts a TCP connection, unless this client's last call
    /// reached it: at most `timeout` (then DEADLINE_EXCEEDED for the call `what`), or without
    /// one what is left of [`CONNECT_WAIT`] since waiting began (then UNAVAILABLE).
    pub async fn wait_reachable(&self, what: &str, timeout: Option<Duration>) -> Result<()> {
        self.wait_until(what, timeout, timeout.map(|t| Instant::now() + t))
            .await
    }

    /// [`Client::wait_reachable`] until `deadline` (`timeout` is the call's, for messages).
    pub(crate) async fn wait_until(
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

    /// Waits for the server (see [`Server::ready`]), then runs one `attempt` of the call on
    /// it, failing with DEADLINE_EXCEEDED once `timeout` passes. An attempt that could not
    /// connect (nothing was sent: the server went away since the last call) waits for the
    /// server again and is retried, within the same deadline.
    pub(crate) async fn with_deadline<T, F, Fut>(
        &self,
        what: &str,
        timeout: Option<Duration>,
        attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Box<dyn Server>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.with_deadline_at(what, timeout, deadline, attempt)
            .await
    }

    /// [`Client::with_deadline`] for a call whose `timeout` started earlier: it ends at
    /// `deadline` (`timeout` after the call began).
    pub(crate) async fn with_deadline_at<T, F, Fut>(
        &self,
        what: &str,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Box<dyn Server>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        for tries in 1.. {
            let server = self.server();
            server.ready(what, timeout, deadline).await?;
            let result = match (timeout, deadline) {
                (Some(t), Some(d)) => tokio::time::timeout_at(d, attempt(server))
                    .await
                    .unwrap_or_else(|_| Err(self.expired(what, t))),
                _ => attempt(server).await,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime;
    use reverb_proto::ServerInfoRequest;

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
