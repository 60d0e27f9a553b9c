//! [`Policy`]: rules in order, a default, a match mode, and the allow and deny lists.

use std::collections::HashMap;
use std::sync::Arc;

use http::Request;

use super::access::AccessList;
use super::error::{Location, PolicyError, Problem};
use super::keys::GLOBAL;
use super::rule::{Action, NamedLimit, Rule};

/// The most limits a policy puts on one request: half of what one
/// [`check_all`](ratewarden_core::Store::check_all) decides, so that each may be checked under
/// its previous quota too while a reload's change settles (see
/// [`PolicyHandle`](super::PolicyHandle)).
pub const MAX_LIMITS_PER_REQUEST: usize = ratewarden_core::MAX_LIMITS / 2;

/// Which rules a request gets.
///
/// ```
/// use ratewarden_tower::policy::{MatchMode, Policy};
/// let policy = Policy::new().match_mode(MatchMode::All);
/// assert_eq!(policy.get_match_mode(), MatchMode::All);
/// assert_eq!(MatchMode::default(), MatchMode::First);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MatchMode {
    /// The first rule that matches, in order.
    #[default]
    First,
    /// Every rule that matches. The strongest action wins (`deny` over `limit` over `shadow`
    /// over `allow`), and the request is checked against the limits of every matching rule
    /// with that action, all together in one
    /// [`check_all`](ratewarden_core::Store::check_all); a limit several of them name is
    /// checked once, at the highest cost they give it.
    All,
}

/// Where the fields of a policy read from a file are.
#[derive(Debug, Default)]
pub(crate) struct Origins {
    pub(crate) file: Arc<str>,
    pub(crate) fields: HashMap<String, (usize, Option<usize>)>,
}

impl Origins {
    /// The location of `field`, or of the closest field that holds it.
    pub(crate) fn locate(&self, field: &str) -> Option<Location> {
        let mut path = field;
        loop {
            if let Some(&(line, column)) = self.fields.get(path) {
                return Some(Location {
                    file: Arc::clone(&self.file),
                    line,
                    column,
                });
            }
            let cut = path.rfind(['.', '['])?;
            path = &path[..cut];
        }
    }
}

/// The rules of a [`PolicyLayer`](super::PolicyLayer): rules in order, the default for
/// requests no rule matched, the [`MatchMode`], and the allow and deny lists.
///
/// A new policy has no rules, and its default lets every request through uncounted.
///
/// ```
/// use http::Method;
/// use ratewarden_tower::policy::{AccessList, Action, MatchMode, NamedLimit, Policy, Rule};
/// use ratewarden_tower::Quota;
///
/// let per_ip = NamedLimit::new("per-ip", "ip", Quota::per_minute(300)?);
/// let policy = Policy::new()
///     .rule(Rule::new().route("/health").action(Action::Allow))
///     .rule(
///         Rule::new()
///             .route("/login")
///             .method(Method::POST)
///             .limit(per_ip.clone())
///             .limit(NamedLimit::new("logins", "ip", Quota::per_hour(20)?)),
///     )
///     .otherwise(Rule::new().limit(per_ip))
///     .match_mode(MatchMode::First)
///     .allow_list(AccessList::new().network("ip", "10.0.0.0/8".parse()?))
///     .deny_list(AccessList::new().value("user", "banned"));
/// policy.validate(&["ip", "user"])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Policy {
    rules: Vec<Rule>,
    default: Option<Rule>,
    mode: MatchMode,
    allow: AccessList,
    deny: AccessList,
    pub(crate) origins: Option<Arc<Origins>>,
}

/// What a policy gives one request.
pub(crate) struct Verdict<'a> {
    pub(crate) action: Action,
    /// Each limit, with its cost.
    pub(crate) limits: Limits<'a>,
}

/// The limits a policy gives one request: one rule's, or the union of several rules'.
pub(crate) enum Limits<'a> {
    /// Those of this rule, at its cost.
    Rule(&'a Rule),
    /// Each limit, with its cost.
    Union(Vec<(&'a NamedLimit, u32)>),
}

impl<'a> Limits<'a> {
    /// Each limit, with its cost.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'a NamedLimit, u32)> + '_ {
        let (rule, union) = match self {
            Self::Rule(rule) => (Some(*rule), &[][..]),
            Self::Union(union) => (None, &union[..]),
        };
        rule.into_iter()
            .flat_map(|rule| rule.limits.iter().map(|limit| (limit, rule.cost)))
            .chain(union.iter().copied())
    }

    /// How many limits.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Rule(rule) => rule.limits.len(),
            Self::Union(union) => union.len(),
        }
    }

    /// The rule they all are, when they are one rule's.
    pub(crate) const fn rule(&self) -> Option<&'a Rule> {
        match self {
            Self::Rule(rule) => Some(rule),
            Self::Union(_) => None,
        }
    }
}

