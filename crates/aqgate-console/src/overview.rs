//! The live overview: the page (`GET /console/`: per queue its messages by state, the
//! oldest READY one's age and the last hour's enqueues and dequeues as small SVG charts;
//! the spool and notification backlogs; jobs and links), its fragments alone
//! (`GET /console/fragments/{queues|backlog}`; `topology`, the topology page's graph, is
//! `topology`'s), and the event stream that says which fragment changed
//! (`GET /console/events`, Server-Sent Events: `event: overview`, `data: queues`,
//! `data: backlog`, or to an admin `data: topology`, keep-alives every 15 s, at most `max_streams` open,
//! each ended after [`STREAM_LIFE`] for the browser to reconnect through the login
//! check again). The figures are the sampler's (`sampler`), never a count per view; every
//! route is the caller's (viewer and up) and shows only the queues it may see.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use aqgate_core::engine::Resolved;
use aqgate_core::topology::ConsoleRole;

use crate::Console;
use crate::answer::{html, not_found_because, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, messages_href, readable, visible};
use crate::sampler::{BUCKETS, Bucket, Figures, depth};

/// An event stream ends after this (the browser's EventSource opens it again).
pub(crate) const STREAM_LIFE: Duration = Duration::from_secs(300);
/// A comment on an idle stream this often, so that proxies keep it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A small chart of an hour's counts: an SVG polyline's points in a 120×24 box.
pub(crate) struct Chart {
    pub points: String,
    pub total: i64,
    pub label: String,
}

#[allow(clippy::cast_precision_loss)]
fn chart(what: &str, counts: &[i64]) -> Chart {
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let step = 120.0 / (BUCKETS.saturating_sub(1).max(1)) as f64;
    let points = counts
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{:.1},{:.1}", i as f64 * step, 23.0 - 22.0 * (*n as f64) / (max as f64)))
        .collect::<Vec<_>>()
        .join(" ");
    let total = counts.iter().sum();
    Chart { points, total, label: format!("{what} per minute over the last hour, {total} in all, at most {max}") }
}

/// One queue's line of the live table.
pub(crate) struct LiveLine {
    pub name: String,
    pub href: Option<String>,
    pub kind: &'static str,
    pub payload: String,
    pub ready: i64,
    pub waiting: i64,
    pub expired: i64,
    pub depth: i64,
    pub oldest: String,
    pub enq: Chart,
    pub deq: Chart,
}

#[derive(Template)]
#[template(path = "live_queues.html")]
struct QueuesFragment {
    queues: Vec<LiveLine>,
    state: LiveState,
}

/// What the fragments say of the sampler itself.
pub(crate) struct LiveState {
    pub known: bool,
    pub failed: bool,
    /// Queues the caller sees beyond the [`SHOWN`] deepest (the queue list has them all).
    pub more: usize,
}

/// Queues the overview shows at most: the deepest, by name; the queue list pages through
/// the rest. (A page and a fragment stay small with 10,000 queues.)
const SHOWN: usize = 50;

pub(crate) struct Backlog {
    pub spool: i64,
    pub notify_pending: i64,
    pub notify_parked: i64,
}

#[derive(Template)]
#[template(path = "live_backlog.html")]
struct BacklogFragment {
    backlog: Backlog,
}

/// The [`SHOWN`] deepest queues the caller sees, from the sampler's figures, by name; and
/// how many more it sees.
fn lines(c: &Console, who: &Caller, f: &Figures) -> (Vec<LiveLine>, usize) {
    let r = c.http.engine.resolved();
    let reader = who.role >= ConsoleRole::Reader;
    let mut picked: Vec<_> = r
        .catalog
        .queues
        .values()
        .filter(|q| visible(c, &who.agent, &q.name))
        .map(|q| (q, r.ids.get(&q.name).and_then(|id| f.queues.get(id)).map(|t| &**t)))
        .collect();
    let more = picked.len().saturating_sub(SHOWN);
    if more > 0 {
        let deep = |t: Option<&crate::sampler::Track>| t.map_or(0, |t| depth(&t.now));
        picked.sort_by(|a, b| deep(b.1).cmp(&deep(a.1)).then_with(|| a.0.name.cmp(&b.0.name)));
        picked.truncate(SHOWN);
        picked.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    }
    let lines = picked
        .into_iter()
        .map(|(q, track)| {
            let now = track.map(|t| t.now).unwrap_or_default();
            let hour = track.map_or_else(|| vec![Bucket::default(); BUCKETS], |t| t.hour(f.minute));
            let enq: Vec<i64> = hour.iter().map(|b| b.enqueued).collect();
            let deq: Vec<i64> = hour.iter().map(|b| b.dequeued).collect();
            LiveLine {
                href: (reader && readable(c, &who.agent, &q.name)).then(|| messages_href(&q.name)),
                name: q.name.clone(),
                kind: aqgate_admin::topology::kind(q),
                payload: q.payload.to_string(),
                ready: now.ready,
                waiting: now.waiting,
                expired: now.expired,
                depth: depth(&now),
                oldest: now.oldest_ready.map_or_else(
                    || "-".to_string(),
                    |t| format!("{:.0} s", aqgate_admin::figures::age_seconds(f.at, Some(t))),
                ),
                enq: chart("Enqueued", &enq),
                deq: chart("Dequeued", &deq),
            }
        })
        .collect();
    (lines, more)
}

