//! aqgate: Oracle-AQ-style message queuing over HTTP (IDAP) and signed e-mail.
//!
//! The binary crate: the HTTP edge (`servlet`, `https`, `edge`), the process wiring
//! (`server`) and the administration commands (`admin`). The protocol, the engine, the
//! stores, the directory, the mail path, the notifications (`notify`) and propagation with
//! the Messaging Gateway (`propagate`), both re-exported, are the workspace's member crates
//! (see ARCHITECTURE.md).

pub mod admin;
pub mod edge;
pub mod https;
/// Notifications (the `aqgate-notify` crate), where the binary's modules and the tests name them.
pub use aqgate_notify as notify;
/// Propagation jobs and the Messaging Gateway (the `aqgate-propagate` crate).
pub use aqgate_propagate as propagate;
pub mod server;
pub mod servlet;

#[cfg(all(feature = "saml", feature = "vendored-openssl"))]
compile_error!(
    "the `saml` feature links xmlsec1, which uses the system OpenSSL; build it without the vendored one: \
     cargo build --release --no-default-features --features saml"
);

/// Why a SAML setting or assertion is refused by a build without the `saml` feature.
pub const SAML_FEATURE_MISSING: &str = "SAML login needs an aqgate built with the `saml` feature \
     (cargo build --release --no-default-features --features saml; README, \"SAML\")";

/// The topology the repository ships: the types, queues, subscribers and agents the
/// examples in `examples/` use (demo passwords, marked as such in the file).
pub const DEFAULT_TOPOLOGY: &str = include_str!("../config/topology.toml");
