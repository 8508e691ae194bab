//! One look of a receive at the store's messages (`Engine::try_receive`), in its phases:
//! the look's settings, the common consumer loop's one-step take, the scan that finds and
//! takes (or locks, or browses) the messages, their decoding, the dequeue history, and the
//! seal of the session's next state with the commit.

use super::*;
use crate::engine::session::GroupAt;

/// One look's settings, fixed before it touches the store.
struct Look {
    now: Micros,
    /// How many messages it takes at most: more than one only for a session that asks (a
    /// propagation job), and never for a browse (its position is one message).
    want: usize,
    /// The session's key of this queue and consumer (its position and group).
    key: (QueueId, String),
    /// The position the scan starts after (`None`: the queue's head).
    start: Option<Position>,
    browse: bool,
    /// A REMOVE that commits at once (IMMEDIATE, or a trailing AQXmlCommit with nothing
    /// else pending) deletes the delivery directly instead of locking it first.
    remove_now: bool,
    /// A propagation batch's messages taken in a transaction its send continues (`HeldTx`).
    holds: bool,
    /// The kinds of stored message looked at.
    stored: Stored,
}

/// What a scan took.
#[derive(Default)]
struct Taken {
    found: Vec<StoredMessage>,
    /// Exception queues that got a message this request's removes left to consumers that
    /// gave up on it.
    moved: Vec<QueueId>,
    /// The group the navigation of a grouped queue is in afterwards.
    group_at: Option<GroupAt>,
}

impl Engine {
    /// One look for stored messages of the kinds `stored` names: found, then removed,
    /// locked or browsed as the request says, with the session's next state sealed in the
    /// same transaction. Empty when there is none to take.
    pub(in crate::engine) async fn try_receive(
        &self,
        d: &Dequeue<'_>,
        session: &mut Session,
        stored: Stored,
    ) -> Result<Vec<Message>, AqError> {
        session.received.clear();
        let look = self.look(d, session, stored);
        if self.takes_head(d, session, &look) {
            return self.take_head_committed(d, session, &look).await;
        }
        let mut tx = if look.holds { self.store.begin_held().await? } else { self.store.begin().await? };
        let taken = match self.scan(&mut *tx, d, session, &look).await? {
            Ok(taken) => taken,
            Err(e) => {
                // The locks this scan took go with the Fault.
                tx.rollback().await?;
                return Err(e);
            }
        };
        if taken.found.is_empty() {
            tx.rollback().await?;
            self.end_of_fetch(d, session, &look).await?;
            return Ok(Vec::new());
        }
        let outs = match self.messages_out(d, session, &look, &taken.found) {
            Ok(outs) => outs,
            Err(e) => {
                // Rolled back now, not when the pool gets to the dropped transaction: the
                // locks it took must be gone when the Fault is answered.
                tx.rollback().await?;
                return Err(e);
            }
        };
        if session.propagates {
            session.received = carried(&taken.found);
        }
        if d.options().dequeue_mode == DequeueMode::Remove && d.queue.keeps_history() {
            self.record_dequeues(&mut *tx, d, session, &look, &taken.found).await?;
        }
        self.seal_look(tx, d, session, &look, taken, outs).await
    }

    /// The look's settings: how many, from where, how the removes commit, and whether a
    /// propagation batch takes its messages in a transaction its send continues.
    fn look(&self, d: &Dequeue<'_>, session: &Session, stored: Stored) -> Look {
        let o = d.options();
        let browse = o.dequeue_mode == DequeueMode::Browse;
        let want = if browse { 1 } else { session.max_messages.clamp(1, 1000) as usize };
        let key = (d.qid, d.consumer.to_string());
        let start = match o.navigation {
            NavigationMode::FirstMessage => None,
            _ => session.positions.get(&key).copied(),
        };
        let remove_now = o.visibility == Visibility::Immediate || (d.req.commit && !session.pending);
        // A propagation batch from a single-consumer queue without history takes its
        // messages in a transaction its send continues (`HeldTx`): removed at once, not
        // locked, since nothing of it is visible until the send's commit. Not with a
        // condition (the rows it passes over would stay locked for the whole batch) nor on
        // a grouped queue (whose groups are claimed by committed locks).
        let holds = session.one_transaction
            && session.propagates
            && !session.pending
            && self.store.holds_transactions()
            && o.dequeue_mode == DequeueMode::Remove
            && !remove_now
            && !d.queue.multi_consumer
            && !d.queue.keeps_history()
            && !d.queue.grouped
            && !d.filter.has_condition()
            && session.idempotency.is_none();
        Look { now: self.now(), want, key, start, browse, remove_now, holds, stored }
    }

