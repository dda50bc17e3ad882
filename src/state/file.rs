//! The state file: its format, its writing aside and renaming, and its
//! reading, whole or not at all.
//!
//! Layout: a head (8 magic bytes and the format version), a body (the
//! engine, the rules, the clock's tick, the save's time by the limiter's
//! clock and by the wall clock, the clients' records, the caller's
//! attachment), both encoded by `postcard`, then a CRC-32 of everything
//! before it, 4 bytes little-endian. The head is read first, so that
//! another program's file and a newer format are told apart from a
//! damaged one.

use std::borrow::Borrow;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{ClientsRefused, Group, RulesText, StateKey, TIERS};
use crate::{build_rules, Bounds, Engine, QuantaClock, RateLimiter, RuleSet, Tick};

/// The first bytes of every state file.
const MAGIC: [u8; 8] = *b"FLOODGAT";

/// The format this build writes and reads. A file of a later one is
/// refused as written by a newer floodgate.
pub const FORMAT_VERSION: u32 = 1;

/// The checksum's bytes at the end of the file.
const CHECKSUM: usize = 4;

#[derive(Serialize, Deserialize)]
struct Head {
    magic: [u8; 8],
    version: u32,
}

#[derive(Serialize, Deserialize)]
struct Body {
    /// Which store's records it holds: `lockfree`, `mutex` or `tiers`.
    kind: String,
    tick_nanos: u64,
    /// The save's time by the limiter's clock, in its ticks.
    saved_tick: u64,
    /// The save's time by the wall clock, in nanoseconds since the Unix
    /// epoch.
    saved_wall_nanos: u64,
    groups: Vec<GroupRecord>,
    attachment: Vec<u8>,
}

/// The clients of one group: a limiter's one (named `""`), or a tier's.
/// Each client is its key's bytes ([`StateKey`]) and the words its engine
/// keeps of it (`RateLimiter::save_clients`), kept end to end in two
/// arrays with each one's length beside them: no allocation per client,
/// to write or to read.
#[derive(Serialize, Deserialize, Default)]
struct GroupRecord {
    name: String,
    /// The rules, each window as a duration (`RulesText`).
    rules: String,
    key_lengths: Vec<u32>,
    keys: Vec<u8>,
    word_counts: Vec<u32>,
    words: Vec<u64>,
}

impl GroupRecord {
    fn push(&mut self, key: &[u8], words: &[u64]) {
        // A key or a state of 2^32 or more would not be one a limiter holds.
        self.key_lengths.push(key.len() as u32);
        self.keys.extend_from_slice(key);
        self.word_counts.push(words.len() as u32);
        self.words.extend_from_slice(words);
    }

    /// Each client's key's bytes and words, if the lengths add up.
    fn clients(&self) -> Option<Vec<(&[u8], &[u64])>> {
        if self.key_lengths.len() != self.word_counts.len() {
            return None;
        }
        let (mut keys, mut words) = (&self.keys[..], &self.words[..]);
        let mut clients = Vec::with_capacity(self.key_lengths.len());
        for (&key_length, &word_count) in self.key_lengths.iter().zip(&self.word_counts) {
            let (key, rest) = keys.split_at_checked(key_length as usize)?;
            keys = rest;
            let (state, rest) = words.split_at_checked(word_count as usize)?;
            words = rest;
            clients.push((key, state));
        }
        (keys.is_empty() && words.is_empty()).then_some(clients)
    }
}

/// What a save wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The clients saved.
    pub clients: usize,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// Saves `limiter`'s state to `path` (module docs): written to a file
/// beside it (`path` with `.PID.tmp` added), flushed to disk, then renamed over
/// `path`, so that `path` holds either its old contents or the new ones.
///
/// # Errors
///
/// [`SaveError`]: a limiter that cannot be saved (tiers, Redis), a key
/// type's bytes, or the file system's error, with the path; `path` is
/// then untouched.
pub fn save<Q, L>(limiter: &L, path: impl AsRef<Path>) -> Result<Summary, SaveError>
where
    Q: ?Sized + StateKey,
    L: ?Sized + RateLimiter<Q>,
{
    save_with(limiter, path, &[])
}

/// [`save`], with `attachment`: bytes of the caller's own, kept in the
/// same file under the same checksum ([`Saved::attachment`]). `floodgate
/// replay` keeps each client's latest time there.
///
/// # Errors
///
/// As [`save`].
pub fn save_with<Q, L>(
    limiter: &L,
    path: impl AsRef<Path>,
    attachment: &[u8],
) -> Result<Summary, SaveError>
where
    Q: ?Sized + StateKey,
    L: ?Sized + RateLimiter<Q>,
{
    let path = path.as_ref();
    let (bytes, clients) =
        encode(limiter, attachment).map_err(|problem| SaveError::new(path, problem))?;
    write_aside(path, &bytes)
        .map_err(|error| SaveError::new(path, SaveProblem::Io(Arc::new(error))))?;
    Ok(Summary {
        clients,
        bytes: bytes.len() as u64,
    })
}

