//! Client errors carry a gRPC status code and a message meant for users.

use crate::transport::connect::{is_silent, Silent};
use tonic::Code;

/// An error from a client call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    /// gRPC status code (also used for local failures of the same kind).
    pub code: Code,
    /// What went wrong.
    pub message: String,
    /// The call's request never reached the server (no connection could be made, or the
    /// transport dropped it unsent): trying it again is safe.
    pub(crate) unsent: bool,
}

/// Errors are equal when they say the same (how the request failed is not compared).
impl PartialEq for ClientError {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl ClientError {
    /// An error with a code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            unsent: false,
        }
    }
    /// Bad argument from the caller.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    /// Data that cannot be decoded.
    pub fn data_loss(message: impl Into<String>) -> Self {
        Self::new(Code::DataLoss, message)
    }
    /// Something this client does not support.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }
    /// A deadline passed.
    pub fn deadline(message: impl Into<String>) -> Self {
        Self::new(Code::DeadlineExceeded, message)
    }

    /// From a gRPC status of a call to `address`. Failures of the connection itself (refused,
    /// reset, broken HTTP/2, streams cancelled by a dying server) become UNAVAILABLE: those
    /// are the statuses the transport made from a local error (they carry it as their source)
    /// and every CANCELLED. Statuses the server sent keep their code.
    pub fn from_status(status: tonic::Status, address: &str) -> Self {
        use std::error::Error;
        if is_silent(&status) {
            return Self::with_address(Code::Unavailable, &Silent.to_string(), address);
        }
        let code = match status.code() {
            Code::Cancelled => Code::Unavailable,
            Code::Unknown | Code::Internal if status.source().is_some() => Code::Unavailable,
            code => code,
        };
        Self::with_address(code, status.message(), address)
    }

    /// Whether this is the error of a server that accepted the connection and then sent
    /// nothing (see `transport::connect`): trying again would only wait again.
    pub fn is_silent_server(&self) -> bool {
        self.code == Code::Unavailable && self.message.ends_with(&Silent.to_string())
    }

    /// From a status of a server of this process (which never crossed a wire: its code is
    /// what the server meant).
    pub fn from_inproc(status: tonic::Status, address: &str) -> Self {
        Self::with_address(status.code(), status.message(), address)
    }

    /// An error whose UNAVAILABLE message names the server.
    fn with_address(code: Code, message: &str, address: &str) -> Self {
        let message = match code {
            Code::Unavailable => format!(
                "Server at {address} is unavailable: {}",
                if message.is_empty() {
                    "connection failed"
                } else {
                    message
                }
            ),
            _ => message.to_string(),
        };
        Self::new(code, message)
    }
}

/// Result alias of the client.
pub type Result<T> = std::result::Result<T, ClientError>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    #[test]
    fn transport_failures_are_unavailable_and_server_statuses_keep_their_code() {
        // A status the transport made from a local error carries that error as its source.
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let local = Status::from_error(Box::new(reset));
        assert_eq!(local.code(), Code::Unknown);
        let e = ClientError::from_status(local, "here:1");
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("here:1"), "{}", e.message);
        // The same words sent by a server are the server's INTERNAL.
        let sent = Status::internal("transport error: reset by peer");
        assert_eq!(
            ClientError::from_status(sent, "here:1").code,
            Code::Internal
        );
        let cancelled = Status::cancelled("stream cancelled");
        assert_eq!(
            ClientError::from_status(cancelled, "here:1").code,
            Code::Unavailable
        );
        let missing = Status::not_found("Priority table t was not found");
        assert_eq!(
            ClientError::from_status(missing, "here:1").code,
            Code::NotFound
        );
        // In-process statuses keep their code.
        let internal = Status::internal("checkpoint task failed");
        assert_eq!(
            ClientError::from_inproc(internal, "here:1").code,
            Code::Internal
        );
    }
}
