//! Policy files: TOML and YAML read through serde, validated with errors that name the
//! file, the line and the field.
//!
//! ```toml
//! match = "first"                       # or "all"
//!
//! [[rules]]
//! routes = ["/login"]                   # exact paths, or prefixes ending in /*
//! methods = ["POST"]
//! headers = [{ name = "x-plan", value = "free" }]  # without value: present
//! cost = 1
//! action = "limit"                      # limit (default), allow, deny or shadow
//! limits = [
//!   { name = "per-ip", key = "ip", quota = "100/min" },
//!   { name = "logins", key = "ip", quota = "20/h sliding-window" },
//! ]
//!
//! [default]                             # requests no rule matched (default: allow)
//! limits = [{ name = "per-ip", key = "ip", quota = "100/min" }]
//!
//! [allow]                               # key name = networks, addresses or values
//! ip = ["10.0.0.0/8", "::1"]
//!
//! [deny]
//! user = ["banned-user"]
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use ratewarden_core::Quota;
use serde::Deserialize;

use super::access::AccessList;
use super::definition::{MatchMode, Origins, Policy};
use super::error::{Location, PolicyError, Problem};
use super::rule::{Action, NamedLimit, Rule};

/// A policy file that cannot be used.
///
/// ```
/// use ratewarden_tower::policy::{LoadError, parse};
/// let err = parse("policy.toml", "[[rules]]\nlimits = [{ name = \"a\", key = \"ip\", quota = \"5/fortnight\" }]\n")
///     .unwrap_err();
/// assert!(matches!(err, LoadError::Invalid(_)));
/// assert!(err.to_string().starts_with("policy.toml:2:"), "{err}");
/// assert!(err.to_string().contains("rules[0].limits[0].quota: "), "{err}");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file's name ends in none of `.toml`, `.yaml` and `.yml`.
    UnknownFormat {
        /// The file.
        file: String,
    },
    /// The file does not parse, or describes a policy that cannot be used.
    Invalid(PolicyError),
}

impl LoadError {
    /// The [`PolicyError`], for a file that was read.
    ///
    /// ```
    /// let err = ratewarden_tower::policy::parse("p.yaml", "rules: 7").unwrap_err();
    /// assert_eq!(err.policy_error().unwrap().location().unwrap().line(), 1);
    /// ```
    #[must_use]
    pub const fn policy_error(&self) -> Option<&PolicyError> {
        match self {
            Self::Invalid(err) => Some(err),
            Self::Read { .. } | Self::UnknownFormat { .. } => None,
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { file, source } => write!(f, "{file}: cannot read the policy: {source}"),
            Self::UnknownFormat { file } => write!(
                f,
                "{file}: unknown policy format (expected a name ending in .toml, .yaml or .yml)"
            ),
            Self::Invalid(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            Self::Invalid(err) => Some(err),
            Self::UnknownFormat { .. } => None,
        }
    }
}

/// Reads the policy file at `path` (TOML for `.toml`, YAML for `.yaml` and `.yml`) and
/// checks everything but its key names, which a layer checks when the policy is given to
/// its [`PolicyHandle`](super::PolicyHandle) (or [`Policy::validate`] with the names). Use
/// it to validate a file without serving, in CI.
///
/// # Errors
///
/// A [`LoadError`]: the file cannot be read, its format is unknown, or it does not parse or
/// describes a policy that cannot be used (naming the file, line, column and field).
///
/// ```no_run
/// let policy = ratewarden_tower::policy::load_file("policy.toml")?;
/// policy.validate(&["ip", "user"])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load_file(path: impl AsRef<Path>) -> Result<Policy, LoadError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        file: file.clone(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|err| {
        // The line of the first byte that is not UTF-8.
        let before = &err.as_bytes()[..err.utf8_error().valid_up_to()];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        LoadError::Invalid(PolicyError {
            field: String::new(),
            problem: Problem::Syntax {
                message: "the file is not UTF-8".to_owned(),
            },
            location: Some(Location {
                file: Arc::from(file.as_str()),
                line,
                column: None,
            }),
        })
    })?;
    parse(&file, &text)
}