/// [`save_with`] into memory: the file's bytes, for a caller that keeps
/// them elsewhere (an object store, a database); [`Saved::from_bytes`]
/// reads them back.
///
/// # Errors
///
/// As [`save`], but for the file system's, which this does not touch.
pub fn to_bytes<Q, L>(limiter: &L, attachment: &[u8]) -> Result<Vec<u8>, SaveError>
where
    Q: ?Sized + StateKey,
    L: ?Sized + RateLimiter<Q>,
{
    encode(limiter, attachment)
        .map(|(bytes, _)| bytes)
        .map_err(|problem| SaveError::new(Path::new(IN_MEMORY), problem))
}

/// What messages name bytes that came from no file by.
const IN_MEMORY: &str = "<bytes>";

/// A save's bytes and how many clients they hold.
fn encode<Q, L>(limiter: &L, attachment: &[u8]) -> Result<(Vec<u8>, usize), SaveProblem>
where
    Q: ?Sized + StateKey,
    L: ?Sized + RateLimiter<Q>,
{
    let Some((kind, tick)) = limiter.saved_by() else {
        return Err(SaveProblem::Unsupported);
    };
    // The limiter's time first, then the wall clock's: the load counts
    // from the wall time on, so any moment spent between the two reads is
    // counted twice rather than not at all (stricter, never more lenient).
    let saved_tick = limiter.now();
    let saved_wall_nanos = wall_nanos(SystemTime::now());
    let mut groups: Vec<GroupRecord> = limiter
        .saved_groups()
        .into_iter()
        .map(|(name, rules)| GroupRecord {
            name,
            rules: RulesText(&rules, tick).to_string(),
            ..GroupRecord::default()
        })
        .collect();
    let mut count = 0;
    limiter.save_clients(&mut |group, key, words| {
        // A handful of groups (tiers): a look along them is the cheapest.
        if let Some(group) = groups.iter_mut().find(|g| g.name == group) {
            count += 1;
            group.push(&key.key_bytes(), words);
        }
    });
    let body = Body {
        kind: kind.to_owned(),
        tick_nanos: tick.nanos(),
        saved_tick,
        saved_wall_nanos,
        groups,
        attachment: attachment.to_vec(),
    };
    let head = Head {
        magic: MAGIC,
        version: FORMAT_VERSION,
    };
    let mut bytes = postcard::to_stdvec(&head).map_err(SaveProblem::Encode)?;
    bytes.extend(postcard::to_stdvec(&body).map_err(SaveProblem::Encode)?);
    Ok((sealed(bytes), count))
}

/// `bytes` with their checksum after them, as a file ends.
fn sealed(mut bytes: Vec<u8>) -> Vec<u8> {
    let checksum = crc32fast::hash(&bytes);
    bytes.extend(checksum.to_le_bytes());
    bytes
}

/// `bytes` with a checksum that holds for them in place of their last
/// four: what a fuzz target uses to reach the decoder past the checksum.
#[doc(hidden)]
pub fn resealed(bytes: &[u8]) -> Vec<u8> {
    sealed(bytes[..bytes.len().saturating_sub(CHECKSUM)].to_vec())
}

/// Writes `bytes` to `path` by way of a file beside it, renamed over it
/// once flushed; the file beside it is removed if anything failed.
fn write_aside(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let aside = aside(path);
    let written = (|| {
        let mut file = fs::File::create(&aside)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&aside, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&aside);
        return written;
    }
    // The rename itself made durable, where the platform allows opening
    // a directory (best effort: the file is whole either way).
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty())
        && let Ok(dir) = fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// The file a save writes beside `path` before renaming it over `path`:
/// `path` with the process's id and `.tmp` added. The process's own name:
/// two processes saving to one path never write into each other's file
/// (the last rename wins, whole).
fn aside(path: &Path) -> PathBuf {
    aside_named(path, "")
}

/// `path` with the process's id, `tag` and `.tmp` added.
fn aside_named(path: &Path, tag: &str) -> PathBuf {
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".{}{tag}.tmp", std::process::id()));
    PathBuf::from(aside)
}

