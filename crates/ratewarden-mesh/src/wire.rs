//! The datagram peers exchange: what each gateway has counted or holds per key (entries,
//! relayed by gossip), and the shares one gateway gives another (transfers, acknowledged).
//!
//! Every number on the wire is cumulative or versioned, so a datagram applied twice, late
//! or out of order changes nothing: an entry replaces an older version of itself, a
//! transfer adds only what its running total adds to the last one applied.
//!
//! The layout is little-endian and fixed-width, declared once here; [`Datagram::decode`]
//! never panics, whatever the bytes.

use std::time::Duration;

use ratewarden_core::{Algorithm, Key, KeyRepr, MAX_KEY_LEN, Quota};

/// A gateway's id in the mesh.
pub type NodeId = u64;

const MAGIC: &[u8; 4] = b"RWM6";
/// A head flag: the sender runs escrow.
const ESCROW: u8 = 1;
/// A head flag: the sender left the mesh.
const LEFT: u8 = 2;
/// A head flag: the sender keeps a fixed split between regions.
const FIXED_SPLIT: u8 = 4;

/// One key under one quota, checked or reserved: what the mesh keeps state for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The key.
    pub key: Key,
    /// The quota it is limited by.
    pub quota: Quota,
    /// Whether this is the state reservations hold and settle on, apart from the state
    /// checks count on for the same key and quota (as the `Store` trait keeps them).
    pub reserved: bool,
}

impl Slot {
    /// The state checks count on for `key` under `quota` (GCRA's for a sliding log, which
    /// the mesh does not decide).
    pub(crate) fn checked(key: &Key, quota: &Quota) -> Self {
        let quota = match quota.algorithm() {
            Algorithm::SlidingLog => quota.with_algorithm(Algorithm::Gcra).unwrap_or(*quota),
            _ => *quota,
        };
        Self {
            key: key.clone(),
            quota,
            reserved: false,
        }
    }

    /// The state reservations hold and settle on for `key` under `quota`.
    pub(crate) fn reserved(key: &Key, quota: &Quota) -> Self {
        Self {
            reserved: true,
            ..Self::checked(key, quota)
        }
    }
}

/// What a gateway (`origin`) last said about a slot, at `version`: in eventual mode the
/// units it has admitted (`a`) since its count started (`b`, µs on its clock: a count that
/// starts later is a new one) and how long ago it last admitted (`c`, µs); in escrow mode
/// its demand (`a`, units a round in thousandths, over many rounds), its share (`b`, parts
/// per million) and its pressure (`c`, units refused a round in thousandths, over a few
/// rounds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The slot.
    pub slot: Slot,
    /// The gateway the figures are about.
    pub origin: NodeId,
    /// Larger is newer (in eventual mode, within a count).
    pub version: u64,
    /// The first figure.
    pub a: u64,
    /// The second figure.
    pub b: u64,
    /// The third figure.
    pub c: u64,
    /// Escrow: the slot's life on its origin (made anew after the origin forgot it: larger
    /// is later), which the shares it exchanges are counted in; ignored in eventual mode.
    pub life: u64,
}

/// The running totals of share (parts per million) and tokens (micro-units) the sender has
/// given the receiver for a slot, from the sender's life of the slot to the receiver's
/// ([`Entry::life`]): a receiver whose slot has another life drops it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The slot.
    pub slot: Slot,
    /// The slot's life on the sender.
    pub from_life: u64,
    /// The slot's life on the receiver, as the sender knows it.
    pub to_life: u64,
    /// Share given in all.
    pub share: u64,
    /// Tokens given in all.
    pub tokens: u64,
}

/// The running total of share the sender has received from the receiver for a slot (so the
/// receiver stops sending it), between the lives of the slot named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The slot.
    pub slot: Slot,
    /// The slot's life on the sender.
    pub from_life: u64,
    /// The slot's life on the receiver, as the sender knows it.
    pub to_life: u64,
    /// Share received in all.
    pub share: u64,
}

