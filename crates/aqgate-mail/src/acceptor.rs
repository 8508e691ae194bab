//! The SMTP filter's decision at the end of DATA: who signed this mail (the agent whose
//! directory mail address is the From address), does the signature verify against that
//! agent's certificate from the directory, and if so, store it durably (the spool) before
//! answering 250. Rejections are SMTP replies (5.7.x), never reply mails (backscatter);
//! a directory or store that is unavailable gives 4.x.x so the sender retries.
//!
//! As a before-queue content filter (`--smtp-reinject`), mail for other recipients is handed
//! on unchanged to the MTA's reinjection port: after the AQ request of the same mail, if
//! any, was verified and spooled, and before the answer, so the client learns the outcome
//! of both at SMTP time.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::reinject::Reinjector;
use crate::smime::{self, GatewayIdentity, TrustStore, Verdict};
use crate::smtp::{Acceptor, MailEnvelope, Reply};
use aqgate_core::clock::{Clock, MICROS_PER_SEC};
use aqgate_core::directory::{CertificateLocation, Directory, DirectoryError};
use aqgate_core::engine::Engine;
use aqgate_core::store::{SpoolPut, SpooledMail};
use aqgate_core::topology::AgentInfo;

pub struct MailAcceptor {
    pub engine: Arc<Engine>,
    pub directory: Arc<dyn Directory>,
    /// Shared with the blocking threads that verify signatures.
    pub trust: Arc<TrustStore>,
    pub clock: Arc<dyn Clock>,
    /// Rung when a mail was spooled (the worker waits on it).
    pub wake: Arc<Notify>,
    /// Where mail for recipients other than the gateway's addresses goes (`None`: the
    /// SMTP session refuses such recipients).
    pub reinject: Option<Reinjector>,
    /// The replay window (the spool's dedupe window): a signingTime older than this is
    /// refused, so a copy replayed after the spool forgot the mail is refused too.
    pub replay_window: std::time::Duration,
    /// The gateway's S/MIME certificate and key: requests encrypted to it are decrypted
    /// (`None`: encrypted requests are refused).
    pub identity: Option<Arc<GatewayIdentity>>,
}

fn directory_reply(e: &DirectoryError, what: &str) -> Reply {
    match e {
        DirectoryError::NotFound(n) => Reply::new(550, "5.7.1", format!("{what}: not in the directory: {n}")),
        DirectoryError::Unavailable(why) => {
            Reply::new(451, "4.4.3", format!("directory unavailable, try again later ({why})"))
        }
        DirectoryError::Malformed(why) => {
            Reply::new(451, "4.7.5", format!("{what}: the directory holds a malformed entry ({why})"))
        }
        DirectoryError::Config(why) => Reply::new(451, "4.3.5", format!("directory configuration problem ({why})")),
    }
}

impl MailAcceptor {
    /// The agent whose directory mail address is `from`. The topology may have changed in
    /// another process (`admin apply`): an unknown sender reloads it once before giving up.
    async fn agent_for(&self, from: &str) -> Result<Option<AgentInfo>, DirectoryError> {
        if let Some(a) = self.find_agent(from).await? {
            return Ok(Some(a));
        }
        if let Err(e) = self.engine.reload().await {
            tracing::warn!(error = %e, "topology reload");
        }
        self.find_agent(from).await
    }