/// Checks that a save to `path` can be written now: its directory exists
/// and takes a file (a file beside `path`, `path` with `.PID.check.tmp`
/// added, is created there and removed at once: a name of its own, so a
/// save under way in this process is left alone), and `path` is not a
/// directory. An existing `path` is left as it is.
///
/// A service that saves at its stop checks this at its start, so that a
/// path that cannot be written is found before anything is served rather
/// than at the stop, with the state lost.
///
/// ```
/// use floodgate::state;
///
/// let missing = std::env::temp_dir().join("floodgate-no-such-directory").join("limits.state");
/// let error = state::check_writable(&missing).unwrap_err();
/// assert!(error.to_string().starts_with("cannot save to "));
/// assert!(state::check_writable(std::env::temp_dir().join("limits.state")).is_ok());
/// ```
///
/// # Errors
///
/// [`SaveError`], naming `path`: a directory that does not exist or does
/// not take a file (permissions, a read-only file system), with the
/// system's error; or `path` is a directory.
pub fn check_writable(path: impl AsRef<Path>) -> Result<(), SaveError> {
    let path = path.as_ref();
    let fail = |problem| Err(SaveError::new(path, problem));
    if path.is_dir() {
        return fail(SaveProblem::IsADirectory);
    }
    let aside = aside_named(path, ".check");
    match fs::File::create(&aside) {
        Ok(file) => {
            drop(file);
            fs::remove_file(&aside)
                .or_else(|error| fail(SaveProblem::Check(aside.clone(), Arc::new(error))))
        }
        Err(error) => fail(SaveProblem::Check(aside, Arc::new(error))),
    }
}

fn wall_nanos(time: SystemTime) -> u64 {
    // Before 1970 counts as 1970, past 2554 as 2554: no clock that runs
    // a limiter is either.
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

/// A state file read whole and checked: what it was saved under, and its
/// clients, ready to load into a limiter of the same rules.
pub struct Saved {
    path: PathBuf,
    kind: String,
    groups: Vec<SavedGroup>,
    tick: Tick,
    saved_tick: u64,
    saved_wall: SystemTime,
    attachment: Vec<u8>,
}

/// One group of a file read: its name, rules and clients.
struct SavedGroup {
    name: String,
    rules: RuleSet,
    clients: GroupRecord,
}

impl fmt::Debug for Saved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let groups: Vec<String> = self
            .groups
            .iter()
            .map(|g| {
                format!(
                    "{}={} ({} clients)",
                    g.name,
                    g.rules,
                    g.clients.key_lengths.len()
                )
            })
            .collect();
        f.debug_struct("Saved")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .field("groups", &groups)
            .field("tick", &self.tick)
            .field("saved_tick", &self.saved_tick)
            .finish_non_exhaustive()
    }
}

impl Saved {
    /// Reads and checks the file at `path`: whole, or an error that says
    /// what is wrong with it.
    ///
    /// # Errors
    ///
    /// [`LoadError`]: a missing or unreadable file, an empty one, another
    /// program's, one of a newer format, or one whose checksum or contents
    /// do not hold (truncated, or changed since it was written).
    pub fn read(path: impl AsRef<Path>) -> Result<Saved, LoadError> {
        let path = path.as_ref();
        let fail = |problem| LoadError::new(path, problem);
        let bytes = fs::read(path).map_err(|error| {
            fail(if error.kind() == io::ErrorKind::NotFound {
                LoadProblem::Missing
            } else {
                LoadProblem::Io(error)
            })
        })?;
        Self::decode(path, &bytes).map_err(fail)
    }

    /// Reads and checks a save's bytes ([`to_bytes`]), as
    /// [`read`](Self::read) reads a file's.
    ///
    /// # Errors
    ///
    /// As `read`, but for the file system's.
    pub fn from_bytes(bytes: &[u8]) -> Result<Saved, LoadError> {
        let path = Path::new(IN_MEMORY);
        Self::decode(path, bytes).map_err(|problem| LoadError::new(path, problem))
    }

