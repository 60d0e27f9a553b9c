//! The rate-limit header fields: [`HeaderStyle`], and their values formatted once per quota.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};
use ratewarden_core::{Info, Quota};

pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(crate) const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub(crate) const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which rate-limit header fields responses carry.
///
/// ```
/// use ratewarden_tower::rate_limit::HeaderStyle;
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Both);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRateLimit,
    /// Both of the above.
    #[default]
    Both,
    /// None (a rejection still carries `Retry-After`).
    None,
}

/// The header values of one (policy name, quota), formatted once.
#[derive(Debug)]
pub(crate) struct PolicyHeaders {
    pub(crate) quota: Quota,
    /// `"name";q=100;w=60`
    policy: HeaderValue,
    /// `100`
    limit: HeaderValue,
    /// `"name";r=`
    ratelimit_prefix: Bytes,
    /// Which policy headers these are, for the per-thread cache of values: no two are alike,
    /// even when one is made after another was freed at the same address.
    id: u64,
}

impl PolicyHeaders {
    pub(crate) fn new(name: &str, quota: Quota) -> Self {
        let limit = u64::from(quota.burst());
        // w: the time one full burst takes to refill, in seconds.
        let window = quota
            .period()
            .saturating_mul(quota.burst())
            .checked_div(quota.count())
            .unwrap_or(Duration::MAX);
        let policy = format!("\"{name}\";q={limit};w={}", ceil_secs(window).max(1));
        let ratelimit_prefix = Bytes::from(format!("\"{name}\";r="));
        Self {
            policy: HeaderValue::try_from(policy).unwrap_or(HeaderValue::from_static("")),
            limit: number(limit),
            ratelimit_prefix,
            quota,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// `"name";q=100;w=60`: the item of `RateLimit-Policy`.
    pub(crate) fn policy_item(&self) -> &[u8] {
        self.policy.as_bytes()
    }

    /// Writes the `style` headers for `info`, each kind (IETF, `X-RateLimit-*`) unless a
    /// stricter limit (an inner layer's, with fewer remaining) already wrote that kind.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, info: &Info, style: HeaderStyle) {
        let (ietf, x) = match style {
            HeaderStyle::Ietf => (true, false),
            HeaderStyle::XRateLimit => (false, true),
            HeaderStyle::Both => (true, true),
            HeaderStyle::None => return,
        };
        let stricter = |written: Option<u64>| written.is_some_and(|r| r <= info.remaining());
        let ietf = ietf && !stricter(written_ratelimit(headers));
        let x = x && !stricter(written_x_remaining(headers));
        if !ietf && !x {
            return;
        }
        VALUES.with_borrow_mut(|values| {
            if ietf {
                let until = ceil_secs(wait(info));
                let ratelimit = values.ratelimit(self, info.remaining(), until);
                headers.insert(RATELIMIT, ratelimit);
                headers.insert(RATELIMIT_POLICY, self.policy.clone());
            }
            if x {
                headers.insert(X_LIMIT, self.limit.clone());
                headers.insert(X_REMAINING, values.remaining(info.remaining()));
                headers.insert(X_RESET, values.reset_at(info.reset_after()));
            }
        });
    }
}

/// The id of the next [`PolicyHeaders`] made.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Where this thread formats header values.
    static VALUES: RefCell<Values> = RefCell::new(Values::default());
}

/// The header values that change from response to response: the last of each is kept (a busy
/// key's count, and the reset's second, change far less often than they are sent, and every
/// response to a flood of denials carries the same), and the others are cut from a shared
/// buffer ([`Buffer`]).
#[derive(Default)]
struct Values {
    buf: Buffer,
    /// `RateLimit`, by policy id, remaining count and seconds.
    ratelimit: Last<(u64, u64, u64)>,
    /// `X-RateLimit-Remaining`, from [`SMALL_NUMBERS`] up.
    remaining: Last<u64>,
    /// `X-RateLimit-Reset`, by UNIX second.
    reset: Last<u64>,
}

impl Values {
    /// `"name";r=REMAINING;t=SECONDS`, of `policy`.
    fn ratelimit(&mut self, policy: &PolicyHeaders, remaining: u64, secs: u64) -> HeaderValue {
        self.ratelimit
            .get_or((policy.id, remaining, secs), &mut self.buf, |buf| {
                buf.put_slice(&policy.ratelimit_prefix);
                put_number(buf, remaining);
                buf.put_slice(b";t=");
                put_number(buf, secs);
            })
    }

