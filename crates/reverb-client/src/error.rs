//! Client errors carry a gRPC status code and a message meant for users.

use tonic::Code;

/// An error from a client call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    /// gRPC status code (also used for local failures of the same kind).
    pub code: Code,
    /// What went wrong.
    pub message: String,
}

impl ClientError {
    /// An error with a code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
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

    /// From a gRPC status received while talking to `address`. Connection-level failures
    /// (refused, reset, cancelled by a dying server, broken HTTP/2) all become UNAVAILABLE.
    pub fn from_status(status: tonic::Status, address: &str) -> Self {
        let text = status.message();
        let transport = matches!(
            status.code(),
            Code::Unknown | Code::Internal | Code::Cancelled
        ) && (status.code() == Code::Cancelled
            || text.starts_with("h2 protocol error")
            || text.starts_with("transport error")
            || text.contains("error trying to connect")
            || text.contains("connection reset")
            || text.contains("broken pipe"));
        let code = if transport {
            Code::Unavailable
        } else {
            status.code()
        };
        let message = match code {
            Code::Unavailable => format!(
                "Server at {address} is unavailable: {}",
                if status.message().is_empty() {
                    "connection failed"
                } else {
                    status.message()
                }
            ),
            _ => status.message().to_string(),
        };
        Self::new(code, message)
    }
}

/// Result alias of the client.
pub type Result<T> = std::result::Result<T, ClientError>;