/// One datagram from `from` to `to`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Datagram {
    /// The sender.
    pub from: NodeId,
    /// The receiver (a datagram delivered elsewhere is dropped: transfers are for it alone).
    pub to: NodeId,
    /// The sender's incarnation (higher after each restart).
    pub incarnation: u64,
    /// The receiver's incarnation as the sender knows it (0: not known): transfers and
    /// acknowledgements meant for an incarnation before are dropped.
    pub to_incarnation: u64,
    /// The highest sequence number the sender has taken from the receiver (0: none): a
    /// receiver that restarted below it moves its own above.
    pub to_sequence: u64,
    /// Whether the sender runs escrow mode (a gateway drops datagrams of the other mode).
    pub escrow: bool,
    /// Whether the sender left the mesh (it admits nothing, and is given nothing more).
    pub left: bool,
    /// The sender's region ([`Config::region`](crate::Config::region)).
    pub region: u16,
    /// Whether the sender keeps a fixed split between regions
    /// ([`Config::region_rounds`](crate::Config::region_rounds) is `None`): it gives no
    /// share across regions, and is given none.
    pub fixed_split: bool,
    /// Entries, any origin's.
    pub entries: Vec<Entry>,
    /// The sender's transfers to the receiver.
    pub transfers: Vec<Transfer>,
    /// The sender's acknowledgements of the receiver's transfers.
    pub acks: Vec<Ack>,
}

/// Why bytes are not a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Not our magic number and version.
    Magic,
    /// Ends before its declared contents.
    Truncated,
    /// A key or quota no gateway could have sent.
    Invalid,
    /// Bytes after its contents.
    Trailing,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Magic => "not a mesh datagram (magic or version)",
            Self::Truncated => "a mesh datagram ends before its contents",
            Self::Invalid => "a mesh datagram carries an invalid key or quota",
            Self::Trailing => "a mesh datagram has bytes after its contents",
        })
    }
}

impl std::error::Error for WireError {}

impl Datagram {
    /// Encodes into datagrams of at most `max` bytes each (at least one; a single record
    /// larger than `max` goes alone).
    #[must_use]
    pub fn encode(&self, max: usize) -> Vec<Vec<u8>> {
        self.encode_with(None, max)
    }

    /// Encodes as [`encode`](Self::encode) does, with `written` entries before its own (as
    /// if they were the first of its entries).
    pub(crate) fn encode_with(&self, written: Option<&Written>, max: usize) -> Vec<Vec<u8>> {
        // Under a UDP datagram's size, so no section can count past u16::MAX records.
        let max = max.min(65_000);
        let mut out = Vec::new();
        let mut current = Writer::new(self);
        let mut place = |section: usize, bytes: &[u8]| {
            if !current.is_empty() && current.len() + bytes.len() > max {
                out.push(std::mem::replace(&mut current, Writer::new(self)).finish());
            }
            current.push(section, bytes);
        };
        for bytes in written.into_iter().flat_map(Written::records) {
            place(Record::ENTRIES, bytes);
        }
        let records = self
            .entries
            .iter()
            .map(Record::Entry)
            .chain(self.transfers.iter().map(Record::Transfer))
            .chain(self.acks.iter().map(Record::Ack));
        // One buffer for every record, written over each time.
        let mut bytes = Vec::with_capacity(64);
        for record in records {
            bytes.clear();
            record.write(&mut bytes);
            place(record.section(), &bytes);
        }
        if !current.is_empty() || out.is_empty() {
            out.push(current.finish());
        }
        out
    }

    /// Decodes one datagram.
    ///
    /// # Errors
    ///
    /// [`WireError`] for anything but a well-formed datagram.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err(WireError::Magic);
        }
        let mut datagram = Self {
            from: r.u64()?,
            to: r.u64()?,
            incarnation: r.u64()?,
            to_incarnation: r.u64()?,
            to_sequence: r.u64()?,
            ..Self::default()
        };
        match r.take(1)?[0] {
            flags if flags & !(ESCROW | LEFT | FIXED_SPLIT) == 0 => {
                datagram.escrow = flags & ESCROW != 0;
                datagram.left = flags & LEFT != 0;
                datagram.fixed_split = flags & FIXED_SPLIT != 0;
            }
            _ => return Err(WireError::Invalid),
        }
        datagram.region = r.u16()?;
        for section in 0..3 {
            let n = r.u16()?;
            for _ in 0..n {
                let slot = r.slot()?;
                match section {
                    0 => datagram.entries.push(Entry {
                        slot,
                        origin: r.u64()?,
                        version: r.u64()?,
                        a: r.u64()?,
                        b: r.u64()?,
                        c: r.u64()?,
                        life: r.u64()?,
                    }),
                    1 => datagram.transfers.push(Transfer {
                        slot,
                        from_life: r.u64()?,
                        to_life: r.u64()?,
                        share: r.u64()?,
                        tokens: r.u64()?,
                    }),
                    _ => datagram.acks.push(Ack {
                        slot,
                        from_life: r.u64()?,
                        to_life: r.u64()?,
                        share: r.u64()?,
                    }),
                }
            }
        }
        if r.0.is_empty() {
            Ok(datagram)
        } else {
            Err(WireError::Trailing)
        }
    }
}

