//! Wiring for `aqgate serve`: open the store, apply the topology, start the engine's
//! background duties and the servlet, and shut down gracefully.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use aqgate_core::clock::SystemClock;
use aqgate_core::engine::{Engine, EngineConfig};
use aqgate_core::topology::Topology;
use aqgate_http::servlet::{AppState, app};
use aqgate_proto::idap::Limits;

/// The SMTP ingestion filter and its forwarding worker.
pub struct MailConfig {
    pub smtp_listener: TcpListener,
    pub smtp: aqgate_mail::smtp::SmtpConfig,
    /// STARTTLS is offered when set.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub trust: aqgate_mail::smime::TrustStore,
    pub directory: Arc<dyn aqgate_directory::Directory>,
    pub gateway_agent: String,
    pub gateway_password: String,
    pub reply_from: String,
    pub transport: aqgate_mail::worker::ReplyTransport,
    /// How long finished mails are remembered for deduplication.
    pub dedupe_window: Duration,
    /// The gateway's S/MIME certificate and key (signs replies, decrypts requests).
    pub identity: Option<Arc<aqgate_mail::smime::GatewayIdentity>>,
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub database_url: String,
    /// Topology file text to apply at start (`None`: keep what the store has).
    pub topology: Option<String>,
    pub engine: EngineConfig,
    pub limits: Limits,
    pub tick: Duration,
    /// How often the store's own tables are vacuumed when due (`Store::vacuum`); zero: never.
    pub vacuum_every: Duration,
    /// Propagation jobs' leases: how long, and this process's name in them.
    pub propagation_lease: aqgate_propagate::LeaseConfig,
    /// Session cookies get `Secure` (behind an HTTPS proxy; over HTTPS they always do).
    pub secure_cookie: bool,
    /// Serve HTTPS on `listen` with these files.
    pub tls: Option<aqgate_http::https::TlsFiles>,
    /// A plain-HTTP listener beside the HTTPS one.
    pub plain_listen: Option<SocketAddr>,
    /// Serve the web console on listeners beyond loopback too (`--console`).
    pub console: bool,
    /// SAML login (`None`: off).
    pub saml: Option<std::sync::Arc<aqgate_http::servlet::SamlVerifier>>,
    /// The notification dispatcher; `None` runs without one (e.g. `aqgate notify` elsewhere).
    pub notify: Option<aqgate_notify::NotifyConfig>,
    /// The listeners' connection caps and timeouts.
    pub edge: aqgate_http::edge::EdgeConfig,
    /// A request body not received whole within this is answered 408.
    pub body_timeout: Duration,
    /// Bounds on password checks.
    pub passwords: aqgate_http::servlet::PasswordLimits,
}

/// Runs until `shutdown` resolves; in-flight requests finish first. The phases: the
/// SQLite lock, the engine on its store ([`start_engine`]), its background duties
/// ([`Duties::start`]), the listeners ([`Listeners::bind`]), the mail tasks, the servlet's
/// state ([`servlet_state`]) and its reloads ([`spawn_reloader`]), serving until
/// `shutdown` ([`Listeners::serve`]), then the duties stopped and awaited.
pub async fn serve(
    cfg: ServeConfig,
    listener: TcpListener,
    mail: Option<MailConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Held until the server ends (and let go by the OS if it dies).
    let _sole = aqgate_store::sqlite::sole_server(&cfg.database_url).map_err(|e| anyhow::anyhow!(e))?;
    // Connections are files: as many as the system allows, and the cap below half of them.
    let mut edge_cfg = cfg.edge.clone();
    edge_cfg.max_connections =
        aqgate_http::edge::fit_to_nofile(edge_cfg.max_connections, aqgate_http::edge::raise_nofile());
    let engine = start_engine(&cfg).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // The control plane: changes in the store ask for a reload (`spawn_reloader`).
    let (changed_tx, changed_rx) = tokio::sync::mpsc::channel(1);
    let duties = Duties::start(&engine, &cfg, _sole.is_some(), changed_tx, &stop_rx).await?;
    let listeners = Listeners::bind(&cfg, listener, mail.is_some()).await?;
    let mail_tasks = match mail {
        Some(m) => start_mail(engine.clone(), listeners.servlet_url()?, m, stop_rx.clone())?,
        None => Vec::new(),
    };
    let state = servlet_state(&engine, &cfg, edge_cfg);
    spawn_reloader(&engine, &state, listeners.tls.clone(), cfg.propagation_lease.agent.clone(), changed_rx);
    let served = listeners.serve(state, cfg.console, shutdown).await?;
    let _ = stop_tx.send(true);
    duties.join().await;
    for t in mail_tasks {
        let _ = t.await;
    }
    served
}

