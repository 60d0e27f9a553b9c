//! How keys are stored: compactly, one table per kind of key.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use ratewarden_core::{Key, KeyRepr};

/// A key as a table stores it.
pub(crate) trait StoredKey: Hash + Eq + Send + Sync + 'static {
    /// Bytes this key owns on the heap (beyond its place in the table).
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl StoredKey for u64 {}
impl StoredKey for [u8; 16] {}
impl StoredKey for [u8; 32] {}

/// Byte strings up to this long are stored inline: with its length and tag, a stored key is
/// 24 bytes, the size of a `String`, and needs no allocation of its own.
const INLINE_BYTES: usize = 22;

/// A stored byte-string key: inline up to 22 bytes, boxed beyond. Hashes and compares as the
/// `[u8]` it holds, so a `&[u8]` finds it.
#[derive(Clone, Debug)]
pub(crate) enum StoredBytes {
    Inline { len: u8, buf: [u8; INLINE_BYTES] },
    Boxed(Box<[u8]>),
}

impl StoredBytes {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= INLINE_BYTES => {
                let mut buf = [0; INLINE_BYTES];
                buf[..bytes.len()].copy_from_slice(bytes);
                Self::Inline { len, buf }
            }
            _ => Self::Boxed(bytes.into()),
        }
    }
}

const _: () = assert!(size_of::<StoredBytes>() == 24);

impl Borrow<[u8]> for StoredBytes {
    #[inline]
    fn borrow(&self) -> &[u8] {
        match self {
            Self::Inline { len, buf } => &buf[..usize::from(*len)],
            Self::Boxed(bytes) => bytes,
        }
    }
}

impl PartialEq for StoredBytes {
    fn eq(&self, other: &Self) -> bool {
        Borrow::<[u8]>::borrow(self) == Borrow::<[u8]>::borrow(other)
    }
}

impl Eq for StoredBytes {}

impl Hash for StoredBytes {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Borrow::<[u8]>::borrow(self).hash(state);
    }
}

impl StoredKey for StoredBytes {
    fn heap_bytes(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            // What the allocator hands out for it: its size rounded up to 16, and its header.
            Self::Boxed(bytes) => bytes.len().div_ceil(16) * 16 + 16,
        }
    }
}

/// A key of any kind with the id of its limit: for the overflow table, where the keys of
/// limits without tables of their own live together.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AnyKey {
    Int(u64, u64),
    Ip(u64, [u8; 16]),
    Bytes(u64, StoredBytes),
    Digest(u64, [u8; 32]),
}

impl AnyKey {
    pub(crate) fn new(limit: u64, key: &Key) -> Self {
        match key.repr() {
            KeyRepr::Int(n) => Self::Int(limit, n),
            KeyRepr::Ip(ip) => Self::Ip(limit, *ip),
            KeyRepr::Bytes(b) => Self::Bytes(limit, StoredBytes::new(b)),
            KeyRepr::Digest(d) => Self::Digest(limit, *d),
        }
    }
}

impl StoredKey for AnyKey {
    fn heap_bytes(&self) -> usize {
        match self {
            Self::Bytes(_, bytes) => bytes.heap_bytes(),
            _ => 0,
        }
    }
}
