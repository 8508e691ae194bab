//! Running `serve`, `smtp` and `notify`: the directory opened, the arguments made into the
//! server's configuration, the listeners bound, and a graceful stop on SIGTERM or SIGINT.

use std::path::PathBuf;
use std::time::Duration;

use crate::args::{MailArgs, NotifyCommandArgs, ServeArgs, SmtpArgs, mail_transport};
use crate::server::ServeConfig;
use aqgate_core::engine::EngineConfig;
use aqgate_proto::idap::Limits;

/// `aqgate serve`: the servlet, the SMTP filter and the notification dispatcher.
/// What would stop `serve` with these settings before it serves, found without starting
/// anything (`config check`): the HTTPS files and plain-HTTP policy, SAML, the directory,
/// the notification policies, the topology file.
pub fn serve_problems(a: &ServeArgs) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |r: anyhow::Result<()>| {
        if let Err(e) = r {
            problems.push(e.to_string());
        }
    };
    check(a.tls.config(a.listen).map(drop));
    check(a.saml.verifier().map(drop));
    check(a.directory.config().map(drop));
    check(aqgate_notify::Policy::parse(&a.notify.notify_allow).map(drop).map_err(|e| anyhow::anyhow!(e)));
    check(a.notify.mail_policy().map(drop));
    if let (Some(p), false) = (&a.topology, a.no_topology) {
        check(std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display())).and_then(|text| {
            let t = aqgate_core::topology::Topology::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {}", p.display(), e.join("; ")))?;
            let catalog = t
                .resolve(&aqgate_core::auth::hash_password)
                .map_err(|e| anyhow::anyhow!("{}: {}", p.display(), e.join("; ")))?;
            match aqgate_propagate::gateway::unbuilt_links(&catalog) {
                unbuilt if unbuilt.is_empty() => Ok(()),
                unbuilt => Err(anyhow::anyhow!("{}: {}", p.display(), unbuilt.join("; "))),
            }
        }));
    }
    problems
}