    /// The agent whose directory entry has the address `from`: one directory search for the
    /// address, matched against the catalog's agents (gateway agents never send mail).
    async fn find_agent(&self, from: &str) -> Result<Option<AgentInfo>, DirectoryError> {
        let uids = match self.directory.agents_with_mail(from).await {
            Ok(uids) => uids,
            Err(DirectoryError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let resolved = self.engine.resolved();
        let mut found: Option<AgentInfo> = None;
        for a in resolved.catalog.agents.values().filter(|a| !a.gateway) {
            if !uids.iter().any(|u| aqgate_core::directory::fold(u) == aqgate_core::directory::fold(&a.name)) {
                continue;
            }
            if let Some(first) = &found {
                // Which agent would act is not clear: refuse rather than guess.
                return Err(DirectoryError::Malformed(format!(
                    "agents {} and {} both have the address {from}",
                    first.name, a.name
                )));
            }
            found = Some(a.clone());
        }
        Ok(found)
    }
}

#[async_trait]
impl Acceptor for MailAcceptor {
    async fn accept(&self, env: &MailEnvelope, raw: &[u8]) -> Vec<Reply> {
        let for_gateway = env.rcpts.iter().any(|r| r.gateway);
        let others: Vec<&str> = env.rcpts.iter().filter(|r| !r.gateway).map(|r| r.address.as_str()).collect();
        // SMTP has one answer for the whole mail: with recipients to hand on, a request is
        // held until that answer is known to be 250 (a 4xx means the client sends the mail
        // again, and only the copy finally accepted is performed and answered).
        let hold = !others.is_empty() && self.reinject.is_some() && !env.lmtp;
        let request = if for_gateway || others.is_empty() { Some(self.spool_request(raw, hold).await) } else { None };
        if others.is_empty() {
            return request.into_iter().map(|(reply, _)| reply).collect();
        }
        let Some(reinject) = &self.reinject else {
            // The session refuses such recipients when there is nowhere to send them.
            return vec![Reply::new(550, "5.1.1", "recipient not accepted here")];
        };
        if env.lmtp {
            // One answer per recipient: the request's for the gateway's addresses, the next
            // server's for the others (handed on whatever became of the request).
            let mut handed_on = reinject.send(&env.mail_from, &others, env.body_8bit, raw, false).await.into_iter();
            return env
                .rcpts
                .iter()
                .map(|r| match (&request, r.gateway) {
                    (Some((req, _)), true) => req.clone(),
                    _ => handed_on.next().unwrap_or_else(|| Reply::new(451, "4.3.0", "internal error; try again")),
                })
                .collect();
        }
        // SMTP: one answer for the whole mail. A request that is refused refuses the mail
        // (nobody gets it, the client sees why); otherwise the mail is handed on, and the
        // next server's refusal (temporary or not) is the answer. A client retrying after a
        // temporary failure sends the request again: the spool recognises it.
        if let Some((req, _)) = &request
            && req.code >= 300
        {
            return vec![req.clone()];
        }
        let handed_on = reinject.send(&env.mail_from, &others, env.body_8bit, raw, true).await;
        let first = handed_on.into_iter().next().unwrap_or_else(|| Reply::new(451, "4.3.0", "internal error"));
        match request {
            Some((req, id)) if first.code < 300 => {
                // The mail is accepted: its request may now be performed and answered.
                if let Some(id) = id
                    && let Err(e) = self.engine.store().spool_release(id, self.clock.now()).await
                {
                    // The others have the mail; the client will send it again and that
                    // copy releases the request.
                    tracing::error!(error = %e, "releasing a held mail failed");
                    return vec![Reply::new(451, "4.3.0", "temporary failure storing the mail; try again later")];
                }
                self.wake.notify_one();
                vec![Reply::new(
                    250,
                    "2.0.0",
                    format!("{}; handed on for {} other recipient(s)", req.text, others.len()),
                )]
            }
            // Not accepted: a held request stays held (not performed, no reply owed) until
            // the client's next attempt, or is forgotten with the dedupe window.
            _ => vec![first],
        }
    }
}

impl MailAcceptor {
    /// The decision about an AQ request by mail: sender → agent → directory certificate →
    /// S/MIME verification → spool. `250` only once the request is committed to the spool.
    pub async fn verify_and_spool(&self, raw: &[u8]) -> Reply {
        self.spool_request(raw, false).await.0
    }

    /// [`MailAcceptor::verify_and_spool`], storing the request `held` if `hold` (see
    /// [`aqgate_core::store::Store::spool_release`]); with the spool id when it was stored.
    async fn spool_request(&self, raw: &[u8], hold: bool) -> (Reply, Option<i64>) {
        match self.verify_and_put(raw, hold).await {
            Ok((reply, id)) => (reply, Some(id)),
            Err(reply) => (reply, None),
        }
    }

    async fn verify_and_put(&self, raw: &[u8], hold: bool) -> Result<(Reply, i64), Reply> {
        let from = match smime::sender_address(raw) {
            Ok(f) => f,
            Err(e) => return Err(Reply::new(550, "5.7.1", format!("rejected: {e}"))),
        };
        let agent = match self.agent_for(&from).await {
            Ok(Some(a)) => a,
            Ok(None) => return Err(Reply::new(550, "5.7.1", format!("rejected: no AQ agent has the address {from}"))),
            Err(e) => return Err(directory_reply(&e, &format!("sender {from}"))),
        };
        if !agent.smtp {
            return Err(Reply::new(550, "5.7.1", format!("rejected: agent {} is not enabled for SMTP", agent.name)));
        }
        let at = match &agent.certificate_location {
            Some(dn) => CertificateLocation::Dn(dn.clone()),
            None => CertificateLocation::Mail(from.clone()),
        };
        let certs = match self.directory.certificates(&at).await {
            Ok(c) if !c.is_empty() => c,
            Ok(_) => {
                return Err(Reply::new(
                    550,
                    "5.7.1",
                    format!("rejected: no certificate for agent {} in the directory", agent.name),
                ));
            }
            Err(e) => return Err(directory_reply(&e, &format!("certificate of agent {}", agent.name))),
        };
        let now = self.clock.now();
        let replay_window = i64::try_from(self.replay_window.as_secs()).unwrap_or(i64::MAX);
        // The verification is CPU work of a millisecond or so (CMS, the chain, revocation):
        // on a blocking thread, so the runtime's workers (one, with the database on a small
        // host) keep serving requests meanwhile.
        let (mail, trust, identity) = (raw.to_vec(), self.trust.clone(), self.identity.clone());
        let verdict = tokio::task::spawn_blocking(move || {
            let policy = smime::Policy { replay_window, gateway: identity.as_deref() };
            smime::verify_with(&mail, &certs, &trust, &policy, now / MICROS_PER_SEC)
        })
        .await
        .unwrap_or_else(|e| {
            // Cancelled at shutdown (`verify_with` catches OpenSSL's panics itself).
            tracing::error!(error = %e, "S/MIME verification task failed");
            Verdict::TempError("the verification did not finish".into())
        });
        let verified = match verdict {
            Verdict::Pass(v) => *v,
            Verdict::Fail(why) => return Err(Reply::new(550, "5.7.1", format!("signature rejected: {why}"))),
            Verdict::PermError(why) => {
                return Err(Reply::new(550, "5.7.1", format!("not an acceptable S/MIME message: {why}")));
            }
            Verdict::TempError(why) => return Err(Reply::new(451, "4.7.0", format!("cannot verify now: {why}"))),
        };
        let mail = SpooledMail {
            id: 0,
            received_at: now,
            agent: agent.name.clone(),
            // Without a Message-ID the mail cannot be recognised when re-sent: it gets a
            // unique key of its own.
            message_id: verified
                .message_id
                .clone()
                .unwrap_or_else(|| format!("{}@aqgate.invalid", aqgate_core::engine::session::random_id())),
            // The signed entity's digest (of the decrypted one, for encrypted mail).
            dedupe_key: verified.digest.clone(),
            // Only the verified From: outer headers such as Reply-To are not covered by the
            // signature, and a replayed mail must not redirect the response elsewhere.
            reply_to: verified.from.clone(),
            subject: verified.subject.clone(),
            idap: verified.idap,
            state: if hold { "held".into() } else { String::new() },
            attempts: 0,
            response: None,
            last_error: None,
            replies_wanted: 1,
            replies_sent: 0,
            resend_message_id: None,
            // An encrypted request is answered encrypted, to the agent's certificate that
            // signed it.
            encrypt_to: verified.encrypted.then(|| verified.signer.clone()),
        };
        match self.engine.store().spool_put(&mail).await {
            Ok(SpoolPut::New(id)) => {
                if !hold {
                    self.wake.notify_one();
                }
                Ok((Reply::new(250, "2.0.0", format!("verified for agent {}; queued as request {id}", agent.name)), id))
            }
            Ok(SpoolPut::Duplicate(id)) => {
                if !hold {
                    self.wake.notify_one();
                }
                Ok((
                    Reply::new(
                        250,
                        "2.0.0",
                        format!("already have this request ({id}); its response will be sent again"),
                    ),
                    id,
                ))
            }
            // RFC 5321's insufficient system storage: the sending MTA keeps the mail.
            Err(e) if e.is_full() => Err(Reply::new(452, "4.3.1", "insufficient system storage; try again later")),
            Err(e) => {
                if e.is_unavailable() {
                    // The store logs the outage once, and its end.
                    tracing::debug!(error = %e, "spooling a verified mail failed: the database is unavailable");
                } else {
                    tracing::error!(error = %e, "spooling a verified mail failed");
                }
                Err(Reply::new(451, "4.3.0", "temporary failure storing the mail; try again later"))
            }
        }
    }
}

/// Accepts SMTP connections until `shutdown` changes; one task per connection. A client
/// over its share of connections (`max_per_client`), or any client while the listener
/// holds `max_connections`, gets 421 and is hung up on.
pub async fn serve_smtp(
    listener: tokio::net::TcpListener,
    cfg: crate::smtp::SmtpConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    acceptor: Arc<dyn Acceptor>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut cfg = cfg;
    cfg.starttls = tls.is_some();
    let cfg = Arc::new(cfg);
    let limit = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections.max(1)));
    let clients = crate::limits::Clients::new(cfg.max_per_client, cfg.per_client_exempt.clone());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "SMTP accept");
                continue;
            }
        };
        // Replies are small and each one waits for the client: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let Some(slot) = clients.admit(peer.ip()) else {
            cfg.counters.refused_per_client.inc();
            tracing::debug!(%peer, "SMTP: too many connections from this client");
            refuse(stream, "421 4.7.0 too many connections from your address, try again later\r\n");
            continue;
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            cfg.counters.refused_full.inc();
            refuse(stream, "421 4.3.2 too many connections, try again later\r\n");
            continue;
        };
        let cfg = cfg.clone();
        let acceptor = acceptor.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            use crate::smtp::{Ended, run_session};
            match run_session(stream, &cfg, acceptor.as_ref(), false).await {
                Ok(Ended::StartTls(plain)) => {
                    if let Some(t) = tls {
                        match tokio::time::timeout(cfg.mail_timeout, t.accept(plain)).await {
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                            Ok(Ok(secure)) => {
                                if let Err(e) = run_session(secure, &cfg, acceptor.as_ref(), true).await {
                                    tracing::debug!(%peer, error = %e, "SMTP session ended");
                                }
                            }
                            Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        }
                    }
                }
                Ok(Ended::Closed) => {}
                Err(e) => tracing::debug!(%peer, error = %e, "SMTP session ended"),
            }
            drop((permit, slot));
        });
    }
}

/// Says `why` and hangs up (a client that does not read gets a few seconds).
fn refuse(stream: tokio::net::TcpStream, why: &'static str) {
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut s = stream;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.write_all(why.as_bytes())).await;
    });
}

/// A TLS server configuration (ring provider) from PEM certificate chain and key files.
pub fn tls_acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().map_err(|e| format!("certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
