//! HTTPS for the servlet: rustls (the ring provider, as everywhere in aqgate), HTTP/1.1
//! and HTTP/2 chosen by ALPN, optional client certificates, and a certificate reload that
//! takes effect for new connections (SIGHUP).
//!
//! Client certificates are optional at the handshake (`--tls-client-ca` makes the server
//! ask for one): a client without one still logs in with Basic credentials on the same
//! listener, unless `--require-client-cert`. A certificate the client does send must chain
//! to a configured client CA, be within its validity, not be revoked by a configured CRL
//! (a CRL past its nextUpdate refuses every certificate of its CA until it is refreshed),
//! and carry clientAuth if it has an extendedKeyUsage; otherwise the handshake fails with
//! the matching TLS alert. Which agent it logs in as is the servlet's business
//! (`servlet::client_cert`).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::edge;
use crate::servlet::TlsConnection;

/// The files of the servlet's TLS configuration, read again on reload.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CAs whose client certificates log in; empty: the server asks for none.
    pub client_ca: Vec<PathBuf>,
    pub client_crl: Vec<PathBuf>,
    /// Refuse a handshake without a client certificate.
    pub require_client_cert: bool,
}

fn read_err(path: &std::path::Path, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{}: {e}", path.display())
}

/// The rustls configuration the files describe.
pub fn server_config(f: &TlsFiles) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&f.cert)
        .map_err(|e| read_err(&f.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err(&f.cert, e))?;
    anyhow::ensure!(!certs.is_empty(), "{}: no certificate in the file", f.cert.display());
    let key = PrivateKeyDer::from_pem_file(&f.key).map_err(|e| read_err(&f.key, e))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
    let builder = if f.client_ca.is_empty() {
        anyhow::ensure!(!f.require_client_cert, "--require-client-cert needs --tls-client-ca");
        anyhow::ensure!(f.client_crl.is_empty(), "--tls-client-crl needs --tls-client-ca");
        builder.with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for path in &f.client_ca {
            let mut n = 0;
            for c in CertificateDer::pem_file_iter(path).map_err(|e| read_err(path, e))? {
                roots.add(c.map_err(|e| read_err(path, e))?).map_err(|e| read_err(path, e))?;
                n += 1;
            }
            anyhow::ensure!(n > 0, "{}: no CA certificate in the file", path.display());
        }
        let mut crls = Vec::new();
        for path in &f.client_crl {
            for c in CertificateRevocationListDer::pem_file_iter(path).map_err(|e| read_err(path, e))? {
                crls.push(c.map_err(|e| read_err(path, e))?);
            }
        }
        let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .with_crls(crls)
            // A CA without a configured CRL is not revocation-checked (as for S/MIME).
            .allow_unknown_revocation_status()
            .enforce_revocation_expiration();
        if !f.require_client_cert {
            v = v.allow_unauthenticated();
        }
        builder.with_client_cert_verifier(v.build().map_err(|e| anyhow::anyhow!("client CA: {e}"))?)
    };
    let mut cfg = builder.with_single_cert(certs, key).map_err(|e| anyhow::anyhow!("TLS certificate and key: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The configuration in use; replaced on reload, read at each new connection.
#[derive(Clone)]
pub struct Reloadable {
    files: TlsFiles,
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

impl Reloadable {
    pub fn load(files: TlsFiles) -> anyhow::Result<Self> {
        let cfg = server_config(&files)?;
        Ok(Self { files, current: Arc::new(RwLock::new(cfg)) })
    }

    /// Reads the files again; on an error the configuration in use stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let cfg = server_config(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = cfg;
        Ok(())
    }

    fn get(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A handshake that takes longer than the request-head timeout is dropped (a client that
/// connects and says nothing holds no task for long).
///
/// A connection with no request in progress is closed when [`edge::Activity`] says it is
/// due: no request head within `--http-header-timeout` of the connection's start or of its
/// first byte after an idle spell, or `--http-idle-timeout` idle between requests (HTTP/2
/// gets a GOAWAY). A connection told to close that still has no request in progress a
/// second later is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Serves `router` over TLS on `listener` until `shutdown` resolves, then lets the
/// connections' in-flight requests finish (as `axum::serve`'s graceful shutdown does).
pub async fn serve(
    listener: TcpListener,
    tls: Reloadable,
    router: Router,
    edge: Arc<edge::Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_connections(listener, Some(tls), router, edge, shutdown).await
}

/// [`serve`] in plain HTTP (HTTP/1.1, and HTTP/2 with prior knowledge), with the same
/// bounds.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    edge: Arc<edge::Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_connections(listener, None, router, edge, shutdown).await
}

async fn serve_connections(
    listener: TcpListener,
    tls: Option<Reloadable>,
    router: Router,
    edge: Arc<edge::Connections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(hyper_util::rt::TokioTimer::new());
    // Every connection task holds a clone; the loop waits for all of them at the end.
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (down_tx, down_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little, as axum::serve does.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Over a cap: closed at once, before a byte is read.
        let Some(slot) = edge.admit(peer.ip()) else { continue };
        // Answers go out at once (no Nagle delay behind a client's delayed ACK).
        let _ = tcp.set_nodelay(true);
        let acceptor = tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.get()));
        let router = router.clone();
        let builder = builder.clone();
        let edge = edge.clone();
        let alive = alive_tx.clone();
        let down = down_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _alive = alive;
            // The peer address tells the store's group commit which connection a request
            // came on, and the password checks' back-off who is guessing.
            let Some(acceptor) = acceptor else {
                let activity = edge::Activity::new();
                let a = activity.clone();
                let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                    let guard = a.enter();
                    let call = router.clone().oneshot(req.map(axum::body::Body::new));
                    async move {
                        let r = call.await;
                        drop(guard);
                        r
                    }
                });
                let io = TokioIo::new(edge::Watched::new(tcp, activity.clone()));
                let conn = builder.serve_connection_with_upgrades(io, service);
                watch(conn, &activity, &edge, down, peer).await;
                return;
            };
            let handshake = edge.config.header_timeout;
            let stream = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "TLS handshake refused");
                    return;
                }
                Err(_) => {
                    edge.header_timeouts.inc();
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let client_cert = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec());
            let conn = TlsConnection::new(client_cert);
            // The head timeout runs from the end of the handshake.
            let activity = edge::Activity::new();
            let a = activity.clone();
            let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                req.extensions_mut().insert(conn.clone());
                let guard = a.enter();
                let call = router.clone().oneshot(req.map(axum::body::Body::new));
                async move {
                    let r = call.await;
                    drop(guard);
                    r
                }
            });
            let io = TokioIo::new(edge::Watched::new(stream, activity.clone()));
            let connection = builder.serve_connection(io, service);
            watch(connection, &activity, &edge, down, peer).await;
        });
    }
    drop(listener);
    let _ = down_tx.send(true);
    drop(alive_tx);
    // Every connection task has ended once no sender is left.
    let _ = alive_rx.recv().await;
    Ok(())
}