/// The store opened (its counters in the process's one metrics registry, which the engine
/// and the dispatcher share and the servlet renders), the topology file applied when one
/// is given (leaving out the jobs an operator removed), and the engine started on it.
async fn start_engine(cfg: &ServeConfig) -> anyhow::Result<Arc<Engine>> {
    let engine_cfg = cfg.engine.clone();
    let store = aqgate_store::open_with(&cfg.database_url, &engine_cfg.metrics).await?;
    if let Some(text) = &cfg.topology {
        let topo = Topology::from_toml(text).map_err(|e| anyhow::anyhow!("topology: {}", e.join("; ")))?;
        let (changes, left_out) = aqgate_admin::apply_at_start(store.as_ref(), &topo).await?;
        for c in &changes {
            tracing::info!(change = %c, "topology");
        }
        for job in &left_out {
            tracing::warn!(
                job = %job,
                "the topology file names a job removed with `admin jobs --remove`: not re-created \
                 (`admin apply FILE` re-creates it)"
            );
        }
    }
    Ok(Engine::start(store, Arc::new(SystemClock), engine_cfg).await?)
}

/// The engine's background duties, each a task that ends when `stop` changes.
struct Duties {
    time_manager: tokio::task::JoinHandle<()>,
    jobs: tokio::task::JoinHandle<()>,
    control: tokio::task::JoinHandle<()>,
    notifier: Option<tokio::task::JoinHandle<()>>,
}

impl Duties {
    /// Starts the time manager; takes over the propagation leases an earlier run left
    /// (all of them when alone on a SQLite file, else those of dead processes on this
    /// host); starts the control plane (which sends on `changed` when the store changed),
    /// the propagation jobs and the notification dispatcher (if configured).
    async fn start(
        engine: &Arc<Engine>,
        cfg: &ServeConfig,
        sole: bool,
        changed: tokio::sync::mpsc::Sender<()>,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        let time_manager = tokio::spawn(time_manager(engine.clone(), cfg.tick, stop.clone()));
        // The database's health, checked every second (readiness, `/metrics`, the duties).
        tokio::spawn(aqgate_store::health::prober(engine.store().clone(), stop.clone()));
        if !cfg.vacuum_every.is_zero() {
            tokio::spawn(aqgate_store::health::vacuumer(engine.store().clone(), cfg.vacuum_every, stop.clone()));
        }
        if sole {
            // Alone on the SQLite file: a lease still held is a killed process's, taken over now
            // rather than when it ends.
            let n = engine.store().job_leases_clear(None).await?;
            if n > 0 {
                tracing::info!(jobs = n, "ended the propagation leases of an earlier run");
            }
        } else {
            // Leases of an earlier run on this host that is dead (this one restarted after a
            // kill): taken over now, not after their lease time.
            aqgate_propagate::lease::end_dead_local_leases(engine.store().as_ref(), &cfg.propagation_lease.owner).await;
        }
        let control = tokio::spawn(aqgate_propagate::control::run(
            engine.clone(),
            cfg.propagation_lease.agent.clone(),
            (cfg.propagation_lease.ttl, aqgate_propagate::control::POLL),
            changed,
            stop.clone(),
        ));
        let jobs = tokio::spawn(aqgate_propagate::run(
            engine.clone(),
            Duration::from_secs(1),
            cfg.propagation_lease.clone(),
            stop.clone(),
        ));
        let notifier = match cfg.notify.clone() {
            Some(n) => {
                let d = aqgate_notify::Dispatcher::new(engine.clone(), n).map_err(|e| anyhow::anyhow!(e))?;
                Some(tokio::spawn(d.run(stop.clone())))
            }
            None => None,
        };
        Ok(Self { time_manager, jobs, control, notifier })
    }

