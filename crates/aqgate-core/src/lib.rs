//! The AQ semantics of aqgate: the engine (enqueue, dequeue, registration, transactions,
//! time manager), sessions, the [`store::Store`] and [`directory::Directory`] interfaces
//! the backends implement, the topology, the clock and the error type.

pub mod auth;
pub mod clock;
pub mod directory;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod notify_policy;
pub use topology::propagation;
pub mod remote;
pub mod store;
pub mod topology;

pub use aqgate_proto::{code, idap, payload, selector, value};
