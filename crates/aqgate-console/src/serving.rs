//! Whether the HTTP listener serves the console: on by default only when every listener
//! that serves the router is on a loopback address (`127.0.0.0/8`, `::1`), where only
//! this machine reaches it; on a listener others reach only when the operator says so
//! (`--console`, `http.console = true`).

use std::net::SocketAddr;

/// Whether to serve the console on `listeners` (the HTTP listener and the plain listener
/// beside HTTPS, when there is one); `configured`: `--console`.
pub fn serves(listeners: &[SocketAddr], configured: bool) -> bool {
    configured || listeners.iter().all(|a| a.ip().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn loopback_serves_by_default_and_others_only_when_configured() {
        assert!(serves(&[a("127.0.0.1:8080")], false));
        assert!(serves(&[a("[::1]:8080")], false));
        assert!(serves(&[a("127.0.0.1:8443"), a("127.0.0.2:8080")], false));
        assert!(!serves(&[a("0.0.0.0:8080")], false));
        assert!(!serves(&[a("[::]:8080")], false));
        assert!(!serves(&[a("192.0.2.1:8080")], false));
        assert!(!serves(&[a("127.0.0.1:8443"), a("0.0.0.0:8080")], false), "a public plain listener");
        assert!(serves(&[a("0.0.0.0:8080")], true));
    }
}
