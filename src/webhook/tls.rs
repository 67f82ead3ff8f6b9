//! HTTPS for the webhook: rustls with the ring provider (the same as kube's client),
//! hyper-util serving each connection with HTTP/1.1 or HTTP/2.
//!
//! The certificate and key are files (a mounted Secret in a cluster). Before every
//! handshake the server compares their modification time, size and inode with what it
//! loaded, and re-reads them when they changed, so a rotated certificate (cert-manager
//! renewing the Secret, the kubelet swapping the mounted files) applies to the next
//! connection without a restart. A pair that fails to load (half written, key not
//! matching) is ignored, and the previous one kept, until the files change again. A
//! failed handshake only ends that connection.

use std::{
    future::Future,
    io,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Longest a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest open connections get to finish after shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("reading the TLS certificate {path}: {message}")]
    Certificate { path: String, message: String },
    #[error("reading the TLS private key {path}: {message}")]
    Key { path: String, message: String },
    #[error("the TLS certificate {cert} and key {key} do not form a usable pair: {message}")]
    Pair {
        cert: String,
        key: String,
        message: String,
    },
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    // `metadata` follows symlinks: a kubelet `..data` swap shows up as a new target.
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode,
    })
}

type Stamps = (Option<FileStamp>, Option<FileStamp>);

struct Loaded {
    stamps: Stamps,
    acceptor: TlsAcceptor,
    /// Stamps of a pair that failed to load, so it is reported once, not per handshake.
    failed: Option<Stamps>,
}

/// The certificate files and the server configuration last built from them.
pub struct ReloadingAcceptor {
    cert_file: PathBuf,
    key_file: PathBuf,
    loaded: Mutex<Loaded>,
    reloads: AtomicU64,
}

impl ReloadingAcceptor {
    /// Loads the pair now; fails if it cannot (a server must not start without one).
    pub fn new(cert_file: PathBuf, key_file: PathBuf) -> Result<Self, TlsError> {
        let stamps = (stamp(&cert_file), stamp(&key_file));
        let config = load(&cert_file, &key_file)?;
        Ok(ReloadingAcceptor {
            cert_file,
            key_file,
            loaded: Mutex::new(Loaded {
                stamps,
                acceptor: TlsAcceptor::from(Arc::new(config)),
                failed: None,
            }),
            reloads: AtomicU64::new(0),
        })
    }

    /// How many times a changed pair has been loaded since start.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// The acceptor for the next handshake, re-reading the files if they changed.
    pub fn current(&self) -> TlsAcceptor {
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        let mut loaded = match self.loaded.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if stamps != loaded.stamps && loaded.failed != Some(stamps) {
            match load(&self.cert_file, &self.key_file) {
                Ok(config) => {
                    loaded.acceptor = TlsAcceptor::from(Arc::new(config));
                    loaded.stamps = stamps;
                    loaded.failed = None;
                    self.reloads.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        cert = %self.cert_file.display(),
                        "webhook: loaded the rotated TLS certificate"
                    );
                }
                Err(e) => {
                    loaded.failed = Some(stamps);
                    tracing::warn!(error = %e, "webhook: keeping the previous TLS certificate");
                }
            }
        }
        loaded.acceptor.clone()
    }
}

fn load(cert_file: &Path, key_file: &Path) -> Result<ServerConfig, TlsError> {
    let cert_shown = cert_file.display().to_string();
    let key_shown = key_file.display().to_string();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certificate {
            path: cert_shown.clone(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certificate {
            path: cert_shown,
            message: "no PEM certificate in the file".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| TlsError::Key {
        path: key_shown.clone(),
        message: e.to_string(),
    })?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Pair {
                cert: cert_shown.clone(),
                key: key_shown.clone(),
                message: e.to_string(),
            })?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Pair {
                cert: cert_shown,
                key: key_shown,
                message: e.to_string(),
            })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Handshake failures are normal (probes, clients with an old CA); say so at most once a
/// minute so the log stays readable.
fn report_handshake_failure(error: &io::Error) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let last = LAST.load(Ordering::Relaxed);
    if now >= last + 60
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::info!(%error, "webhook: a TLS handshake failed (reported at most once a minute)");
    }
}

