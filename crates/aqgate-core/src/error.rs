//! `AqError`: the one error type of the IDAP surface. Every failure of a request becomes
//! one of these and then an IDAP `Fault`; internals (SQL text, paths) never leak into it.
//!
//! Error numbers follow Oracle where Oracle has one for the condition (see the table in
//! docs/faults.md).

use aqgate_proto::idap::model::{Fault, FaultKind};

/// Oracle-style error numbers used in faults.
pub use aqgate_proto::code;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("AQ-{code}: {message}")]
pub struct AqError {
    pub kind: FaultKind,
    pub code: i32,
    pub message: String,
}

impl AqError {
    pub fn client(code: i32, message: impl Into<String>) -> Self {
        Self { kind: FaultKind::Client, code, message: message.into() }
    }
    pub fn server(code: i32, message: impl Into<String>) -> Self {
        Self { kind: FaultKind::Server, code, message: message.into() }
    }
    pub fn no_such_queue(name: &str) -> Self {
        Self::client(code::NO_SUCH_QUEUE, format!("queue {name} does not exist"))
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::client(code::INVALID_VALUE, message)
    }
    pub fn to_fault(&self) -> Fault {
        Fault { kind: self.kind, code: self.code, message: self.message.clone() }
    }
}

impl AqError {
    /// A directory failure, as a fault. `what` says what was being resolved.
    pub fn directory(e: crate::directory::DirectoryError, what: &str) -> Self {
        use crate::directory::DirectoryError as D;
        match e {
            D::NotFound(n) => AqError::client(code::DIRECTORY, format!("{what}: not found in the directory: {n}")),
            D::Unavailable(why) => AqError::server(
                code::DIRECTORY_UNAVAILABLE,
                format!("{what}: the directory is temporarily unavailable ({why}); retry later"),
            ),
            D::Malformed(why) => {
                AqError::server(code::DIRECTORY, format!("{what}: the directory holds a malformed entry: {why}"))
            }
            D::Config(why) => AqError::server(code::DIRECTORY, format!("{what}: directory configuration: {why}")),
        }
    }
}

impl From<crate::store::StoreError> for AqError {
    fn from(e: crate::store::StoreError) -> Self {
        if e.is_session_conflict() {
            // Normally mapped by the engine, which knows whether the session still lives.
            return AqError::client(
                code::SESSION_BUSY,
                "another request with the same session cookie ran at the same time; nothing of this one was performed, send it again",
            );
        }
        if e.is_full() {
            // Logged by the store when writes start failing, not once per request.
            tracing::debug!(error = %e, "store full");
            return AqError::server(
                code::STORE_FULL,
                "the store cannot write: its disk is full; nothing of this request was performed, \
                 send it again (with the same Idempotency-Key) once space is freed",
            );
        }
        if e.is_unavailable() {
            // The store logs when the database goes away and when it is back, not once
            // per request.
            tracing::debug!(error = %e, "database unavailable");
            return store_unavailable_error();
        }
        // The cause is logged here once; the client sees a generic server fault.
        tracing::error!(error = %e, "store failure");
        AqError::server(code::INTERNAL, "internal store error; the request was not performed")
    }
}

/// The fault of a request the database could not take (unreachable, connection lost,
/// refusing writes): nothing of it was performed; it may be sent again.
pub fn store_unavailable_error() -> AqError {
    AqError::server(
        code::STORE_UNAVAILABLE,
        "the database is unavailable; nothing of this request was performed: retry it (with the same \
         Idempotency-Key) once the database is back",
    )
}
