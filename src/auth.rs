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
    fn basic_header_parses() {
        assert_eq!(parse_basic("Basic c2NvdHQ6dGlnZXI="), Some(("scott".into(), "tiger".into())));
        assert_eq!(parse_basic("Bearer abc"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
    }
}