enum Record<'a> {
    Entry(&'a Entry),
    Transfer(&'a Transfer),
    Ack(&'a Ack),
}

/// Entries written once, for every datagram that carries them
/// ([`Datagram::encode_with`]): a round's gossip goes to several peers.
#[derive(Debug, Default)]
pub(crate) struct Written {
    bytes: Vec<u8>,
    /// Where each entry's bytes end.
    ends: Vec<usize>,
}

impl Written {
    /// `entries`, each written as a datagram carries it.
    pub(crate) fn entries(entries: &[Entry]) -> Self {
        let mut written = Self::default();
        for entry in entries {
            Record::Entry(entry).write(&mut written.bytes);
            written.ends.push(written.bytes.len());
        }
        written
    }

    /// Each entry's bytes.
    fn records(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.bytes[start..end])
    }
}

impl Record<'_> {
    /// The section of entries.
    const ENTRIES: usize = 0;

    const fn section(&self) -> usize {
        match self {
            Self::Entry(_) => Self::ENTRIES,
            Self::Transfer(_) => 1,
            Self::Ack(_) => 2,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Self::Entry(e) => {
                write_slot(out, &e.slot);
                for n in [e.origin, e.version, e.a, e.b, e.c, e.life] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
            Self::Transfer(t) => {
                write_slot(out, &t.slot);
                for n in [t.from_life, t.to_life, t.share, t.tokens] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
            Self::Ack(a) => {
                write_slot(out, &a.slot);
                for n in [a.from_life, a.to_life, a.share] {
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
        }
    }
}

/// Bytes of a datagram's head before its sections.
const HEAD: usize = 4 + 8 + 8 + 8 + 8 + 8 + 1 + 2;

/// A datagram being filled: its header, and each section's record count and bytes.
struct Writer {
    head: Vec<u8>,
    sections: [(u16, Vec<u8>); 3],
}

impl Writer {
    /// A datagram's head: the magic, `from`, `to`, both incarnations, the receiver's last
    /// sequence number, the flags and the sender's region (47 bytes).
    fn new(datagram: &Datagram) -> Self {
        let mut head = Vec::with_capacity(HEAD);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&datagram.from.to_le_bytes());
        head.extend_from_slice(&datagram.to.to_le_bytes());
        head.extend_from_slice(&datagram.incarnation.to_le_bytes());
        head.extend_from_slice(&datagram.to_incarnation.to_le_bytes());
        head.extend_from_slice(&datagram.to_sequence.to_le_bytes());
        let mut flags = 0;
        if datagram.escrow {
            flags |= ESCROW;
        }
        if datagram.left {
            flags |= LEFT;
        }
        if datagram.fixed_split {
            flags |= FIXED_SPLIT;
        }
        head.push(flags);
        head.extend_from_slice(&datagram.region.to_le_bytes());
        Self {
            head,
            sections: Default::default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.sections.iter().all(|(n, _)| *n == 0)
    }

    fn len(&self) -> usize {
        self.head.len()
            + self
                .sections
                .iter()
                .map(|(_, b)| 2 + b.len())
                .sum::<usize>()
    }

    fn push(&mut self, section: usize, record: &[u8]) {
        let (n, bytes) = &mut self.sections[section];
        *n += 1;
        bytes.extend_from_slice(record);
    }

    fn finish(self) -> Vec<u8> {
        let mut out = self.head;
        for (n, bytes) in self.sections {
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&bytes);
        }
        out
    }
}

/// The bit of a slot's first byte (its algorithm) that marks a reserved state.
const RESERVED: u8 = 0x80;

fn write_slot(out: &mut Vec<u8>, slot: &Slot) {
    let q = &slot.quota;
    let algorithm = match q.algorithm() {
        Algorithm::TokenBucket => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingWindow => 3,
        // A slot never carries a sliding log (see `Slot::checked`).
        Algorithm::Gcra | Algorithm::SlidingLog => 0,
    };
    out.push(algorithm | if slot.reserved { RESERVED } else { 0 });
    out.extend_from_slice(&q.count().to_le_bytes());
    out.extend_from_slice(&q.burst().to_le_bytes());
    out.extend_from_slice(&q.period_micros().to_le_bytes());
    out.extend_from_slice(&slot.key.scope().to_le_bytes());
    match slot.key.repr() {
        KeyRepr::Int(n) => {
            out.push(0);
            out.extend_from_slice(&n.to_le_bytes());
        }
        KeyRepr::Ip(ip) => {
            out.push(1);
            out.extend_from_slice(ip);
        }
        KeyRepr::Bytes(b) => {
            out.push(2);
            // At most MAX_KEY_LEN (128) bytes: a longer key is a digest.
            out.push(u8::try_from(b.len()).unwrap_or(u8::MAX));
            out.extend_from_slice(b);
        }
        KeyRepr::Digest(d) => {
            out.push(3);
            out.extend_from_slice(d);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.take(N)?.try_into().map_err(|_| WireError::Truncated)
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn slot(&mut self) -> Result<Slot, WireError> {
        let first = self.array::<1>()?[0];
        let algorithm = match first & !RESERVED {
            0 => Algorithm::Gcra,
            1 => Algorithm::TokenBucket,
            2 => Algorithm::FixedWindow,
            3 => Algorithm::SlidingWindow,
            _ => return Err(WireError::Invalid),
        };
        let (count, burst, period) = (self.u32()?, self.u32()?, self.u64()?);
        let quota = Quota::new(count, Duration::from_micros(period))
            .and_then(|q| q.with_burst(burst))
            .and_then(|q| q.with_algorithm(algorithm))
            .map_err(|_| WireError::Invalid)?;
        let scope = self.u64()?;
        let key = match self.array::<1>()?[0] {
            0 => Key::from(self.u64()?),
            1 => Key::from_repr(KeyRepr::Ip(&self.array()?)),
            2 => {
                let len = usize::from(self.array::<1>()?[0]);
                if len > MAX_KEY_LEN {
                    return Err(WireError::Invalid);
                }
                Key::from_repr(KeyRepr::Bytes(self.take(len)?))
            }
            3 => Key::from_repr(KeyRepr::Digest(&self.array()?)),
            _ => return Err(WireError::Invalid),
        };
        // Quota::new keeps the burst at the count; a zero burst or count is refused above.
        Ok(Slot {
            key: key.scoped(scope),
            quota,
            reserved: first & RESERVED != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: Key) -> Slot {
        Slot {
            key,
            quota: "100/min".parse().expect("a quota"),
            reserved: false,
        }
    }

    #[test]
    fn a_datagram_round_trips_and_splits_under_its_size() {
        let keys = [
            Key::from(7_u64),
            Key::from("user-1"),
            Key::hashed("secret"),
            Key::from(std::net::IpAddr::from([10, 0, 0, 1])).scoped(9),
        ];
        let datagram = Datagram {
            from: 1,
            to: 2,
            incarnation: 7,
            to_incarnation: 8,
            to_sequence: 9,
            escrow: true,
            left: true,
            region: 3,
            fixed_split: true,
            entries: (0..40)
                .map(|i| Entry {
                    slot: Slot {
                        reserved: i % 3 == 0,
                        ..slot(keys[i % 4].clone())
                    },
                    origin: i as u64,
                    version: 3,
                    a: 4,
                    b: 5,
                    c: 6,
                    life: 7,
                })
                .collect(),
            transfers: vec![Transfer {
                slot: slot(keys[1].clone()),
                from_life: 11,
                to_life: 12,
                share: 10,
                tokens: 20,
            }],
            acks: vec![Ack {
                slot: slot(keys[2].clone()),
                from_life: 31,
                to_life: 32,
                share: 30,
            }],
        };
        let parts = datagram.encode(500);
        assert!(parts.len() > 1);
        let mut joined = Datagram {
            from: 1,
            to: 2,
            incarnation: 7,
            to_incarnation: 8,
            to_sequence: 9,
            escrow: true,
            left: true,
            region: 3,
            fixed_split: true,
            ..Datagram::default()
        };
        for part in &parts {
            assert!(part.len() <= 500, "{}", part.len());
            let d = Datagram::decode(part).expect("decodes");
            assert!(d.escrow && d.left && d.region == 3 && d.fixed_split);
            joined.entries.extend(d.entries);
            joined.transfers.extend(d.transfers);
            joined.acks.extend(d.acks);
        }
        assert_eq!(joined, datagram);
    }

    #[test]
    fn garbage_is_refused_never_a_panic() {
        let good = Datagram {
            from: 1,
            to: 2,
            entries: vec![Entry {
                slot: slot(Key::from("k")),
                origin: 1,
                version: 1,
                a: 1,
                b: 1,
                c: 1,
                life: 1,
            }],
            ..Datagram::default()
        }
        .encode(1400)
        .remove(0);
        for cut in 0..good.len() {
            assert!(Datagram::decode(&good[..cut]).is_err());
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(Datagram::decode(&long), Err(WireError::Trailing));
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..10_000 {
            let mut bytes = good.clone();
            let i = rng.usize(..bytes.len());
            bytes[i] = rng.u8(..);
            let _ = Datagram::decode(&bytes);
        }
    }
}
