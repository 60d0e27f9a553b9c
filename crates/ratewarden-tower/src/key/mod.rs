//! Key extractors: whose quota a request counts against.
//!
//! A [`KeyExtractor`] turns a request into a [`Key`], or into `None` when the request carries
//! no usable identity; the layer then follows its
//! [`MissingKey`](crate::rate_limit::MissingKey) rule instead of falling back to a shared
//! bucket. Closures `Fn(&Request<B>) -> Option<Key>` are extractors too.
//!
//! | extractor | key |
//! |-----------|-----|
//! | [`PeerIp`] | the connection's peer address (IPv6 grouped by prefix, default /64) |
//! | [`ClientIp`] | the client address behind configured trusted proxies |
//! | [`Header`] | a header's value (hashed when secret or long) |
//! | [`JwtClaim`] | a claim of a verified bearer JWT (feature `jwt`) |
//! | [`FromExtension`] | a typed value an upstream layer put in the extensions |
//! | [`Global`] | one key for every request |
//!
//! ```
//! use http::{HeaderName, Request};
//! use ratewarden_tower::Key;
//! use ratewarden_tower::key::{Header, KeyExtractor};
//!
//! let by_tenant = |req: &Request<()>| {
//!     let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
//!     Some(Key::from(format!("tenant:{tenant}")))
//! };
//! let req = Request::builder().header("x-tenant", "acme").body(()).unwrap();
//! assert_eq!(by_tenant.extract(&req), Some(Key::from("tenant:acme")));
//! assert_eq!(Header::new(HeaderName::from_static("x-api-key")).extract(&req), None);
//! ```

mod client_ip;
mod header;
#[cfg(feature = "jwt")]
mod jwt;
mod peer_ip;

use std::marker::PhantomData;
use std::net::SocketAddr;

use http::Request;
use ratewarden_core::Key;

pub use client_ip::{ClientIp, ForwardedHeader};
pub use header::Header;
#[cfg(feature = "jwt")]
#[cfg_attr(docsrs, doc(cfg(feature = "jwt")))]
pub use jwt::JwtClaim;
pub use peer_ip::{InvalidIpv6Prefix, PeerIp};

/// Derives the [`Key`] a request is counted against. `None` means the request has no usable
/// key; the layer then applies its [`MissingKey`](crate::rate_limit::MissingKey) rule.
///
/// Closures `Fn(&Request<B>) -> Option<Key>` implement it.
///
/// ```
/// use http::Request;
/// use ratewarden_tower::key::{Global, KeyExtractor};
///
/// let req = Request::new(());
/// assert_eq!(Global.extract(&req), Global.extract(&Request::new(())));
/// ```
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The request's key, or `None` when it has none.
    fn extract(&self, req: &Request<B>) -> Option<Key>;

    /// The `WWW-Authenticate` challenge to send with the answer to a request without a key,
    /// when the key is a credential (`Bearer` for `JwtClaim`); `None`, the default, for
    /// keys that are not.
    ///
    /// ```
    /// use ratewarden_tower::key::{KeyExtractor, PeerIp};
    /// assert_eq!(KeyExtractor::<()>::challenge(&PeerIp::new()), None);
    /// ```
    fn challenge(&self) -> Option<http::HeaderValue> {
        None
    }

    /// Whether `req`, which [`extract`](Self::extract) found no key in, carries one that
    /// cannot be used: the key's header (`Authorization` for a token) more than once, or a
    /// trusted proxy's forwarded address unreadable. Such a request is refused even under
    /// [`MissingKey::Skip`](crate::rate_limit::MissingKey::Skip), which lets through only
    /// requests that carry no key of this limit's: a client cannot leave its limit by
    /// sending its key twice while the application, reading one of them, still serves it as
    /// that key's. `false` by default (closures: a request without a key carries none).
    ///
    /// ```
    /// use http::{HeaderName, Request};
    /// use ratewarden_tower::key::{Header, KeyExtractor};
    ///
    /// let api_key = Header::new(HeaderName::from_static("x-api-key"));
    /// let twice = Request::builder()
    ///     .header("x-api-key", "k1")
    ///     .header("x-api-key", "k1")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(api_key.extract(&twice), None);
    /// assert!(api_key.has_unusable_key(&twice));
    /// assert!(!api_key.has_unusable_key(&Request::new(())));
    /// ```
    fn has_unusable_key(&self, req: &Request<B>) -> bool {
        let _ = req;
        false
    }

    /// The key this extractor gives the client that [`Key::from`] names as `key`, for lists
    /// of keys such as [`FailureMode::closed_allowing`](crate::rate_limit::FailureMode::closed_allowing): `key`
    /// itself by default. [`PeerIp`] and [`ClientIp`] key an IPv6 client by its network
    /// prefix (a /64 by default), so an allowed IPv6 address names its network; and they read
    /// an address written as text (`Key::from("192.0.2.1")`) as that address.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::key::{KeyExtractor, PeerIp};
    /// use std::net::IpAddr;
    ///
    /// let host: IpAddr = "2001:db8::9".parse().unwrap();
    /// let network: IpAddr = "2001:db8::".parse().unwrap();
    /// assert_eq!(KeyExtractor::<()>::key_for(&PeerIp::new(), Key::from(host)), Key::from(network));
    /// assert_eq!(KeyExtractor::<()>::key_for(&PeerIp::new(), Key::from("2001:db8::9")), Key::from(network));
    /// ```
    fn key_for(&self, key: Key) -> Key {
        key
    }
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<Key> + Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        self(req)
    }
}