    /// Whether the look is the common consumer loop — take the head, commit — which one
    /// atomic step of the store serves.
    fn takes_head(&self, d: &Dequeue<'_>, session: &Session, look: &Look) -> bool {
        d.options().dequeue_mode == DequeueMode::Remove
            && look.remove_now
            && d.req.commit
            && !self.sealed(session)
            && !session.pending
            && look.start.is_none()
            && !d.filter.has_condition()
            && !d.queue.multi_consumer
            && d.queue.retention.is_none()
            && look.want == 1
            && d.filter.transformation.is_none()
            && !d.queue.grouped
    }

    /// The common consumer loop in one atomic step: the head taken and committed at once.
    async fn take_head_committed(
        &self,
        d: &Dequeue<'_>,
        session: &mut Session,
        look: &Look,
    ) -> Result<Vec<Message>, AqError> {
        let q =
            CandidateQuery { include_locked: false, include_waiting: false, limit: 1, ..self.query(d, session, look) };
        let Some(m) = self.store.take_head(&q, session.origin).await? else { return Ok(Vec::new()) };
        let out = match self.message_out(d.resolved, d.queue, &m, look.now, !session.propagates, None) {
            Ok(out) => out,
            Err(e) => {
                // Removed already, but not returnable: put it back (at the end of its
                // priority), so that the Fault loses nothing.
                self.put_back(&m, look.stored == Stored::Spilled).await?;
                return Err(e);
            }
        };
        // A session without a row that ends its transaction: nothing to keep.
        session.end_transaction();
        Ok(vec![out])
    }

    /// The look's candidate query from its start (`after` and `limit` are the scan's).
    fn query(&self, d: &Dequeue<'_>, session: &Session, look: &Look) -> CandidateQuery {
        CandidateQuery {
            queue: d.qid,
            consumer: d.consumer.to_string(),
            txn: session.txn.clone(),
            now: look.now,
            after: None,
            corrid: d.filter.corrid.clone(),
            msgid: d.filter.msgid,
            include_locked: look.browse,
            include_waiting: session.propagates && !session.ready_only && !look.browse,
            // Without a condition the first candidate is normally the answer: fetch one
            // payload, not a page of them.
            limit: if d.filter.has_condition() {
                SCAN_BATCH.max(look.want as i64)
            } else {
                i64::try_from(look.want).unwrap_or(1)
            },
            stored: look.stored,
        }
    }

    /// Finds and takes the look's messages in `tx`: a grouped queue's by its groups, any
    /// other's in passes from the position. The outer `Err` is the store's (the transaction
    /// is dropped); the inner one a Fault, before which the caller rolls back.
    async fn scan(
        &self,
        tx: &mut dyn StoreTx,
        d: &Dequeue<'_>,
        session: &Session,
        look: &Look,
    ) -> Result<Result<Taken, AqError>, AqError> {
        // A grouped queue navigates by groups (a propagation job's session moves messages
        // as from any queue: see `grouping`).
        if d.queue.grouped && !session.propagates {
            let grouped = self.take_grouped(tx, d, session, look.stored, look.remove_now).await;
            return Ok(grouped.map(|(found, group_at)| Taken { found, moved: Vec::new(), group_at }));
        }
        // Scan from the position; REMOVE and LOCKED wrap around once so that a consumer
        // never starves on messages sorted before its position (e.g. higher priority).
        let passes: &[Option<Position>] =
            if look.start.is_some() && !look.browse { &[look.start, None] } else { &[look.start] };
        let mut taken = Taken::default();
        for &from in passes {
            let mut q = CandidateQuery { after: from, ..self.query(d, session, look) };
            loop {
                let batch = tx.candidates(&q).await?;
                let (picked, exhausted) = match pick(d, look, batch, taken.found.len(), &mut q) {
                    Ok(p) => p,
                    Err(e) => return Ok(Err(e)),
                };
                self.take_picked(tx, d, session, look, picked, &mut taken).await?;
                if taken.found.len() >= look.want {
                    return Ok(Ok(taken));
                }
                if exhausted {
                    break;
                }
            }
        }
        Ok(Ok(taken))
    }