    /// Waits for every duty to end (after `stop` changed).
    async fn join(self) {
        let _ = self.time_manager.await;
        let _ = self.jobs.await;
        let _ = self.control.await;
        if let Some(n) = self.notifier {
            let _ = n.await;
        }
    }
}

/// The servlet's listeners: the main one (HTTPS when `tls`), a plain-HTTP one beside it
/// (`--plain-listen`), and the in-process mail worker's own loopback one when HTTPS has
/// no plain listener beside it.
struct Listeners {
    main: TcpListener,
    tls: Option<aqgate_http::https::Reloadable>,
    plain: Option<TcpListener>,
    internal: Option<TcpListener>,
}

impl Listeners {
    /// Loads the TLS files and binds the listeners beside `main` (`mail`: the mail worker
    /// runs in this process).
    async fn bind(cfg: &ServeConfig, main: TcpListener, mail: bool) -> anyhow::Result<Self> {
        let tls = cfg.tls.clone().map(aqgate_http::https::Reloadable::load).transpose()?;
        let plain = match cfg.plain_listen {
            Some(a) => Some(TcpListener::bind(a).await.map_err(|e| anyhow::anyhow!("--plain-listen {a}: {e}"))?),
            None => None,
        };
        // The in-process mail worker posts to the servlet over plain HTTP on loopback: the
        // plain listener, or one of its own on an ephemeral loopback port beside HTTPS.
        let internal = match (&tls, &plain, mail) {
            (Some(_), None, true) => Some(TcpListener::bind("127.0.0.1:0").await?),
            _ => None,
        };
        Ok(Self { main, tls, plain, internal })
    }

    /// Where the in-process mail worker posts its requests.
    fn servlet_url(&self) -> anyhow::Result<String> {
        let http = match (&self.plain, &self.internal) {
            (Some(l), _) | (None, Some(l)) => l.local_addr()?,
            (None, None) => self.main.local_addr()?,
        };
        let host = if http.ip().is_unspecified() { "127.0.0.1".to_string() } else { http.ip().to_string() };
        Ok(format!("http://{host}:{}/aqserv", http.port()))
    }

    /// Serves the servlet on every listener until `shutdown` resolves and their requests
    /// have finished. The outer error: the main listener's task failed; the inner one is
    /// what serving on it ended with.
    async fn serve(
        self,
        state: AppState,
        console: bool,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<anyhow::Result<()>> {
        let edge = state.edge.clone();
        // One shutdown signal for every listener.
        let (down_tx, down_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = down_tx.send(true);
        });
        let down = move || {
            let mut rx = down_rx.clone();
            async move {
                let _ = rx.wait_for(|d| *d).await;
            }
        };
        let listening = [Some(self.main.local_addr()?), self.plain.as_ref().and_then(|l| l.local_addr().ok())];
        let router = aqgate_console::mount(
            app(state.clone()),
            state,
            &listening.into_iter().flatten().collect::<Vec<_>>(),
            console,
        );
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(addr = %self.main.local_addr()?, scheme, "aqgate servlet listening");
        let main = match self.tls {
            Some(t) => tokio::spawn(aqgate_http::https::serve(self.main, t, router.clone(), edge.clone(), down())),
            None => tokio::spawn(aqgate_http::https::serve_plain(self.main, router.clone(), edge.clone(), down())),
        };
        let mut others = Vec::new();
        if let Some(l) = self.plain {
            tracing::info!(addr = %l.local_addr()?, "aqgate servlet listening (plain HTTP)");
            others.push(tokio::spawn(aqgate_http::https::serve_plain(l, router.clone(), edge.clone(), down())));
        }
        if let Some(l) = self.internal {
            others.push(tokio::spawn(aqgate_http::https::serve_plain(l, router.clone(), edge.clone(), down())));
        }
        let served = main.await.map_err(|e| anyhow::anyhow!("servlet task: {e}"))?;
        for o in others {
            let _ = o.await;
        }
        Ok(served)
    }
}