pub async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        db,
        listen,
        topology,
        no_topology,
        session_timeout,
        session_tombstone_ttl,
        idempotency_window,
        max_wait,
        max_body,
        max_sessions,
        max_sessions_per_agent,
        idempotency_max_response_bytes,
        idempotency_max_records_per_agent,
        idempotency_max_bytes_per_agent,
        propagation_lease_ttl,
        vacuum_every,
        broker_max_message_bytes,
        buffered_max_messages,
        buffered_spill_bytes,
        buffered_max_bytes,
        buffered_spill_after,
        max_recipients,
        max_long_polls_per_agent,
        condition_max_steps,
        condition_max_text_bytes,
        condition_request_steps,
        secure_cookie,
        console,
        tls,
        edge,
        directory: directory_args,
        mail: mail_args,
        notify: notify_args,
        saml: saml_args,
    } = a;
    let tls_files = tls.config(listen)?;
    let saml = saml_args.verifier()?;
    let stop = shutdown_signal();
    let directory =
        aqgate_directory::open(&directory_args.config()?).await.map_err(|e| anyhow::anyhow!("directory: {e}"))?;
    let topology = match (topology, no_topology) {
        (_, true) => None,
        (Some(p), _) => Some(std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?),
        (None, false) => Some(aqgate_admin::DEFAULT_TOPOLOGY.to_string()),
    };
    let cfg = ServeConfig {
        listen,
        database_url: db.database,
        topology,
        engine: EngineConfig {
            max_wait: Duration::from_secs(max_wait),
            session_timeout: Duration::from_secs(session_timeout),
            tombstone_ttl: Duration::from_secs(session_tombstone_ttl),
            idempotency_window: Duration::from_secs(idempotency_window),
            buffered: aqgate_core::engine::BufferConfig {
                max_messages: buffered_max_messages,
                spill_bytes: buffered_spill_bytes,
                max_bytes: buffered_max_bytes,
                spill_after: Duration::from_secs(buffered_spill_after),
            },
            max_recipients: usize::try_from(max_recipients).unwrap_or(usize::MAX),
            max_long_polls_per_agent: usize::try_from(max_long_polls_per_agent).unwrap_or(usize::MAX),
            conditions: aqgate_core::engine::ConditionLimits {
                limits: aqgate_proto::selector::Limits {
                    max_steps: condition_max_steps,
                    max_text_bytes: usize::try_from(condition_max_text_bytes).unwrap_or(usize::MAX),
                },
                request_steps: condition_request_steps,
            },
            shares: aqgate_core::engine::Shares {
                max_sessions,
                max_sessions_per_agent: usize::try_from(max_sessions_per_agent).unwrap_or(usize::MAX),
                idempotency_max_response_bytes: usize::try_from(idempotency_max_response_bytes).unwrap_or(usize::MAX),
                idempotency_max_records_per_agent,
                idempotency_max_bytes_per_agent,
            },
            directory: Some(directory.clone()),
            notify_policy: std::sync::Arc::new(
                aqgate_notify::Policy::parse(&notify_args.notify_allow).map_err(|e| anyhow::anyhow!(e))?,
            ),
            notify_mail_policy: std::sync::Arc::new(notify_args.mail_policy()?),
            remote_spaces: Some(std::sync::Arc::new(aqgate_propagate::RemoteSpaceClients::default())),
            ..EngineConfig::default()
        },
        limits: Limits {
            max_bytes: max_body,
            max_recipients: usize::try_from(max_recipients).unwrap_or(usize::MAX),
            ..Limits::default()
        },
        tick: Duration::from_secs(1),
        vacuum_every: Duration::from_secs(vacuum_every),
        propagation_lease: aqgate_propagate::LeaseConfig::new(Duration::from_secs(propagation_lease_ttl))
            .broker_max_message_bytes(broker_max_message_bytes),
        secure_cookie,
        console,
        tls: tls_files,
        plain_listen: tls.plain_listen,
        saml,
        notify: if notify_args.no_notify { None } else { Some(notify_args.config(&mail_args, directory.clone())?) },
        edge: edge.edge(),
        body_timeout: Duration::from_secs(edge.http_body_timeout),
        passwords: edge.passwords(),
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| {
        anyhow::anyhow!("cannot listen for HTTP on {} (--listen, AQGATE_LISTEN, http.listen): {e}", cfg.listen)
    })?;
    let mail = if mail_args.no_smtp {
        None
    } else {
        Some(mail_config(&mail_args, directory_args.ldap_url.is_some(), directory.clone()).await?)
    };
    crate::server::serve(cfg, listener, mail, stop).await
}

/// `aqgate smtp`: the SMTP filter and its forwarding worker, posting to a servlet elsewhere.
pub async fn smtp(a: SmtpArgs) -> anyhow::Result<()> {
    let SmtpArgs { db, servlet_url, directory: directory_args, mail: mail_args } = a;
    if mail_args.no_smtp {
        anyhow::bail!(
            "the smtp command runs the SMTP filter alone: --no-smtp (smtp.enabled = false) leaves it nothing to run"
        );
    }
    let stop = shutdown_signal();
    let directory =
        aqgate_directory::open(&directory_args.config()?).await.map_err(|e| anyhow::anyhow!("directory: {e}"))?;
    let mail = mail_config(&mail_args, directory_args.ldap_url.is_some(), directory).await?;
    crate::server::smtp_only(&db.database, servlet_url, mail, stop).await
}

