//! [`Down`]: a store that always fails.

/// A store that is down: every call fails with a connection error.
///
/// ```
/// # async fn demo() {
/// use ratewarden_core::{Key, Quota, Store};
/// let failed = tests::Down.check(&Key::from(1_u64), &Quota::per_second(1).unwrap(), 1).await;
/// assert!(failed.unwrap_err().is_connection());
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Down;

impl ratewarden_core::Store for Down {
    async fn check(
        &self,
        _: &ratewarden_core::Key,
        _: &ratewarden_core::Quota,
        _: u32,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        Err(down())
    }
    async fn peek(
        &self,
        _: &ratewarden_core::Key,
        _: &ratewarden_core::Quota,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        Err(down())
    }
    async fn reset(
        &self,
        _: &ratewarden_core::Key,
        _: &ratewarden_core::Quota,
    ) -> Result<(), ratewarden_core::StoreError> {
        Err(down())
    }
}

fn down() -> ratewarden_core::StoreError {
    ratewarden_core::StoreError::new(ratewarden_core::StoreErrorKind::Connection)
}
