//! Token authentication. A server with a token serves only calls that carry it
//! (`authorization: Bearer <token>`, as our clients send it); any other call gets
//! UNAUTHENTICATED before it reaches the service, so it reads and changes nothing.

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The metadata key a token travels in.
pub const AUTHORIZATION: &str = "authorization";

/// Checks the token of every call (lets every call through when the server has none).
#[derive(Clone, Default)]
pub(crate) struct TokenCheck {
    expected: Option<std::sync::Arc<[u8]>>,
}

impl TokenCheck {
    pub(crate) fn new(token: Option<&str>) -> Self {
        Self {
            expected: token.map(|t| format!("Bearer {t}").into_bytes().into()),
        }
    }

    /// Whether a client holding `token` may call this server.
    pub(crate) fn accepts(&self, token: Option<&str>) -> bool {
        match (&self.expected, token) {
            (None, _) => true,
            (Some(expected), Some(token)) => same(expected, format!("Bearer {token}").as_bytes()),
            (Some(_), None) => false,
        }
    }
}

impl Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        match request.metadata().get(AUTHORIZATION) {
            Some(given) if same(expected, given.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated(
                "the auth token of this call is not the server's",
            )),
            None => Err(Status::unauthenticated(
                "this server requires an auth token (auth_token= or REVERB_AUTH_TOKEN)",
            )),
        }
    }
}

/// Compares in time that depends only on the lengths, so timing tells nothing of the token.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_token_passes() {
        let mut check = TokenCheck::new(Some("s3cret"));
        let with = |value: Option<&str>| {
            let mut request = Request::new(());
            if let Some(v) = value {
                request
                    .metadata_mut()
                    .insert(AUTHORIZATION, v.parse().unwrap());
            }
            request
        };
        assert!(check.call(with(Some("Bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cres"),
            Some("s3cret"),
        ] {
            let status = check.call(with(bad)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(!status.message().contains("s3cret"));
        }
        assert!(check.accepts(Some("s3cret")) && !check.accepts(Some("x")));
        assert!(!check.accepts(None));
        let mut open = TokenCheck::new(None);
        assert!(open.call(with(None)).is_ok() && open.accepts(Some("any")));
    }
}