/// Parses `text`, the policy file named `file` (whose extension gives the format, and which
/// errors name), as [`load_file`] does.
///
/// # Errors
///
/// As for [`load_file`], but for reading.
///
/// ```
/// use ratewarden_tower::policy::parse;
/// let policy = parse("policy.yaml", "
/// default:
///   limits:
///     - { name: per-ip, key: ip, quota: 5/min }
/// ")?;
/// assert_eq!(policy.limits()[0].quota().to_string(), "5/min");
/// # Ok::<(), ratewarden_tower::policy::LoadError>(())
/// ```
pub fn parse(file: &str, text: &str) -> Result<Policy, LoadError> {
    let lower = file.to_ascii_lowercase();
    let lines = LineIndex::new(text);
    let name: Arc<str> = Arc::from(file);
    if lower.ends_with(".toml") {
        let raw = parse_toml(text, &name, &lines)?;
        build(&raw, &name, &lines)
    } else if lower.ends_with(".yaml") || lower.ends_with(".yml") {
        let raw = parse_yaml(text, &name)?;
        build(&raw, &name, &lines)
    } else {
        Err(LoadError::UnknownFormat {
            file: file.to_owned(),
        })
    }
}

fn syntax(
    file: &Arc<str>,
    field: String,
    at: Option<(usize, Option<usize>)>,
    message: String,
) -> LoadError {
    let field = if field == "." { String::new() } else { field };
    LoadError::Invalid(PolicyError {
        field,
        problem: Problem::Syntax { message },
        location: at.map(|(line, column)| Location {
            file: Arc::clone(file),
            line,
            column,
        }),
    })
}

fn parse_toml(
    text: &str,
    file: &Arc<str>,
    lines: &LineIndex,
) -> Result<RawPolicy<toml::Spanned<String>, toml::Spanned<u32>>, LoadError> {
    let deserializer = toml::Deserializer::parse(text).map_err(|err| {
        let at = err.span().map(|span| lines.at(span.start));
        syntax(file, String::new(), at, err.message().to_owned())
    })?;
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let field = err.path().to_string();
        let inner = err.into_inner();
        let at = inner.span().map(|span| lines.at(span.start));
        syntax(file, field, at, inner.message().to_owned())
    })
}

type YamlPolicy = RawPolicy<serde_saphyr::Spanned<String>, serde_saphyr::Spanned<u32>>;

fn parse_yaml(text: &str, file: &Arc<str>) -> Result<YamlPolicy, LoadError> {
    let mut path = String::new();
    let parsed = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|err| {
            path = err.path().to_string();
            err.into_inner()
        })
    });
    parsed.map_err(|err| {
        let at = err.location().map(|l| {
            (
                usize::try_from(l.line()).unwrap_or(usize::MAX),
                usize::try_from(l.column()).ok(),
            )
        });
        // The first line of the parser's message: the rest is a rendered snippet.
        let message = err.to_string();
        let message = message.lines().next().unwrap_or_default().to_owned();
        syntax(file, path, at, message)
    })
}

/// Byte offsets to lines and columns.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self { starts }
    }

    /// The line and column (from 1) of byte `offset`.
    fn at(&self, offset: usize) -> (usize, Option<usize>) {
        let line = self.starts.partition_point(|&start| start <= offset);
        let start = self
            .starts
            .get(line.saturating_sub(1))
            .copied()
            .unwrap_or(0);
        (line.max(1), Some(offset - start.min(offset) + 1))
    }
}

/// A value read with where it was: `toml::Spanned` and `serde_saphyr::Spanned`.
trait Located<T> {
    fn value(&self) -> &T;
    fn at(&self, lines: &LineIndex) -> (usize, Option<usize>);
}

