//! PEM files (certificates and private keys) for the TLS settings: read by `config`'s
//! checks and by the server, so that what check-config accepts, serve loads.

use std::path::Path;

/// Why a PEM file cannot be used. Never quotes the file's contents.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("cannot read {path}: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid PEM: {source}")]
    InvalidCerts {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in it")]
    NoCertificate { path: String },
    #[error("{path}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it")]
    NoKey { path: String },
    #[error("{path}: not valid PEM")]
    InvalidKey { path: String },
    #[error("the key does not fit the certificate: {0}")]
    KeyMismatch(rustls::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, PemError> {
    std::fs::read(path).map_err(|source| PemError::Unreadable {
        path: path.display().to_string(),
        source,
    })
}

/// The certificates of a PEM file (at least one), or why not.
pub fn read_certs(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, PemError> {
    let pem = read(path)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| PemError::InvalidCerts {
            path: path.display().to_string(),
            source,
        })?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file, or why not. Errors never quote the file's contents.
pub fn read_key(path: &Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, PemError> {
    let pem = read(path)?;
    let path = path.display().to_string();
    match rustls_pemfile::private_key(&mut pem.as_slice()) {
        Ok(Some(k)) => Ok(k),
        Ok(None) => Err(PemError::NoKey { path }),
        Err(_) => Err(PemError::InvalidKey { path }),
    }
}

/// Whether `key` is the private key of the first certificate of `certs` (as rustls
/// checks when it builds a server configuration).
pub fn check_pair(
    certs: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> Result<(), PemError> {
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(certs, key, &provider)
        .map(|_| ())
        .map_err(PemError::KeyMismatch)
}
