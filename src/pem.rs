//! PEM files (certificates and private keys) for the TLS settings: read by `config`'s
//! checks and by the server, so that what check-config accepts, serve loads.

use std::path::Path;

/// The certificates of a PEM file (at least one), or why not.
pub fn read_certs(path: &Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file, or why not. Errors never quote the file's contents.
pub fn read_key(path: &Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    match rustls_pemfile::private_key(&mut pem.as_slice()) {
        Ok(Some(k)) => Ok(k),
        Ok(None) => Err(format!(
            "{}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
            path.display()
        )),
        Err(_) => Err(format!("{}: not valid PEM", path.display())),
    }
}

/// Whether `key` is the private key of the first certificate of `certs` (as rustls
/// checks when it builds a server configuration).
pub fn check_pair(
    certs: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> Result<(), String> {
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(certs, key, &provider)
        .map(|_| ())
        .map_err(|e| format!("the key does not fit the certificate: {e}"))
}
