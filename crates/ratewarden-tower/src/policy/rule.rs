//! [`Rule`], [`NamedLimit`] and [`Action`]: what a request matches and what it then gets.

use std::fmt;
use std::sync::{Arc, OnceLock};

use http::header::HeaderName;
use http::{HeaderValue, Method, Request};
use ratewarden_core::{Key, Quota};

use crate::rate_limit::headers::PolicyHeaders;

use super::error::{PolicyError, Problem};

/// What a rule does with the requests it matches.
///
/// In [`MatchMode::All`](super::MatchMode::All), the strongest action of the matching rules
/// wins: `Deny` over `Limit` over `Shadow` over `Allow`.
///
/// ```
/// use ratewarden_tower::policy::{Action, Rule};
/// let health = Rule::new().route("/health").action(Action::Allow);
/// # let _ = health;
/// assert_eq!(Action::default(), Action::Limit);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Action {
    /// Let the request through, uncounted.
    Allow,
    /// Decide, count and send headers, but never refuse: for trying limits on live traffic.
    Shadow,
    /// Check the rule's limits: admitted, the request goes on; denied, 429.
    #[default]
    Limit,
    /// Refuse the request (403 by default, see
    /// [`PolicyLayerBuilder::deny_status`](super::PolicyLayerBuilder::deny_status)).
    Deny,
}

impl Action {
    /// The name used in policy files: `allow`, `shadow`, `limit` or `deny`.
    ///
    /// ```
    /// assert_eq!(ratewarden_tower::policy::Action::Shadow.as_str(), "shadow");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Shadow => "shadow",
            Self::Limit => "limit",
            Self::Deny => "deny",
        }
    }
}

/// One limit of a rule: a name (shown in the `RateLimit` headers, and scoping its buckets),
/// the name of the key extractor that keys it, and its quota.
///
/// A name is one limit: wherever a policy uses it, it has the same key and quota, and its
/// buckets are its own (two names never share state, even with equal keys and quotas).
///
/// ```
/// use ratewarden_tower::policy::NamedLimit;
/// use ratewarden_tower::Quota;
///
/// let per_ip = NamedLimit::new("per-ip", "ip", Quota::per_minute(100)?);
/// assert_eq!(per_ip.name(), "per-ip");
/// assert_eq!(per_ip.key(), "ip");
/// assert_eq!(per_ip.quota(), &Quota::per_minute(100)?);
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
#[derive(Clone)]
pub struct NamedLimit {
    named: Arc<Named>,
    quota: Quota,
}

/// A [`NamedLimit`]'s strings, behind one pointer.
#[derive(Debug)]
struct Named {
    name: Arc<str>,
    key: Box<str>,
    /// [`Key::scope_of`] the name, computed once.
    scope: u64,
    /// Its header values (`"name";q=Q;w=W` ...), formatted once.
    headers: Arc<PolicyHeaders>,
}

impl NamedLimit {
    /// The limit `name`, keyed by the extractor registered as `key`, under `quota`.
    ///
    /// See the example on [`NamedLimit`].
    #[must_use]
    pub fn new(name: &str, key: &str, quota: Quota) -> Self {
        Self {
            named: Arc::new(Named {
                headers: Arc::new(PolicyHeaders::new(name, quota)),
                scope: Key::scope_of(name),
                name: Arc::from(name),
                key: key.into(),
            }),
            quota,
        }
    }

    /// The limit's name.
    ///
    /// See the example on [`NamedLimit`].
    #[must_use]
    pub fn name(&self) -> &str {
        &self.named.name
    }

    /// The name of the key extractor that keys it.
    ///
    /// See the example on [`NamedLimit`].
    #[must_use]
    pub fn key(&self) -> &str {
        &self.named.key
    }

    /// Its quota.
    ///
    /// See the example on [`NamedLimit`].
    #[must_use]
    pub const fn quota(&self) -> &Quota {
        &self.quota
    }

    pub(crate) fn scope(&self) -> u64 {
        self.named.scope
    }

    pub(crate) fn policy_item(&self) -> &[u8] {
        self.named.headers.policy_item()
    }

    /// What a request's headers and rejection show of the limit.
    pub(crate) fn shown(&self) -> Shown {
        Shown(Arc::clone(&self.named))
    }

    /// Whether `other` is the same limit: the same key and quota (names aside).
    pub(crate) fn same_as(&self, other: &Self) -> bool {
        self.named.key == other.named.key && self.quota == other.quota
    }