impl<T> Located<T> for toml::Spanned<T> {
    fn value(&self) -> &T {
        self.get_ref()
    }

    fn at(&self, lines: &LineIndex) -> (usize, Option<usize>) {
        lines.at(self.span().start)
    }
}

impl<T> Located<T> for serde_saphyr::Spanned<T> {
    fn value(&self) -> &T {
        &self.value
    }

    fn at(&self, _: &LineIndex) -> (usize, Option<usize>) {
        let location = self.referenced;
        (
            usize::try_from(location.line()).unwrap_or(usize::MAX),
            usize::try_from(location.column()).ok(),
        )
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "S: Deserialize<'de>, N: Deserialize<'de>")
)]
struct RawPolicy<S, N> {
    #[serde(default, rename = "match")]
    mode: Option<S>,
    #[serde(default = "Vec::new")]
    rules: Vec<RawRule<S, N>>,
    #[serde(default)]
    default: Option<RawRule<S, N>>,
    #[serde(default = "BTreeMap::new")]
    allow: BTreeMap<String, Vec<S>>,
    #[serde(default = "BTreeMap::new")]
    deny: BTreeMap<String, Vec<S>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "S: Deserialize<'de>, N: Deserialize<'de>")
)]
struct RawRule<S, N> {
    #[serde(default)]
    routes: Option<Vec<S>>,
    #[serde(default)]
    methods: Option<Vec<S>>,
    #[serde(default = "Vec::new")]
    headers: Vec<RawHeader<S>>,
    #[serde(default = "Vec::new")]
    limits: Vec<RawLimit<S>>,
    #[serde(default)]
    cost: Option<N>,
    #[serde(default)]
    action: Option<S>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "S: Deserialize<'de>"))]
struct RawHeader<S> {
    name: S,
    #[serde(default)]
    value: Option<S>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit<S> {
    name: S,
    key: S,
    quota: S,
}

/// Turns what was read into a [`Policy`] that remembers where each field was.
struct Builder<'a> {
    file: &'a Arc<str>,
    lines: &'a LineIndex,
    origins: HashMap<String, (usize, Option<usize>)>,
}

