//! What named a tier for a check, for the warning about a name the
//! registry lacks: the resolver, or the caller of
//! `RateLimiter::check_ruled_in_n_at` — which the HTTP layer says more of
//! (the header the name came from, or its `tier_from`) while its check
//! runs on this thread.

use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// What named the tier of the check running on this thread, when its
    /// caller said (the HTTP layer, around each poll of its check).
    static NAMED_BY: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// What named the tier of a check of `check_ruled_in_n_at` running on this
/// thread now: what its caller said, else the call itself.
pub(super) fn caller() -> String {
    NAMED_BY
        .with(|named| named.borrow().as_deref().map(str::to_owned))
        .unwrap_or_else(|| "a call of check_ruled_in_n_at".to_owned())
}

#[cfg(feature = "http")]
pub(crate) use self::scoped::named_by;

#[cfg(feature = "http")]
mod scoped {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use super::NAMED_BY;

    pin_project_lite::pin_project! {
        /// A check whose tier `source` named: each poll runs with
        /// `source` set on its thread.
        pub(crate) struct NamedBy<F> {
            source: Arc<str>,
            #[pin]
            check: F,
        }
    }

    /// The check `check` makes, made and then polled with `source` (what
    /// named its tier: "the request's header x-plan") set on its thread: a
    /// limiter in memory decides as the call makes its future (a ready
    /// one), an `async fn` wrapper of one at its first poll.
    pub(crate) fn named_by<F: Future>(source: &Arc<str>, check: impl FnOnce() -> F) -> NamedBy<F> {
        NamedBy {
            source: Arc::clone(source),
            check: scoped(source, check),
        }
    }

    /// Runs `run` with `source` set on this thread.
    fn scoped<T>(source: &Arc<str>, run: impl FnOnce() -> T) -> T {
        let before = NAMED_BY.with(|named| named.replace(Some(Arc::clone(source))));
        let _restore = Restore(before);
        run()
    }

    /// Puts back what was set before, however the poll ends (an unwind
    /// included).
    struct Restore(Option<Arc<str>>);

    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            NAMED_BY.with(|named| *named.borrow_mut() = before);
        }
    }

    impl<F: Future> Future for NamedBy<F> {
        type Output = F::Output;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.project();
            let check = this.check;
            scoped(this.source, || check.poll(cx))
        }
    }
}
