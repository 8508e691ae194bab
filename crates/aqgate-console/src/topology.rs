//! The topology graph (admin): `GET /console/topology`, an inline SVG drawn on the
//! server: source queues → propagation and gateway jobs → destinations (queues, remote
//! aqgates, forwarders' URLs, foreign queues) → the gateway links they go through, in
//! columns. A job is coloured by its state (running, disabled, broken or failed), a link
//! by its own; the edge into a job carries its backlog, the edge out the messages it moved
//! and its rate. Live: the graph is the fragment `topology`
//! (`GET /console/fragments/topology`), which the overview's event stream names to an
//! admin when the sampler's figures of the jobs change.
//! At most [`NODES_MAX`] nodes are drawn; the page says when more were left out. Every
//! name is text of the SVG, escaped by the template. Only the jobs that start or end at
//! a queue the caller sees are drawn.

use std::collections::HashMap;

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use aqgate_core::topology::ConsoleRole;

use crate::Console;
use crate::answer::{html, unavailable};
use crate::caller::Caller;
use crate::pages::{Nav, visible};

/// The most nodes drawn.
pub(crate) const NODES_MAX: usize = 500;

const COL_W: i64 = 340;
const NODE_W: i64 = 220;
const NODE_H: i64 = 34;
const ROW_H: i64 = 48;
const MARGIN: i64 = 20;

pub(crate) struct Node {
    x: i64,
    y: i64,
    w: i64,
    h: i64,
    tx: i64,
    ty: i64,
    label: String,
    /// What it is and its state, as the CSS class (`queue`, `job running`, …).
    class: String,
    title: String,
}

pub(crate) struct Edge {
    x1: i64,
    y1: i64,
    x2: i64,
    y2: i64,
    lx: i64,
    ly: i64,
    label: String,
}

#[derive(Template)]
#[template(path = "topology.html")]
struct Topology {
    nav: Nav,
    /// The graph, rendered (escaped) by its own template.
    graph: String,
}

/// The graph alone: the page's live fragment.
#[derive(Template)]
#[template(path = "topology_graph.html")]
struct Graph {
    width: i64,
    height: i64,
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    left_out: usize,
    jobs: usize,
}

/// Places named nodes in columns, each name once.
#[derive(Default)]
struct Layout {
    at: HashMap<(usize, String), usize>,
    rows: [i64; 4],
    nodes: Vec<Node>,
    left_out: usize,
}

impl Layout {
    /// The node `name` of column `col`, placed if new; `None` past [`NODES_MAX`].
    fn node(&mut self, col: usize, name: &str, class: &str, title: String) -> Option<usize> {
        if let Some(&i) = self.at.get(&(col, name.to_string())) {
            return Some(i);
        }
        if self.nodes.len() >= NODES_MAX {
            self.left_out += 1;
            return None;
        }
        let (x, y) = (MARGIN + col as i64 * COL_W, MARGIN + self.rows[col] * ROW_H);
        self.rows[col] += 1;
        let label: String = if name.chars().count() > 30 {
            name.chars().take(29).chain(std::iter::once('…')).collect()
        } else {
            name.to_string()
        };
        self.nodes.push(Node {
            x,
            y,
            w: NODE_W,
            h: NODE_H,
            tx: x + 8,
            ty: y + 22,
            label,
            class: class.to_string(),
            title,
        });
        self.at.insert((col, name.to_string()), self.nodes.len() - 1);
        Some(self.nodes.len() - 1)
    }

    fn edge(&self, from: usize, to: usize, label: String) -> Edge {
        let (a, b) = (&self.nodes[from], &self.nodes[to]);
        let (x1, y1, x2, y2) = (a.x + a.w, a.y + a.h / 2, b.x, b.y + b.h / 2);
        Edge { x1, y1, x2, y2, lx: (x1 + x2) / 2, ly: (y1 + y2) / 2 - 4, label }
    }
}

/// A job's colour: its actual state first (broken, failed), then what is asked.
fn job_class(state: &str, requested: &str) -> &'static str {
    let s = state.to_ascii_uppercase();
    if s.contains("BROKEN") || s.contains("FAIL") {
        "job broken"
    } else if requested != "ENABLED" || s.contains("DISABLED") || s.contains("STOPPED") {
        "job disabled"
    } else {
        "job running"
    }
}

fn link_class(state: &str) -> &'static str {
    match state.to_ascii_uppercase().as_str() {
        "CONNECTED" | "UP" | "RUNNING" => "link up",
        "STALE" | "RECONNECTING" | "CONNECTING" => "link disabled",
        _ => "link broken",
    }
}

