//! [`JwtClaim`]: a claim of a verified bearer JWT as the key.

use std::fmt;
use std::sync::Arc;

use http::Request;
use http::header::AUTHORIZATION;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ratewarden_core::Key;

use super::KeyExtractor;

/// Keys a request by one claim (default `sub`) of its bearer JWT, **after** verifying the
/// token's signature, its expiry (`exp`) and its start (`nbf`, RFC 7519 4.1.5) with the
/// configured key, and, when set, its [audience](Self::audience) and [issuer](Self::issuer).
///
/// A request without exactly one `Authorization: Bearer` header, or whose token is forged,
/// expired, not yet valid, for another audience or issuer, malformed or lacks the claim, has
/// no key: it never reaches a user's bucket (put a per-IP layer in front, so that it is still
/// counted; see the crate docs on pre-auth limits). With the `tracing` feature, the reason is
/// logged at debug level. String and integer claims are keys; others are not.
///
/// Tokens carrying an `aud` claim (as identity providers' do) are keys whatever their
/// audience until [`audience`](Self::audience) names the accepted ones: set it, so that a
/// token issued for another service is no key here.
///
/// ```
/// use http::Request;
/// use jsonwebtoken::{EncodingKey, Header};
/// use ratewarden_tower::Key;
/// use ratewarden_tower::key::{JwtClaim, KeyExtractor};
///
/// let secret = b"demo secret";
/// let extractor = JwtClaim::hs256(secret)?; // fails here if jsonwebtoken has no backend
///
/// let claims = serde_json::json!({ "sub": "user-42", "exp": 4_000_000_000u64 });
/// let token = jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(secret)?)?;
/// let req = Request::builder()
///     .header("authorization", format!("Bearer {token}"))
///     .body(())?;
/// assert_eq!(extractor.extract(&req), Some(Key::from("user-42")));
///
/// let forged = Request::builder().header("authorization", "Bearer e30.e30.AAAA").body(())?;
/// assert_eq!(extractor.extract(&forged), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct JwtClaim {
    key: Arc<DecodingKey>,
    validation: Arc<Validation>,
    claim: Arc<str>,
}

impl JwtClaim {
    /// Verifies HS256 tokens with `secret` and keys by `sub`.
    ///
    /// # Errors
    ///
    /// When the HMAC key cannot be built, or `jsonwebtoken` has no crypto backend (see the
    /// crate's feature flags).
    ///
    /// ```
    /// use ratewarden_tower::key::{JwtClaim, KeyExtractor};
    /// let extractor = JwtClaim::hs256(b"secret")?;
    /// let unsigned = http::Request::builder().header("authorization", "Bearer e30.e30.").body(()).unwrap();
    /// assert_eq!(extractor.extract(&unsigned), None);
    /// # Ok::<(), jsonwebtoken::errors::Error>(())
    /// ```
    pub fn hs256(secret: &[u8]) -> Result<Self, jsonwebtoken::errors::Error> {
        Self::new(
            DecodingKey::from_secret(secret)?,
            validation(Algorithm::HS256),
        )
    }

    /// Verifies RS256 tokens with an RSA public key in PEM and keys by `sub`.
    ///
    /// # Errors
    ///
    /// When `pem` is not an RSA public key, or `jsonwebtoken` has no crypto backend.
    ///
    /// ```
    /// assert!(ratewarden_tower::key::JwtClaim::rs256_pem(b"not a key").is_err());
    /// ```
    pub fn rs256_pem(pem: &[u8]) -> Result<Self, jsonwebtoken::errors::Error> {
        Self::new(
            DecodingKey::from_rsa_pem(pem)?,
            validation(Algorithm::RS256),
        )
    }