    pub(crate) fn check_name(&self, field: &str) -> Result<(), PolicyError> {
        let name = &self.named.name;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if valid {
            Ok(())
        } else {
            Err(PolicyError::new(
                format!("{field}.name"),
                Problem::InvalidLimitName {
                    name: name.to_string(),
                },
            ))
        }
    }
}

/// What a request's headers and rejection show of a [`NamedLimit`]: its name and its
/// `RateLimit-Policy` item, one pointer to clone.
#[derive(Clone, Debug)]
pub(crate) struct Shown(Arc<Named>);

impl Shown {
    pub(crate) fn name(&self) -> &str {
        &self.0.name
    }

    pub(crate) fn shown_name(&self) -> &Arc<str> {
        &self.0.name
    }

    pub(crate) fn policy_item(&self) -> &[u8] {
        self.0.headers.policy_item()
    }

    /// Its header values, for a request it alone applied to.
    pub(crate) fn headers(&self) -> &Arc<PolicyHeaders> {
        &self.0.headers
    }
}

impl fmt::Debug for NamedLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedLimit")
            .field("name", &self.named.name)
            .field("key", &self.named.key)
            .field("quota", &self.quota.to_string())
            .finish()
    }
}

impl PartialEq for NamedLimit {
    fn eq(&self, other: &Self) -> bool {
        self.named.name == other.named.name && self.same_as(other)
    }
}

impl Eq for NamedLimit {}

/// A route pattern: an exact path (`/users/{id}`, compared with axum's matched path when
/// there is one) or a prefix (`/api/*`: `/api` and everything under `/api/`; `/*`: every
/// path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Exact(String),
    Prefix(String),
}

impl Route {
    fn parse(pattern: &str) -> Option<Self> {
        if !pattern.starts_with('/') {
            return None;
        }
        if let Some(prefix) = pattern.strip_suffix("/*") {
            if prefix.contains('*') {
                return None;
            }
            return Some(Self::Prefix(prefix.to_owned()));
        }
        if pattern.contains('*') {
            return None;
        }
        Some(Self::Exact(pattern.to_owned()))
    }

    #[inline]
    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(exact) => path == exact,
            // (`/*`: every path, with no call to compare nothing.)
            Self::Prefix(prefix) if prefix.is_empty() => true,
            Self::Prefix(prefix) => path
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')),
        }
    }
}

/// A header condition: present, or equal to a value.
#[derive(Clone, Debug)]
pub(crate) struct HeaderCondition {
    name: String,
    value: Option<String>,
    parsed: Option<(HeaderName, Option<HeaderValue>)>,
}

/// One rule of a [`Policy`](super::Policy): conditions on the request (route, method,
/// header; all must hold, and each lists alternatives), and what a matching request gets:
/// its limits, its cost and its [`Action`].
///
/// A rule without conditions matches every request. Routes are compared with axum's
/// `MatchedPath` when the request has one (so `/users/{id}` names a route), else with the
/// URI path; a pattern ending in `/*` is a prefix.
///
/// ```
/// use http::Method;
/// use ratewarden_tower::policy::{Action, NamedLimit, Rule};
/// use ratewarden_tower::Quota;
///
/// let uploads = Rule::new()
///     .route("/upload/*")
///     .method(Method::POST)
///     .header("x-plan", Some("free"))
///     .limit(NamedLimit::new("per-ip", "ip", Quota::per_minute(100)?))
///     .limit(NamedLimit::new("uploads-per-user", "user", Quota::per_hour(10)?))
///     .cost(2);
/// let blocked = Rule::new().route("/admin/*").action(Action::Deny);
/// # let _ = (uploads, blocked);
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Rule {
    routes: Vec<(String, Option<Route>)>,
    methods: Vec<(String, Option<Method>)>,
    headers: Vec<HeaderCondition>,
    pub(crate) limits: Vec<NamedLimit>,
    pub(crate) cost: u32,
    pub(crate) action: Action,
    policy_header: PolicyHeader,
}

/// The `RateLimit-Policy` value of all of a rule's limits, formatted by the first request
/// that shows them. Its `Debug` is blank: a rule's shows what the rule means, the same before
/// and after requests.
#[derive(Clone)]
struct PolicyHeader(OnceLock<HeaderValue>);

impl fmt::Debug for PolicyHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("..")
    }
}

impl Default for Rule {
    fn default() -> Self {
        Self::new()
    }
}

impl Rule {
    /// A rule matching every request, with no limits, cost 1 and [`Action::Limit`].
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub const fn new() -> Self {
        Self {
            routes: Vec::new(),
            methods: Vec::new(),
            headers: Vec::new(),
            limits: Vec::new(),
            cost: 1,
            action: Action::Limit,
            policy_header: PolicyHeader(OnceLock::new()),
        }
    }

