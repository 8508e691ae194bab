//! HTTP header and cookie names aqgate's servlet and its clients (the mail worker, the
//! benchmark, tests) share.

/// The session cookie (AQ's servlet keeps sessions by cookie).
pub const SESSION_COOKIE: &str = "AQSESSIONID";
/// A gateway (the mail path) acting on behalf of the agent named here.
pub const ON_BEHALF_HEADER: &str = "aq-on-behalf-of";
/// At most once per agent and key (IETF httpapi `Idempotency-Key`).
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// A SAML 2.0 assertion (or the IdP's `samlp:Response`), base64 of its exact XML bytes,
/// for clients that cannot put it in the IDAP `Header` (docs/security.md, "SAML").
pub const SAML_ASSERTION_HEADER: &str = "aq-saml-assertion";
/// Set on a response replayed for an `Idempotency-Key` seen before.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// When the messages of a send to a remote queue space may be dequeued at the remote:
/// `HH:MM`, `R:HH:MM`, `L:HH:MM` or an RFC 3339 timestamp (docs/remote-queue-spaces.md).
pub const SCHEDULE_HEADER: &str = "aq-schedule";
/// The client's time zone for an `L:HH:MM` schedule: a UTC offset (`+01:00`).
pub const CLIENT_TIMEZONE_HEADER: &str = "aq-client-timezone";
/// WS-Security's namespace: an IDAP `Header` entry `wsse:Security` carries a SAML token.
pub const WSSE_NS: &str = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd";
