//! [`Interest`]: a waiter's or dispatcher's claim on a queue's enqueue signals.

/// Interest in a queue's enqueue signals (see [`super::Store::interest`]), given up when dropped.
#[must_use = "the interest ends when this is dropped"]
pub struct Interest(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Interest {
    /// No interest needed (the backend signals every process there is).
    pub fn none() -> Self {
        Self(None)
    }

    /// Interest a backend holds until this is dropped, then gives up by `release`.
    pub fn held(release: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self(Some(Box::new(release)))
    }

    /// Whether the backend needed it: then what was committed before it took effect must
    /// be looked for once more.
    pub fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release();
        }
    }
}

impl std::fmt::Debug for Interest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Interest").field(&self.is_held()).finish()
    }
}