/// The servlet's state: the engine, the request limits, cookies, SAML, the body timeout,
/// the listeners' connection bounds, the password checks' bounds, and the propagation
/// gauges `/metrics` adds.
fn servlet_state(engine: &Arc<Engine>, cfg: &ServeConfig, edge_cfg: aqgate_http::edge::EdgeConfig) -> AppState {
    let mut state = AppState::new(engine.clone(), cfg.limits);
    state.secure_cookie = cfg.secure_cookie;
    state.saml = cfg.saml.clone();
    state.body_timeout = cfg.body_timeout;
    state.edge = aqgate_http::edge::Connections::new(edge_cfg, &engine.config().metrics);
    state.passwords =
        Arc::new(aqgate_http::servlet::PasswordGate::new(cfg.passwords.clone(), &engine.config().metrics));
    state.more_metrics = Some(propagation_metrics());
    state
}

/// The topology is reloaded (and the directory cache dropped) on SIGHUP and when the
/// control plane sees a change in the store (`propagate::control`, through `changed`);
/// SIGHUP also reloads the TLS files.
fn spawn_reloader(
    engine: &Arc<Engine>,
    state: &AppState,
    tls: Option<aqgate_http::https::Reloadable>,
    agent: Arc<aqgate_propagate::control::Agent>,
    mut changed: tokio::sync::mpsc::Receiver<()>,
) {
    let engine = engine.clone();
    let credentials = state.credentials.clone();
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            let signalled = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let signalled = std::future::pending::<bool>();
            let hangup = tokio::select! {
                s = signalled => {
                    if !s {
                        return;
                    }
                    true
                }
                c = changed.recv() => {
                    if c.is_none() {
                        return;
                    }
                    false
                }
            };
            reload(&engine, &credentials, &agent).await;
            if hangup && let Some(t) = &tls {
                match t.reload() {
                    Ok(()) => tracing::info!("TLS certificate, key and client CAs reloaded"),
                    Err(e) => tracing::warn!(error = %e, "TLS reload failed; keeping the old certificate"),
                }
            }
        }
    });
}

/// Starts the SMTP filter and its forwarding worker; they stop when `stop` changes.
pub fn start_mail(
    engine: Arc<Engine>,
    servlet_url: String,
    mut m: MailConfig,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    m.smtp.counters = aqgate_mail::limits::SmtpCounters::register(&engine.config().metrics);
    let clock: Arc<dyn aqgate_core::clock::Clock> = Arc::new(SystemClock);
    let claim_owner = aqgate_propagate::lease::process_owner();
    {
        // Mail a dead predecessor on this host had claimed: forwarded now, not after the claim.
        let (store, me, now) = (engine.store().clone(), claim_owner.clone(), clock.now());
        tokio::spawn(async move { aqgate_propagate::lease::end_dead_local_claims(store.as_ref(), &me, now).await });
    }
    let worker = Arc::new(aqgate_mail::worker::Worker::new(
        engine.store().clone(),
        clock.clone(),
        aqgate_mail::worker::WorkerConfig {
            servlet_url,
            gateway_agent: m.gateway_agent,
            gateway_password: m.gateway_password,
            reply_from: m.reply_from,
            transport: m.transport,
            max_attempts: 20,
            dedupe_window: m.dedupe_window,
            identity: m.identity.clone(),
            claim_owner,
        },
    ));
    let gateway = aqgate_mail::acceptor::MailAcceptor {
        engine,
        directory: m.directory,
        trust: Arc::new(m.trust),
        clock,
        wake: worker.wake.clone(),
        reinject: m.smtp.reinject.as_ref().map(|addr| aqgate_mail::reinject::Reinjector {
            addr: addr.clone(),
            helo: m.smtp.hostname.clone(),
            timeout: std::time::Duration::from_secs(60),
        }),
        replay_window: m.dedupe_window,
        identity: m.identity,
    };
    if let Some(r) = &gateway.reinject {
        tracing::info!(to = %r.addr, "mail for other recipients is handed on (reinjected)");
    }
    tracing::info!(addr = %m.smtp_listener.local_addr()?, "aqgate SMTP filter listening");
    Ok(vec![
        tokio::spawn(aqgate_mail::acceptor::serve_smtp(
            m.smtp_listener,
            m.smtp,
            m.tls,
            Arc::new(gateway),
            stop.clone(),
        )),
        tokio::spawn(worker.run(stop)),
    ])
}

