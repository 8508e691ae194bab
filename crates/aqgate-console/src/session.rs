//! Console sessions: a random token (the cookie's value) → the agent, held in this
//! process's memory, bounded in number (a login past the bound ends the least recently
//! used session) and in idle time (a session unused for that long ends). The role is not
//! kept: it is read from the topology on every request, so a reload that changes or
//! removes it takes effect at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Entry {
    agent: String,
    last: Instant,
}

pub(crate) struct Sessions {
    max: usize,
    idle: Duration,
    map: Mutex<HashMap<String, Entry>>,
}

impl Sessions {
    pub(crate) fn new(max: usize, idle: Duration) -> Self {
        Self { max: max.max(1), idle, map: Mutex::new(HashMap::new()) }
    }

    /// A new session of `agent`: its token.
    pub(crate) fn open(&self, agent: &str) -> String {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let token = hex::encode(bytes);
        let now = Instant::now();
        let mut map = lock(&self.map);
        if map.len() >= self.max {
            map.retain(|_, e| now.duration_since(e.last) < self.idle);
        }
        while map.len() >= self.max {
            let oldest = map.iter().min_by_key(|(_, e)| e.last).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(token.clone(), Entry { agent: agent.to_string(), last: now });
        token
    }

    /// The agent of the live session `token` (which counts as used now).
    pub(crate) fn agent(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut map = lock(&self.map);
        let live = map.get(token).is_some_and(|e| now.duration_since(e.last) < self.idle);
        if !live {
            map.remove(token);
            return None;
        }
        let e = map.get_mut(token)?;
        e.last = now;
        Some(e.agent.clone())
    }

    pub(crate) fn close(&self, token: &str) {
        lock(&self.map).remove(token);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_in_number_and_idle_time() {
        let s = Sessions::new(2, Duration::from_millis(200));
        let a = s.open("A");
        let b = s.open("B");
        assert_eq!(s.agent(&a).as_deref(), Some("A"));
        let c = s.open("C");
        assert_eq!(s.len(), 2);
        assert_eq!(s.agent(&b), None, "the least recently used went");
        assert_eq!(s.agent(&a).as_deref(), Some("A"));
        assert_eq!(s.agent(&c).as_deref(), Some("C"));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(s.agent(&a), None, "idle too long");
        s.close(&c);
        assert_eq!(s.agent(&c), None);
        assert_ne!(s.open("A"), s.open("A"), "tokens are random");
    }
}
