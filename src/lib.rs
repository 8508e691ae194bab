//! aqgate: Oracle-AQ-style message queuing over HTTP (IDAP) and signed e-mail.
//!
//! See ARCHITECTURE.md for the code map and the invariants. In short: `idap` is the pure
//! codec, `engine` the AQ semantics over the `store` trait, `servlet` the HTTP edge,
//! `topology` and `admin` the declarative configuration.

pub mod admin;
pub mod auth;
pub mod clock;
pub mod directory;
pub mod engine;
pub mod error;
pub mod idap;
pub mod mail;
pub mod notify;
pub mod payload;
pub mod selector;
pub mod server;
pub mod servlet;
pub mod store;
pub mod topology;
pub mod value;

/// The topology the repository ships: the types, queues, subscribers and agents the
/// reference examples use (demo passwords, marked as such in the file).
pub const DEFAULT_TOPOLOGY: &str = include_str!("../config/topology.toml");
