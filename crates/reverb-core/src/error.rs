//! Errors of the engine. Each maps to one gRPC status code in the server.

/// What went wrong in a table operation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// The caller passed something malformed (maps to INVALID_ARGUMENT / `ValueError`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A named thing does not exist (maps to NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts the current state (maps to FAILED_PRECONDITION).
    #[error("{0}")]
    FailedPrecondition(String),
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, CoreError>;

/// Builds an `InvalidArgument` error from a format string.
#[macro_export]
macro_rules! invalid_arg {
    ($($arg:tt)*) => { $crate::CoreError::InvalidArgument(format!($($arg)*)) };
}