/// Drives one connection to its end: closed gracefully when it is due (see
/// [`edge::Activity::due`]) or the server stops; dropped when, told to close, it still
/// has no request in progress [`CLOSE_GRACE`] later.
async fn watch<C>(
    conn: C,
    activity: &edge::Activity,
    edge: &edge::Connections,
    mut down: tokio::sync::watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    tokio::pin!(conn);
    let cfg = &edge.config;
    let mut closing: Option<tokio::time::Instant> = None;
    loop {
        let now = tokio::time::Instant::now();
        let wake = match (closing, activity.due(cfg)) {
            (Some(since), _) => since + CLOSE_GRACE,
            (None, Some((at, _))) => tokio::time::Instant::from_std(at),
            // A request is in progress: look again later.
            (None, None) => now + cfg.header_timeout,
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            r = down.wait_for(|d| *d), if closing.is_none() => {
                let _ = r;
                conn.as_mut().graceful_shutdown();
                closing = Some(tokio::time::Instant::now());
            }
            () = tokio::time::sleep_until(wake) => {
                match closing {
                    Some(_) if activity.in_flight() == 0 => return,
                    // A request is finishing: wait for it.
                    Some(_) => closing = Some(tokio::time::Instant::now()),
                    None => {
                        if let Some((at, why)) = activity.due(cfg)
                            && at <= std::time::Instant::now()
                        {
                            match why {
                                edge::Due::Header => edge.header_timeouts.inc(),
                                edge::Due::Idle => edge.idle_timeouts.inc(),
                            };
                            tracing::debug!(%peer, ?why, "closing a connection without a request in progress");
                            conn.as_mut().graceful_shutdown();
                            closing = Some(tokio::time::Instant::now());
                        }
                    }
                }
            }
        }
    }
}