    /// The file's bytes, checked and decoded.
    fn decode(path: &Path, bytes: &[u8]) -> Result<Saved, LoadProblem> {
        if bytes.is_empty() {
            return Err(LoadProblem::Empty);
        }
        if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
            return Err(LoadProblem::NotAStateFile);
        }
        let Ok((head, rest)) = postcard::take_from_bytes::<Head>(bytes) else {
            return Err(LoadProblem::Damaged);
        };
        if head.version > FORMAT_VERSION {
            return Err(LoadProblem::NewerFormat {
                version: head.version,
            });
        }
        if head.version != FORMAT_VERSION {
            return Err(LoadProblem::UnknownFormat {
                version: head.version,
            });
        }
        let Some(split) = bytes.len().checked_sub(CHECKSUM) else {
            return Err(LoadProblem::Damaged);
        };
        let (checked, checksum) = bytes.split_at(split);
        if rest.len() < CHECKSUM || checksum != crc32fast::hash(checked).to_le_bytes() {
            return Err(LoadProblem::Damaged);
        }
        let body_bytes = &rest[..rest.len() - CHECKSUM];
        let body = match postcard::take_from_bytes::<Body>(body_bytes) {
            Ok((body, [])) => body,
            _ => return Err(LoadProblem::Damaged),
        };
        if !KINDS.contains(&body.kind.as_str()) || body.groups.is_empty() {
            return Err(LoadProblem::Damaged);
        }
        let tick = Tick::from_duration(Duration::from_nanos(body.tick_nanos))
            .ok_or(LoadProblem::Damaged)?;
        let groups = body
            .groups
            .into_iter()
            .map(|mut group| {
                let rules: RuleSet = group.rules.parse().map_err(|_| LoadProblem::Damaged)?;
                if group.clients().is_none() {
                    return Err(LoadProblem::Damaged);
                }
                Ok(SavedGroup {
                    rules: rules.in_ticks_of(tick).map_err(|_| LoadProblem::Damaged)?,
                    name: std::mem::take(&mut group.name),
                    clients: group,
                })
            })
            .collect::<Result<Vec<_>, LoadProblem>>()?;
        Ok(Saved {
            path: path.to_owned(),
            kind: body.kind,
            groups,
            tick,
            saved_tick: body.saved_tick,
            saved_wall: UNIX_EPOCH + Duration::from_nanos(body.saved_wall_nanos),
            attachment: body.attachment,
        })
    }

    /// The rules it was saved under: a limiter's, or a registry's
    /// default (first) tier's ([`tiers`](Self::tiers) names them all).
    pub fn rules(&self) -> &RuleSet {
        &self.groups[0].rules
    }

    /// A registry's tiers, each with the rules it was saved under; one
    /// unnamed entry for a limiter's save.
    pub fn tiers(&self) -> impl Iterator<Item = (&str, &RuleSet)> {
        self.groups.iter().map(|g| (g.name.as_str(), &g.rules))
    }

    /// The engine that saved it; `None` for a registry of tiers
    /// ([`Tiers`](crate::tiers::Tiers) keeps its own store).
    pub fn engine(&self) -> Option<Engine> {
        self.kind.parse().ok()
    }

    /// The saving limiter's clock tick.
    pub fn tick(&self) -> Tick {
        self.tick
    }

    /// How many clients it holds.
    pub fn clients(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.clients.key_lengths.len())
            .sum()
    }

    /// The save's time by the saving limiter's clock, in its ticks.
    pub fn saved_at(&self) -> u64 {
        self.saved_tick
    }

    /// The save's time by the wall clock.
    pub fn saved_wall(&self) -> SystemTime {
        self.saved_wall
    }

    /// The bytes the saver attached ([`save_with`]); empty if none.
    pub fn attachment(&self) -> &[u8] {
        &self.attachment
    }

    /// Where a loaded limiter's clock goes on from when the wall clock
    /// reads `wall_now`: the save's ticks, plus the wall-clock time since
    /// the save in ticks (0 if the wall clock reads earlier than at the
    /// save: time never runs backwards across a restart).
    pub fn resume_at(&self, wall_now: SystemTime) -> u64 {
        let passed = wall_now.duration_since(self.saved_wall).unwrap_or_default();
        let ticks = passed.as_nanos() / u128::from(self.tick.nanos());
        self.saved_tick
            .saturating_add(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    /// Puts every saved client into `limiter`, which must hold none yet and
    /// apply the same rules (every tier of a registry) in the same kind of
    /// store with the same tick; its clock should go on from
    /// [`resume_at`](Self::resume_at) (a real clock:
    /// [`QuantaClock::starting_at`]; a trace's clock goes on by itself).
    /// All clients, or, past a cap, the ones with the least left; or none.
    /// Answers how many it holds.
    ///
    /// # Errors
    ///
    /// [`LoadError`]: other rules, engine or tick, a limiter that holds
    /// clients already or cannot be loaded, or a client the rules could
    /// not hold (a damaged file whose checksum still held).
    pub fn load_into<Q, L>(&self, limiter: &L) -> Result<usize, LoadError>
    where
        Q: ?Sized + StateKey,
        L: ?Sized + RateLimiter<Q>,
    {
        self.load(limiter, false)
    }

    /// [`load_into`](Self::load_into) a limiter whose rules may have
    /// changed since the save (a deploy that changed a limit), each client
    /// carried over to the new rules as a tier's
    /// [reload](crate::tiers::Tiers::reload_rules) carries it, rule by
    /// rule: the new rule at each position has spent what the saved one
    /// there had (a rule past the saved ones, what the last one had; an
    /// `in-flight` rule, nothing), judged at the limiter's `now`. What
    /// was spent is kept; when it was spent is not (see
    /// [tiers.md](https://docs.rs/floodgate/latest/floodgate/tiers/index.html)'s
    /// table). A registry's client is carried over at its next call; a
    /// limiter's, as it is loaded. Under the same rules, exactly
    /// `load_into`.
    ///
    /// # Errors
    ///
    /// As `load_into`, but for changed rules; a tier the registry no
    /// longer has is still an error.
    pub fn load_carried_into<Q, L>(&self, limiter: &L) -> Result<usize, LoadError>
    where
        Q: ?Sized + StateKey + std::hash::Hash + Eq + 'static,
        Q::Owned: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
        L: ?Sized + RateLimiter<Q>,
    {
        let changed = self.kind != TIERS
            && limiter.saved_groups().first().is_some_and(|(_, rules)| {
                RulesText(rules, self.tick).to_string()
                    != RulesText(&self.groups[0].rules, self.tick).to_string()
            });
        if changed {
            return self.carry(limiter);
        }
        self.load(limiter, true)
    }

    /// A limiter's load under changed rules: the save loaded exactly into
    /// a limiter of its own rules, each client's spend read there rule by
    /// rule at the new limiter's `now`, and put into it as that spend.
    fn carry<Q, L>(&self, limiter: &L) -> Result<usize, LoadError>
    where
        Q: ?Sized + StateKey + std::hash::Hash + Eq + 'static,
        Q::Owned: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
        L: ?Sized + RateLimiter<Q>,
    {
        let fail = |problem| LoadError::new(&self.path, problem);
        self.same_store(limiter)?;
        let (Some(engine), [group]) = (self.engine(), &self.groups[..]) else {
            return Err(fail(LoadProblem::Damaged));
        };
        let now = limiter.now();
        let clock = crate::ManualClock::with_tick(now, self.tick);
        let saved = build_rules::<Q, _>(&group.rules, engine, clock, Bounds::new())
            .map_err(|error| fail(LoadProblem::Rules(error)))?;
        let records = group
            .clients
            .clients()
            .ok_or_else(|| fail(LoadProblem::Damaged))?;
        let mut keys = Vec::with_capacity(records.len());
        let mut clients = Vec::with_capacity(records.len());
        for (i, (key, words)) in records.into_iter().enumerate() {
            let key =
                Q::from_key_bytes(key).ok_or_else(|| fail(LoadProblem::BadKey { client: i }))?;
            keys.push(key.clone());
            clients.push((key, words));
        }
        saved
            .load_clients(vec![Group {
                name: String::new(),
                rules: group.rules.clone(),
                clients,
            }])
            .map_err(|refused| fail(refused_problem(refused)))?;
        let rules = limiter.rules();
        let spent = keys
            .into_iter()
            .map(|key| {
                let read = saved.check_ruled_n_at(key.borrow(), now, 0);
                let old: Vec<u64> = if read.each.is_empty() {
                    vec![read.config.limit() - read.decision.remaining()]
                } else {
                    read.each
                        .iter()
                        .map(|answer| answer.rule.config().limit() - answer.decision.remaining())
                        .collect()
                };
                let new = rules
                    .iter()
                    .enumerate()
                    .map(|(i, rule)| match rule.policy() {
                        crate::PolicyKind::InFlight => 0,
                        _ => old[i.min(old.len() - 1)].min(rule.config().limit()),
                    })
                    .collect();
                (key, new)
            })
            .collect();
        limiter
            .load_spent(spent)
            .map_err(|refused| fail(refused_problem(refused)))
    }

    /// That `limiter` keeps the kind of store this was saved from, with
    /// the same tick.
    fn same_store<Q, L>(&self, limiter: &L) -> Result<(), LoadError>
    where
        Q: ?Sized,
        L: ?Sized + RateLimiter<Q>,
    {
        let fail = |problem| LoadError::new(&self.path, problem);
        let Some((kind, tick)) = limiter.saved_by() else {
            return Err(fail(LoadProblem::Unsupported));
        };
        if kind != self.kind {
            return Err(fail(LoadProblem::OtherKind {
                saved: self.kind.clone(),
                given: kind.to_owned(),
            }));
        }
        if tick != self.tick {
            return Err(fail(LoadProblem::OtherTick {
                saved: self.tick,
                given: tick,
            }));
        }
        Ok(())
    }

    fn load<Q, L>(&self, limiter: &L, carried: bool) -> Result<usize, LoadError>
    where
        Q: ?Sized + StateKey,
        L: ?Sized + RateLimiter<Q>,
    {
        let fail = |problem| LoadError::new(&self.path, problem);
        self.same_store(limiter)?;
        let (kind, tick) = (self.kind.as_str(), self.tick);
        let given: Vec<(String, String)> = limiter
            .saved_groups()
            .into_iter()
            .map(|(name, rules)| (name, RulesText(&rules, tick).to_string()))
            .collect();
        for group in &self.groups {
            let saved = RulesText(&group.rules, self.tick).to_string();
            match given.iter().find(|(name, _)| *name == group.name) {
                None => {
                    return Err(fail(LoadProblem::UnknownTier {
                        tier: group.name.clone(),
                    }))
                }
                Some((_, now)) if *now != saved && !(carried && kind == TIERS) => {
                    return Err(fail(LoadProblem::OtherRules {
                        tier: group.name.clone(),
                        saved,
                        given: now.clone(),
                    }));
                }
                Some(_) => {}
            }
        }
        let mut groups = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let records = group
                .clients
                .clients()
                .ok_or_else(|| fail(LoadProblem::Damaged))?;
            let mut clients = Vec::with_capacity(records.len());
            for (i, (key, words)) in records.into_iter().enumerate() {
                let key = Q::from_key_bytes(key)
                    .ok_or_else(|| fail(LoadProblem::BadKey { client: i }))?;
                clients.push((key, words));
            }
            groups.push(Group {
                name: group.name.clone(),
                rules: group.rules.clone(),
                clients,
            });
        }
        limiter
            .load_clients(groups)
            .map_err(|refused| fail(refused_problem(refused)))
    }
}