    /// Matches requests for `pattern` too (`/exact` or `/prefix/*`); a pattern that is
    /// neither is refused by [`Policy::validate`](super::Policy::validate).
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub fn route(mut self, pattern: &str) -> Self {
        self.routes
            .push((pattern.to_owned(), Route::parse(pattern)));
        self
    }

    /// Matches requests of `method` too.
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub fn method(mut self, method: Method) -> Self {
        self.methods
            .push((method.as_str().to_owned(), Some(method)));
        self
    }

    /// Matches the method named `method` too (`"GET"`); an invalid name is refused by
    /// [`Policy::validate`](super::Policy::validate).
    ///
    /// ```
    /// let rule = ratewarden_tower::policy::Rule::new().method_named("PATCH");
    /// # let _ = rule;
    /// ```
    #[must_use]
    pub fn method_named(mut self, method: &str) -> Self {
        self.methods.push((
            method.to_owned(),
            Method::from_bytes(method.as_bytes()).ok(),
        ));
        self
    }

    /// Requires the header `name`: present (`None`), or with exactly `value`. Invalid
    /// names and values are refused by [`Policy::validate`](super::Policy::validate).
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub fn header(mut self, name: &str, value: Option<&str>) -> Self {
        let parsed_name = HeaderName::from_bytes(name.as_bytes()).ok();
        let parsed_value = value.map(HeaderValue::from_str);
        let parsed = match (parsed_name, parsed_value) {
            (Some(name), None) => Some((name, None)),
            (Some(name), Some(Ok(value))) => Some((name, Some(value))),
            _ => None,
        };
        self.headers.push(HeaderCondition {
            name: name.to_owned(),
            value: value.map(str::to_owned),
            parsed,
        });
        self
    }

    /// Adds a limit.
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub fn limit(mut self, limit: NamedLimit) -> Self {
        self.limits.push(limit);
        self.policy_header = PolicyHeader(OnceLock::new());
        self
    }

    /// What each matching request costs, in each of the rule's limits (default 1; 0 is
    /// refused by [`Policy::validate`](super::Policy::validate)).
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub const fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// What a matching request gets (default [`Action::Limit`]).
    ///
    /// See the example on [`Rule`].
    #[must_use]
    pub const fn action(mut self, action: Action) -> Self {
        self.action = action;
        self
    }

    /// The rule's limits.
    ///
    /// ```
    /// assert!(ratewarden_tower::policy::Rule::new().limits().is_empty());
    /// ```
    #[must_use]
    pub fn limits(&self) -> &[NamedLimit] {
        &self.limits
    }

    /// The rule's action.
    ///
    /// ```
    /// use ratewarden_tower::policy::{Action, Rule};
    /// assert_eq!(Rule::new().get_action(), Action::Limit);
    /// ```
    #[must_use]
    pub const fn get_action(&self) -> Action {
        self.action
    }

    /// The `RateLimit-Policy` value of a request every one of the rule's limits applied to.
    pub(crate) fn policy_header(&self) -> &HeaderValue {
        self.policy_header
            .0
            .get_or_init(|| policy_value(&self.limits))
    }

    pub(crate) fn has_conditions(&self) -> bool {
        !(self.routes.is_empty() && self.methods.is_empty() && self.headers.is_empty())
    }

    /// Checks everything but key names and limit names; `field` is the rule's path.
    pub(crate) fn check(&self, field: &str) -> Result<(), PolicyError> {
        for (i, (pattern, route)) in self.routes.iter().enumerate() {
            if route.is_none() {
                return Err(PolicyError::new(
                    format!("{field}.routes[{i}]"),
                    Problem::InvalidRoute {
                        route: pattern.clone(),
                    },
                ));
            }
        }
        for (i, (name, method)) in self.methods.iter().enumerate() {
            if method.is_none() {
                return Err(PolicyError::new(
                    format!("{field}.methods[{i}]"),
                    Problem::InvalidMethod {
                        method: name.clone(),
                    },
                ));
            }
        }
        for (i, header) in self.headers.iter().enumerate() {
            if header.parsed.is_none() {
                let shown = match &header.value {
                    Some(value) if HeaderName::from_bytes(header.name.as_bytes()).is_ok() => {
                        value.clone()
                    }
                    _ => header.name.clone(),
                };
                return Err(PolicyError::new(
                    format!("{field}.headers[{i}]"),
                    Problem::InvalidHeader { header: shown },
                ));
            }
        }
        if self.cost == 0 {
            return Err(PolicyError::new(format!("{field}.cost"), Problem::ZeroCost));
        }
        Ok(())
    }

