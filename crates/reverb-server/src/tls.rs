//! TLS for a server's connections (rustls): its certificate and key, and optionally the
//! authority client certificates must chain to (then only clients presenting one are served).

use reverb_proto::tls::{self as files, env_path};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// A server's TLS settings, read and checked from PEM files.
#[derive(Clone)]
pub struct ServerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("client_ca", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// The certificate chain at `cert` and private key at `key` (PEM files); with
    /// `client_ca`, clients must present a certificate that chains to it.
    pub fn from_files(cert: &str, key: &str, client_ca: Option<&str>) -> Result<Self, String> {
        Ok(Self {
            cert: files::read_certificates(cert, "TLS certificate")?,
            key: files::read_private_key(key, "TLS key")?,
            client_ca: client_ca
                .map(|p| files::read_certificates(p, "TLS client CA"))
                .transpose()?,
        })
    }

    /// The settings `REVERB_TLS_CERT`, `REVERB_TLS_KEY` and `REVERB_TLS_CLIENT_CA` name;
    /// `None` when neither a certificate nor a key is named.
    pub fn from_env() -> Result<Option<Self>, String> {
        Self::from_paths(
            env_path(files::ENV_SERVER_CERT).as_deref(),
            env_path(files::ENV_SERVER_KEY).as_deref(),
            env_path(files::ENV_CLIENT_CA).as_deref(),
        )
    }

    /// From optional paths: none for no TLS; a certificate needs its key and the other way
    /// round; a client CA needs both.
    pub fn from_paths(
        cert: Option<&str>,
        key: Option<&str>,
        client_ca: Option<&str>,
    ) -> Result<Option<Self>, String> {
        match (cert, key) {
            (Some(cert), Some(key)) => Self::from_files(cert, key, client_ca).map(Some),
            (None, None) if client_ca.is_none() => Ok(None),
            (None, None) => Err(
                "A TLS client CA needs the server's TLS certificate and key as well".to_string(),
            ),
            (Some(_), None) => Err("A TLS certificate needs its private key (tls_key)".into()),
            (None, Some(_)) => Err("A TLS key needs its certificate (tls_cert)".into()),
        }
    }

    pub(crate) fn config(&self) -> ServerTlsConfig {
        let config = ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key));
        match &self.client_ca {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}
