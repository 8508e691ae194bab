//! [`StoreError`]: why a store operation failed, opaque to its callers, who ask what it
//! means (unavailable, full, a session conflict), never which database said it.

/// Why a store operation failed. Opaque: callers ask what it means
/// ([`StoreError::is_unavailable`], [`StoreError::is_session_conflict`]), never which
/// database said it; the message is for logs (never for a client).
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreErrorKind {
    /// The database could not be reached, or the connection in use was lost.
    Unavailable,
    /// A session row was not at the version the write expected.
    SessionConflict,
    /// A row the store holds is not what it wrote, or an internal invariant broke.
    Corrupt,
    /// A statement failed.
    Failed,
    /// The database could not write: its disk (or quota) is full.
    Full,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl StoreError {
    /// A statement (or migration) failed on a healthy connection.
    pub fn failed(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self { kind: StoreErrorKind::Failed, source: e.into() }
    }
    /// The database could not be reached (no connection to be had, or the one in use was
    /// lost).
    pub fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self { kind: StoreErrorKind::Unavailable, source: e.into() }
    }
    /// The database refused a write for want of space (SQLite's `SQLITE_FULL`,
    /// PostgreSQL's `53100 disk_full`): nothing of the transaction was written.
    pub fn full(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self { kind: StoreErrorKind::Full, source: e.into() }
    }
    /// A row is not what the store wrote, or an internal hand-off broke.
    pub fn corrupt(what: impl Into<String>) -> Self {
        Self { kind: StoreErrorKind::Corrupt, source: Box::new(Message(what.into())) }
    }
    /// A session row written in the transaction was not at the version the write expected
    /// (see [`StoreTx::session_put`]); the transaction was rolled back.
    pub fn session_conflict() -> Self {
        Self {
            kind: StoreErrorKind::SessionConflict,
            source: Box::new(Message("the session was changed by another request".into())),
        }
    }

    /// The database could not be reached (no connection to be had, or the one in use was
    /// lost), as opposed to a statement failing: trying again at once, request by
    /// request, would only wait again.
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// See [`StoreError::session_conflict`].
    pub fn is_session_conflict(&self) -> bool {
        self.kind == StoreErrorKind::SessionConflict
    }

    /// See [`StoreError::full`]: retrying helps once space is freed, not before.
    pub fn is_full(&self) -> bool {
        self.kind == StoreErrorKind::Full
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            StoreErrorKind::Unavailable | StoreErrorKind::Failed => write!(f, "database: {}", self.source),
            StoreErrorKind::Full => write!(f, "database full: {}", self.source),
            StoreErrorKind::Corrupt => write!(f, "corrupt row: {}", self.source),
            StoreErrorKind::SessionConflict => write!(f, "{}", self.source),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}
