//! Buffered messages in the store: the state of a spilled one, and which kinds a dequeue
//! looks at.

/// `messages.state` of a spilled buffered message (Oracle's SPILLED).
pub const SPILLED: i32 = 7;

/// Which stored messages a dequeue looks at (Oracle's dequeue DELIVERY_MODE, as far as
/// the store holds buffered messages: the spilled ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stored {
    /// Persistent messages only: every state but [`SPILLED`].
    #[default]
    Persistent,
    /// Spilled buffered messages only.
    Spilled,
    /// Both.
    Either,
}