    /// Takes the picked candidates as the dequeue mode says — browsed as they are, removed
    /// (a held transaction's in one statement), or locked — into `taken`; those another
    /// transaction took first are left out.
    async fn take_picked(
        &self,
        tx: &mut dyn StoreTx,
        d: &Dequeue<'_>,
        session: &Session,
        look: &Look,
        picked: Vec<StoredMessage>,
        taken: &mut Taken,
    ) -> Result<(), AqError> {
        let mode = d.options().dequeue_mode;
        match mode {
            DequeueMode::Browse => taken.found.extend(picked),
            DequeueMode::Remove if look.holds => {
                let seqs: Vec<i64> = picked.iter().map(|m| m.seq).collect();
                let removed: std::collections::HashSet<i64> =
                    tx.remove_singles(&seqs, &session.txn).await?.into_iter().collect();
                taken.found.extend(picked.into_iter().filter(|m| removed.contains(&m.seq)));
            }
            DequeueMode::Remove if look.remove_now => {
                for m in picked {
                    match tx.remove_now(m.seq, d.consumer, &session.txn, d.queue.multi_consumer).await? {
                        Removal::Missed => continue,
                        Removal::Removed => {}
                        // The consumers left gave up on it: it moves now.
                        Removal::Stranded(s) => taken.moved.extend(move_stranded(tx, d.resolved, &[s]).await?),
                    }
                    taken.found.push(m);
                }
            }
            DequeueMode::Locked | DequeueMode::Remove => {
                let kind = if mode == DequeueMode::Locked { LockKind::Locked } else { LockKind::Remove };
                let locked: std::collections::HashSet<i64> = match picked.as_slice() {
                    [] => Default::default(),
                    [m] => {
                        if tx.lock(m.seq, d.consumer, &session.txn, kind).await? {
                            [m.seq].into()
                        } else {
                            Default::default()
                        }
                    }
                    _ => {
                        let seqs: Vec<i64> = picked.iter().map(|m| m.seq).collect();
                        tx.lock_many(&seqs, d.consumer, &session.txn, kind).await?.into_iter().collect()
                    }
                };
                taken.found.extend(picked.into_iter().filter(|m| locked.contains(&m.seq)));
            }
        }
        Ok(())
    }

    /// A look that found nothing: at the end of a NEXT_MESSAGE browse, the next browse
    /// starts from the beginning again.
    async fn end_of_fetch(&self, d: &Dequeue<'_>, session: &mut Session, look: &Look) -> Result<(), AqError> {
        if look.browse
            && d.options().navigation == NavigationMode::NextMessage
            && session.positions.contains_key(&look.key)
        {
            let mut next = session.state();
            next.positions.remove(&look.key);
            next.groups.remove(&look.key);
            self.seal_alone(session, next).await?;
        }
        Ok(())
    }

    /// The found messages as the receiver gets them, decoded before anything commits: a
    /// message that cannot be returned is neither removed nor locked nor passed by the
    /// browse position (a Fault changes nothing).
    fn messages_out(
        &self,
        d: &Dequeue<'_>,
        session: &Session,
        look: &Look,
        found: &[StoredMessage],
    ) -> Result<Vec<Message>, AqError> {
        let transformation = d.filter.transformation.as_deref();
        found
            .iter()
            .map(|m| self.message_out(d.resolved, d.queue, m, look.now, !session.propagates, transformation))
            .collect()
    }

    /// Who took the removed messages, in the same transaction as the removes, and in which
    /// IDAP transaction (Oracle's DEQ_TXN_ID): a rollback of a pending remove takes its row
    /// back with it. An IMMEDIATE remove inside an open transaction is not that
    /// transaction's: it has its own.
    async fn record_dequeues(
        &self,
        tx: &mut dyn StoreTx,
        d: &Dequeue<'_>,
        session: &Session,
        look: &Look,
        found: &[StoredMessage],
    ) -> Result<(), AqError> {
        let txn = if d.options().visibility != Visibility::Immediate || d.req.commit {
            session.txn.clone()
        } else {
            crate::engine::session::random_id()
        };
        let txn = Some(txn);
        let rows: Vec<DequeueRecord> = found
            .iter()
            .filter(|m| m.state != SPILLED)
            .map(|m| DequeueRecord {
                seq: m.seq,
                consumer: d.consumer.to_string(),
                deq_time: look.now,
                deq_user_id: session.agent.clone(),
                txn: txn.clone(),
                retry_count: m.retry_count,
            })
            .collect();
        if !rows.is_empty() {
            tx.record_dequeues(&rows).await?;
        }
        Ok(())
    }

