//! aqgate's HTTP edge: the IDAP servlet (`servlet`: the router, Basic, client-certificate
//! and SAML login, sessions, `Idempotency-Key`, `/metrics`), HTTPS (`https`: rustls, the
//! accept loops of both listeners) and the listeners' bounds (`edge`), with the command-line
//! flags that configure them (`cli`). It reaches the store only through the engine's `Store`
//! trait: no database driver, no broker client (`tests/tidy.rs`).

pub mod cli;
pub mod edge;
pub mod https;
pub mod servlet;

/// Why a SAML setting or assertion is refused by a build without the `saml` feature.
pub const SAML_FEATURE_MISSING: &str = "SAML login needs an aqgate built with the `saml` feature \
     (cargo build --release --no-default-features --features saml; docs/security.md, \"SAML\")";
