//! A fast, bounded, in-process [`Store`](ratewarden_core::Store) for [`ratewarden_core`].
//!
//! [`MemoryStore`] keeps a compact state per key in sharded hash tables: a GCRA key costs one
//! `u64` beside its key, updated with a single compare-and-swap under a shared shard lock. It
//! is bounded in bytes ([`MemoryStoreBuilder::max_memory`], default 64 MiB) and forgets idle
//! keys by itself, without a background thread.
//!
//! ```
//! use ratewarden_core::{Key, Quota};
//! use ratewarden_memory::MemoryStore;
//!
//! let store = MemoryStore::new();
//! let quota = Quota::per_second(2)?;
//! let key = Key::from("user-1");
//! assert!(store.check_sync(&key, &quota, 1).is_allowed());
//! assert!(store.check_sync(&key, &quota, 1).is_allowed());
//! assert!(!store.check_sync(&key, &quota, 1).is_allowed());
//! # Ok::<(), ratewarden_core::QuotaError>(())
//! ```
//!
//! # Keys, quotas and limits
//!
//! A key has one state per quota and per named limit ([`Key::limit_id`](ratewarden_core::Key::limit_id)):
//! requests decided under different quotas never share state, even on one key. Each limit
//! (a scope and a quota) gets tables of its own, one per kind of key, so integer, IP and short
//! string keys are stored inline without a tag. Past 256 distinct limits (or when the bound
//! leaves no room for a new limit's tables), further limits share overflow tables whose
//! entries carry their limit (8 bytes more a key). Clones of a `MemoryStore` share one state.
//!
//! # Memory
//!
//! Every byte of the tables is counted against the bound: their allocations, what their keys
//! own (strings over 22 bytes), and what their states own (a sliding log reserves its
//! `count` timestamps when its key is created, so a log never grows afterwards). A table
//! grows only while the bound allows. The only excess is momentary: a table rehashing holds
//! its old and new allocations for the length of one rehash of one shard (at most about 64 KiB
//! at the default bound). A test measures the bytes the allocator hands out under floods of
//! each kind of key, sliding logs of 4,096 entries included.
//!
//! # Forgetting and evicting
//!
//! A key is forgotten once its state equals a fresh one (for GCRA, once its theoretical arrival
//! time has passed), which never changes a decision. Every insertion of a new key sweeps a few
//! buckets of its shard and a few of another table's (bounded work, never a whole table at
//! once, never under more than one shard's lock), and a shard that turns sparse gives its
//! memory back.
//!
//! When the bound is reached and a new key needs room, the store **evicts**: it samples a few
//! entries of the new key's shard and forgets the one closest to fresh (like Redis's
//! approximated LRU), a sixteenth of the shard at a time; when that shard has nothing
//! left to evict while others hold the bound (keys with large states, such as sliding logs,
//! a few to a shard), it evicts from the other shards, never waiting for their locks. A new client is never refused for
//! lack of room, so a flood of identities cannot lock out everyone else. The price, which
//! [`MemoryStore::evictions`] counts: **an evicted key gets back what it had spent and not yet
//! regained, at most one burst (or one window's count) per eviction**. Evictions prefer, of
//! the entries sampled, the one with the least left to regain, so a key that spent more than
//! a flood's one-request keys goes only when a sample holds nothing closer to fresh (with a
//! burst of 1, a throttled key and a one-request key look alike). How many evictions a
//! flood causes is bounded only by how fast it brings new keys: size the store so that it
//! does not evict in normal traffic, watch [`MemoryStore::evictions`], and put a per-IP limit
//! in front of per-identity limits so that a flood is stopped before it fills the store.
//!
//! A store refuses a new key (a denial for at most a second) only when it cannot make room at
//! all: a bound too small for a new limit's tables and the overflow tables alike, or for one
//! key's state (a sliding log larger than the whole bound).

mod keys;
mod limits;
mod slot;
mod store;
mod table;

pub use store::{ConfigError, MIN_MEMORY, MemoryStore, MemoryStoreBuilder};

#[cfg(test)]
mod tests;
