//! Synchronous sends to remote queue spaces as the engine sees them: the [`RemoteSpaces`]
//! interface the binary implements over HTTP, and the faults its outcomes give the sender
//! (Tuxedo's domain gateway maps the remote's status to the client's the same way).

use crate::error::{AqError, code};
use crate::idap::model::Message;
use crate::topology::propagation::RemoteDef;

/// One synchronous send: every message of the client's request, forwarded in one IDAP
/// request with a trailing commit, so the remote keeps all of them or none.
#[derive(Debug, Clone)]
pub struct RemoteSend {
    /// The space (`HQ`) and the local queue name (`HQ.ORDERS`), for faults and logs.
    pub space: String,
    pub local: String,
    /// Where and as whom.
    pub login: RemoteDef,
    /// `SCHEMA.QUEUE` at the remote.
    pub queue: String,
    pub messages: Vec<Message>,
    /// The remote's `Idempotency-Key`: derived from the client's key when it gave one, so a
    /// retry of the request is a replay there.
    pub key: String,
}

/// Why a synchronous send was not answered with the remote's message ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteRefusal {
    /// The remote has no such queue (QMEBADQUEUE).
    NoSuchQueue(String),
    /// The remote refuses the messages as invalid or its agent's privileges (QMEINVAL).
    Invalid(String),
    /// Too large for the remote, or the remote has no space (QMENOSPACE).
    NoSpace(String),
    /// Any other failure the remote reported (QMESYSTEM).
    System(String),
    /// The remote could not be reached; the request never went out (TPENOENT).
    Unreachable(String),
    /// The request went out and no answer came (a cut, a timeout): performed or not.
    InDoubt(String),
    /// The remote says an earlier request under the same key was performed (it kept that
    /// one's response, not this one's).
    Performed(String),
}

impl RemoteRefusal {
    /// The fault the sender gets; `why` is the remote's answer, already bounded.
    pub fn fault(&self, send: &RemoteSend) -> AqError {
        let at = format!("remote queue space {} ({} at {})", send.space, send.queue, send.login.url);
        match self {
            Self::NoSuchQueue(why) => AqError::client(
                code::NO_SUCH_QUEUE,
                format!("queue {} does not exist at {at}: {why}; nothing was enqueued", send.local),
            ),
            Self::Invalid(why) => {
                AqError::client(code::INVALID_VALUE, format!("{at} refused the send: {why}; nothing was enqueued"))
            }
            Self::NoSpace(why) => AqError::client(
                code::REMOTE_NO_SPACE,
                format!("{at} has no space for the send: {why}; nothing was enqueued"),
            ),
            Self::System(why) => {
                AqError::server(code::REMOTE_SYSTEM, format!("{at} failed the send: {why}; nothing was enqueued"))
            }
            Self::Unreachable(why) => AqError::server(
                code::REMOTE_UNREACHABLE,
                format!("{at} is unreachable: {why}; the send was not performed"),
            ),
            Self::InDoubt(why) => AqError::server(
                code::INTERNAL,
                format!(
                    "no answer from {at}: {why}; the request may or may not have been performed \
                     (with an Idempotency-Key, send it again to learn which)"
                ),
            ),
            Self::Performed(why) => AqError::client(
                code::IDEMPOTENCY_NOT_KEPT,
                format!(
                    "the request with this Idempotency-Key was performed at {at} ({why}); its message ids were \
                     not kept here, and nothing is performed again"
                ),
            ),
        }
    }
}

/// Sends to the remote aqgates of synchronous remote queue spaces.
#[async_trait::async_trait]
pub trait RemoteSpaces: Send + Sync + 'static {
    /// Forwards `send` and answers the remote's message ids, one per message in order.
    async fn send(&self, send: &RemoteSend) -> Result<Vec<String>, RemoteRefusal>;
}