    /// Verifies ES256 tokens with an EC public key in PEM and keys by `sub`.
    ///
    /// # Errors
    ///
    /// When `pem` is not an EC public key, or `jsonwebtoken` has no crypto backend.
    ///
    /// ```
    /// assert!(ratewarden_tower::key::JwtClaim::es256_pem(b"not a key").is_err());
    /// ```
    pub fn es256_pem(pem: &[u8]) -> Result<Self, jsonwebtoken::errors::Error> {
        Self::new(DecodingKey::from_ec_pem(pem)?, validation(Algorithm::ES256))
    }

    /// Verifies with `key` under `validation` as given (algorithms, expiry, audience, issuer,
    /// ...), as the application decoding with the same `Validation` does, and keys by `sub`.
    /// Note that `jsonwebtoken`'s `Validation` does not check `nbf` unless `validate_nbf` is
    /// set, refuses tokens carrying `aud` unless an audience is set, and checks `aud` and
    /// `iss` only in tokens that carry them unless they are in `required_spec_claims`; the
    /// ready-made constructors check `nbf`, accept any audience until
    /// [`audience`](Self::audience), and require what [`audience`](Self::audience) and
    /// [`issuer`](Self::issuer) set.
    ///
    /// # Errors
    ///
    /// When `jsonwebtoken` has no crypto backend for this process (see the crate's feature
    /// flags): never later, at a request.
    ///
    /// ```
    /// use ratewarden_tower::jsonwebtoken::{Algorithm, DecodingKey, Validation};
    /// let mut validation = Validation::new(Algorithm::HS256);
    /// validation.set_audience(&["api"]);
    /// let extractor = ratewarden_tower::key::JwtClaim::new(DecodingKey::from_secret(b"s")?, validation)?;
    /// # Ok::<(), ratewarden_tower::jsonwebtoken::errors::Error>(())
    /// ```
    pub fn new(
        key: DecodingKey,
        validation: Validation,
    ) -> Result<Self, jsonwebtoken::errors::Error> {
        crypto_backend()?;
        Ok(Self {
            key: Arc::new(key),
            validation: Arc::new(validation),
            claim: Arc::from("sub"),
        })
    }

    /// Accepts only tokens whose `aud` (a string, or any element of an array) is one of
    /// `audiences`: a token issued for another service, or for none, is no key.
    ///
    /// ```
    /// let extractor = ratewarden_tower::key::JwtClaim::hs256(b"s")?.audience(["https://api.example.com"]);
    /// assert!(format!("{extractor:?}").contains("https://api.example.com"));
    /// # Ok::<(), jsonwebtoken::errors::Error>(())
    /// ```
    #[must_use]
    pub fn audience<I: IntoIterator<Item = S>, S: ToString>(mut self, audiences: I) -> Self {
        let audiences: Vec<String> = audiences.into_iter().map(|a| a.to_string()).collect();
        let validation = Arc::make_mut(&mut self.validation);
        validation.set_audience(&audiences);
        validation.validate_aud = true;
        // `jsonwebtoken` checks `aud` only in tokens that carry one, unless it is required.
        validation.required_spec_claims.insert("aud".to_owned());
        self
    }

    /// Accepts only tokens whose `iss` is one of `issuers` (a token must then carry one).
    ///
    /// ```
    /// let extractor = ratewarden_tower::key::JwtClaim::hs256(b"s")?.issuer(["https://idp.example.com/"]);
    /// assert!(format!("{extractor:?}").contains("https://idp.example.com/"));
    /// # Ok::<(), jsonwebtoken::errors::Error>(())
    /// ```
    #[must_use]
    pub fn issuer<I: IntoIterator<Item = S>, S: ToString>(mut self, issuers: I) -> Self {
        let issuers: Vec<String> = issuers.into_iter().map(|i| i.to_string()).collect();
        let validation = Arc::make_mut(&mut self.validation);
        validation.set_issuer(&issuers);
        validation.required_spec_claims.insert("iss".to_owned());
        self
    }