/// `aqgate notify`: the notification dispatcher alone.
pub async fn notify(a: NotifyCommandArgs) -> anyhow::Result<()> {
    let NotifyCommandArgs { db, poll_ms, directory: directory_args, mail: mail_args, notify: notify_args } = a;
    if notify_args.no_notify {
        anyhow::bail!(
            "the notify command runs the notification dispatcher alone: --no-notify (notify.enabled = false) leaves it nothing to run"
        );
    }
    let stop = shutdown_signal();
    let directory =
        aqgate_directory::open(&directory_args.config()?).await.map_err(|e| anyhow::anyhow!("directory: {e}"))?;
    let cfg = notify_args.config(&mail_args, directory)?;
    crate::server::notify_only(&db.database, cfg, Duration::from_millis(poll_ms.max(10)), stop).await
}

/// The TEST ONLY CA and CRL that sign the demo agents' certificates (certs/).
const DEMO_CA: &[u8] = include_bytes!("../certs/ca.pem");
const DEMO_CRL: &[u8] = include_bytes!("../certs/ca.crl");
/// The TEST ONLY demo gateway S/MIME certificate and key (certs/), aq@localhost.
const DEMO_GATEWAY_CERT: &[u8] = include_bytes!("../certs/gateway-smime.pem");
const DEMO_GATEWAY_KEY: &[u8] = include_bytes!("../certs/gateway-smime.key.pem");

async fn mail_config(
    a: &MailArgs,
    real_directory: bool,
    directory: std::sync::Arc<dyn aqgate_directory::Directory>,
) -> anyhow::Result<crate::server::MailConfig> {
    use aqgate_mail::smime::TrustStore;
    let trust = if a.smime_ca.is_empty() {
        // The demo CA is only a default next to the demo directory: a real directory needs
        // a real CA, said explicitly.
        anyhow::ensure!(
            !real_directory,
            "--ldap-url needs --smime-ca (the CA agent certificates chain to), or --no-smtp"
        );
        tracing::warn!("SMTP filter trusts the TEST ONLY demo CA (certs/ca.pem); use --smime-ca in production");
        TrustStore::from_pem(&[DEMO_CA], &[DEMO_CRL]).map_err(|e| anyhow::anyhow!("demo CA: {e}"))?
    } else {
        TrustStore::from_pem_files(&a.smime_ca, &a.smime_crl).map_err(|e| anyhow::anyhow!("S/MIME trust: {e}"))?
    };
    for issuer in trust.intermediate_crl_issuers() {
        tracing::info!(%issuer, "CRL of an intermediate CA (no --smime-ca issued it): applies to the intermediate of that name that mails carry");
    }
    let gateway_password = match (&a.gateway_password_file, std::env::var("AQGATE_GATEWAY_PASSWORD").ok()) {
        (Some(f), _) => std::fs::read_to_string(f)
            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
            .trim_end_matches(['\r', '\n'])
            .to_string(),
        (None, Some(p)) => p,
        (None, None) => {
            tracing::warn!("SMTP filter uses the DEMO gateway password; set AQGATE_GATEWAY_PASSWORD");
            "gateway-demo".to_string()
        }
    };
    let addresses: Vec<String> = a.gateway_addresses.iter().map(|x| x.trim().to_ascii_lowercase()).collect();
    let reply_from = addresses.first().cloned().ok_or_else(|| anyhow::anyhow!("--gateway-address is empty"))?;
    let identity = gateway_identity(a, real_directory, &reply_from)?;
    let tls = match (&a.smtp_tls_cert, &a.smtp_tls_key) {
        (Some(c), Some(k)) => {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
            Some(aqgate_mail::acceptor::tls_acceptor(&read(c)?, &read(k)?).map_err(|e| anyhow::anyhow!(e))?)
        }
        (None, None) => None,
        // Flags and the environment are checked by clap; the configuration file here.
        _ => anyhow::bail!("STARTTLS needs both --smtp-tls-cert and --smtp-tls-key (smtp.tls_cert, smtp.tls_key)"),
    };
    let smtp_listener = tokio::net::TcpListener::bind(a.smtp_listen).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen for SMTP on {} (--smtp-listen, AQGATE_SMTP_LISTEN, smtp.listen; --no-smtp for none): {e}",
            a.smtp_listen
        )
    })?;
    Ok(crate::server::MailConfig {
        smtp_listener,
        smtp: aqgate_mail::smtp::SmtpConfig {
            hostname: a.smtp_hostname.clone(),
            gateway_addresses: addresses,
            reinject: match &a.smtp_reinject {
                Some(url) => Some(aqgate_mail::reinject::parse_target(url).map_err(|e| anyhow::anyhow!(e))?),
                None => None,
            },
            max_message_size: a.smtp_max_size,
            idle_timeout: Duration::from_secs(300),
            mail_timeout: Duration::from_secs(a.smtp_mail_timeout),
            data_timeout: Duration::from_secs(a.smtp_data_timeout),
            spool: aqgate_mail::data::DataSpool::new(
                a.smtp_data_dir.clone().unwrap_or_else(std::env::temp_dir),
                a.smtp_data_memory,
                usize::try_from(a.smtp_max_large_messages).unwrap_or(usize::MAX),
            ),
            max_connections: usize::try_from(a.smtp_max_connections).unwrap_or(usize::MAX),
            max_per_client: usize::try_from(a.smtp_max_per_client).unwrap_or(usize::MAX),
            per_client_exempt: aqgate_mail::limits::parse_exempt(&a.smtp_per_client_exempt)
                .map_err(|e| anyhow::anyhow!("--smtp-per-client-exempt: {e}"))?,
            // Registered with the process's metrics when the filter starts.
            counters: aqgate_mail::limits::SmtpCounters::default(),
            starttls: tls.is_some(),
            max_session: Duration::from_secs(1800),
            lmtp: a.lmtp,
        },
        tls,
        trust,
        directory,
        gateway_agent: a.gateway_agent.clone(),
        gateway_password,
        reply_from,
        transport: mail_transport(a),
        dedupe_window: Duration::from_secs(a.dedupe_window_hours.saturating_mul(3600)),
        identity,
    })
}