fn backlog(f: &Figures) -> Backlog {
    Backlog { spool: f.spool, notify_pending: f.notify_pending, notify_parked: f.notify_parked }
}

/// The queues fragment as rendered for one agent and role, at one sample of one topology:
/// every tab of that agent with that role shares it, so a sample costs one render per
/// agent watching, however many tabs it has open (the first asks, the others wait for it).
#[derive(Default)]
pub(crate) struct Rendered {
    slots: std::sync::Mutex<BTreeMap<(String, ConsoleRole), Arc<Slot>>>,
}

struct Slot {
    generation: u64,
    /// Held, so that its address is not another topology's while the slot lives.
    topology: Arc<Resolved>,
    html: tokio::sync::OnceCell<Option<Arc<str>>>,
}

/// Agents whose render is kept at most (past it, the kept ones are dropped).
const RENDERED_MAX: usize = 256;

impl Rendered {
    /// The queues fragment for `who`, as of the sampler's last sample; `None` when it did
    /// not render (logged).
    async fn queues(&self, c: &Console, who: &Caller) -> Option<Arc<str>> {
        let f = c.live.figures();
        let r = c.http.engine.resolved();
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let key = (who.agent.name.clone(), who.role);
            match slots.get(&key) {
                Some(s) if s.generation == f.generation && Arc::ptr_eq(&s.topology, &r) => s.clone(),
                _ => {
                    if slots.len() >= RENDERED_MAX {
                        slots.clear();
                    }
                    let s =
                        Arc::new(Slot { generation: f.generation, topology: r, html: tokio::sync::OnceCell::new() });
                    slots.insert(key, s.clone());
                    s
                }
            }
        };
        slot.html
            .get_or_init(|| async {
                let (queues, more) = lines(c, who, &f);
                let t = QueuesFragment { queues, state: LiveState { known: f.sampled, failed: f.failed, more } };
                match t.render() {
                    Ok(h) => Some(Arc::from(h)),
                    Err(e) => {
                        tracing::warn!(error = %e, "console: a template did not render");
                        None
                    }
                }
            })
            .await
            .clone()
    }
}

fn rendered(body: Option<Arc<str>>) -> Response {
    match body {
        Some(h) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], h.to_string()).into_response()
        }
        None => (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered\n").into_response(),
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    nav: Nav,
    /// The queues fragment, rendered (escaped) by its own template.
    queues: Arc<str>,
    backlog: Backlog,
    jobs: Vec<JobLine>,
    links: Vec<LinkLine>,
}

struct JobLine {
    name: String,
    state: String,
    source: String,
    destination: String,
    backlog: i64,
    lag: String,
    last_error: String,
    enabled: bool,
    /// The `aqgate admin jobs` command line of its action, and of its reset.
    cli: String,
    reset_cli: String,
}

struct LinkLine {
    name: String,
    kind: &'static str,
    state: String,
    connections: i64,
}