/// `aqgate smtp`: the SMTP filter and worker alone, posting to a servlet elsewhere. The
/// process shares the store (spool, topology) with that servlet.
pub async fn smtp_only(
    database_url: &str,
    servlet_url: String,
    mail: MailConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let store = aqgate_store::open(database_url).await?;
    let engine = Engine::attach(store.clone(), Arc::new(SystemClock), EngineConfig::default()).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(aqgate_store::health::prober(store, stop_rx.clone()));
    let tasks = start_mail(engine, servlet_url, mail, stop_rx)?;
    shutdown.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// `aqgate notify`: the notification dispatcher alone, on a store a servlet elsewhere
/// writes. On PostgreSQL commits of other processes wake it (LISTEN/NOTIFY); on SQLite,
/// which has no such channel between processes, it also looks every `poll`.
pub async fn notify_only(
    database_url: &str,
    cfg: aqgate_notify::NotifyConfig,
    poll: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let store = aqgate_store::open(database_url).await?;
    let engine = Engine::attach(store.clone(), Arc::new(SystemClock), EngineConfig::default()).await?;
    let mut cfg = cfg;
    match store.listen().await? {
        Some(rx) => forward_wakeups(&engine, rx),
        None => cfg.fallback_poll = Some(poll),
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(aqgate_store::health::prober(store, stop_rx.clone()));
    let d = aqgate_notify::Dispatcher::new(engine, cfg).map_err(|e| anyhow::anyhow!(e))?;
    let task = tokio::spawn(d.run(stop_rx));
    tracing::info!("aqgate notification dispatcher running");
    shutdown.await;
    let _ = stop_tx.send(true);
    let _ = task.await;
    Ok(())
}

/// Reloads the topology and drops the directory cache; the verified credentials are
/// forgotten only when an agent's password changed (a reload that changes none of them,
/// such as the control plane's first look at start, keeps them).
async fn reload(
    engine: &Engine,
    credentials: &aqgate_core::auth::CredentialCache,
    agent: &aqgate_propagate::control::Agent,
) {
    let passwords = |e: &Engine| -> Vec<(String, Option<String>)> {
        e.resolved().catalog.agents.iter().map(|(n, a)| (n.clone(), a.password_hash.clone())).collect()
    };
    let before = passwords(engine);
    match engine.reload().await {
        Ok(()) => {
            if passwords(engine) != before {
                credentials.clear();
            }
            if let Some(d) = &engine.config().directory {
                d.invalidate();
            }
            tracing::info!("topology reloaded, directory cache dropped");
        }
        Err(e) => {
            tracing::warn!(error = %e, "topology reload failed; keeping the old one");
            agent.failed(&format!("reloading the topology: {}", e.message), engine.now());
        }
    }
    agent.reloaded();
}

/// What `/metrics` adds to the servlet's own figures: the propagation jobs' and the gateway
/// links' gauges, from the administration read model (`aqgate_admin::status`).
fn propagation_metrics() -> aqgate_http::servlet::MoreMetrics {
    Arc::new(|engine| Box::pin(async move { aqgate_admin::status::metrics(&engine).await }))
}

/// The engine's background duties, scheduled: a round of the time manager every `tick`
/// (the purge of ended sessions at most once a minute), and cross-process wake-ups from
/// the store's listener. Runs until `shutdown` changes.
pub async fn time_manager(engine: Arc<Engine>, tick: Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    if let Ok(Some(rx)) = engine.store().listen().await {
        forward_wakeups(&engine, rx);
    }
    let mut interval = tokio::time::interval(tick);
    let mut purged: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !engine.store().health().available {
            // The store logged the outage: the rounds wait for the database to be back.
            continue;
        }
        let purge = purged.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
        engine.time_manager_round(purge).await;
        if engine.store().writes_refused() {
            // Finds out that space was freed even when no request writes.
            let _ = engine.store().probe_write().await;
        }
        if purge {
            purged = Some(tokio::time::Instant::now());
        }
    }
}

/// Wakes the engine's waiters on each queue the store's listener signals (commits of other
/// processes), until the listener ends.
fn forward_wakeups(engine: &Arc<Engine>, mut rx: tokio::sync::mpsc::Receiver<aqgate_core::store::QueueId>) {
    let engine = engine.clone();
    tokio::spawn(async move {
        while let Some(q) = rx.recv().await {
            engine.wake(q);
        }
    });
}
