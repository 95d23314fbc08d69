//! TLS on the listener (rustls with ring): HTTP/1.1 and HTTP/2 by ALPN, optional client
//! certificates (mutual TLS), and certificates re-read when their files change.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The listener's TLS files (see `config::ServerTlsConfig`).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

/// Why the server's TLS configuration cannot be built from its files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("server TLS: {0}")]
    Pem(#[from] crate::pem::PemError),
    #[error("server TLS: {0}")]
    Rustls(rustls::Error),
    #[error("server TLS: {file}: {source}")]
    ClientCa {
        file: String,
        source: RustlsOrVerifier,
    },
    #[error("server TLS: {cert} and {key}: {source}")]
    Pair {
        cert: String,
        key: String,
        source: rustls::Error,
    },
}

/// The two ways a client CA can be refused.
#[derive(Debug, thiserror::Error)]
pub enum RustlsOrVerifier {
    #[error("{0}")]
    Rustls(rustls::Error),
    #[error("{0}")]
    Verifier(rustls::server::VerifierBuilderError),
}

/// How often the files' modification times are looked at (on a handshake).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The current server configuration, rebuilt when a file changes.
pub struct TlsSource {
    files: TlsFiles,
    state: Mutex<State>,
}

struct State {
    config: Arc<ServerConfig>,
    stamps: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl TlsSource {
    /// Loads the files; an error here stops start-up.
    pub fn load(files: TlsFiles) -> Result<TlsSource, TlsError> {
        let stamps = stamps(&files);
        let config = Arc::new(build(&files)?);
        Ok(TlsSource {
            files,
            state: Mutex::new(State {
                config,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The configuration for a new handshake. At most once a second it looks at the
    /// files' modification times, and rebuilds when one changed; a file that does not
    /// load then keeps the previous configuration and is logged (without its contents).
    pub fn current(&self) -> Arc<ServerConfig> {
        let Ok(mut st) = self.state.lock() else {
            // A panic while reloading left the lock poisoned: keep serving what we had.
            return self.fallback();
        };
        if st.checked.elapsed() >= CHECK_EVERY {
            st.checked = Instant::now();
            let now = stamps(&self.files);
            if now != st.stamps {
                st.stamps = now;
                match build(&self.files) {
                    Ok(c) => {
                        st.config = Arc::new(c);
                        tracing::info!(cert_file = %self.files.cert_file.display(), "server TLS certificate reloaded");
                    }
                    Err(e) => tracing::error!(
                        error = %e,
                        "server TLS files changed but do not load; keeping the previous certificate"
                    ),
                }
            }
        }
        st.config.clone()
    }

    fn fallback(&self) -> Arc<ServerConfig> {
        match self.state.lock() {
            Ok(st) => st.config.clone(),
            Err(p) => p.into_inner().config.clone(),
        }
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current())
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    std::iter::once(&files.cert_file)
        .chain(std::iter::once(&files.key_file))
        .chain(files.client_ca_file.iter())
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

fn build(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let certs: Vec<CertificateDer<'static>> = crate::pem::read_certs(&files.cert_file)?;
    let key: PrivateKeyDer<'static> = crate::pem::read_key(&files.key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?;
    let builder = match &files.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            let refused = |source| TlsError::ClientCa {
                file: ca.display().to_string(),
                source,
            };
            for c in crate::pem::read_certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| refused(RustlsOrVerifier::Rustls(e)))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| refused(RustlsOrVerifier::Verifier(e)))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Pair {
            cert: files.cert_file.display().to_string(),
            key: files.key_file.display().to_string(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