/// `GET /console/`: the live figures (see the module's documentation), the jobs whose
/// source the caller sees, the gateway links' states.
pub(crate) async fn page(State(c): State<Console>, who: Caller) -> Response {
    c.live.ensure(&c.http.engine).await;
    let store = c.http.engine.store().as_ref();
    let jobs = match aqgate_admin::jobs::jobs_in(store, &c.http.engine.resolved()).await {
        Ok(j) => j,
        Err(e) => return unavailable(&e),
    };
    let links = match aqgate_admin::gateway::links_in(store, &c.http.engine.resolved()).await {
        Ok(l) => l,
        Err(e) => return unavailable(&e),
    };
    let jobs = jobs
        .into_iter()
        .filter(|j| visible(&c, &who.agent, &j.source))
        .map(|j| JobLine {
            enabled: j.requested == "ENABLED",
            cli: crate::cli::admin(&[
                "jobs",
                if j.requested == "ENABLED" { "--disable" } else { "--enable" },
                j.name.as_str(),
            ]),
            reset_cli: crate::cli::admin(&["jobs", "--reset", j.name.as_str()]),
            name: j.name,
            state: j.state,
            source: j.source,
            destination: j.destination,
            backlog: j.backlog,
            lag: format!("{:.1}", j.lag),
            last_error: j.last_error.unwrap_or_default(),
        })
        .collect();
    let links = links
        .into_iter()
        .map(|l| LinkLine { name: l.name, kind: l.kind, state: l.state, connections: l.connections })
        .collect();
    let Some(queues) = c.rendered.queues(&c, &who).await else { return rendered(None) };
    let backlog = backlog(&c.live.figures());
    html(StatusCode::OK, &Overview { nav: Nav::of(&who), queues, backlog, jobs, links })
}

/// `GET /console/fragments/{queues|backlog}`: one fragment of the overview, alone.
pub(crate) async fn fragment(State(c): State<Console>, who: Caller, Path(name): Path<String>) -> Response {
    c.live.ensure(&c.http.engine).await;
    match name.as_str() {
        "queues" => rendered(c.rendered.queues(&c, &who).await),
        "backlog" => html(StatusCode::OK, &BacklogFragment { backlog: backlog(&c.live.figures()) }),
        "topology" => crate::topology::fragment(&c, &who).await,
        _ => not_found_because("No such fragment."),
    }
}

/// The state of one event stream.
struct Stream {
    c: Console,
    agent: String,
    seen: u64,
    rx: tokio::sync::watch::Receiver<u64>,
    pending: Vec<&'static str>,
    until: tokio::time::Instant,
    _slot: crate::sampler::StreamSlot,
}

impl Stream {
    /// The next event, or `None` when the stream ends (its life is over, the agent lost
    /// its console role, the sampler is gone).
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(what) = self.pending.pop() {
                return Some(Event::default().event("overview").data(what));
            }
            tokio::select! {
                changed = self.rx.changed() => changed.ok()?,
                () = tokio::time::sleep_until(self.until) => return None,
            }
            let agent = self.c.http.engine.agent(&self.agent).filter(|a| a.console.is_some())?;
            let generation = *self.rx.borrow_and_update();
            let admin = agent.console.is_some_and(|r| r >= ConsoleRole::Admin);
            let (backlog, queues, jobs) = {
                let f = self.c.live.figures();
                let r = self.c.http.engine.resolved();
                let queues = f.queues.iter().any(|(id, t)| {
                    t.changed > self.seen && r.names.get(id).is_some_and(|name| visible(&self.c, &agent, name))
                });
                (f.backlog_changed > self.seen, queues, admin && f.jobs_changed > self.seen)
            };
            if jobs {
                self.pending.push("topology");
            }
            if backlog {
                self.pending.push("backlog");
            }
            if queues {
                self.pending.push("queues");
            }
            self.seen = generation;
        }
    }
}

/// `GET /console/events`: the overview's event stream (see the module's documentation);
/// 503 past the cap of open streams.
pub(crate) async fn events(State(c): State<Console>, who: Caller) -> Response {
    let Some(slot) = c.live.open_stream() else {
        return (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "30")], "too many live views open\n")
            .into_response();
    };
    c.live.ensure(&c.http.engine).await;
    let rx = c.live.subscribe();
    let seen = *rx.borrow();
    let s = Stream {
        agent: who.agent.name.clone(),
        c,
        seen,
        rx,
        pending: Vec::new(),
        until: tokio::time::Instant::now() + STREAM_LIFE,
        _slot: slot,
    };
    let stream = futures_util::stream::unfold(s, |mut s| async move {
        let e = s.next().await?;
        Some((Ok::<_, Infallible>(e), s))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response()
}
