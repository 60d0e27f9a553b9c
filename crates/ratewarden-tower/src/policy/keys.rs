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

    fn index(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|(n, _)| &**n == name)
    }
}

/// The keys of one request, each extracted at most once.
pub(crate) struct RequestKeys<'a, B> {
    keys: &'a Keys<B>,
    req: &'a Request<B>,
    cache: Vec<Option<Option<Key>>>,
}

impl<'a, B> RequestKeys<'a, B> {
    pub(crate) fn new(keys: &'a Keys<B>, req: &'a Request<B>) -> Self {
        Self {
            keys,
            req,
            cache: vec![None; keys.entries.len()],
        }
    }

    /// The key named `name` of the request (`None`: no such key, or the request has none).
    pub(crate) fn get(&mut self, name: &str) -> Option<Key> {
        let i = self.keys.index(name)?;
        let slot = &mut self.cache[i];
        if slot.is_none() {
            *slot = Some(self.keys.entries[i].1.extract(self.req));
        }
        slot.clone().flatten()
    }

    /// The key `name`'s extractor gives the client `Key::from(value)` names.
    pub(crate) fn key_for(&self, name: &str, key: Key) -> Key {
        match self.keys.index(name) {
            Some(i) => self.keys.entries[i].1.key_for(key),
            None => key,
        }
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
