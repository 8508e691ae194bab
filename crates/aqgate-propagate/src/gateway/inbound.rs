//! An inbound gateway job (broker → AQ) at work: fetch a batch, drop what was enqueued
//! already (its mark), send what is too big or does not convert to the exception queue,
//! enqueue the rest with their marks, and ack the batch after those commits (see the
//! parent module for the whole of it).
//!
//! **Sizes.** A body over the link's `max_message_bytes` (or the process's
//! `--broker-max-message-bytes`) goes to the exception queue whole, with the reason, as a
//! body that does not convert does; it is acked only after that commit, so it neither
//! stalls the job nor is lost. What a client cannot read at all (an MQTT packet over the
//! Maximum Packet Size the job announced, which a broker keeping to MQTT v5 never sends)
//! makes the job FAILED with the reason while it reconnects.

use std::time::Duration;

use aqgate_core::engine::{Engine, JobTally, Session};
use aqgate_core::error::{AqError, code};
use aqgate_core::propagation::PropagationInfo;
use aqgate_core::topology::gateway::GatewayRoute;
use aqgate_proto::idap::Message;

use super::convert::{self, Incoming, Outgoing};
use super::{Board, Fail, Pacing, Published, Sink, Source, connected, sink, source};
use crate::{Moved, Stats, carried_send};

/// An inbound job's worker, while this process holds its lease: until `stats.stop`.
pub(super) async fn inbound(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    stats: &Stats,
    board: &Board,
) {
    let mut pacing = Pacing::new(job);
    let mut conn: Option<Box<dyn Source>> = None;
    let mut exceptions: Option<Box<dyn Sink>> = None;
    let max_body = board.max_body(&route.link);
    while !*stats.stop.borrow() {
        if conn.as_ref().is_some_and(|c| c.stale()) || exceptions.as_ref().is_some_and(|c| c.stale()) {
            // Another job found the shared connection down: connect again with them.
            (conn, exceptions) = (None, None);
            board.report(engine, &route.link.name, &job.name, Err("the shared connection went")).await;
        }
        if conn.is_none() {
            let made = source(board, &route.link, &route.foreign, &job.name).await;
            conn = connected(engine, job, route, stats, board, &mut pacing, made).await;
        }
        let Some(s) = conn.as_mut() else { continue };
        board.alive(engine, &route.link.name).await;
        let batch = if pacing.alone() { 1 } else { job.batch_size as usize };
        let wait = if job.schedule.latency > 0 { Duration::from_millis(100) } else { Duration::from_secs(crate::WAIT) };
        let step =
            in_batch(engine, job, route, (s.as_mut(), max_body, wait), (board, &mut exceptions), batch, stats).await;
        if s.spent() {
            conn = None;
            board.closed(engine, &route.link.name, &job.name).await;
        }
        match step {
            Ok(Moved::Done(n)) => {
                pacing.done(job, stats);
                pacing.latency(job, n, &stats.stop).await;
            }
            Ok(Moved::Refused) => pacing.refused(job),
            Err(e) => {
                if let Fail::Link(why) | Fail::Unreadable(why) = &e {
                    if let Some(c) = conn.take() {
                        c.failed();
                    }
                    if let Some(c) = exceptions.take() {
                        c.failed();
                    }
                    board.report(engine, &route.link.name, &job.name, Err(why)).await;
                }
                pacing.failed(engine, job, (&route.link, board), stats, &e).await;
            }
        }
    }
    // Let go of the connections first: the link's row counts what stays open.
    drop(exceptions);
    if conn.take().is_some() {
        board.closed(engine, &route.link.name, &job.name).await;
    }
    pacing.end(stats);
}

