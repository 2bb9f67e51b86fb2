//! TLS files as servers and clients read them: PEM certificates and keys named by path
//! (keyword arguments, config keys or environment variables), checked when they are read so
//! a wrong file is an error naming it, not a failed connection later.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The server's certificate chain (PEM), when a server is given none.
pub const ENV_SERVER_CERT: &str = "REVERB_TLS_CERT";
/// The server's private key (PEM).
pub const ENV_SERVER_KEY: &str = "REVERB_TLS_KEY";
/// The authority client certificates must chain to; with it, a server serves only clients
/// that present one (mutual TLS).
pub const ENV_CLIENT_CA: &str = "REVERB_TLS_CLIENT_CA";
/// The authority a client checks the server's certificate against; with it, clients connect
/// over TLS.
pub const ENV_CA: &str = "REVERB_TLS_CA";
/// The client's certificate chain (PEM), for servers that require one.
pub const ENV_CLIENT_CERT: &str = "REVERB_TLS_CLIENT_CERT";
/// The client's private key (PEM).
pub const ENV_CLIENT_KEY: &str = "REVERB_TLS_CLIENT_KEY";
/// The name the server's certificate must carry, when not the host of the address.
pub const ENV_SERVER_NAME: &str = "REVERB_TLS_SERVER_NAME";

/// The environment variable `name` when it is set and not empty.
pub fn env_path(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn read(path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("Could not read the {what} file '{path}': {e}"))
}

/// The PEM file at `path` holding one or more certificates (`what` names it in errors).
pub fn read_certificates(path: &str, what: &str) -> Result<Vec<u8>, String> {
    let pem = read(path, what)?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| format!("The {what} file '{path}' is not valid PEM: {e}"))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!(
            "The {what} file '{path}' holds no certificate (expected PEM with a \
             '-----BEGIN CERTIFICATE-----' block)"
        ));
    }
    Ok(pem)
}

/// The PEM file at `path` holding a private key (PKCS#8, PKCS#1 or SEC1).
pub fn read_private_key(path: &str, what: &str) -> Result<Vec<u8>, String> {
    let pem = read(path, what)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("The {what} file '{path}' holds no private key in PEM form: {e}"))?;
    Ok(pem)
}