impl Builder<'_> {
    fn note<T>(&mut self, field: &str, value: &impl Located<T>) {
        self.origins.insert(field.to_owned(), value.at(self.lines));
    }

    fn error(&self, field: &str, problem: Problem) -> LoadError {
        let location = self.origins.get(field).map(|&(line, column)| Location {
            file: Arc::clone(self.file),
            line,
            column,
        });
        LoadError::Invalid(PolicyError {
            field: field.to_owned(),
            problem,
            location,
        })
    }

    fn rule<S: Located<String>, N: Located<u32>>(
        &mut self,
        field: &str,
        raw: &RawRule<S, N>,
    ) -> Result<Rule, LoadError> {
        let mut rule = Rule::new();
        // An empty list reads as "any" in a rule: written out, it most likely meant "none".
        for (list, name) in [(&raw.routes, "routes"), (&raw.methods, "methods")] {
            if list.as_ref().is_some_and(Vec::is_empty) {
                return Err(self.error(
                    field,
                    Problem::Syntax {
                        message: format!(
                            "{name} = [] would match every request: leave {name} out for that, or list some"
                        ),
                    },
                ));
            }
        }
        for (i, route) in raw.routes.iter().flatten().enumerate() {
            self.note(&format!("{field}.routes[{i}]"), route);
            rule = rule.route(route.value());
        }
        for (i, method) in raw.methods.iter().flatten().enumerate() {
            let method_field = format!("{field}.methods[{i}]");
            self.note(&method_field, method);
            // Methods are case-sensitive: `get` is an extension method, never a GET.
            if method.value().bytes().any(|b| b.is_ascii_lowercase()) {
                return Err(self.error(
                    &method_field,
                    Problem::Syntax {
                        message: format!(
                            "method {:?} is not {:?}: methods are case-sensitive",
                            method.value(),
                            method.value().to_ascii_uppercase()
                        ),
                    },
                ));
            }
            rule = rule.method_named(method.value());
        }
        for (i, header) in raw.headers.iter().enumerate() {
            self.note(&format!("{field}.headers[{i}]"), &header.name);
            rule = rule.header(
                header.name.value(),
                header.value.as_ref().map(|v| v.value().as_str()),
            );
        }
        if let Some(cost) = &raw.cost {
            self.note(&format!("{field}.cost"), cost);
            rule = rule.cost(*cost.value());
        }
        if let Some(action) = &raw.action {
            let action_field = format!("{field}.action");
            self.note(&action_field, action);
            let parsed = match action.value().as_str() {
                "limit" => Action::Limit,
                "allow" => Action::Allow,
                "deny" => Action::Deny,
                "shadow" => Action::Shadow,
                other => {
                    return Err(self.error(
                        &action_field,
                        Problem::Syntax {
                            message: format!(
                                "unknown action {other:?} (expected limit, allow, deny or shadow)"
                            ),
                        },
                    ));
                }
            };
            rule = rule.action(parsed);
        }
        for (j, limit) in raw.limits.iter().enumerate() {
            let at = format!("{field}.limits[{j}]");
            self.note(&at, &limit.name);
            self.note(&format!("{at}.name"), &limit.name);
            self.note(&format!("{at}.key"), &limit.key);
            let quota_field = format!("{at}.quota");
            self.note(&quota_field, &limit.quota);
            let text = limit.quota.value();
            let quota: Quota = text
                .parse()
                .map_err(|err: ratewarden_core::ParseQuotaError| {
                    self.error(
                        &quota_field,
                        Problem::InvalidQuota {
                            quota: text.clone(),
                            reason: err.to_string(),
                        },
                    )
                })?;
            rule = rule.limit(NamedLimit::new(
                limit.name.value(),
                limit.key.value(),
                quota,
            ));
        }
        Ok(rule)
    }

    fn list<S: Located<String>>(
        &mut self,
        field: &str,
        raw: &BTreeMap<String, Vec<S>>,
    ) -> AccessList {
        let mut list = AccessList::new();
        // Entries are numbered across keys, in the order the list holds them.
        let mut i = 0;
        for (key, entries) in raw {
            for entry in entries {
                self.note(&format!("{field}.{key}[{i}]"), entry);
                list = list.entry(key, entry.value());
                i += 1;
            }
        }
        list
    }
}