/// The gateway's S/MIME certificate and key: given, the demo one next to the demo
/// directory, or none (replies unsigned, encrypted requests refused).
fn gateway_identity(
    a: &MailArgs,
    real_directory: bool,
    reply_from: &str,
) -> anyhow::Result<Option<std::sync::Arc<aqgate_mail::smime::GatewayIdentity>>> {
    use aqgate_mail::smime::GatewayIdentity;
    let identity = match (&a.smime_reply_cert, &a.smime_reply_key) {
        (Some(c), Some(k)) => {
            GatewayIdentity::from_pem_files(c, k).map_err(|e| anyhow::anyhow!("--smime-reply-cert: {e}"))?
        }
        (None, None) if !real_directory => {
            tracing::warn!(
                "replies are signed with the TEST ONLY demo gateway certificate (certs/gateway-smime.pem); use --smime-reply-cert in production"
            );
            GatewayIdentity::from_pem(DEMO_GATEWAY_CERT, DEMO_GATEWAY_KEY)
                .map_err(|e| anyhow::anyhow!("demo gateway certificate: {e}"))?
        }
        (None, None) => {
            tracing::warn!("no --smime-reply-cert: replies are not signed, and encrypted requests are refused");
            return Ok(None);
        }
        // Flags and the environment are checked by clap; the configuration file here.
        _ => anyhow::bail!(
            "the gateway certificate needs both --smime-reply-cert and --smime-reply-key (smime.reply_cert, smime.reply_key)"
        ),
    };
    if !identity.emails().iter().any(|e| e == reply_from) {
        tracing::warn!(reply_from, emails = ?identity.emails(), "replies come from an address that is not the gateway certificate's: mail clients will not show them as signed by it");
    }
    Ok(Some(std::sync::Arc::new(identity)))
}

/// Registers the handlers for SIGTERM and SIGINT at once (so a signal that arrives while
/// the service is still starting — migrations, topology — is not the default "die" but a
/// graceful stop as soon as it serves) and resolves when one arrives.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(int) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutting down");
    }
}