    /// Ends the look: the session's next state kept with the held transaction of a
    /// propagation batch, or sealed (session row, idempotency record) into the transaction,
    /// published and tallied if the request commits, committed, and the queues that got
    /// messages woken.
    async fn seal_look(
        &self,
        mut tx: Box<dyn StoreTx>,
        d: &Dequeue<'_>,
        session: &mut Session,
        look: &Look,
        taken: Taken,
        outs: Vec<Message>,
    ) -> Result<Vec<Message>, AqError> {
        let takes_lock = !look.browse && !look.remove_now;
        let next = next_state(d, session, look, &taken);
        if look.holds {
            // No session row: a crash ends the transaction, and the messages are back.
            self.settle(session, next, None);
            session.held.hold(tx, d.qid);
            return Ok(outs);
        }
        // A browse takes, locks and removes nothing: under an idempotency key it is not
        // recorded (a retry browses again), unless it commits the session's earlier work.
        let changes = !look.browse || (d.req.commit && session.pending);
        let response = (session.idempotency.is_some() && changes).then(|| {
            Response::Receive(
                StatusResponse::ok(),
                Some(ReceiveResult { destination: d.queue.name.clone(), messages: outs.clone() }),
            )
        });
        let version = self.seal(&mut *tx, session, &next, response.as_ref()).await?;
        let mut woken = taken.moved;
        if d.req.commit && (session.pending || takes_lock) {
            woken.extend(publish(&mut *tx, d.resolved, session, session.dequeued || takes_lock).await?);
        }
        if d.req.commit {
            self.tally(&mut *tx, session).await?;
        }
        self.commit_tx(tx).await?;
        self.settle(session, next, version);
        for q in woken {
            self.wake(q);
        }
        Ok(outs)
    }
}

/// The candidates of one batch that meet the condition, as many as are still wanted
/// (`have` found already), moving `q`'s position past each one looked at; and whether the
/// batch was the last (nothing after it, and none of it left unlooked at).
fn pick(
    d: &Dequeue<'_>,
    look: &Look,
    batch: Vec<StoredMessage>,
    have: usize,
    q: &mut CandidateQuery,
) -> Result<(Vec<StoredMessage>, bool), AqError> {
    let mut exhausted = (batch.len() as i64) < q.limit;
    let mut picked = Vec::new();
    for m in batch {
        if have + picked.len() >= look.want {
            // Not looked at: the next query starts from here.
            exhausted = false;
            break;
        }
        q.after = Some(Position { prio_key: m.prio_key, seq: m.seq });
        // Over its budget: an `Err`.
        if d.filter.matches_condition(&m, d.queue, d.resolved)? {
            picked.push(m);
        }
    }
    Ok((picked, exhausted))
}

/// What a propagation job carries of each message it received (`Session::received`).
fn carried(found: &[StoredMessage]) -> Vec<Carried> {
    found
        .iter()
        .map(|m| Carried {
            enq_time: m.enq_time,
            delay_until: m.delay_until,
            expire_at: m.expire_at,
            enq_user_id: m.enq_user_id.clone(),
            origin: Some(Origin { msgid: m.msgid, queue: m.queue, why: None }),
        })
        .collect()
}

/// The session's state after the look: its position past the last message found, the
/// group it is in, and its transaction ended (the request commits) or pending (it took
/// locks).
fn next_state(d: &Dequeue<'_>, session: &Session, look: &Look, taken: &Taken) -> SessionState {
    let mut next = session.state();
    if let Some(g) = taken.group_at {
        next.groups.insert(look.key.clone(), g);
    }
    if let Some(m) = taken.found.last() {
        next.positions.insert(look.key.clone(), Position { prio_key: m.prio_key, seq: m.seq });
    }
    if d.req.commit {
        next.end_transaction();
    } else if !look.browse && !look.remove_now {
        next.pending = true;
        next.dequeued = true;
    }
    next
}
