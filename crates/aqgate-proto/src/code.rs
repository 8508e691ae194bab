//! Oracle-style error numbers used in IDAP faults (the table in docs/faults.md).

/// ORA-01031 insufficient privileges.
pub const NOT_PERMITTED: i32 = 1031;
/// ORA-24010 queue does not exist.
pub const NO_SUCH_QUEUE: i32 = 24010;
/// ORA-24031 invalid value (a request parameter).
pub const INVALID_VALUE: i32 = 24031;
/// ORA-24093 AQ agent not granted privileges of database user: a `sender_id` on a secure
/// queue names no agent enabled for the database user the request enqueues as.
pub const AGENT_NOT_ENABLED: i32 = 24093;
/// ORA-24033 no recipients for message.
pub const NO_RECIPIENTS: i32 = 24033;
/// ORA-24039 queue not created for multiple consumers (consumer_name on a single-consumer queue).
pub const NOT_MULTI_CONSUMER: i32 = 24039;
/// ORA-25207 enqueue failed, queue is disabled for enqueueing.
pub const ENQUEUE_DISABLED: i32 = 25207;
/// ORA-25215 user_data type and queue type do not match.
pub const PAYLOAD_MISMATCH: i32 = 25215;
/// ORA-25229 error on transformation of message: a transformation failed on a message (the
/// text names the transformation and the target attribute).
pub const TRANSFORMATION: i32 = 25229;
/// ORA-25226 dequeue failed, queue is not enabled for dequeue.
pub const DEQUEUE_DISABLED: i32 = 25226;
/// ORA-25228 timeout or end-of-fetch during message dequeue.
pub const NO_MESSAGE: i32 = 25228;
/// ORA-25235 fetched all messages in current transaction: a NEXT_MESSAGE dequeue on a queue
/// with message grouping found no more messages of the current group (NEXT_TRANSACTION
/// goes on to the next group).
pub const FETCHED_ALL_IN_GROUP: i32 = 25235;
/// ORA-25231 cannot dequeue because CONSUMER_NAME not specified.
pub const CONSUMER_REQUIRED: i32 = 25231;
/// ORA-25297 enqueue of buffered message failed, attempted to enqueue buffered message
/// with a delay.
pub const BUFFERED_ENQUEUE: i32 = 25297;
/// ORA-25298 only immediate visibility mode supported for buffered message enqueue or
/// dequeue.
pub const BUFFERED_VISIBILITY: i32 = 25298;
/// ORA-25307 enqueue rate too high, flow control enabled: a queue holds as many unspilled
/// buffered messages as it may; sent again once its consumers catch up, it is taken.
pub const FLOW_CONTROL: i32 = 25307;
/// ORA-25263 no message in queue with message ID.
pub const NO_SUCH_MESSAGE_ID: i32 = 25263;
/// ORA-24034 application is already a subscriber / unknown subscriber.
pub const NOT_A_SUBSCRIBER: i32 = 24035;
/// ORA-25200 invalid value for a selector condition (aqgate: condition not supported).
pub const BAD_CONDITION: i32 = 25200;
/// ORA-02393 exceeded call limit on CPU usage: aqgate: a condition, rule or
/// transformation needs more work or a longer text than its budget allows (the text names
/// the condition and the limit); nothing of the request was performed.
pub const CONDITION_BUDGET: i32 = 2393;
/// ORA-25402 transaction must roll back: the store lost part of the session's
/// uncommitted work (the database restarted since it was sent); the client rolls back.
pub const TRANSACTION_LOST: i32 = 25402;
/// ORA-25254 time-out in LISTEN / session expired; aqgate: the session's work was rolled back.
pub const SESSION_EXPIRED: i32 = 25254;
/// aqgate: a name (agent alias, …) is not in the directory, or the directory is not
/// configured.
pub const DIRECTORY: i32 = 24047;
/// aqgate: the directory is temporarily unreachable or too slow; retry later.
pub const DIRECTORY_UNAVAILABLE: i32 = 24048;
/// aqgate: the session cookie names no session of this agent that the store knows (it
/// ended and was forgotten, or was never issued). Whatever it left open is not
/// committed; the client drops the cookie and starts its transaction again.
pub const SESSION_UNKNOWN: i32 = 24049;
/// aqgate: another request of the same session (on another node) changed it while this
/// one ran; nothing of this request was performed, and it may be sent again.
pub const SESSION_BUSY: i32 = 24050;
/// aqgate: an `Idempotency-Key` was used before with a different request (HTTP 422).
pub const IDEMPOTENCY_MISMATCH: i32 = 24051;
/// aqgate: a request with the same `Idempotency-Key` is being performed now (HTTP 409).
pub const IDEMPOTENCY_IN_PROGRESS: i32 = 24052;
/// aqgate: the agent has `--idempotency-max-records-per-agent` requests recorded under
/// Idempotency-Keys; nothing of this one was performed (HTTP 503, Retry-After).
pub const IDEMPOTENCY_LIMIT: i32 = 24061;
/// aqgate: the request with this Idempotency-Key was performed, but its response was too
/// large to keep (`--idempotency-max-response-bytes`, `--idempotency-max-bytes-per-agent`):
/// a retry gets this instead of the response, and nothing is performed again.
pub const IDEMPOTENCY_NOT_KEPT: i32 = 24062;
/// aqgate: a synchronous send to a remote queue space was refused there for want of space
/// (Tuxedo's QMENOSPACE): the message is larger than the remote takes (HTTP 413, 25443),
/// its store is full (1653), or it has no session or buffer to spare (18, 25307); nothing
/// is kept, here or there.
pub const REMOTE_NO_SPACE: i32 = 24063;
/// aqgate: a synchronous send to a remote queue space failed there otherwise (Tuxedo's
/// QMESYSTEM): a store failure, the queue closed for enqueue, credentials refused, an
/// answer that is not IDAP; nothing is kept, here or there.
pub const REMOTE_SYSTEM: i32 = 24064;
/// aqgate: the remote queue space could not be reached (Tuxedo's TPENOENT: connection
/// refused, no such host, no connection within the timeout); the send was not performed.
pub const REMOTE_UNREACHABLE: i32 = 24065;
/// ORA-00018 maximum number of sessions exceeded: aqgate: the request would leave a session
/// open past `--max-sessions-per-agent` or `--max-sessions`; nothing of it was performed
/// (HTTP 503, Retry-After).
pub const SESSION_LIMIT: i32 = 18;
/// ORA-01653 unable to extend table: aqgate: the store cannot write, its disk is full;
/// nothing of the request was performed, and it may be sent again once space is freed.
pub const STORE_FULL: i32 = 1653;
/// ORA-01034 ORACLE not available: aqgate: the database is unavailable (unreachable, its
/// connection lost, or refusing writes as a standby does during a failover); nothing of
/// the request was performed, and it may be sent again (with the same Idempotency-Key)
/// once the database is back (HTTP 503, Retry-After).
pub const STORE_UNAVAILABLE: i32 = 1034;
/// ORA-00600 internal error (store failure); details are logged, not returned.
pub const INTERNAL: i32 = 600;