/// What a job's source or destination is: a queue of the topology, a foreign queue
/// (`NAME@LINK`), or a remote (a URL).
fn end_class(c: &Console, name: &str) -> &'static str {
    if c.http.engine.resolved().catalog.queue(name).is_some() {
        "queue"
    } else if name.contains("://") {
        "remote"
    } else {
        "foreign"
    }
}

/// `GET /console/topology` (admin): the page, live as the overview is (the graph is the
/// fragment `topology`, fetched again when the sampler's figures of the jobs change).
pub(crate) async fn topology(State(c): State<Console>, who: Caller) -> Response {
    if let Some(r) = who.below(ConsoleRole::Admin) {
        return r;
    }
    c.live.ensure(&c.http.engine).await;
    match graph(&c, &who).await {
        Ok(g) => match g.render() {
            Ok(graph) => html(StatusCode::OK, &Topology { nav: Nav::of(&who), graph }),
            Err(e) => {
                tracing::warn!(error = %e, "console: a template did not render");
                html(StatusCode::OK, &Topology { nav: Nav::of(&who), graph: String::new() })
            }
        },
        Err(r) => r,
    }
}

/// `GET /console/fragments/topology` (admin): the graph alone.
pub(crate) async fn fragment(c: &Console, who: &Caller) -> Response {
    if let Some(r) = who.below(ConsoleRole::Admin) {
        return r;
    }
    match graph(c, who).await {
        Ok(g) => html(StatusCode::OK, &g),
        Err(r) => r,
    }
}

/// The graph of the jobs `who` sees: each job's backlog on the edge into it, what it moved
/// and its rate (the sampler's: between its last two samples) on the edge out.
async fn graph(c: &Console, who: &Caller) -> Result<Graph, Response> {
    let store = c.http.engine.store().as_ref();
    let resolved = c.http.engine.resolved();
    let jobs = aqgate_admin::jobs::jobs_in(store, &resolved).await.map_err(|e| unavailable(&e))?;
    let links = aqgate_admin::gateway::links_in(store, &resolved).await.map_err(|e| unavailable(&e))?;
    let figures = c.live.figures();
    // Scoped as the overview is: the jobs that start (or, inbound, end) at a queue the
    // caller sees.
    let jobs: Vec<_> = jobs
        .into_iter()
        .filter(|j| visible(c, &who.agent, &j.source) || visible(c, &who.agent, &j.destination))
        .collect();
    let link_state: HashMap<String, String> = links.iter().map(|l| (l.name.clone(), l.state.clone())).collect();
    let mut l = Layout::default();
    let mut edges = Vec::new();
    for j in &jobs {
        let src = l.node(0, &j.source, end_class(c, &j.source), format!("{} ({})", j.source, end_class(c, &j.source)));
        let title = format!("{} · {} · {} · requested {}", j.name, j.kind, j.state, j.requested);
        let job = l.node(1, &j.name, job_class(&j.state, j.requested), title);
        let dst = l.node(
            2,
            &j.destination,
            end_class(c, &j.destination),
            format!("{} ({})", j.destination, end_class(c, &j.destination)),
        );
        if let (Some(s), Some(n)) = (src, job) {
            edges.push(l.edge(s, n, format!("backlog {}", j.backlog)));
        }
        if let (Some(n), Some(d)) = (job, dst) {
            let rate = figures.jobs.get(&j.name).map_or(0.0, |t| t.rate);
            edges.push(l.edge(n, d, format!("{} moved · {rate:.1}/s", j.propagated)));
        }
        // A foreign queue's link (`NAME@LINK`), on either end.
        for (end, node) in [(&j.source, src), (&j.destination, dst)] {
            if let (Some((_, link)), Some(node)) = (end.rsplit_once('@'), node)
                && let Some(state) = link_state.get(link)
                && let Some(ln) = l.node(3, link, link_class(state), format!("link {link} · {state}"))
            {
                edges.push(l.edge(node, ln, String::new()));
            }
        }
    }
    for k in &links {
        l.node(3, &k.name, link_class(&k.state), format!("link {} ({}) · {}", k.name, k.kind, k.state));
    }
    let rows = l.rows.iter().copied().max().unwrap_or(0).max(1);
    Ok(Graph {
        width: 2 * MARGIN + 3 * COL_W + NODE_W,
        height: 2 * MARGIN + rows * ROW_H,
        jobs: jobs.len(),
        left_out: l.left_out,
        nodes: l.nodes,
        edges,
    })
}