/// One inbound batch of up to `max` broker messages, from `src`, waiting up to `wait` for
/// the first (bodies of up to `max_body` bytes go to the destination).
async fn in_batch(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    (src, max_body, wait): (&mut dyn Source, u64, Duration),
    (board, exceptions): (&Board, &mut Option<Box<dyn Sink>>),
    max: usize,
    stats: &Stats,
) -> Result<Moved, Fail> {
    let mut stop = stats.stop.clone();
    let mut fetched = tokio::select! {
        r = src.fetch(max, wait) => match r {
            Ok(m) => m,
            Err(e) => return Err(src.unreadable().map_or(Fail::Link(e), Fail::Unreadable)),
        },
        _ = stop.wait_for(|s| *s) => return Ok(Moved::Done(0)),
    };
    if fetched.is_empty() {
        return Ok(Moved::Done(0));
    }
    for m in &mut fetched {
        m.settle(route.options.aq_msg_properties);
    }
    let all: Vec<u64> = fetched.iter().map(|m| m.tag).collect();
    // Messages enqueued already (a redelivery after a crash between the commit and the
    // ack, or the same broker id twice in this batch): acked, not enqueued again.
    let ids: Vec<String> = fetched.iter().filter_map(|m| m.broker_id.clone()).collect();
    let mut seen: std::collections::HashSet<String> = if ids.is_empty() {
        Default::default()
    } else {
        match engine.store().gateway_seen(&job.agent, &ids).await {
            Ok(s) => s.into_iter().collect(),
            Err(e) => {
                let _ = src.requeue(&all).await;
                return Err(Fail::Aq(e.into()));
            }
        }
    };
    let mut take = Vec::new();
    let mut bad: Vec<(&Incoming, String)> = Vec::new();
    for m in &fetched {
        if let Some(id) = &m.broker_id
            && !seen.insert(id.clone())
        {
            tracing::info!(job = %job.name, broker_id = %id, redelivered = m.redelivered,
                "a broker message enqueued already: acked, not enqueued again");
            continue;
        }
        if route.options.no_local && m.link_mark.as_deref() == Some(route.link.name.as_str()) {
            // JMS_NoLocal: published by an outbound job over this link; acked, not taken.
            tracing::debug!(job = %job.name, "a message published over the job's own link: left (no_local)");
            continue;
        }
        if m.body.len() as u64 > max_body {
            let why = format!("{} bytes, over the link's max_message_bytes ({max_body})", m.body.len());
            bad.push((m, why));
            continue;
        }
        match convert::message_of(&route.payload, m, &job.agent, job.preserve_message_id) {
            Ok(msg) => take.push((m, msg)),
            Err(why) => bad.push((m, why)),
        }
    }
    let result = async {
        if !bad.is_empty() {
            in_exceptions(engine, job, route, (board, exceptions), &bad, stats).await?;
            let oversize = bad.iter().filter(|(m, _)| m.body.len() as u64 > max_body).count();
            stats.counters.oversize.add(oversize as u64);
        }
        if !take.is_empty() {
            let mut session = Session::new(&job.agent, engine.now());
            session.propagates = true;
            session.seen = take.iter().filter_map(|(m, _)| m.broker_id.clone()).collect();
            let msgs: Vec<Message> = take
                .iter()
                .enumerate()
                .map(|(i, (_, m))| Message { number: Some(u32::try_from(i + 1).unwrap_or(u32::MAX)), ..m.clone() })
                .collect();
            session.tally = Some(JobTally::moved(&job.name, take.len()));
            let sent = carried_send(
                engine,
                &mut session,
                &job.destination,
                route.inbound_transformation.clone(),
                msgs,
                Vec::new(),
            )
            .await;
            session.seen.clear();
            match sent {
                Ok(_) => {}
                Err(e) if crate::permanent(&e) && take.len() > 1 => return Ok(false),
                Err(e) if crate::permanent(&e) => {
                    let why = format!("the destination refused it: {}", e.message);
                    let bad: Vec<(&Incoming, String)> = take.iter().map(|(m, _)| (*m, why.clone())).collect();
                    in_exceptions(engine, job, route, (board, exceptions), &bad, stats).await?;
                    return Ok(true);
                }
                Err(e) => return Err(Fail::Aq(e)),
            }
            stats.moved(take.len(), engine.now());
        }
        Ok(true)
    }
    .await;
    match result {
        Ok(true) => {
            src.ack(&all).await.map_err(Fail::Link)?;
            Ok(Moved::Done(all.len()))
        }
        Ok(false) => {
            src.requeue(&all).await.map_err(Fail::Link)?;
            Ok(Moved::Refused)
        }
        Err(e) => {
            let _ = src.requeue(&all).await;
            Err(e)
        }
    }
}

