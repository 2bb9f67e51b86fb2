//! gRPC statuses the server answers with.

use reverb_core::CoreError;
use tonic::Status;

/// What a sample that waited `rate_limiter_timeout` for the rate limiter in vain fails with
/// (the reference's text), over every transport.
pub const RATE_LIMITER_TIMEOUT: &str =
    "Rate Limiter: Timeout exceeded before the right to sample was acquired.";

/// Maps an engine error to its gRPC status.
pub(crate) fn from_core(e: CoreError) -> Status {
    match e {
        CoreError::InvalidArgument(m) => Status::invalid_argument(m),
        CoreError::NotFound(m) => Status::not_found(m),
        CoreError::FailedPrecondition(m) => Status::failed_precondition(m),
    }
}