/// One key for every request: a limit on the whole service.
///
/// ```
/// use http::Request;
/// use ratewarden_tower::key::{Global, KeyExtractor};
/// assert!(Global.extract(&Request::new(())).is_some());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl<B> KeyExtractor<B> for Global {
    fn extract(&self, _req: &Request<B>) -> Option<Key> {
        // A digest, so that it can never equal an IP, integer or string key.
        static GLOBAL: std::sync::OnceLock<Key> = std::sync::OnceLock::new();
        Some(
            GLOBAL
                .get_or_init(|| Key::hashed("ratewarden-tower:global"))
                .clone(),
        )
    }
}

/// The key is a typed value that an upstream layer (authentication, say) put in the request
/// extensions. Requests without it have no key.
///
/// ```
/// use http::Request;
/// use ratewarden_tower::Key;
/// use ratewarden_tower::key::{FromExtension, KeyExtractor};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl From<UserId> for Key {
///     fn from(user: UserId) -> Key { Key::from(user.0) }
/// }
///
/// let mut req = Request::new(());
/// req.extensions_mut().insert(UserId(7));
/// assert_eq!(FromExtension::<UserId>::new().extract(&req), Some(Key::from(7u64)));
/// ```
pub struct FromExtension<T>(PhantomData<fn() -> T>);

impl<T> FromExtension<T> {
    /// An extractor reading `T` from the extensions.
    ///
    /// ```
    /// use ratewarden_tower::{Key, key::{FromExtension, KeyExtractor}};
    /// let extractor = FromExtension::<u64>::new();
    /// let mut req = http::Request::new(());
    /// assert_eq!(extractor.extract(&req), None);
    /// req.extensions_mut().insert(42u64);
    /// assert_eq!(extractor.extract(&req), Some(Key::from(42u64)));
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for FromExtension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for FromExtension<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for FromExtension<T> {}

impl<T> std::fmt::Debug for FromExtension<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FromExtension")
            .field(&std::any::type_name::<T>())
            .finish()
    }
}

impl<B, T> KeyExtractor<B> for FromExtension<T>
where
    T: Clone + Into<Key> + Send + Sync + 'static,
{
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        req.extensions().get::<T>().cloned().map(Into::into)
    }
}

/// Whether `req` has the header `name` more than once: a key the client could send twice,
/// of which the application may read another than the limit would
/// ([`KeyExtractor::has_unusable_key`]).
pub(crate) fn sent_twice<B>(req: &Request<B>, name: impl http::header::AsHeaderName) -> bool {
    req.headers().get_all(name).iter().nth(1).is_some()
}

/// `value` without the optional whitespace (SP and HTAB) around it, which is no part of a
/// field value (RFC 9110 5.5): ` abc\t` is the value `abc`.
pub(crate) fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

/// The connection's peer address, from whichever of these the server put in the request
/// extensions: a plain `SocketAddr`, axum's `ConnectInfo<SocketAddr>` (feature `axum`), or
/// tonic's `TcpConnectInfo` (feature `tonic`).
///
/// ```
/// use http::Request;
/// use std::net::SocketAddr;
///
/// let mut req = Request::new(());
/// assert_eq!(ratewarden_tower::key::peer_addr(&req), None);
/// let addr: SocketAddr = "192.0.2.1:5000".parse().unwrap();
/// req.extensions_mut().insert(addr);
/// assert_eq!(ratewarden_tower::key::peer_addr(&req), Some(addr));
/// ```
#[must_use]
pub fn peer_addr<B>(req: &Request<B>) -> Option<SocketAddr> {
    let extensions = req.extensions();
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Some(addr);
    }
    let addr = extensions.get::<SocketAddr>().copied();
    if addr.is_none() {
        warn_no_peer_address();
    }
    addr
}

/// A server that never gives the peer address is a deployment mistake, not a client's: every
/// request keyed by it gets the missing-key answer. Said once per process, at warn level.
fn warn_no_peer_address() {
    #[cfg(feature = "tracing")]
    {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "a request has no peer address, so it has no rate-limit key: serve axum with \
                 `into_make_service_with_connect_info::<SocketAddr>()` (ratewarden-tower's `axum` \
                 feature is on by default), tonic with the `tonic` feature, or insert a \
                 `SocketAddr` into the request extensions"
            );
        });
    }
}
