//! The web console: server-rendered pages (askama templates, autoescaped) on the
//! administration read models the CLI uses, served on the HTTP listener at `/console`.
//!
//! - [`serving`]: whether the listener serves it (loopback by default, elsewhere only
//!   when configured).
//! - `session`: console sessions, bounded in number and idle time, in this process.
//! - `caller`: who is asking (a session cookie, or Basic checked through the servlet's
//!   bounded password checks) and the role the topology gives the agent.
//! - `security`: the headers of every answer and the same-origin check of every
//!   state-changing request.
//! - `overview` (the live overview, its fragments and event stream) over `sampler` (one
//!   sampler of the store's figures for every viewer).
//! - `pages`, `messages`, `payload`: the pages (`answer`: what they share); `assets`: the stylesheet and the script,
//!   embedded in the binary.
//! - `timeline`, `replay`, `operations`: a message's timeline, replays and the audit log,
//!   the IDAP sessions, the mail spool and the notifications; `cli`: the `aqgate admin`
//!   command line of an action ("Copy as CLI").
//! - `filter`: the listing's filters; `tester`: the condition tester; `publish`: the
//!   publish form; `topology`: the topology graph.
//!
//! The console reaches the store only through the core's `Store` trait and the
//! administration read models; it reads messages as a BROWSE does (no lock, no retry
//! count, no redelivery).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use aqgate_http::servlet::AppState;

mod answer;
mod assets;
mod caller;
mod cli;
mod filter;
mod messages;
mod operations;
mod overview;
mod pages;
mod payload;
mod publish;
mod replay;
mod sampler;
mod security;
pub mod serving;
mod session;
mod tester;
mod timeline;
mod topology;

pub use caller::COOKIE;

/// The console's bounds on its sessions.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// Sessions held at once; a login past it ends the least recently used one.
    pub max_sessions: usize,
    /// A session unused this long ends.
    pub idle: Duration,
    /// The live overview's sampling interval (clamped to 1–10 s).
    pub sample_every: Duration,
    /// Event streams (`/console/events`) open at once; one more is answered 503.
    pub max_streams: usize,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            max_sessions: 1_000,
            idle: Duration::from_secs(15 * 60),
            sample_every: Duration::from_secs(2),
            max_streams: 200,
        }
    }
}

/// What every console handler has: the servlet's state (the engine, the password checks),
/// the console's sessions and its sampler.
#[derive(Clone)]
pub struct Console {
    http: AppState,
    sessions: Arc<session::Sessions>,
    live: Arc<sampler::Sampler>,
    /// The overview's queues fragment, rendered once per agent and sample.
    rendered: Arc<overview::Rendered>,
}

/// `servlet` with the console's routes merged in when the console serves on `listening`
/// (every listener on loopback, or `--console`: [`serving::serves`]).
pub fn mount(servlet: Router, http: AppState, listening: &[std::net::SocketAddr], flag: bool) -> Router {
    if serving::serves(listening, flag) {
        tracing::info!("web console at /console");
        servlet.merge(router(http, ConsoleConfig::default()))
    } else {
        tracing::info!("web console off: the HTTP listener is not on loopback (--console serves it there)");
        servlet
    }
}

/// The console's routes, all under `/console`, to merge into the HTTP listener's router.
pub fn router(http: AppState, cfg: ConsoleConfig) -> Router {
    let state = Console {
        http,
        sessions: Arc::new(session::Sessions::new(cfg.max_sessions, cfg.idle)),
        live: sampler::Sampler::new(cfg.sample_every, cfg.max_streams),
        rendered: Arc::default(),
    };
    Router::new()
        .route("/console", get(overview::page))
        .route("/console/", get(overview::page))
        .route("/console/events", get(overview::events))
        .route("/console/fragments/{name}", get(overview::fragment))
        .route("/console/login", get(caller::login_form).post(caller::login))
        .route("/console/logout", post(caller::logout))
        .route("/console/queues", get(pages::queues))
        .route("/console/queues/{queue}/messages", get(messages::list))
        .route("/console/queues/{queue}/messages/{msg_id}", get(messages::one))
        .route("/console/queues/{queue}/messages/{msg_id}/payload", get(messages::download))
        .route("/console/queues/{queue}/messages/{msg_id}/timeline", get(timeline::page))
        .route("/console/queues/{queue}/replay", get(replay::form).post(replay::run))
        .route("/console/audit", get(replay::audit))
        .route("/console/sessions", get(operations::sessions))
        .route("/console/sessions/{id}/abort", post(operations::abort))
        .route("/console/spool", get(operations::spool))
        .route("/console/notifications", get(operations::notifications))
        .route("/console/queues/{queue}/tester", get(tester::tester))
        .route("/console/queues/{queue}/publish", get(publish::form).post(publish::post))
        .route("/console/topology", get(topology::topology))
        .route("/console/jobs/{job}/{action}", post(pages::job_action))
        .route("/console/agents", get(pages::agents))
        .route("/console/assets/{name}", get(assets::asset))
        .route("/console/{*rest}", axum::routing::any(pages::not_found))
        .layer(axum::middleware::from_fn(security::guard))
        .with_state(state)
}