    /// `X-RateLimit-Remaining`: small counts from the table.
    fn remaining(&mut self, n: u64) -> HeaderValue {
        if n < SMALL_NUMBERS {
            return number(n);
        }
        self.remaining
            .get_or(n, &mut self.buf, |buf| put_number(buf, n))
    }

    /// `X-RateLimit-Reset`: the UNIX time, in seconds rounded up, `after` from now.
    fn reset_at(&mut self, after: Duration) -> HeaderValue {
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(after);
        let secs = ceil_secs(at);
        self.reset
            .get_or(secs, &mut self.buf, |buf| put_number(buf, secs))
    }
}

/// The last value of a field, and what it was made from.
struct Last<K>(Option<(K, HeaderValue)>);

impl<K> Default for Last<K> {
    fn default() -> Self {
        Self(None)
    }
}

impl<K: PartialEq> Last<K> {
    /// The value made from `key`: the last one if it was, else the bytes `write` puts, cut
    /// from `buf`.
    fn get_or(
        &mut self,
        key: K,
        buf: &mut Buffer,
        write: impl FnOnce(&mut BytesMut),
    ) -> HeaderValue {
        if let Some((last, value)) = &self.0
            && *last == key
        {
            return value.clone();
        }
        let value = buf.cut(Buffer::LONGEST, write);
        self.0 = Some((key, value.clone()));
        value
    }
}

/// Header values cut from a shared buffer: a value is a reference into it, so formatting one
/// allocates nothing but, once per [`Buffer::CHUNK`] bytes, the next buffer. A buffer is freed
/// when the last value cut from it is dropped.
#[derive(Default)]
pub(crate) struct Buffer(BytesMut);

impl Buffer {
    /// Bytes per buffer: about 100 responses' values. Small, so that a value kept long (a
    /// cached response) holds little memory besides its own.
    const CHUNK: usize = 4_096;
    /// Room for the longest value of one limit: a name of 64 bytes (as long as a limit's name
    /// may be), quoted, and two 20-digit numbers. (A longer one would still be whole: the
    /// buffer would grow.)
    pub(crate) const LONGEST: usize = 128;

    /// A value of the bytes `write` puts (visible ASCII, as every value here), at most
    /// `longest` bytes long.
    pub(crate) fn cut(&mut self, longest: usize, write: impl FnOnce(&mut BytesMut)) -> HeaderValue {
        if self.0.capacity() - self.0.len() < longest {
            self.0 = BytesMut::with_capacity(Self::CHUNK);
        }
        write(&mut self.0);
        HeaderValue::from_maybe_shared(self.0.split().freeze())
            .unwrap_or(HeaderValue::from_static(""))
    }
}

pub(crate) fn put_number(buf: &mut BytesMut, n: u64) {
    buf.put_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// What `RateLimit`'s `t` shows of a decision: the wait of a denial that can wait, else the
/// time until the quota is whole again.
pub(crate) fn wait(info: &Info) -> Duration {
    if info.retry_after().is_zero() {
        info.reset_after()
    } else {
        info.retry_after()
    }
}

/// The `X-RateLimit-Remaining` an inner rate-limit layer already wrote, if any.
fn written_x_remaining(headers: &HeaderMap) -> Option<u64> {
    headers.get(X_REMAINING)?.to_str().ok()?.parse().ok()
}

/// The `r` of the `RateLimit` an inner rate-limit layer already wrote, if any.
fn written_ratelimit(headers: &HeaderMap) -> Option<u64> {
    let field = headers.get(RATELIMIT)?.to_str().ok()?;
    let r = field
        .split(';')
        .find_map(|param| param.trim().strip_prefix("r="))?;
    r.parse().ok()
}

/// Numbers below this are formatted once per process and never allocate again.
const SMALL_NUMBERS: u64 = 1_024;

/// A header value for `n`; small ones come from a table built once.
pub(crate) fn number(n: u64) -> HeaderValue {
    static TABLE: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // One string holding "0", "1", ..., "1023", leaked once: static header values clone
        // without touching a reference count.
        let mut all = String::new();
        let mut ends = Vec::new();
        for i in 0..SMALL_NUMBERS {
            all.push_str(itoa::Buffer::new().format(i));
            ends.push(all.len());
        }
        let all: &'static str = Box::leak(all.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&all[start..end]);
                start = end;
                value
            })
            .collect()
    });
    usize::try_from(n)
        .ok()
        .and_then(|i| table.get(i))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
