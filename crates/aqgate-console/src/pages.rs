//! The console's pages but the overview (`overview`) and a queue's messages: the queue
//! list (keyset paging by name or by backlog, a name filter), the agents (admin), a job's
//! enable and disable (operator), and the answers every page shares (the navigation, 403,
//! 404).

use std::collections::HashMap;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;

use aqgate_core::topology::{AgentInfo, ConsoleRole, Privilege};

use crate::Console;
use crate::answer::{bad_request, forbidden, html, not_found_because, see_other, unavailable};
use crate::caller::Caller;

/// The navigation bar's view of the caller.
pub(crate) struct Nav {
    pub agent: String,
    pub role: &'static str,
    level: ConsoleRole,
}

impl Nav {
    pub(crate) fn of(c: &Caller) -> Self {
        Self { agent: c.agent.name.clone(), role: c.role.as_str(), level: c.role }
    }

    pub(crate) fn operator(&self) -> bool {
        self.level >= ConsoleRole::Operator
    }

    pub(crate) fn admin(&self) -> bool {
        self.level >= ConsoleRole::Admin
    }
}

/// Any other page under `/console`: 404 to a caller, else the way to the login.
pub(crate) async fn not_found(_: Caller) -> Response {
    not_found_because("No such console page.")
}

/// The query's parameters (the last of each name).
pub(crate) fn params(uri: &Uri) -> HashMap<String, String> {
    url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect()
}

/// Whether `agent` may see `queue` at all: one of its database users owns it or holds a
/// grant on it.
pub(crate) fn visible(c: &Console, agent: &AgentInfo, queue: &str) -> bool {
    let r = c.http.engine.resolved();
    r.catalog.queue(queue).is_some_and(|q| {
        r.catalog.permits(agent, q, Privilege::Enqueue) || r.catalog.permits(agent, q, Privilege::Dequeue)
    })
}

/// Whether `agent` may read `queue`'s messages: it may dequeue from it.
pub(crate) fn readable(c: &Console, agent: &AgentInfo, queue: &str) -> bool {
    let r = c.http.engine.resolved();
    r.catalog.queue(queue).is_some_and(|q| r.catalog.permits(agent, q, Privilege::Dequeue))
}

/// Whether `agent` may enqueue to `queue`.
pub(crate) fn enqueuable(c: &Console, agent: &AgentInfo, queue: &str) -> bool {
    let r = c.http.engine.resolved();
    r.catalog.queue(queue).is_some_and(|q| r.catalog.permits(agent, q, Privilege::Enqueue))
}

struct QueueLine {
    name: String,
    kind: &'static str,
    payload: String,
    depth: i64,
    /// The oldest ready message's enqueue time, and its age as shown.
    oldest: Option<aqgate_core::clock::Micros>,
    age: String,
    href: Option<String>,
}

pub(crate) fn messages_href(queue: &str) -> String {
    format!("/console/queues/{}/messages", url::form_urlencoded::byte_serialize(queue.as_bytes()).collect::<String>())
}

/// The queues the caller sees whose name contains `wanted` (upper case), with their depth
/// as of the console's sampler's last sample: no count of the store's rows per page.
async fn queue_lines(c: &Console, who: &Caller, wanted: &str) -> Vec<QueueLine> {
    c.live.ensure(&c.http.engine).await;
    let r = c.http.engine.resolved();
    let f = c.live.figures();
    let reader = who.role >= ConsoleRole::Reader;
    let track = |q: &aqgate_core::topology::QueueInfo| r.ids.get(&q.name).and_then(|id| f.queues.get(id));
    r.catalog
        .queues
        .values()
        .filter(|q| q.name.to_ascii_uppercase().contains(wanted) && visible(c, &who.agent, &q.name))
        .map(|q| QueueLine {
            href: (reader && readable(c, &who.agent, &q.name)).then(|| messages_href(&q.name)),
            name: q.name.clone(),
            kind: aqgate_admin::topology::kind(q),
            payload: q.payload.to_string(),
            depth: track(q).map_or(0, |t| crate::sampler::depth(&t.now)),
            oldest: track(q).and_then(|t| t.now.oldest_ready),
            age: track(q).and_then(|t| t.now.oldest_ready).map_or_else(
                || "-".to_string(),
                |t| format!("{:.0} s", aqgate_admin::figures::age_seconds(f.at, Some(t))),
            ),
        })
        .collect()
}

#[derive(Template)]
#[template(path = "queues.html")]
struct Queues {
    nav: Nav,
    queues: Vec<QueueLine>,
    filter: String,
    sort: &'static str,
    next: Option<String>,
}

/// Queues shown per page when not told, and the most.
const PAGE: usize = 50;
const PAGE_MAX: usize = 500;