fn build<S: Located<String>, N: Located<u32>>(
    raw: &RawPolicy<S, N>,
    file: &Arc<str>,
    lines: &LineIndex,
) -> Result<Policy, LoadError> {
    let mut builder = Builder {
        file,
        lines,
        origins: HashMap::new(),
    };
    let mut policy = Policy::new();
    if let Some(mode) = &raw.mode {
        builder.note("match", mode);
        let mode = match mode.value().as_str() {
            "first" => MatchMode::First,
            "all" => MatchMode::All,
            other => {
                return Err(builder.error(
                    "match",
                    Problem::Syntax {
                        message: format!("unknown match mode {other:?} (expected first or all)"),
                    },
                ));
            }
        };
        policy = policy.match_mode(mode);
    }
    for (i, rule) in raw.rules.iter().enumerate() {
        policy = policy.rule(builder.rule(&format!("rules[{i}]"), rule)?);
    }
    if let Some(rule) = &raw.default {
        policy = policy.otherwise(builder.rule("default", rule)?);
    }
    policy = policy
        .allow_list(builder.list("allow", &raw.allow))
        .deny_list(builder.list("deny", &raw.deny));
    // A rule, a list of limits or the list of rules is where its first field is.
    let mut origins = builder.origins;
    let parents: Vec<(String, (usize, Option<usize>))> = (origins.iter())
        .flat_map(|(field, &at)| {
            let cuts = field.match_indices(['.', '[']).map(|(i, _)| i);
            cuts.map(move |i| (field[..i].to_owned(), at))
        })
        .collect();
    for (parent, at) in parents {
        let entry = origins.entry(parent).or_insert(at);
        *entry = (*entry).min(at);
    }
    policy.origins = Some(Arc::new(Origins {
        file: Arc::clone(file),
        fields: origins,
    }));
    policy.check(None).map_err(LoadError::Invalid)?;
    // A rule that limits with no limits lets what it matches through uncounted.
    let empty = (policy.rules().iter()).position(|rule| {
        matches!(rule.get_action(), Action::Limit | Action::Shadow) && rule.limits().is_empty()
    });
    if let Some(i) = empty {
        let field = format!("rules[{i}]");
        let location = (policy.origins.as_ref()).and_then(|origins| origins.locate(&field));
        return Err(LoadError::Invalid(PolicyError {
            field,
            problem: Problem::Syntax {
                message: "a rule that limits names no limits (add some, or say action = \"allow\")"
                    .to_owned(),
            },
            location,
        }));
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"match = "all"

[[rules]]
routes = ["/api/*"]
limits = [
  { name = "per-ip", key = "ip", quota = "100/min" },
]

[[rules]]
routes = ["/upload"]
methods = ["POST"]
headers = [{ name = "x-plan", value = "free" }]
cost = 2
limits = [{ name = "uploads", key = "user", quota = "10/h sliding-window" }]

[default]
action = "allow"

[allow]
ip = ["10.0.0.0/8", "::1"]
"#;

    #[test]
    fn toml_and_yaml_read_the_same_policy() {
        let toml = parse("p.toml", TOML).unwrap();
        let yaml = parse(
            "p.yml",
            r#"
match: all
rules:
  - routes: ["/api/*"]
    limits:
      - { name: per-ip, key: ip, quota: 100/min }
  - routes: ["/upload"]
    methods: [POST]
    headers: [{ name: x-plan, value: free }]
    cost: 2
    limits: [{ name: uploads, key: user, quota: "10/h sliding-window" }]
default:
  action: allow
allow:
  ip: ["10.0.0.0/8", "::1"]
"#,
        )
        .unwrap();
        assert_eq!(toml.get_match_mode(), MatchMode::All);
        assert_eq!(toml.limits(), yaml.limits());
        assert_eq!(toml.allowed(), yaml.allowed());
        assert_eq!(toml.rules()[1].cost, 2);
        assert_eq!(yaml.rules()[1].cost, 2);
        toml.validate(&["ip", "user"]).unwrap();
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let bad = TOML.replace("10/h sliding-window", "10/h sliding-windw");
        let err = parse("policy.toml", &bad).unwrap_err().to_string();
        assert!(
            err.starts_with("policy.toml:14:") && err.contains(": rules[1].limits[0].quota: "),
            "{err}"
        );
        let err = parse("policy.toml", "[[rules]]\ncost = \"two\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("policy.toml:2:") && err.contains("rules[0].cost"),
            "{err}"
        );
        let err = parse("policy.toml", "[[rules]]\nroute = [\"/\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("policy.toml:2:") && err.contains("route"),
            "{err}"
        );
        let err = parse("p.yaml", "rules:\n  - routes: [nope]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("p.yaml:2:") && err.contains("rules[0].routes[0]"),
            "{err}"
        );
        // A key no layer registered: located once the policy is checked against the keys.
        let err = parse("policy.toml", TOML)
            .unwrap()
            .validate(&["ip"])
            .unwrap_err();
        assert_eq!(err.field(), "rules[1].limits[0].key");
        assert_eq!(err.location().map(Location::line), Some(14));
        let err = parse("policy.json", "{}").unwrap_err();
        assert!(matches!(err, LoadError::UnknownFormat { .. }));
    }
}