/// Serves `router` over HTTPS on `listener` until `shutdown` completes, then lets open
/// connections finish (up to 10 s). Fails at once if the certificate pair cannot be
/// loaded; after that, nothing a client does stops the server.
pub async fn serve_tls(
    listener: TcpListener,
    cert_file: impl Into<PathBuf>,
    key_file: impl Into<PathBuf>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TlsError> {
    let acceptor = Arc::new(ReloadingAcceptor::new(cert_file.into(), key_file.into())?);
    serve_with(listener, acceptor, router, shutdown).await;
    Ok(())
}

/// [`serve_tls`] with an acceptor the caller keeps (to watch [`ReloadingAcceptor::reloads`]).
pub async fn serve_with(
    listener: TcpListener,
    acceptor: Arc<ReloadingAcceptor>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(error = %e, "webhook: accept failed; backing off");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let tls = acceptor.current();
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    report_handshake_failure(&e);
                    return;
                }
                Err(_) => return,
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            // Connection errors (a client going away mid-request) end only this connection.
            let _ = watcher.watch(connection.into_owned()).await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;

    use super::*;
    use crate::webhook::certs;

    /// An HTTPS GET over a fresh connection that trusts only `ca_file`.
    async fn get(addr: SocketAddr, ca_file: &Path) -> io::Result<String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file).map_err(io::Error::other)? {
            roots
                .add(cert.map_err(io::Error::other)?)
                .map_err(io::Error::other)?;
        }
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(io::Error::other)?
                .with_root_certificates(roots)
                .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").map_err(io::Error::other)?;
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        tls.write_all(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        tls.read_to_string(&mut out).await?;
        Ok(out)
    }

    fn hosts() -> Vec<String> {
        vec!["localhost".into(), "127.0.0.1".into()]
    }

    #[tokio::test]
    async fn serves_https_survives_bad_handshakes_and_picks_up_rotated_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let first = certs::self_signed(dir.path(), &hosts()).unwrap_or_else(|e| panic!("{e}"));
        let old_ca = dir.path().join("old-ca.crt");
        std::fs::copy(&first.ca_file, &old_ca).unwrap_or_else(|e| panic!("{e}"));

        let router = Router::new().route("/hello", axum::routing::get(|| async { "hello" }));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let acceptor = Arc::new(
            ReloadingAcceptor::new(first.cert_file.clone(), first.key_file.clone())
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(listener, acceptor.clone(), router, async {
            let _ = stopped.await;
        }));

        let reply = get(addr, &old_ca).await.unwrap_or_else(|e| panic!("{e}"));
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.ends_with("hello"));

        // Garbage instead of a ClientHello, and a client that hangs up mid-handshake.
        let mut junk = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        junk.write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        drop(junk);
        drop(tokio::net::TcpStream::connect(addr).await);
        assert!(
            get(addr, &old_ca).await.is_ok(),
            "still serving after bad handshakes"
        );

        // A half-written rotation (key does not match the certificate) is not used.
        let second_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let second =
            certs::self_signed(second_dir.path(), &hosts()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::copy(&second.cert_file, &first.cert_file).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            get(addr, &old_ca).await.is_ok(),
            "old pair kept while the key lags"
        );
        assert_eq!(acceptor.reloads(), 0);

        // The full rotation applies to the next connection, without a restart.
        std::fs::copy(&second.key_file, &first.key_file).unwrap_or_else(|e| panic!("{e}"));
        let reply = get(addr, &second.ca_file)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(reply.ends_with("hello"));
        assert_eq!(acceptor.reloads(), 1);
        assert!(
            get(addr, &old_ca).await.is_err(),
            "the old CA no longer verifies"
        );

        let _ = stop.send(());
        server.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "listener closed"
        );
    }

    #[test]
    fn missing_or_mismatched_files_fail_at_start() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let missing = ReloadingAcceptor::new(dir.path().join("no.crt"), dir.path().join("no.key"));
        assert!(matches!(missing, Err(TlsError::Certificate { .. })));
        let a =
            certs::self_signed(&dir.path().join("a"), &hosts()).unwrap_or_else(|e| panic!("{e}"));
        let b =
            certs::self_signed(&dir.path().join("b"), &hosts()).unwrap_or_else(|e| panic!("{e}"));
        let mismatched = ReloadingAcceptor::new(a.cert_file.clone(), b.key_file.clone());
        assert!(
            matches!(mismatched, Err(TlsError::Pair { .. })),
            "{:?}",
            mismatched.err()
        );
        let no_key = ReloadingAcceptor::new(a.cert_file.clone(), a.cert_file.clone());
        assert!(matches!(no_key, Err(TlsError::Key { .. })));
    }
}