/// The default's default: let everything through.
static ALLOW_ALL: Rule = Rule::new().action(Action::Allow);

impl Policy {
    /// A policy with no rules, whose default lets every request through uncounted.
    ///
    /// See the example on [`Policy`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule, after those already added.
    ///
    /// See the example on [`Policy`].
    #[must_use]
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// The rule for requests no rule matched (a rule without conditions: conditions are
    /// refused by [`validate`](Self::validate)).
    ///
    /// See the example on [`Policy`].
    #[must_use]
    pub fn otherwise(mut self, rule: Rule) -> Self {
        self.default = Some(rule);
        self
    }

    /// Which rules a request gets (default [`MatchMode::First`]).
    ///
    /// See the example on [`Policy`].
    #[must_use]
    pub const fn match_mode(mut self, mode: MatchMode) -> Self {
        self.mode = mode;
        self
    }

    /// The clients let through uncounted, whatever the rules say.
    ///
    /// See the example on [`Policy`].
    #[must_use]
    pub fn allow_list(mut self, list: AccessList) -> Self {
        self.allow = list;
        self
    }

    /// The clients refused, whatever the rules and the allow list say.
    ///
    /// See the example on [`Policy`].
    #[must_use]
    pub fn deny_list(mut self, list: AccessList) -> Self {
        self.deny = list;
        self
    }

    /// The rules, in order.
    ///
    /// ```
    /// use ratewarden_tower::policy::{Policy, Rule};
    /// assert_eq!(Policy::new().rule(Rule::new()).rules().len(), 1);
    /// ```
    #[must_use]
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule for requests no rule matched.
    ///
    /// ```
    /// use ratewarden_tower::policy::{Action, Policy};
    /// assert_eq!(Policy::new().default_rule().get_action(), Action::Allow);
    /// ```
    #[must_use]
    pub fn default_rule(&self) -> &Rule {
        self.default.as_ref().unwrap_or(&ALLOW_ALL)
    }

    /// The match mode.
    ///
    /// See the example on [`MatchMode`].
    #[must_use]
    pub const fn get_match_mode(&self) -> MatchMode {
        self.mode
    }

    /// The allow list.
    ///
    /// ```
    /// assert!(ratewarden_tower::policy::Policy::new().allowed().is_empty());
    /// ```
    #[must_use]
    pub const fn allowed(&self) -> &AccessList {
        &self.allow
    }

    /// The deny list.
    ///
    /// ```
    /// assert!(ratewarden_tower::policy::Policy::new().denied().is_empty());
    /// ```
    #[must_use]
    pub const fn denied(&self) -> &AccessList {
        &self.deny
    }

    /// Every limit the policy names, once each, in the order first named.
    ///
    /// ```
    /// use ratewarden_tower::policy::{NamedLimit, Policy, Rule};
    /// use ratewarden_tower::Quota;
    /// let per_ip = NamedLimit::new("per-ip", "ip", Quota::per_second(5)?);
    /// let policy = Policy::new().rule(Rule::new().limit(per_ip.clone())).otherwise(Rule::new().limit(per_ip));
    /// assert_eq!(policy.limits().len(), 1);
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    #[must_use]
    pub fn limits(&self) -> Vec<&NamedLimit> {
        let mut seen: Vec<&NamedLimit> = Vec::new();
        for rule in self.all_rules() {
            for limit in &rule.limits {
                if !seen.iter().any(|l| l.name() == limit.name()) {
                    seen.push(limit);
                }
            }
        }
        seen
    }

