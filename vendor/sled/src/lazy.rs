//! This module exists because `lazy_static` causes TSAN to
//! be very unhappy. We rely heavily on TSAN for finding
//! races, so we don't use `lazy_static`.
//!
//! agent-loop: a thread that finds the value being initialized waits for it
//! (`std::sync::OnceLock`), where sled's own version spun on an atomic flag. The
//! I/O pool's threads are spawned while its queue is initialized, and each spun
//! until the spawning thread finished: on two cores, two spinning threads took
//! both from the thread they were waiting for.

use std::sync::OnceLock;

/// A lazily initialized value
pub struct Lazy<T, F> {
    value: OnceLock<T>,
    init: F,
}

impl<T, F> Lazy<T, F> {
    /// Create a new Lazy
    pub const fn new(init: F) -> Self
    where
        F: Sized,
    {
        Self { value: OnceLock::new(), init }
    }
}

impl<T, F> std::ops::Deref for Lazy<T, F>
where
    F: Fn() -> T,
{
    type Target = T;

    fn deref(&self) -> &T {
        self.value.get_or_init(&self.init)
    }
}
