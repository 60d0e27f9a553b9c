//! The key extractors a layer registered by name, and the keys of one request.

use std::sync::Arc;

use http::{HeaderValue, Request};
use ratewarden_core::Key;

use crate::key::{Global, KeyExtractor};

/// The name of the key every layer has: one key for every request.
pub(crate) const GLOBAL: &str = "global";

/// A [`KeyExtractor`] behind a pointer.
trait DynKey<B>: Send + Sync {
    fn extract(&self, req: &Request<B>) -> Option<Key>;
    fn challenge(&self) -> Option<HeaderValue>;
    fn has_unusable_key(&self, req: &Request<B>) -> bool;
    fn key_for(&self, key: Key) -> Key;
}

impl<B, K: KeyExtractor<B>> DynKey<B> for K {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        KeyExtractor::extract(self, req)
    }

    fn challenge(&self) -> Option<HeaderValue> {
        KeyExtractor::challenge(self)
    }

    fn has_unusable_key(&self, req: &Request<B>) -> bool {
        KeyExtractor::has_unusable_key(self, req)
    }

    fn key_for(&self, key: Key) -> Key {
        KeyExtractor::key_for(self, key)
    }
}

/// Extractors by name, `global` first.
pub(crate) struct Keys<B> {
    entries: Vec<(Arc<str>, Arc<dyn DynKey<B>>)>,
}

impl<B> Clone for Keys<B> {
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
        }
    }
}

impl<B: 'static> Keys<B> {
    pub(crate) fn new() -> Self {
        Self {
            entries: vec![(Arc::from(GLOBAL), Arc::new(Global))],
        }
    }

    /// Registers `extractor` as `name`, replacing one of that name.
    pub(crate) fn insert<K: KeyExtractor<B>>(&mut self, name: &str, extractor: K) {
        self.entries.retain(|(n, _)| &**n != name);
        self.entries.push((Arc::from(name), Arc::new(extractor)));
    }
}

impl<B> Keys<B> {
    pub(crate) fn names(&self) -> Vec<String> {
        self.entries.iter().map(|(n, _)| n.to_string()).collect()
    }

    /// `key` as the extractor `name` keys it ([`KeyExtractor::key_for`]).
    pub(crate) fn key_for(&self, name: &str, key: Key) -> Key {
        match self.index(name) {
            Some(i) => self.entries[i].1.key_for(key),
            None => key,
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|(n, _)| &**n == name)
    }
}

/// How many extractors' keys a request keeps without allocating.
const INLINE: usize = 8;

/// The keys of one request, each extracted at most once.
pub(crate) struct RequestKeys<'a, B> {
    keys: &'a Keys<B>,
    req: &'a Request<B>,
    /// The keys of the first [`INLINE`] extractors, by index: `None` until extracted.
    first: [Option<Option<Key>>; INLINE],
    /// Those of the others, made when one is extracted.
    rest: Vec<Option<Option<Key>>>,
}

impl<'a, B> RequestKeys<'a, B> {
    pub(crate) const fn new(keys: &'a Keys<B>, req: &'a Request<B>) -> Self {
        Self {
            keys,
            req,
            first: [const { None }; INLINE],
            rest: Vec::new(),
        }
    }

    /// The key named `name` of the request (`None`: no such key, or the request has none).
    pub(crate) fn get(&mut self, name: &str) -> Option<Key> {
        let i = self.keys.index(name)?;
        let slot = match self.first.get_mut(i) {
            Some(slot) => slot,
            None => {
                let rest = self.keys.entries.len() - INLINE;
                if self.rest.len() < rest {
                    self.rest.resize(rest, None);
                }
                &mut self.rest[i - INLINE]
            }
        };
        slot.get_or_insert_with(|| self.keys.entries[i].1.extract(self.req))
            .clone()
    }

    /// The key `name`'s extractor gives the client `Key::from(value)` names.
    pub(crate) fn key_for(&self, name: &str, key: Key) -> Key {
        self.keys.key_for(name, key)
    }

    /// The challenge of key `name`'s extractor, and whether the request carries an unusable
    /// key for it.
    pub(crate) fn missing(&self, name: &str) -> (Option<HeaderValue>, bool) {
        match self.keys.index(name) {
            Some(i) => {
                let extractor = &self.keys.entries[i].1;
                (extractor.challenge(), extractor.has_unusable_key(self.req))
            }
            None => (None, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn each_key_is_extracted_once_past_the_inline_ones_too() {
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let mut keys = Keys::<()>::new();
        for i in 0..INLINE + 3 {
            keys.insert(&format!("k{i}"), move |_: &Request<()>| {
                CALLS.fetch_add(1, Ordering::Relaxed);
                (i % 2 == 0).then(|| Key::from(i as u64))
            });
        }
        let req = Request::new(());
        let mut request_keys = RequestKeys::new(&keys, &req);
        for _ in 0..2 {
            assert_eq!(request_keys.get("k0"), Some(Key::from(0u64)));
            assert_eq!(request_keys.get("k1"), None);
            assert_eq!(request_keys.get("k10"), Some(Key::from(10u64)));
            assert_eq!(request_keys.get("k9"), None);
            assert_eq!(request_keys.get("nope"), None);
        }
        assert_eq!(CALLS.load(Ordering::Relaxed), 4);
        assert!(request_keys.get(GLOBAL).is_some());
    }
}