/// What a limiter's refusal of saved clients says of the file.
fn refused_problem(refused: ClientsRefused) -> LoadProblem {
    match refused {
        ClientsRefused::Unsupported => LoadProblem::Unsupported,
        ClientsRefused::NotEmpty => LoadProblem::NotEmpty,
        ClientsRefused::Client(client) => LoadProblem::BadClient { client },
        ClientsRefused::Duplicate(client) => LoadProblem::Duplicate { client },
        ClientsRefused::UnknownGroup(tier) => LoadProblem::UnknownTier { tier },
    }
}

/// The kinds of store a file may hold the records of.
const KINDS: [&str; 3] = ["lockfree", "mutex", TIERS];

/// Reads the file at `path` and builds a limiter from it: its rules on its
/// engine, under `bounds`, on a [`QuantaClock`] that goes on from the
/// save's ticks plus the wall-clock time since the save
/// ([`Saved::resume_at`]), holding every saved client (or as many as a
/// cap in `bounds` holds).
///
/// # Errors
///
/// [`LoadError`]: what [`Saved::read`] and [`Saved::load_into`] refuse;
/// a save whose tick is not the nanosecond of the real clock; `bounds`
/// the rules refuse.
pub fn load<Q>(path: impl AsRef<Path>, bounds: Bounds) -> Result<Arc<dyn RateLimiter<Q>>, LoadError>
where
    Q: ?Sized + StateKey + std::hash::Hash + Eq + 'static,
    Q::Owned: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let saved = Saved::read(path)?;
    let fail = |problem| LoadError::new(&saved.path, problem);
    let Some(engine) = saved.engine() else {
        return Err(fail(LoadProblem::OtherKind {
            saved: saved.kind.clone(),
            given: "a limiter".to_owned(),
        }));
    };
    if saved.tick != Tick::NANOSECOND {
        return Err(fail(LoadProblem::OtherTick {
            saved: saved.tick,
            given: Tick::NANOSECOND,
        }));
    }
    let clock = QuantaClock::starting_at(saved.resume_at(SystemTime::now()));
    let limiter = build_rules::<Q, _>(saved.rules(), engine, clock, bounds)
        .map_err(|error| fail(LoadProblem::Rules(error)))?;
    saved.load_into(&*limiter)?;
    Ok(limiter)
}

