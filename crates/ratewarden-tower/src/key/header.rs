//! [`Header`]: a request header's value as the key (digested for credentials).

use http::Request;
use http::header::HeaderName;
use ratewarden_core::{Key, KeyRepr};

use super::KeyExtractor;

/// Keys a request by the value of one header, such as `x-api-key`.
///
/// The key is the field value without the optional whitespace (spaces and tabs) around it,
/// which RFC 9110 (5.5) makes no part of it: `abc` and ` abc\t` are one key. A request whose
/// header is absent, empty or only whitespace has no key; one whose header is present more
/// than once has an [unusable](KeyExtractor::has_unusable_key) key (two values would make the
/// choice the client's), and is refused even when keyless requests are skipped.
/// [`Header::secret`] keeps only a SHA-256 digest of the value, so an API key is never stored
/// or logged; values longer than [`MAX_KEY_LEN`](ratewarden_core::MAX_KEY_LEN) bytes are
/// always digested.
///
/// Values are otherwise compared byte for byte: key by a header whose value a client cannot
/// vary while being served as the same identity (an API key, a header your proxy sets). Not
/// `Host`: its letter case, a port or a trailing dot would each make a new key for the same
/// site, and HTTP/2 requests carry it as `:authority`, not as a header.
///
/// ```
/// use http::{HeaderName, Request};
/// use ratewarden_tower::Key;
/// use ratewarden_tower::key::{Header, KeyExtractor};
///
/// const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// let req = Request::builder().header("x-api-key", "sk_live_123").body(()).unwrap();
/// assert_eq!(Header::new(API_KEY).extract(&req), Some(Key::from("sk_live_123")));
/// assert_eq!(Header::secret(API_KEY).extract(&req), Some(Key::hashed("sk_live_123")));
///
/// let padded = Request::builder().header("x-api-key", " sk_live_123\t").body(()).unwrap();
/// assert_eq!(Header::new(API_KEY).extract(&padded), Some(Key::from("sk_live_123")));
/// let blank = Request::builder().header("x-api-key", " \t ").body(()).unwrap();
/// assert_eq!(Header::new(API_KEY).extract(&blank), None);
///
/// let twice = Request::builder()
///     .header("x-api-key", "a")
///     .header("x-api-key", "b")
///     .body(())
///     .unwrap();
/// assert_eq!(Header::new(API_KEY).extract(&twice), None);
/// ```
#[derive(Clone, Debug)]
pub struct Header {
    name: HeaderName,
    secret: bool,
}

impl Header {
    /// Keys by `name`'s value as is (digested past `MAX_KEY_LEN` bytes).
    ///
    /// ```
    /// use ratewarden_tower::{Key, key::{Header, KeyExtractor}};
    /// // A header the gateway's proxy sets, after authenticating the tenant.
    /// let extractor = Header::new(http::HeaderName::from_static("x-tenant-id"));
    /// let req = http::Request::builder().header("x-tenant-id", "tenant-a").body(())?;
    /// assert_eq!(extractor.extract(&req), Some(Key::from("tenant-a")));
    /// # Ok::<(), http::Error>(())
    /// ```
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self {
            name,
            secret: false,
        }
    }

    /// Keys by the SHA-256 digest of `name`'s value: for credentials.
    ///
    /// ```
    /// use ratewarden_tower::{Key, key::{Header, KeyExtractor}};
    /// let extractor = Header::secret(http::HeaderName::from_static("x-api-key"));
    /// let req = http::Request::builder().header("x-api-key", "sk_live_123").body(())?;
    /// // The key is a digest: the credential itself is never stored.
    /// assert_ne!(extractor.extract(&req), Some(Key::from("sk_live_123")));
    /// assert!(extractor.extract(&req).is_some());
    /// # Ok::<(), http::Error>(())
    /// ```
    #[must_use]
    pub fn secret(name: HeaderName) -> Self {
        Self { name, secret: true }
    }
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let mut values = req.headers().get_all(&self.name).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        // The field value, as the application's header parsing reads it: `abc` and ` abc\t`
        // are one key, not a new bucket per padding.
        let value = super::trim_ows(value.as_bytes());
        if value.is_empty() {
            return None;
        }
        Some(if self.secret {
            Key::hashed(value)
        } else {
            Key::from_bytes(value)
        })
    }

    /// More than once: which value the application reads is its own choice.
    fn has_unusable_key(&self, req: &Request<B>) -> bool {
        super::sent_twice(req, &self.name)
    }

    /// A secret header's key is its value digested, as [`extract`](Self::extract) keys it.
    fn key_for(&self, key: Key) -> Key {
        match key.repr() {
            KeyRepr::Bytes(value) if self.secret => Key::hashed(value),
            _ => key,
        }
    }
}
