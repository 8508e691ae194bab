//! A send to a synchronous remote queue space (the default for `[[remote_queue_spaces]]`):
//! checked here as any send is (privileges, payload type, the space's limits, schedule),
//! then forwarded at once through [`crate::remote::RemoteSpaces`] in one IDAP request that
//! commits there, and answered with the remote's message ids or its refusal as a fault.
//! Nothing is stored here; nothing is acknowledged that the remote has not committed.
//!
//! The send must be the whole of its transaction: a request that leaves its transaction
//! open (no AQXmlCommit, ON_COMMIT visibility) or joins a session's open transaction is
//! refused (24031), since a later local commit or rollback could not take the remote's
//! work with it.

use super::*;
use crate::remote::{RemoteSend, RemoteSpaces};
use crate::topology::remote_space::RemoteTarget;

impl Engine {
    /// Forwards `messages` (checked, transformed, their delays set) to the space of `queue`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn send_synchronously(
        &self,
        session: &mut Session,
        remote: &dyn RemoteSpaces,
        target: &RemoteTarget,
        queue: &QueueInfo,
        messages: &[Message],
        commit: bool,
        wrap: fn(EnqueueResult) -> Response,
    ) -> Result<Response, AqError> {
        let send = RemoteSend {
            space: target.space.clone(),
            local: queue.name.clone(),
            login: target.login.clone(),
            queue: target.queue.clone(),
            messages: messages.iter().map(there).collect(),
            key: remote_key(session),
        };
        let ids = match remote.send(&send).await {
            Ok(ids) if ids.len() == messages.len() => ids,
            Ok(ids) => {
                tracing::error!(space = %target.space, sent = messages.len(), answered = ids.len(),
                    "the remote answered another number of message ids than it was sent");
                return Err(AqError::server(
                    code::REMOTE_SYSTEM,
                    format!(
                        "remote queue space {} answered {} message ids for {} messages",
                        target.space,
                        ids.len(),
                        messages.len()
                    ),
                ));
            }
            Err(refusal) => {
                let e = refusal.fault(&send);
                tracing::info!(space = %target.space, queue = %queue.name, code = e.code, reason = %e.message.escape_debug(),
                    "a synchronous send to a remote queue space was not answered with the remote's message ids");
                return Err(e);
            }
        };
        let response = wrap(EnqueueResult { destination: queue.name.clone(), message_ids: ids });
        let mut next = session.state();
        if commit {
            next.end_transaction();
        }
        let version = if self.sealed(session) {
            // The session's row and the idempotency record: a retry under the same key is
            // answered from here.
            let mut tx = self.store.begin().await?;
            let v = self.seal(&mut *tx, session, &next, Some(&response)).await?;
            self.commit_tx(tx).await?;
            v
        } else {
            None
        };
        self.settle(session, next, version);
        Ok(response)
    }
}

/// Whether a send to a synchronous space may go: it must commit at once and find no open
/// transaction in its session.
pub(super) fn refuse_in_transaction(
    target: &RemoteTarget,
    queue: &str,
    commit_now: bool,
    pending: bool,
) -> Result<(), AqError> {
    if commit_now && !pending {
        return Ok(());
    }
    Err(AqError::invalid(format!(
        "{queue} is a queue of synchronous remote queue space {}: a send to it is forwarded at once and must be \
         its whole transaction (send it with AQXmlCommit, in no open transaction; or declare the space \
         store_and_forward)",
        target.space
    )))
}

/// The remote's copy of a message: payload, priority, correlation, delay and expiration.
/// The remote records the space's agent as the sender (what it can verify).
fn there(m: &Message) -> Message {
    let h = &m.header;
    Message {
        number: m.number,
        header: MessageHeader {
            correlation: h.correlation.clone(),
            priority: h.priority,
            delay: h.delay,
            expiration: h.expiration,
            ..MessageHeader::default()
        },
        payload: m.payload.clone(),
    }
}

/// The remote's `Idempotency-Key`: with the client's key, one derived from it and the
/// agent (a retry is a replay there); without, a fresh one.
fn remote_key(session: &Session) -> String {
    match &session.idempotency {
        Some(claim) => {
            let mut d = ring::digest::Context::new(&ring::digest::SHA256);
            d.update(session.agent.as_bytes());
            d.update(b"\0");
            d.update(claim.key.as_bytes());
            format!("sync-{}", hex::encode(d.finish().as_ref()))
        }
        None => format!("sync-{}", session::random_id()),
    }
}
