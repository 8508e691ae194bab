//! An IDAP client for aqgate over HTTP.
//!
//! * [`request`]: typed requests (send, publish, receive with wait, browse, correlation or
//!   condition, consumer; commit, rollback) written by `aqgate_proto`'s writer, every value
//!   escaped;
//! * [`answer`]: answers parsed into typed results (message ids, messages with payloads,
//!   statuses) and faults (code, text, HTTP status);
//! * [`client`]: one agent's [`Client`]: HTTP Basic, the servlet's session cookie carried
//!   across requests (its transaction), an `Idempotency-Key` on every request, transient
//!   failures tried again under the same key, timeouts and a cap on the answer's size;
//! * [`cli`]: the `aqgate send|receive|browse|commit|rollback` commands.

pub mod answer;
pub mod cli;
pub mod client;
pub mod request;

pub use answer::{Answer, Fault, Received};
pub use client::{Client, Config, Error, PostError, Reply};
pub use request::{Outgoing, Payload, Receive};
