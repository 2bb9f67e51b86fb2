//! TLS for a client's connections (rustls): the authority the server's certificate must
//! chain to, and the client's own certificate for servers that require one (mutual TLS).

use reverb_proto::tls::{self as files, env_path};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A client's TLS settings, read and checked from PEM files.
#[derive(Clone)]
pub struct Tls {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Trusting the authority at `ca` (PEM); presenting the certificate at `cert` with the
    /// key at `key` when both are given; checking the server's certificate for
    /// `server_name` instead of the address's host when given.
    pub fn from_files(
        ca: &str,
        cert: Option<&str>,
        key: Option<&str>,
        server_name: Option<&str>,
    ) -> Result<Self, String> {
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((
                files::read_certificates(cert, "TLS client certificate")?,
                files::read_private_key(key, "TLS client key")?,
            )),
            (None, None) => None,
            (Some(_), None) => {
                return Err("A TLS client certificate needs its private key (tls_key)".into())
            }
            (None, Some(_)) => {
                return Err("A TLS client key needs its certificate (tls_cert)".into())
            }
        };
        Ok(Self {
            ca: files::read_certificates(ca, "TLS CA")?,
            identity,
            server_name: server_name.filter(|n| !n.is_empty()).map(str::to_string),
        })
    }

    /// From optional paths: no CA is no TLS (then a client certificate is an error).
    pub fn from_paths(
        ca: Option<&str>,
        cert: Option<&str>,
        key: Option<&str>,
        server_name: Option<&str>,
    ) -> Result<Option<Self>, String> {
        match ca {
            Some(ca) => Self::from_files(ca, cert, key, server_name).map(Some),
            None if cert.is_some() || key.is_some() => Err(
                "A TLS client certificate needs the CA to check the server with (tls_ca)".into(),
            ),
            None => Ok(None),
        }
    }

    /// The settings `REVERB_TLS_CA`, `REVERB_TLS_CLIENT_CERT`, `REVERB_TLS_CLIENT_KEY` and
    /// `REVERB_TLS_SERVER_NAME` name; `None` without a CA.
    pub fn from_env() -> Result<Option<Self>, String> {
        Self::from_paths(
            env_path(files::ENV_CA).as_deref(),
            env_path(files::ENV_CLIENT_CERT).as_deref(),
            env_path(files::ENV_CLIENT_KEY).as_deref(),
            env_path(files::ENV_SERVER_NAME).as_deref(),
        )
    }

    /// Whether the client presents a certificate of its own.
    pub fn has_client_certificate(&self) -> bool {
        self.identity.is_some()
    }

    pub(crate) fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}