    /// Keys by `claim` instead of `sub` (e.g. `tenant_id`).
    ///
    /// ```
    /// let extractor = ratewarden_tower::key::JwtClaim::hs256(b"s")?.claim("tenant_id");
    /// assert!(format!("{extractor:?}").contains("tenant_id"));
    /// # Ok::<(), jsonwebtoken::errors::Error>(())
    /// ```
    #[must_use]
    pub fn claim(mut self, claim: &str) -> Self {
        self.claim = Arc::from(claim);
        self
    }
}

/// The ready-made constructors' validation: `alg` only, `exp` and `nbf` checked, any audience.
fn validation(alg: Algorithm) -> Validation {
    let mut validation = Validation::new(alg);
    validation.validate_nbf = true;
    validation.validate_aud = false;
    validation
}

impl fmt::Debug for JwtClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtClaim")
            .field("algorithms", &self.validation.algorithms)
            .field("claim", &self.claim)
            .field("audience", &self.validation.aud)
            .field("issuer", &self.validation.iss)
            .finish_non_exhaustive()
    }
}

impl<B> KeyExtractor<B> for JwtClaim {
    fn challenge(&self) -> Option<http::HeaderValue> {
        Some(http::HeaderValue::from_static("Bearer"))
    }

    /// `Authorization` more than once: which credential the application reads is its own
    /// choice. A single bearer token that is no key here (forged, expired, another issuer's,
    /// an opaque API key) is not this limit's, as another scheme's (`Basic`) is not: the
    /// application refuses or serves it, and another limit may key it.
    fn has_unusable_key(&self, req: &Request<B>) -> bool {
        super::sent_twice(req, AUTHORIZATION)
    }

    fn extract(&self, req: &Request<B>) -> Option<Key> {
        let mut values = req.headers().get_all(AUTHORIZATION).iter();
        let value = values.next()?.to_str().ok()?;
        if values.next().is_some() {
            return None;
        }
        // `to_str` admits visible ASCII, SP and HTAB only, so `trim` drops exactly the
        // optional whitespace around the field value (RFC 9110 5.5), as `Header` does; the
        // token's own `trim` allows more than the one SP between scheme and token (11.4).
        let (scheme, token) = value.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let data = match jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token.trim(),
            &self.key,
            &self.validation,
        ) {
            Ok(data) => data,
            Err(error) => {
                // The reason only: never the token.
                #[cfg(feature = "tracing")]
                tracing::debug!(reason = ?error.kind(), "bearer token refused: no rate-limit key");
                #[cfg(not(feature = "tracing"))]
                let _ = error;
                return None;
            }
        };
        match data.claims.get(&*self.claim)? {
            serde_json::Value::String(s) if !s.is_empty() => Some(Key::from(s.as_str())),
            serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => {
                Some(Key::from(n.to_string()))
            }
            _ => None,
        }
    }
}

/// Makes sure `jsonwebtoken` can verify in this process, so that no request ever meets its
/// panic for a missing backend. With exactly one backend compiled in, or one installed by the
/// application, that one is used. With none selected (both compiled in, say) and one of this
/// crate's backend features on, that backend is installed as the process default (RustCrypto
/// when both features are on).
fn crypto_backend() -> Result<(), jsonwebtoken::errors::Error> {
    use jsonwebtoken::crypto::CryptoProvider;
    if CryptoProvider::try_get_default().is_some() {
        return Ok(());
    }
    #[cfg(feature = "jwt-rust-crypto")]
    let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
    #[cfg(all(feature = "jwt-aws-lc-rs", not(feature = "jwt-rust-crypto")))]
    let _ = jsonwebtoken::crypto::aws_lc::DEFAULT_PROVIDER.install_default();
    match CryptoProvider::try_get_default() {
        Some(_) => Ok(()),
        None => Err(jsonwebtoken::errors::ErrorKind::Provider(
            "jsonwebtoken has no crypto backend selected: enable ratewarden-tower's `jwt-rust-crypto` \
             or `jwt-aws-lc-rs` feature, or call jsonwebtoken's `CryptoProvider::install_default` first"
                .to_owned(),
        )
        .into()),
    }
}