/// Loads the state file at `path` into the limiter `build` makes, or,
/// when there is no file yet (a first start), answers `build`'s limiter as
/// it is: the start of a service that keeps its limits across restarts,
/// with [`Saver`](crate::state::Saver) for the saves.
///
/// `build` is given the tick its limiter's clock starts at: where the
/// save's clock goes on from ([`Saved::resume_at`]: the save's ticks plus
/// the wall-clock time since), or 0 without a file. A real clock is
/// [`QuantaClock::starting_at`] that tick; a [`ManualClock`](crate::ManualClock)
/// is set to it. The limiter is built by the caller, so its rules,
/// bounds, counting and clock are the caller's: a file saved under other
/// rules is refused ([`LoadError::is_other_rules`]; [`Saved::load_carried_into`]
/// carries its clients over instead).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use floodgate::{state, Builder, QuantaClock, RateLimiter};
///
/// let path = std::env::temp_dir().join(format!("floodgate-doc-lon-{}.state", std::process::id()));
/// let rules = "gcra:5/1h".parse()?;
/// let build = |start| Builder::from_rules(&rules).clock(QuantaClock::starting_at(start)).build::<str>();
///
/// let limiter = state::load_or_new(&path, build)?; // no file: a new limiter
/// for _ in 0..5 {
///     limiter.check("maya");
/// }
/// state::save(&*limiter, &path)?;
///
/// let restarted = state::load_or_new(&path, build)?; // the file: maya's spend kept
/// assert!(!restarted.check("maya").allowed());
/// # std::fs::remove_file(&path)?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// [`LoadError`]: a file that exists but cannot be read whole (a corrupt
/// file is never silently replaced by a new limiter: the error says what
/// is wrong with it, and the caller decides), one that
/// [`Saved::load_into`] refuses, or `build`'s error.
pub fn load_or_new<Q, L>(
    path: impl AsRef<Path>,
    build: impl FnOnce(u64) -> Result<Arc<L>, crate::ConfigError>,
) -> Result<Arc<L>, LoadError>
where
    Q: ?Sized + StateKey,
    L: ?Sized + RateLimiter<Q>,
{
    let path = path.as_ref();
    let saved = match Saved::read(path) {
        Ok(saved) => saved,
        Err(error) if error.is_missing() => {
            return build(0).map_err(|error| LoadError::new(path, LoadProblem::Build(error)));
        }
        Err(error) => return Err(error),
    };
    let limiter = build(saved.resume_at(SystemTime::now()))
        .map_err(|error| LoadError::new(path, LoadProblem::Build(error)))?;
    let loaded = saved.load_into(&*limiter)?;
    tracing::info!(
        loaded,
        "floodgate: loaded {} from {}",
        super::clients(loaded),
        path.display()
    );
    Ok(limiter)
}

