//! A fast, bounded, in-process [`Store`](rl_core::Store) for [`rl_core`].
//!
//! [`MemoryStore`] keeps a compact state per key in a sharded hash map: a GCRA key costs one
//! `u64` beside its key, updated with a single compare-and-swap under a shared shard lock
//! ([`dashmap`](https://docs.rs/dashmap), whose readers take their lock with one `fetch_add`). It
//! is bounded ([`MemoryStoreBuilder::max_keys`], default 1,000,000) and forgets idle keys by
//! itself, without a background thread.
//!
//! ```
//! use rl_core::{Key, Quota};
//! use rl_store_memory::MemoryStore;
//!
//! let store = MemoryStore::new();
//! let quota = Quota::per_second(2)?;
//! let key = Key::from("user-1");
//! assert!(store.check_sync(&key, &quota, 1).is_allowed());
//! assert!(store.check_sync(&key, &quota, 1).is_allowed());
//! assert!(!store.check_sync(&key, &quota, 1).is_allowed());
//! # Ok::<(), rl_core::QuotaError>(())
//! ```
//!
//! # Memory and eviction
//!
//! A key is forgotten once its state equals a fresh one (for GCRA, once its theoretical arrival
//! time has passed), so forgetting it never changes a decision. The store sweeps such keys
//! whenever it has doubled in size since its last sweep, an amortised O(1) per new key.
//!
//! When `max_keys` keys are live and none of them can be forgotten yet, a **new** key is
//! denied ([`Decision::Denied`](rl_core::Decision::Denied), remaining 0) with a retry time at
//! which the earliest live key becomes forgettable. A full store sweeps all its keys at most
//! once every 100 ms, so under a sustained flood a new key may wait up to 100 ms longer than
//! strictly needed. Known keys keep being decided as usual, and
//! no throttled key is ever evicted early: a flood of new identities costs bounded memory and
//! never buys anyone a fresh quota. Put a per-IP limit in front of per-identity limits so that
//! such a flood is stopped before it fills the store.
//!
//! # Keys and algorithms
//!
//! One state is kept per (key, [`Algorithm`](rl_core::Algorithm)). Integer, IP and short
//! string keys are stored inline; clones of a `MemoryStore` share one map.

mod store;
mod table;

pub use store::{MemoryStore, MemoryStoreBuilder};

#[cfg(test)]
mod tests;
