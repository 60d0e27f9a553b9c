//! [`AccessList`]: keys and networks that are always let through, or always refused.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;
use ratewarden_core::{Key, KeyRepr};

use super::error::{PolicyError, Problem};
use super::keys::RequestKeys;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    /// The key is an IP address in this network.
    Network(IpNet),
    /// The key is the one the key's extractor gives this value.
    Value(String),
}

/// A list of clients by key: key values (`user` = `svc-health`) and IP networks (`ip` in
/// `10.0.0.0/8`), part of a [`Policy`](super::Policy) and reloaded with it.
///
/// A request is on the list when one of its keys is: its value equals a listed value (as
/// that key's extractor keys it, so an IPv6 address names its /64 under
/// [`PeerIp`](crate::key::PeerIp)), or it is an IP address in a listed network. An IPv6 client
/// keyed by its /64 is in a network when the network holds the /64's first address: list IPv6
/// networks of /64 or wider.
///
/// On the [deny list](super::Policy::deny_list) a request is refused (403 by default); on the
/// [allow list](super::Policy::allow_list) it goes through uncounted. The deny list is
/// looked at first.
///
/// ```
/// use ratewarden_tower::policy::AccessList;
///
/// let allow = AccessList::new()
///     .network("ip", "10.0.0.0/8".parse()?)
///     .network("ip", "2001:db8::/32".parse()?)
///     .value("user", "health-checker");
/// assert_eq!(allow.len(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessList {
    entries: Vec<(String, Entry)>,
}

impl AccessList {
    /// An empty list.
    ///
    /// See the example on [`AccessList`].
    #[must_use]
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// Adds the clients whose key `key` is an IP address in `network` (an IPv4-mapped IPv6
    /// network, `::ffff:10.0.0.0/104`, is the IPv4 network it maps: the key of such a client).
    ///
    /// See the example on [`AccessList`].
    #[must_use]
    pub fn network(mut self, key: &str, network: IpNet) -> Self {
        let network = match network {
            IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
                Some(v4) => {
                    ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(network, IpNet::V4)
                }
                None => network,
            },
            other => other,
        };
        self.entries.push((key.to_owned(), Entry::Network(network)));
        self
    }

    /// Adds the client whose key `key` is `value` (an IP address, for an IP key).
    ///
    /// See the example on [`AccessList`].
    #[must_use]
    pub fn value(mut self, key: &str, value: &str) -> Self {
        self.entries
            .push((key.to_owned(), Entry::Value(value.to_owned())));
        self
    }

    /// Adds an entry as a policy file writes it: a network (`10.0.0.0/8`), or a value (an
    /// address such as `192.0.2.1` or `2001:db8::5` is a value: the client the key's extractor
    /// keys by it, an IPv6 address naming its /64 under [`PeerIp`](crate::key::PeerIp)).
    ///
    /// ```
    /// use ratewarden_tower::policy::AccessList;
    /// let list = AccessList::new().entry("ip", "192.0.2.1").entry("ip", "10.0.0.0/8");
    /// assert_eq!(list, AccessList::new().value("ip", "192.0.2.1").network("ip", "10.0.0.0/8".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn entry(self, key: &str, entry: &str) -> Self {
        match entry.parse::<IpNet>() {
            Ok(network) => self.network(key, network),
            Err(_) => self.value(key, entry),
        }
    }

    /// How many entries the list has.
    ///
    /// See the example on [`AccessList`].
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the list has no entries.
    ///
    /// ```
    /// assert!(ratewarden_tower::policy::AccessList::new().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The key names the list uses, with their fields (`FIELD.KEY[i]`).
    pub(crate) fn keys<'a>(&'a self, field: &'a str) -> impl Iterator<Item = (String, &'a str)> {
        self.entries
            .iter()
            .enumerate()
            .map(move |(i, (key, _))| (format!("{field}.{key}[{i}]"), key.as_str()))
    }

    pub(crate) fn check(&self, field: &str) -> Result<(), PolicyError> {
        for (i, (key, entry)) in self.entries.iter().enumerate() {
            if let Entry::Value(value) = entry
                && (value.is_empty() || value.trim() != value || unreadable_address(value))
            {
                return Err(PolicyError::new(
                    format!("{field}.{key}[{i}]"),
                    Problem::InvalidListEntry {
                        entry: value.clone(),
                    },
                ));
            }
        }
        Ok(())
    }

    /// Whether a key the list names is in the request but cannot be read (a header sent
    /// twice): such a request cannot be told off the list.
    pub(crate) fn has_unusable<B>(&self, keys: &mut RequestKeys<'_, B>) -> bool {
        (self.entries.iter()).any(|(name, _)| keys.get(name).is_none() && keys.missing(name).1)
    }

    /// Whether the request whose keys are `keys` is on the list (a key that cannot be read
    /// is on neither: see [`has_unusable`](Self::has_unusable)).
    pub(crate) fn contains<B>(&self, keys: &mut RequestKeys<'_, B>) -> bool {
        self.entries.iter().any(|(name, entry)| {
            let Some(key) = keys.get(name) else {
                return false;
            };
            match entry {
                Entry::Network(network) => match key.repr() {
                    KeyRepr::Ip(bytes) => {
                        let v6 = Ipv6Addr::from(*bytes);
                        let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
                        network.contains(&ip)
                    }
                    _ => false,
                },
                Entry::Value(value) => {
                    let listed = match value.parse::<IpAddr>() {
                        Ok(ip) => Key::from(ip),
                        Err(_) => Key::from(value.as_str()),
                    };
                    keys.key_for(name, listed).scoped(0) == key.scoped(0)
                }
            }
        })
    }
}

/// A value written as an address or a network that is neither (`10.0.0.0/33`,
/// `192.0.2.010`): it would match no client, silently.
fn unreadable_address(value: &str) -> bool {
    let v4_like = value.contains('.')
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'/'));
    let v6_like = value.contains(':')
        && value
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || matches!(b, b'.' | b':' | b'/'));
    (v4_like || v6_like) && value.parse::<IpAddr>().is_err()
}
