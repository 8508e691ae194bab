//! Agent passwords: argon2id hashes (PHC strings). Verification is CPU-heavy by design, so
//! callers run it on the blocking pool; a session cookie spares it on later requests.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString, rand_core::OsRng};

pub fn hash_password(password: &str) -> Result<String, String> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("cannot hash password: {e}"))
}

/// Constant-time check of `password` against a PHC hash; a malformed hash never matches.
pub fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(h) => Argon2::default().verify_password(password.as_bytes(), &h).is_ok(),
        Err(_) => false,
    }
}

/// Remembers credentials that passed argon2 for a while, so that clients which send Basic
/// credentials on every request (curl without a cookie jar, the SMTP gateway) do not pay
/// a deliberately slow hash each time. Only a keyed BLAKE2b MAC of the password is kept,
/// under a random key that never leaves the process. Its time is the clock's.
pub struct CredentialCache {
    key: [u8; 32],
    ttl: std::time::Duration,
    clock: std::sync::Arc<dyn crate::clock::Clock>,
    entries: std::sync::Mutex<std::collections::HashMap<String, ([u8; 32], std::time::Instant)>>,
}

impl CredentialCache {
    pub fn new(ttl: std::time::Duration, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        use rand::RngCore;
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        Self { key, ttl, clock, entries: std::sync::Mutex::new(std::collections::HashMap::new()) }
    }

    fn mac(&self, user: &str, password: &str) -> Option<[u8; 32]> {
        use blake2::digest::{Mac, consts::U32};
        let mut m = blake2::Blake2bMac::<U32>::new_from_slice(&self.key).ok()?;
        m.update(user.as_bytes());
        m.update(&[0]);
        m.update(password.as_bytes());
        Some(m.finalize().into_bytes().into())
    }

    /// Whether (user, password) passed verification recently.
    pub fn check(&self, user: &str, password: &str) -> bool {
        let Some(mac) = self.mac(user, password) else { return false };
        let g = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.clock.instant();
        g.get(user).is_some_and(|(m, at)| *m == mac && now.saturating_duration_since(*at) < self.ttl)
    }

    pub fn remember(&self, user: &str, password: &str) {
        let Some(mac) = self.mac(user, password) else { return };
        let mut g = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() > 100_000 {
            g.clear();
        }
        g.insert(user.to_string(), (mac, self.clock.instant()));
    }

    /// Forgets everything (after a topology reload: passwords may have changed).
    pub fn clear(&self) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Decodes an `Authorization: Basic …` value into (user, password).
pub fn parse_basic(value: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_verify_and_reject() {
        let h = hash_password("tiger").expect("hash");
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("tiger", &h));
        assert!(!verify_password("Tiger", &h));
        assert!(!verify_password("tiger", "not-a-hash"));
    }

    #[test]
    fn credential_cache_matches_only_the_same_password() {
        let clock = std::sync::Arc::new(crate::clock::SystemClock);
        let c = CredentialCache::new(std::time::Duration::from_secs(60), clock.clone());
        assert!(!c.check("SCOTT", "tiger"));
        c.remember("SCOTT", "tiger");
        assert!(c.check("SCOTT", "tiger"));
        assert!(!c.check("SCOTT", "tiger2"));
        assert!(!c.check("JOHN", "tiger"));
        c.clear();
        assert!(!c.check("SCOTT", "tiger"));
        let expired = CredentialCache::new(std::time::Duration::ZERO, clock);
        expired.remember("SCOTT", "tiger");
        assert!(!expired.check("SCOTT", "tiger"));
    }

    #[test]
    fn basic_header_parses() {
        assert_eq!(parse_basic("Basic c2NvdHQ6dGlnZXI="), Some(("scott".into(), "tiger".into())));
        assert_eq!(parse_basic("Bearer abc"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
    }
}
