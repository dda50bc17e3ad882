//! The answer a policy gives for one request.

/// What a limiter answers for one request of one client at one instant.
///
/// Being limited is a normal answer, not an error: `allowed == false` with
/// `retry_after` saying when the same request would get through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// What `remaining` would answer right after this call: how many
    /// requests arriving one after another at this same instant would be
    /// admitted. While other threads decide for the same client, it may
    /// already count their later admissions (the sliding log reads it just
    /// after its own): it never promises more than later checks honour.
    pub remaining: u64,
    /// For a rejected request, the smallest `d >= 1` such that the same
    /// request at `now + d` would be admitted if nothing else happened in
    /// between; 0 for an admitted one.
    pub retry_after: u64,
    /// Leaky bucket only: how long an admitted request must wait before it
    /// proceeds (its place in the queue). 0 for every other policy and for
    /// rejected requests.
    pub delay: u64,
}

impl Decision {
    /// An admitted request.
    pub(crate) const fn admit(remaining: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            retry_after: 0,
            delay: 0,
        }
    }

    /// A rejected request. `remaining` is what a `remaining` call would
    /// answer at this instant (the policies that reject at full capacity
    /// always answer 0, but the counter policy may not).
    pub(crate) const fn reject(remaining: u64, retry_after: u64) -> Self {
        Self {
            allowed: false,
            remaining,
            retry_after,
            delay: 0,
        }
    }
}