/// `GET /console/queues?q=&sort=name|backlog|age&after=&limit=`: the queues the caller
/// sees, those whose name contains `q` (any case), by name, by backlog (largest first) or by
/// age (the oldest ready message first; queues with none last), then by name, a page at a
/// time after the cursor `after` (the last line of the page before: its name, or
/// `KEY:name` by backlog or age). No count of all rows is made.
pub(crate) async fn queues(State(c): State<Console>, who: Caller, uri: Uri) -> Response {
    let p = params(&uri);
    let filter = p.get("q").map(|s| s.trim().to_string()).unwrap_or_default();
    let sort = match p.get("sort").map(String::as_str) {
        Some("backlog") => "backlog",
        Some("age") => "age",
        _ => "name",
    };
    let limit = p.get("limit").and_then(|l| l.parse().ok()).unwrap_or(PAGE).clamp(1, PAGE_MAX);
    let mut lines = queue_lines(&c, &who, &filter.to_ascii_uppercase()).await;
    let number = |q: &QueueLine| match sort {
        "backlog" => -q.depth,
        "age" => q.oldest.unwrap_or(i64::MAX),
        _ => 0,
    };
    lines.sort_by(|a, b| number(a).cmp(&number(b)).then_with(|| a.name.cmp(&b.name)));
    if let Some(after) = p.get("after") {
        let cursor = if sort == "name" {
            Some((0, after.as_str()))
        } else {
            after.split_once(':').and_then(|(d, n)| Some((d.parse::<i64>().ok()?, n)))
        };
        if let Some(cursor) = cursor {
            lines.retain(|q| (number(q), q.name.as_str()) > cursor);
        }
    }
    let more = lines.len() > limit;
    lines.truncate(limit);
    let next = more.then(|| lines.last()).flatten().map(|last| {
        let after = if sort == "name" { last.name.clone() } else { format!("{}:{}", number(last), last.name) };
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        s.append_pair("q", &filter).append_pair("sort", sort);
        s.append_pair("limit", &limit.to_string()).append_pair("after", &after);
        format!("/console/queues?{}", s.finish())
    });
    html(StatusCode::OK, &Queues { nav: Nav::of(&who), queues: lines, filter, sort, next })
}

struct AgentLine {
    name: String,
    protocols: String,
    db_users: String,
    gateway: bool,
    console: &'static str,
}

#[derive(Template)]
#[template(path = "agents.html")]
struct Agents {
    nav: Nav,
    agents: Vec<AgentLine>,
}

/// `GET /console/agents` (admin): the topology's agents and their console roles.
pub(crate) async fn agents(State(c): State<Console>, who: Caller) -> Response {
    if let Some(r) = who.below(ConsoleRole::Admin) {
        return r;
    }
    let agents = aqgate_admin::agents_of(&c.http.engine.resolved())
        .into_iter()
        .map(|a| AgentLine {
            console: c.http.engine.agent(&a.name).and_then(|i| i.console).map_or("-", ConsoleRole::as_str),
            name: a.name,
            protocols: a.protocols,
            db_users: a.db_users,
            gateway: a.gateway,
        })
        .collect();
    html(StatusCode::OK, &Agents { nav: Nav::of(&who), agents })
}

/// `POST /console/jobs/{job}/{enable|disable|reset}` (operator, on a job whose source queue
/// the caller may dequeue from): what `aqgate admin jobs --enable|--disable|--reset` does.
pub(crate) async fn job_action(
    State(c): State<Console>,
    who: Caller,
    Path((job, action)): Path<(String, String)>,
) -> Response {
    if let Some(r) = who.below(ConsoleRole::Operator) {
        return r;
    }
    let enable = match action.as_str() {
        "enable" => Some(true),
        "disable" => Some(false),
        "reset" => None,
        _ => return not_found_because("No such action."),
    };
    let store = c.http.engine.store().as_ref();
    let jobs = match aqgate_admin::jobs::jobs_in(store, &c.http.engine.resolved()).await {
        Ok(j) => j,
        Err(e) => return unavailable(&e),
    };
    let name = aqgate_core::topology::canon(&job);
    let Some(j) = jobs.iter().find(|j| j.name == name) else { return not_found_because("No such job.") };
    if !readable(&c, &who.agent, &j.source) {
        return forbidden("The job's source queue is not yours to dequeue from.");
    }
    let done = match enable {
        Some(enable) => aqgate_admin::jobs::set_enabled(store, &name, enable).await,
        None => aqgate_admin::jobs::reset(store, &name).await,
    };
    match done {
        Ok(true) => {
            tracing::info!(agent = %who.agent.name, job = %name, action = %action, "console: job action");
            if enable.is_some() {
                // This process's pages read its running topology: reloaded now, so that the
                // page it is sent back to shows the change (the others follow the control plane).
                if let Err(e) = c.http.engine.reload().await {
                    tracing::warn!(error = %e, "console: the topology was not reloaded after a job action");
                }
            }
            see_other("/console/")
        }
        Ok(false) if enable.is_none() => bad_request("The job has not run yet: there is nothing to reset."),
        Ok(false) => not_found_because("No such job."),
        Err(e) => unavailable(&e),
    }
}
