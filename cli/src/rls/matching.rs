//! A request's descriptors to the limits that apply, as envoyproxy/ratelimit
//! finds them (its `GetLimit` and the service's `replaces`).
//!
//! A descriptor is an ordered list of entries, each a key and a value. Its
//! entries are walked level by level from the domain's top descriptors:
//! at each level the entry's `KEY_VALUE` first, then the level's wildcard
//! patterns in the order written (the first that matches), then `KEY`
//! alone. The walk stops where nothing matches or where the descriptor
//! reached has no nested descriptors. The limit is that of the descriptor
//! reached by the **last** entry, if that one has a `rate_limit`: a
//! request with fewer or more entries than the configuration's levels has
//! none, and no limit means the request is not limited (OK).
//!
//! Across a request's descriptors, a limit whose `name` some other limit
//! found for the same request `replaces` is dropped (its descriptor is then
//! not limited); an `unlimited` limit is never dropped, and its own
//! `replaces` still count.

use std::collections::{HashMap, HashSet};

use super::config::{Config, Domain, Limit};

/// One entry of a request's descriptor: a key and a value. Implemented for
/// pairs of strings and for references, so that `[("k", "v")]` and a slice
/// of the protocol's entries both serve.
pub trait DescriptorEntry {
    /// The key.
    fn key(&self) -> &str;
    /// The value.
    fn value(&self) -> &str;
}

impl<K: AsRef<str>, V: AsRef<str>> DescriptorEntry for (K, V) {
    fn key(&self) -> &str {
        self.0.as_ref()
    }

    fn value(&self) -> &str {
        self.1.as_ref()
    }
}

impl<T: DescriptorEntry + ?Sized> DescriptorEntry for &T {
    fn key(&self) -> &str {
        (**self).key()
    }

    fn value(&self) -> &str {
        (**self).value()
    }
}

/// One level of a domain's descriptors.
#[derive(Debug, Clone, Default)]
pub(super) struct Level {
    /// The descriptors, in the order written.
    descriptors: Vec<Descriptor>,
    /// Their index by composite key, `KEY` or `KEY_VALUE`.
    by_key: HashMap<String, usize>,
    /// The descriptors whose composite key holds a `*`, in the order
    /// written.
    wildcards: Vec<Wildcard>,
}

#[derive(Debug, Clone)]
struct Descriptor {
    line: u32,
    limit: Option<Limit>,
    children: Level,
}

/// A composite key with `*`s, split on them once at load.
#[derive(Debug, Clone)]
struct Wildcard {
    index: usize,
    parts: Vec<String>,
}

impl Level {
    /// The line of the descriptor at `composite`, if there is one.
    pub(super) fn line_of(&self, composite: &str) -> Option<u32> {
        self.by_key
            .get(composite)
            .map(|&index| self.descriptors[index].line)
    }

    /// A descriptor at `composite` (not yet there).
    pub(super) fn insert(
        &mut self,
        composite: String,
        line: u32,
        limit: Option<Limit>,
        children: Level,
    ) {
        let index = self.descriptors.len();
        if composite.contains('*') {
            self.wildcards.push(Wildcard {
                index,
                parts: composite.split('*').map(str::to_owned).collect(),
            });
        }
        self.by_key.insert(composite, index);
        self.descriptors.push(Descriptor {
            line,
            limit,
            children,
        });
    }

    /// Every limit below, depth first in the order written.
    pub(super) fn collect_limits<'a>(&'a self, limits: &mut Vec<&'a Limit>) {
        for descriptor in &self.descriptors {
            limits.extend(descriptor.limit.as_ref());
            descriptor.children.collect_limits(limits);
        }
    }

    /// The descriptor an entry reaches at this level: `KEY_VALUE`, then
    /// the first wildcard matching it, then `KEY`.
    fn reach(&self, composite: &str, key: &str) -> Option<&Descriptor> {
        let index = self.by_key.get(composite).copied().or_else(|| {
            self.wildcards
                .iter()
                .find(|wildcard| wildcard_match(&wildcard.parts, composite))
                .map(|wildcard| wildcard.index)
        });
        let index = index.or_else(|| self.by_key.get(key).copied())?;
        Some(&self.descriptors[index])
    }
}

/// Whether `text` matches the pattern split on its `*`s, each `*` any run
/// of characters (none included): the reference's `wildcardMatch`.
fn wildcard_match(parts: &[String], text: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|only| only == text);
    };
    if !text.starts_with(first.as_str()) || !text.ends_with(last.as_str()) {
        return false;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if text.len() < fixed {
        return false;
    }
    // Both ends are whole prefixes and suffixes, so the cuts fall on
    // character boundaries; the middle parts are found in order between.
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

impl Domain {
    /// The limit of one descriptor (its entries in order), or none: the
    /// request is then not limited by it.
    pub fn limits_for<E: DescriptorEntry>(
        &self,
        entries: impl IntoIterator<Item = E>,
    ) -> Option<&Limit> {
        let mut level = &self.root;
        let mut found = None;
        // One buffer for every entry's composite key.
        let mut composite = String::new();
        let mut entries = entries.into_iter().peekable();
        while let Some(entry) = entries.next() {
            composite.clear();
            composite.push_str(entry.key());
            composite.push('_');
            composite.push_str(entry.value());
            let Some(descriptor) = level.reach(&composite, entry.key()) else {
                break;
            };
            if entries.peek().is_none() {
                found = descriptor.limit.as_ref();
            }
            if descriptor.children.descriptors.is_empty() {
                break;
            }
            level = &descriptor.children;
        }
        found
    }

    /// The limit applied to each of a request's descriptors, in order:
    /// each one's [`limits_for`](Self::limits_for), less those a limit
    /// found for another descriptor `replaces` by name.
    pub fn applied_limits<D, E>(
        &self,
        descriptors: impl IntoIterator<Item = D>,
    ) -> Vec<Option<&Limit>>
    where
        D: IntoIterator<Item = E>,
        E: DescriptorEntry,
    {
        let mut limits: Vec<Option<&Limit>> = descriptors
            .into_iter()
            .map(|entries| self.limits_for(entries))
            .collect();
        let replaced: HashSet<&str> = limits
            .iter()
            .flatten()
            .flat_map(|limit| limit.replaces.iter().map(String::as_str))
            .collect();
        if replaced.is_empty() {
            return limits;
        }
        for slot in &mut limits {
            let dropped = slot.is_some_and(|limit| {
                !limit.is_unlimited()
                    && limit
                        .name
                        .as_deref()
                        .is_some_and(|name| replaced.contains(name))
            });
            if dropped {
                *slot = None;
            }
        }
        limits
    }
}

impl Config {
    /// The limit applied to each of a request's descriptors in `domain`:
    /// [`Domain::applied_limits`], or none for every descriptor of an
    /// unknown domain (which the reference answers OK).
    pub fn applied_limits<D, E>(
        &self,
        domain: &str,
        descriptors: impl IntoIterator<Item = D>,
    ) -> Vec<Option<&Limit>>
    where
        D: IntoIterator<Item = E>,
        E: DescriptorEntry,
    {
        match self.domain(domain) {
            Some(domain) => domain.applied_limits(descriptors),
            None => descriptors.into_iter().map(|_| None).collect(),
        }
    }
}

#[cfg(test)]
#[path = "matching_tests.rs"]
mod tests;