    /// Whether `req`, whose route is `path`, meets every condition.
    #[inline]
    pub(crate) fn matches<B>(&self, req: &Request<B>, path: &str) -> bool {
        // The route first, inline: most rules of a policy are told apart by it.
        let route = self.routes.is_empty()
            || self
                .routes
                .iter()
                .any(|(_, route)| route.as_ref().is_some_and(|r| r.matches(path)));
        route && (self.methods.is_empty() && self.headers.is_empty() || self.matches_rest(req))
    }

    /// Whether `req` meets the method and header conditions.
    fn matches_rest<B>(&self, req: &Request<B>) -> bool {
        let method = self.methods.is_empty()
            || self
                .methods
                .iter()
                .any(|(_, m)| m.as_ref() == Some(req.method()));
        method
            && self.headers.iter().all(|h| match &h.parsed {
                Some((name, None)) => req.headers().contains_key(name),
                Some((name, Some(value))) => req.headers().get_all(name).iter().any(|v| v == value),
                None => false,
            })
    }
}

/// The `RateLimit-Policy` value of `limits`: `"name";q=Q;w=W` each.
pub(crate) fn policy_value(limits: &[NamedLimit]) -> HeaderValue {
    use bytes::BufMut as _;
    let mut value = bytes::BytesMut::new();
    for limit in limits {
        if !value.is_empty() {
            value.put_slice(b", ");
        }
        value.put_slice(limit.policy_item());
    }
    // (Limit names are checked to be tokens; a quota formats as digits.)
    HeaderValue::from_maybe_shared(value.freeze()).unwrap_or(HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_routes_match_the_prefix_and_what_is_under_it_only() {
        let api = Route::parse("/api/*").unwrap();
        assert!(api.matches("/api"));
        assert!(api.matches("/api/users/7"));
        assert!(!api.matches("/apis"));
        let all = Route::parse("/*").unwrap();
        assert!(all.matches("/"));
        assert!(all.matches("/anything"));
        assert_eq!(Route::parse("api"), None);
        assert_eq!(Route::parse("/a/*/b"), None);
        assert!(Route::parse("/users/{id}").unwrap().matches("/users/{id}"));
    }

    #[test]
    fn conditions_of_one_kind_are_alternatives_and_kinds_all_hold() {
        let rule = Rule::new()
            .route("/a")
            .route("/b/*")
            .method(Method::GET)
            .header("x-plan", Some("gold"));
        let req = |method: Method, plan: &str| {
            Request::builder()
                .method(method)
                .header("x-plan", plan)
                .body(())
                .unwrap()
        };
        assert!(rule.matches(&req(Method::GET, "gold"), "/b/c"));
        assert!(!rule.matches(&req(Method::GET, "free"), "/a"));
        assert!(!rule.matches(&req(Method::POST, "gold"), "/a"));
        assert!(!rule.matches(&req(Method::GET, "gold"), "/c"));
        assert!(
            Rule::new()
                .header("x-plan", None)
                .matches(&req(Method::GET, ""), "/")
        );
    }

    #[test]
    fn the_policy_header_is_formatted_once_for_the_limits_the_rule_has() {
        let quota = Quota::per_minute(100).unwrap();
        let rule = Rule::new().limit(NamedLimit::new("a", "ip", quota));
        let before = format!("{rule:?}");
        assert_eq!(rule.policy_header(), r#""a";q=100;w=60"#);
        assert_eq!(
            format!("{rule:?}"),
            before,
            "a rule's Debug is what it means"
        );
        let more = rule.clone().limit(NamedLimit::new("b", "ip", quota));
        assert_eq!(more.policy_header(), r#""a";q=100;w=60, "b";q=100;w=60"#);
        assert_eq!(rule.policy_header(), r#""a";q=100;w=60"#);
    }

    #[test]
    fn invalid_conditions_name_their_field() {
        let err = Rule::new()
            .route("/ok")
            .route("bad")
            .check("rules[3]")
            .unwrap_err();
        assert_eq!(err.field(), "rules[3].routes[1]");
        let err = Rule::new()
            .header("bad name", None)
            .check("rules[0]")
            .unwrap_err();
        assert_eq!(err.field(), "rules[0].headers[0]");
        let err = Rule::new()
            .method_named("GE T")
            .check("default")
            .unwrap_err();
        assert_eq!(err.field(), "default.methods[0]");
        assert_eq!(
            Rule::new().cost(0).check("r").unwrap_err().problem(),
            &Problem::ZeroCost
        );
    }
}