    fn all_rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().chain(self.default.as_ref())
    }

    /// Checks the policy against the key names a layer registered (`global` always is):
    /// routes, methods, headers, costs, limit names, that a name is one limit, that no
    /// request gets more than [`MAX_LIMITS_PER_REQUEST`] limits, and that every key is
    /// registered.
    ///
    /// # Errors
    ///
    /// The first [`PolicyError`] found, naming its field (and, for a policy read from a file,
    /// its line).
    ///
    /// See the example on [`Policy`].
    pub fn validate(&self, keys: &[&str]) -> Result<(), PolicyError> {
        self.check(Some(keys))
    }

    /// [`validate`](Self::validate), with key names unchecked when `keys` is `None`.
    pub(crate) fn check(&self, keys: Option<&[&str]>) -> Result<(), PolicyError> {
        self.check_fields(keys).map_err(|mut err| {
            if let Some(origins) = &self.origins {
                err.location = origins.locate(&err.field);
            }
            err
        })
    }

    fn check_fields(&self, keys: Option<&[&str]>) -> Result<(), PolicyError> {
        let known = |key: &str| keys.is_none_or(|keys| key == GLOBAL || keys.contains(&key));
        let unknown = |field: String, key: &str| {
            let mut names: Vec<String> = std::iter::once(GLOBAL)
                .chain(keys.unwrap_or_default().iter().copied())
                .map(str::to_owned)
                .collect();
            names.sort();
            names.dedup();
            PolicyError::new(
                field,
                Problem::UnknownKey {
                    key: key.to_owned(),
                    known: names,
                },
            )
        };
        let mut first_defined: HashMap<&str, (String, &NamedLimit)> = HashMap::new();
        let fields = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| (format!("rules[{i}]"), rule))
            .chain(self.default.iter().map(|rule| ("default".to_owned(), rule)));
        let mut all_names: Vec<&str> = Vec::new();
        for (field, rule) in fields {
            rule.check(&field)?;
            if field == "default" && rule.has_conditions() {
                return Err(PolicyError::new(field, Problem::ConditionsOnDefault));
            }
            if rule.limits.len() > MAX_LIMITS_PER_REQUEST {
                return Err(PolicyError::new(
                    format!("{field}.limits"),
                    Problem::TooManyLimits {
                        count: rule.limits.len(),
                        max: MAX_LIMITS_PER_REQUEST,
                    },
                ));
            }
            for (j, limit) in rule.limits.iter().enumerate() {
                let limit_field = format!("{field}.limits[{j}]");
                limit.check_name(&limit_field)?;
                if !known(limit.key()) {
                    return Err(unknown(format!("{limit_field}.key"), limit.key()));
                }
                match first_defined.get(limit.name()) {
                    Some((first, defined)) if !defined.same_as(limit) => {
                        return Err(PolicyError::new(
                            limit_field,
                            Problem::ConflictingLimit {
                                name: limit.name().to_owned(),
                                first: first.clone(),
                            },
                        ));
                    }
                    Some(_) => {}
                    None => {
                        first_defined.insert(limit.name(), (limit_field, limit));
                    }
                }
                // Every limit a limiting rule gives, wherever its name was first written.
                let limiting = rule.action != Action::Allow && rule.action != Action::Deny;
                if limiting && !all_names.contains(&limit.name()) {
                    all_names.push(limit.name());
                }
            }
        }
        if self.mode == MatchMode::All && all_names.len() > MAX_LIMITS_PER_REQUEST {
            // Every rule may match one request: their limits together must fit.
            return Err(PolicyError::new(
                "rules",
                Problem::TooManyLimits {
                    count: all_names.len(),
                    max: MAX_LIMITS_PER_REQUEST,
                },
            ));
        }
        for (name, list) in [("allow", &self.allow), ("deny", &self.deny)] {
            list.check(name)?;
            for (field, key) in list.keys(name) {
                if !known(key) {
                    return Err(unknown(field, key));
                }
            }
        }
        Ok(())
    }

    /// What the policy gives `req`, whose route is `path`.
    pub(crate) fn verdict<B>(&self, req: &Request<B>, path: &str) -> Verdict<'_> {
        fn of(rule: &Rule) -> Verdict<'_> {
            Verdict {
                action: rule.action,
                limits: Limits::Rule(rule),
            }
        }
        match self.mode {
            MatchMode::First => {
                for rule in &self.rules {
                    if rule.matches(req, path) {
                        return of(rule);
                    }
                }
                of(self.default_rule())
            }
            MatchMode::All => {
                let mut matching = self.rules.iter().filter(|rule| rule.matches(req, path));
                let Some(first) = matching.next() else {
                    return of(self.default_rule());
                };
                let rules: Vec<&Rule> = std::iter::once(first).chain(matching).collect();
                let action = rules.iter().map(|r| r.action).max().unwrap_or_default();
                let mut strongest = rules.iter().filter(|r| r.action == action);
                // One rule: its limits as they are, unless it names a limit twice (once
                // here, at its cost).
                if let (Some(only), None) = (strongest.next(), strongest.next())
                    && only
                        .limits
                        .iter()
                        .enumerate()
                        .all(|(i, limit)| only.limits[..i].iter().all(|l| l.name() != limit.name()))
                {
                    return of(only);
                }
                let mut limits: Vec<(&NamedLimit, u32)> = Vec::new();
                for rule in rules.iter().filter(|r| r.action == action) {
                    for limit in &rule.limits {
                        match limits.iter_mut().find(|(l, _)| l.name() == limit.name()) {
                            Some((_, cost)) => *cost = (*cost).max(rule.cost),
                            None => limits.push((limit, rule.cost)),
                        }
                    }
                }
                Verdict {
                    action,
                    limits: Limits::Union(limits),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use ratewarden_core::Quota;

    fn limit(name: &str, per_second: u32) -> NamedLimit {
        NamedLimit::new(name, "ip", Quota::per_second(per_second).unwrap())
    }

    fn names(verdict: &Verdict<'_>) -> Vec<(String, u32)> {
        verdict
            .limits
            .iter()
            .map(|(l, c)| (l.name().to_owned(), c))
            .collect()
    }

    #[test]
    fn first_match_takes_the_first_rule_and_no_match_the_default() {
        let policy = Policy::new()
            .rule(Rule::new().route("/api/*").limit(limit("api", 10)))
            .rule(Rule::new().route("/api/search").limit(limit("search", 1)))
            .otherwise(Rule::new().limit(limit("rest", 5)));
        let req = Request::new(());
        let verdict = policy.verdict(&req, "/api/search");
        assert_eq!(names(&verdict), [("api".to_owned(), 1)]);
        assert_eq!(
            names(&policy.verdict(&req, "/other")),
            [("rest".to_owned(), 1)]
        );
    }

    #[test]
    fn all_matches_unite_the_limits_of_the_strongest_action() {
        let policy = Policy::new()
            .match_mode(MatchMode::All)
            .rule(Rule::new().route("/api/*").limit(limit("api", 10)))
            .rule(
                Rule::new()
                    .route("/api/upload")
                    .limit(limit("uploads", 1))
                    .cost(3),
            )
            .rule(
                Rule::new()
                    .method(Method::POST)
                    .limit(limit("api", 10))
                    .cost(2),
            )
            .rule(Rule::new().route("/api/*").action(Action::Allow))
            .rule(
                Rule::new()
                    .route("/api/shadow")
                    .action(Action::Shadow)
                    .limit(limit("s", 1)),
            );
        let post = Request::post("/").body(()).unwrap();
        let verdict = policy.verdict(&post, "/api/upload");
        assert_eq!(verdict.action, Action::Limit);
        assert_eq!(
            names(&verdict),
            [("api".to_owned(), 2), ("uploads".to_owned(), 3)]
        );
        let denied = policy
            .clone()
            .rule(Rule::new().route("/api/upload").action(Action::Deny));
        assert_eq!(denied.verdict(&post, "/api/upload").action, Action::Deny);
    }

    #[test]
    fn a_name_is_one_limit() {
        let policy = Policy::new()
            .rule(Rule::new().limit(limit("api", 10)))
            .rule(Rule::new().limit(limit("api", 20)));
        let err = policy.validate(&["ip"]).unwrap_err();
        assert_eq!(err.field(), "rules[1].limits[0]");
        assert!(err.to_string().contains("rules[0].limits[0]"), "{err}");
    }

    #[test]
    fn the_default_takes_no_conditions_and_lists_name_registered_keys() {
        let err = Policy::new()
            .otherwise(Rule::new().route("/x"))
            .validate(&[])
            .unwrap_err();
        assert_eq!(err.problem(), &Problem::ConditionsOnDefault);
        let err = Policy::new()
            .allow_list(AccessList::new().value("user", "a"))
            .validate(&["ip"])
            .unwrap_err();
        assert_eq!(err.field(), "allow.user[0]");
    }

    #[test]
    fn too_many_limits_are_refused_when_loaded() {
        let mut rule = Rule::new();
        for i in 0..=MAX_LIMITS_PER_REQUEST {
            rule = rule.limit(limit(&format!("l{i}"), 1));
        }
        let err = Policy::new().rule(rule).validate(&["ip"]).unwrap_err();
        assert!(matches!(err.problem(), Problem::TooManyLimits { .. }));
    }
}
