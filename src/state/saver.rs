//! A limiter saved on a thread of its own: every interval while it runs,
//! and once more when the saver stops or is dropped, so that a service
//! keeps its limits across restarts in two lines ([`load_or_new`] and
//! [`Saver::spawn`]).
//!
//! [`load_or_new`]: super::load_or_new

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{save, SaveError, StateKey, Summary};
use crate::RateLimiter;

/// How many times the stop's save is tried before it gives up.
const STOP_ATTEMPTS: u32 = 3;

/// The pause between two of the stop's attempts: long enough for a
/// passing condition (a full disk that a log rotation frees, a network
/// file system's hiccup) to pass, short enough for a stop that a
/// supervisor times.
const STOP_PAUSE: Duration = Duration::from_millis(250);

/// Saves a limiter to a file every interval on a thread of its own, and
/// once more when it stops ([`stop`](Self::stop)) or is dropped. A failed
/// save is logged through `tracing` every time (a warning), counted
/// ([`failures`](Self::failures), [`last_error`](Self::last_error)), and
/// tried again at the next interval; the stop's save is tried
/// three times, a quarter of a second apart, before it gives up (an
/// error).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use floodgate::{state, Builder, QuantaClock, RateLimiter};
///
/// let path = std::env::temp_dir().join(format!("floodgate-doc-saver-{}.state", std::process::id()));
/// let rules = "fixed-window:1000/1d".parse()?;
/// let build = |start| Builder::from_rules(&rules).clock(QuantaClock::starting_at(start)).build::<str>();
///
/// // The service's start: the last save if there is one, then a save every minute.
/// let limiter = state::load_or_new(&path, build)?;
/// let saver = state::Saver::spawn(Arc::clone(&limiter), &path, Duration::from_secs(60));
///
/// limiter.check("alice");
/// drop(saver); // its stop: one more save, at once
/// assert_eq!(state::Saved::read(&path)?.clients(), 1);
/// # std::fs::remove_file(&path)?;
/// # Ok(())
/// # }
/// ```
///
/// One saver per file: two savers of one process writing one path would
/// each write a whole file, the last rename winning, but with no order
/// between them. Saves of one saver are made one at a time.
pub struct Saver {
    shared: Arc<Shared>,
    /// The periodic saves' thread, until the stop joins it.
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Whether [`stop`](Self::stop) was called: a drop then saves no more.
    stopped: AtomicBool,
}

/// A save of the limiter to a path.
type SaveTo = Box<dyn Fn(&Path) -> Result<Summary, SaveError> + Send + Sync>;

/// What the saver and its thread share.
struct Shared {
    path: PathBuf,
    interval: Option<Duration>,
    save: SaveTo,
    /// `true` once the saver stops: the thread's wait ends and it returns.
    stopping: Mutex<bool>,
    wake: Condvar,
    /// Held through each save: one at a time, since two would write the
    /// same file beside the target.
    saving: Mutex<()>,
    /// Relaxed, these three: each is a count of its own, read only to be
    /// reported; the last error's mutex orders what it holds.
    saves: AtomicU64,
    failures: AtomicU64,
    last_error: Mutex<Option<SaveError>>,
}

/// A lock whose holder panicked is still good here: what the mutexes
/// guard (a flag, nothing, the last error) is whole at every step.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// One save, counted: a success clears the last error.
    fn save_counted(&self) -> Result<Summary, SaveError> {
        let _one_at_a_time = lock(&self.saving);
        match (self.save)(&self.path) {
            Ok(summary) => {
                self.saves.fetch_add(1, Ordering::Relaxed);
                *lock(&self.last_error) = None;
                Ok(summary)
            }
            Err(error) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                *lock(&self.last_error) = Some(error.clone());
                Err(error)
            }
        }
    }

    /// The periodic saves, until the saver stops.
    fn run(&self, interval: Duration) {
        let mut stopping = lock(&self.stopping);
        // Ends when the saver stops: `stop` sets the flag under this lock
        // and wakes the wait, which re-checks it (a spurious wake-up waits
        // on). Otherwise each pass waits out one interval and saves.
        loop {
            stopping = self
                .wake
                .wait_timeout_while(stopping, interval, |stopping| !*stopping)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if *stopping {
                return;
            }
            drop(stopping);
            if let Err(error) = self.save_counted() {
                let failures = self.failures.load(Ordering::Relaxed);
                tracing::warn!(
                    path = %self.path.display(),
                    failures,
                    "floodgate: {error}; trying again in {} ({failures} failed so far)",
                    Interval(interval)
                );
            }
            stopping = lock(&self.stopping);
        }
    }
}

/// An interval as the rules write a duration (`1m`, `500ms`).
struct Interval(Duration);

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::rule::write_duration(f, self.0)
    }
}

