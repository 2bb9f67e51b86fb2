//! gRPC statuses the server answers with.

use reverb_core::CoreError;
use tonic::Status;

/// What a sample that waited `rate_limiter_timeout` for the rate limiter in vain fails with
/// (the reference's text), over every transport.
pub const RATE_LIMITER_TIMEOUT: &str =
    "Rate Limiter: Timeout exceeded before the right to sample was acquired.";

/// Caller input as statuses echo it: at most [`ECHO_MAX`] bytes, then how long it was. A
/// status travels in an HTTP/2 header: a whole 20,000-character name would not fit, and the
/// caller would get a protocol error instead of the answer.
pub(crate) fn echo(input: &str) -> std::borrow::Cow<'_, str> {
    if input.len() <= ECHO_MAX {
        return input.into();
    }
    let mut end = ECHO_MAX;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &input[..end], input.len()).into()
}

/// Most bytes of caller input a status repeats.
pub(crate) const ECHO_MAX: usize = 256;

/// Maps an engine error to its gRPC status.
pub(crate) fn from_core(e: CoreError) -> Status {
    match e {
        CoreError::InvalidArgument(m) => Status::invalid_argument(m),
        CoreError::NotFound(m) => Status::not_found(m),
        CoreError::FailedPrecondition(m) => Status::failed_precondition(m),
    }
}

/// Maps a chunk store's error (which names its directory) to its gRPC status: a full disk is
/// RESOURCE_EXHAUSTED, a chunk the store refuses INVALID_ARGUMENT, a payload that fails its
/// checksum DATA_LOSS, anything else INTERNAL.
pub(crate) fn from_storage(e: std::io::Error) -> Status {
    if reverb_core::chunk_store::is_full(&e) {
        Status::resource_exhausted(e.to_string())
    } else if e.kind() == std::io::ErrorKind::InvalidInput {
        Status::invalid_argument(e.to_string())
    } else if e.kind() == std::io::ErrorKind::InvalidData {
        Status::data_loss(e.to_string())
    } else {
        Status::internal(e.to_string())
    }
}