/// Why a save failed: the file it was for, and what happened. The file
/// is untouched.
#[derive(Clone, Debug)]
pub struct SaveError {
    path: PathBuf,
    problem: SaveProblem,
}

/// The system's errors shared, so that an error is kept as the last one
/// ([`Saver::last_error`](crate::state::Saver::last_error)) and returned.
#[derive(Clone, Debug)]
enum SaveProblem {
    Unsupported,
    Encode(postcard::Error),
    Io(Arc<io::Error>),
    /// [`check_writable`]: the file beside the target could not be
    /// created or removed.
    Check(PathBuf, Arc<io::Error>),
    IsADirectory,
}

impl SaveError {
    fn new(path: &Path, problem: SaveProblem) -> Self {
        Self {
            path: path.to_owned(),
            problem,
        }
    }

    /// The file the save was for.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for SaveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.problem {
            SaveProblem::Unsupported => write!(
                f,
                "cannot save to {path}: this limiter keeps no saves (the in-memory engines do)"
            ),
            SaveProblem::Encode(error) => write!(f, "cannot save to {path}: {error}"),
            SaveProblem::Io(error) => write!(f, "cannot save to {path}: {error}"),
            SaveProblem::Check(aside, error) => {
                let dir = aside
                    .parent()
                    .filter(|dir| !dir.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                write!(
                    f,
                    "cannot save to {path}: a file cannot be created in {}: {error}",
                    dir.display()
                )
            }
            SaveProblem::IsADirectory => write!(f, "cannot save to {path}: it is a directory"),
        }
    }
}

impl std::error::Error for SaveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            SaveProblem::Io(error) | SaveProblem::Check(_, error) => Some(&**error),
            SaveProblem::Encode(error) => Some(error),
            SaveProblem::Unsupported | SaveProblem::IsADirectory => None,
        }
    }
}

/// Why a state file was not loaded: the file, and what is wrong with it.
/// Nothing of it was loaded.
#[derive(Debug)]
pub struct LoadError {
    path: PathBuf,
    problem: LoadProblem,
}