impl Saver {
    /// Saves `limiter` to `path` every `interval`, the first an interval
    /// from now, on a thread of its own; and once more at the stop or the
    /// drop. Check the path at the start with
    /// [`check_writable`](super::check_writable): a saver of a path that
    /// cannot be written counts its failures and tries again, and a path
    /// that becomes writable is saved to at the next interval.
    ///
    /// # Panics
    ///
    /// If `interval` is zero (saves without a pause), or the thread cannot
    /// be started (as [`std::thread::spawn`]).
    pub fn spawn<Q, L>(limiter: Arc<L>, path: impl Into<PathBuf>, interval: Duration) -> Saver
    where
        Q: ?Sized + StateKey + 'static,
        L: ?Sized + RateLimiter<Q> + 'static,
    {
        assert!(
            !interval.is_zero(),
            "a saver's interval must be longer than zero"
        );
        let saver = Self::with(limiter, path.into(), Some(interval));
        let shared = Arc::clone(&saver.shared);
        let thread = std::thread::Builder::new()
            .name("floodgate-saver".to_owned())
            .spawn(move || shared.run(interval))
            .expect("failed to spawn the saver's thread");
        *lock(&saver.thread) = Some(thread);
        saver
    }

    /// Saves `limiter` to `path` once, at the stop or the drop; no thread.
    pub fn new<Q, L>(limiter: Arc<L>, path: impl Into<PathBuf>) -> Saver
    where
        Q: ?Sized + StateKey + 'static,
        L: ?Sized + RateLimiter<Q> + 'static,
    {
        Self::with(limiter, path.into(), None)
    }

    fn with<Q, L>(limiter: Arc<L>, path: PathBuf, interval: Option<Duration>) -> Saver
    where
        Q: ?Sized + StateKey + 'static,
        L: ?Sized + RateLimiter<Q> + 'static,
    {
        Saver {
            shared: Arc::new(Shared {
                path,
                interval,
                save: Box::new(move |path: &Path| save::<Q, L>(&*limiter, path)),
                stopping: Mutex::new(false),
                wake: Condvar::new(),
                saving: Mutex::new(()),
                saves: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                last_error: Mutex::new(None),
            }),
            thread: Mutex::new(None),
            stopped: AtomicBool::new(false),
        }
    }

    /// Saves now (after a save under way, if there is one), counted as any
    /// other; not logged: the caller has the error.
    ///
    /// # Errors
    ///
    /// The save's [`SaveError`].
    pub fn save_now(&self) -> Result<Summary, SaveError> {
        self.shared.save_counted()
    }

    /// Stops the periodic saves (waiting for a save under way) and saves
    /// once more: up to three attempts, a quarter of a second apart, each
    /// failure logged. It blocks: from async code, call it where blocking
    /// is allowed (`tokio::task::spawn_blocking`). A drop after it saves no
    /// more; without it, the drop does the same and logs the outcome.
    ///
    /// # Errors
    ///
    /// The last attempt's [`SaveError`]: the state was not saved.
    pub fn stop(&self) -> Result<Summary, SaveError> {
        self.stopped.store(true, Ordering::SeqCst);
        *lock(&self.shared.stopping) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            // A thread that panicked (a limiter's save that panicked) has
            // stopped all the same; the last save below tries again.
            let _ = thread.join();
        }
        let path = self.shared.path.display();
        let mut attempt = 1;
        // Ends within STOP_ATTEMPTS attempts: each either succeeds, or
        // is the last and gives up, or pauses and counts one more.
        loop {
            match self.shared.save_counted() {
                Ok(summary) => return Ok(summary),
                Err(error) if attempt < STOP_ATTEMPTS => {
                    tracing::warn!(
                        path = %path,
                        attempt,
                        "floodgate: {error}; trying again in {} (the stop's attempt {attempt} \
                         of {STOP_ATTEMPTS})",
                        Interval(STOP_PAUSE)
                    );
                    std::thread::sleep(STOP_PAUSE);
                    attempt += 1;
                }
                Err(error) => {
                    tracing::error!(
                        path = %path,
                        "floodgate: {error}; the state was not saved (the stop's \
                         {STOP_ATTEMPTS} attempts failed)"
                    );
                    return Err(error);
                }
            }
        }
    }

    /// The file it saves to.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// How often it saves; `None` for a saver that saves at its stop only
    /// ([`new`](Self::new)).
    pub fn interval(&self) -> Option<Duration> {
        self.shared.interval
    }

    /// How many saves succeeded.
    pub fn saves(&self) -> u64 {
        self.shared.saves.load(Ordering::Relaxed)
    }

    /// How many saves failed, every attempt counted (each of the stop's).
    pub fn failures(&self) -> u64 {
        self.shared.failures.load(Ordering::Relaxed)
    }

    /// The last save's error if it failed; `None` once a save succeeds
    /// again (or before any failed).
    pub fn last_error(&self) -> Option<SaveError> {
        lock(&self.shared.last_error).clone()
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        if !self.stopped.load(Ordering::SeqCst) {
            // Logged by `stop`, attempt by attempt.
            let _ = self.stop();
        }
    }
}

impl fmt::Debug for Saver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saver")
            .field("path", &self.shared.path)
            .field("interval", &self.shared.interval)
            .field("saves", &self.saves())
            .field("failures", &self.failures())
            .finish_non_exhaustive()
    }
}
