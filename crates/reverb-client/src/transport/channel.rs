//! The gRPC channel a client's calls go through: tonic's, plus the client's auth token
//! (`authorization: Bearer <token>`) on every call when it has one.

use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::transport::Channel;
use tower_service::Service;

/// A channel that adds the auth token to every request.
#[derive(Clone, Debug)]
pub struct AuthChannel {
    channel: Channel,
    authorization: Option<http::HeaderValue>,
}

impl AuthChannel {
    /// `channel`, sending `token` with every call (none when `None`). A token that cannot be
    /// a header value is an error.
    pub fn new(channel: Channel, token: Option<&str>) -> Result<Self, String> {
        let authorization = token
            .map(|t| {
                let mut value = http::HeaderValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| "an auth token must be printable ASCII".to_string())?;
                value.set_sensitive(true);
                Ok::<_, String>(value)
            })
            .transpose()?;
        Ok(Self {
            channel,
            authorization,
        })
    }
}

impl AuthChannel {
    /// The connection underneath (shared by clones).
    pub fn connection(&self) -> Channel {
        self.channel.clone()
    }
}

impl Service<http::Request<Body>> for AuthChannel {
    type Response = <Channel as Service<http::Request<Body>>>::Response;
    type Error = <Channel as Service<http::Request<Body>>>::Error;
    type Future = <Channel as Service<http::Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.channel, cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if let Some(value) = &self.authorization {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value.clone());
        }
        self.channel.call(request)
    }
}