#[derive(Debug)]
enum LoadProblem {
    Missing,
    Io(io::Error),
    Empty,
    NotAStateFile,
    NewerFormat {
        version: u32,
    },
    UnknownFormat {
        version: u32,
    },
    Damaged,
    OtherRules {
        tier: String,
        saved: String,
        given: String,
    },
    OtherKind {
        saved: String,
        given: String,
    },
    UnknownTier {
        tier: String,
    },
    OtherTick {
        saved: Tick,
        given: Tick,
    },
    Rules(crate::ConfigError),
    /// [`load_or_new`]'s `build` failed.
    Build(crate::ConfigError),
    Unsupported,
    NotEmpty,
    BadKey {
        client: usize,
    },
    BadClient {
        client: usize,
    },
    Duplicate {
        client: usize,
    },
}

impl LoadError {
    fn new(path: &Path, problem: LoadProblem) -> Self {
        Self {
            path: path.to_owned(),
            problem,
        }
    }

    /// The file that was not loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file does not exist (a first start, for a caller that
    /// starts empty then).
    pub fn is_missing(&self) -> bool {
        matches!(self.problem, LoadProblem::Missing)
    }

    /// Whether the file was saved under other rules than the limiter's (a
    /// deploy that changed a limit), or holds a tier it lacks.
    pub fn is_other_rules(&self) -> bool {
        matches!(
            self.problem,
            LoadProblem::OtherRules { .. } | LoadProblem::UnknownTier { .. }
        )
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.problem {
            LoadProblem::Missing => write!(f, "cannot load {path}: no such file"),
            LoadProblem::Io(error) => write!(f, "cannot load {path}: {error}"),
            LoadProblem::Empty => write!(f, "cannot load {path}: the file is empty"),
            LoadProblem::NotAStateFile => {
                write!(f, "cannot load {path}: not a floodgate state file")
            }
            LoadProblem::NewerFormat { version } => write!(
                f,
                "cannot load {path}: written in state format {version} by a newer floodgate; \
                 this one reads format {FORMAT_VERSION}"
            ),
            LoadProblem::UnknownFormat { version } => write!(
                f,
                "cannot load {path}: state format {version} is not one this floodgate reads \
                 (format {FORMAT_VERSION})"
            ),
            LoadProblem::Damaged => write!(
                f,
                "cannot load {path}: the file is damaged (truncated, or changed since it was \
                 written): its checksum or contents do not hold"
            ),
            LoadProblem::OtherRules { tier, saved, given } if tier.is_empty() => write!(
                f,
                "cannot load {path}: saved under the rules {saved}, not {given} \
                 (Saved::load_carried_into carries its clients over to the new rules)"
            ),
            LoadProblem::OtherRules { tier, saved, given } => write!(
                f,
                "cannot load {path}: tier {tier} was saved under the rules {saved}, not {given} \
                 (Saved::load_carried_into carries its clients over to the new rules)"
            ),
            LoadProblem::OtherKind { saved, given } => write!(
                f,
                "cannot load {path}: saved by {}, not {}",
                kind_name(saved),
                kind_name(given)
            ),
            LoadProblem::UnknownTier { tier } => write!(
                f,
                "cannot load {path}: it holds clients of tier {tier}, which this registry lacks"
            ),
            LoadProblem::OtherTick { saved, given } => write!(
                f,
                "cannot load {path}: saved with a clock tick of {saved}, not {given}"
            ),
            LoadProblem::Rules(error) => write!(f, "cannot load {path}: {error}"),
            LoadProblem::Build(error) => {
                write!(f, "cannot build the limiter for {path}: {error}")
            }
            LoadProblem::Unsupported => write!(
                f,
                "cannot load {path}: this limiter keeps no saves (the in-memory engines do)"
            ),
            LoadProblem::NotEmpty => write!(
                f,
                "cannot load {path}: the limiter holds clients already; load into a new one"
            ),
            LoadProblem::BadKey { client } => write!(
                f,
                "cannot load {path}: client {client}'s key is not a key of this limiter's type"
            ),
            LoadProblem::BadClient { client } => write!(
                f,
                "cannot load {path}: client {client}'s state is not one its rules can hold"
            ),
            LoadProblem::Duplicate { client } => {
                write!(f, "cannot load {path}: client {client}'s key appears twice")
            }
        }
    }
}

/// A kind of store as a message names it.
fn kind_name(kind: &str) -> String {
    match kind {
        TIERS => "a registry of tiers".to_owned(),
        "lockfree" | "mutex" => format!("the {kind} engine"),
        other => other.to_owned(),
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            LoadProblem::Io(error) => Some(error),
            LoadProblem::Rules(error) | LoadProblem::Build(error) => Some(error),
            _ => None,
        }
    }
}