/// Broker messages that cannot become AQ messages: to the job's exception queue (a local
/// RAW queue, the bytes as they came with the reason as correlation; or a foreign queue of
/// the same link), committed with their marks; without one, the job fails naming them.
async fn in_exceptions(
    engine: &Engine,
    job: &PropagationInfo,
    route: &GatewayRoute,
    (board, exceptions): (&Board, &mut Option<Box<dyn Sink>>),
    bad: &[(&Incoming, String)],
    stats: &Stats,
) -> Result<(), Fail> {
    let why = |m: &Incoming, w: &str| format!("{}: {w}", m.broker_id.as_deref().unwrap_or("a message without an id"));
    if let Some(eq) = &job.exception_queue {
        let mut session = Session::new(&job.agent, engine.now());
        session.propagates = true;
        session.seen = bad.iter().filter_map(|(m, _)| m.broker_id.clone()).collect();
        let msgs: Vec<Message> = bad
            .iter()
            .map(|(m, w)| {
                // To be looked at now: no delay, no expiry (as outbound exception copies).
                let raw = Incoming { correlation: Some(why(m, w)), delay: None, expiration: None, ..(*m).clone() };
                convert::message_of(&aqgate_core::payload::PayloadKind::Raw, &raw, &job.agent, false)
                    .map_err(|e| Fail::Aq(AqError::server(code::INTERNAL, e)))
            })
            .collect::<Result<_, _>>()?;
        session.tally = Some(JobTally::excepted(&job.name, bad.len()));
        let r = carried_send(engine, &mut session, eq, None, msgs, Vec::new()).await;
        session.seen.clear();
        r.map_err(Fail::Aq)?;
        stats.excepted(bad.len(), engine.now());
    } else if let Some(fq) = &route.foreign_exception {
        if exceptions.is_none() {
            *exceptions = Some(sink(board, &route.link, fq, &job.name).await.map_err(Fail::Link)?);
        }
        let Some(s) = exceptions.as_mut() else { return Err(Fail::Link("no exception link".into())) };
        let out: Vec<Outgoing> = bad
            .iter()
            .map(|(m, w)| Outgoing {
                id: m.message_id.clone().unwrap_or_else(aqgate_core::engine::session::random_id),
                body: m.body.clone(),
                content_type: "application/octet-stream",
                correlation: Some(why(m, w)),
                priority: m.priority.unwrap_or(1),
                expiration_ms: None,
                redelivered: m.redelivered,
                queue: job.source.clone(),
                // The broker's properties as they came, when they can be read.
                props: m.jms.props().unwrap_or_default(),
                // The reason travels as AQ-Correlation whatever the job's options.
                mode: convert::Mode { persistent: true, aq_properties: true, link: None },
            })
            .collect();
        for r in s.publish(&out).await.map_err(Fail::Link)?.await.map_err(Fail::Link)? {
            if let Published::Refused(w) = r {
                return Err(Fail::Aq(AqError::client(
                    code::NOT_PERMITTED,
                    format!("the exception queue refused: {w}"),
                )));
            }
        }
        stats.excepted_abroad(bad.len(), engine.now());
    } else {
        let list = bad.iter().map(|(m, w)| why(m, w)).collect::<Vec<_>>().join("; ");
        return Err(Fail::Aq(AqError::client(code::NOT_PERMITTED, format!("{list} (the job has no exception queue)"))));
    }
    for (m, w) in bad {
        tracing::warn!(job = %job.name, reason = %why(m, w), "a broker message went to the exception queue");
    }
    Ok(())
}
