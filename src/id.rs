//! Producer identities.
//!
//! Real Kafka brokers identify producers by a 64-bit number the broker hands
//! out; tests and examples often use short names ("p1"). Both are supported,
//! and both are cheap on the hot path: a numeric id is a `u64` and never
//! touches the heap, and a name of up to [`INLINE_NAME_LEN`] bytes is stored
//! inline, so `mgr.append("p1", ..)` allocates nothing either. Longer names
//! are kept behind an `Arc<str>`, so cloning a `ProducerId` never copies a
//! long name.
//!
//! An inline name is packed as three little-endian 64-bit words read
//! straight from the source string, with the bytes past the name zero. The
//! state map hashes and compares those words directly, so a lookup by a
//! short name never copies it byte by byte or calls `memcmp`. Each name has
//! exactly one representation (inline if and only if it fits), so two ids
//! are equal exactly when their representations are.
//!
//! A numeric id and a name are different producers even when they print the
//! same: `ProducerId::from(7u64) != ProducerId::from("7")`.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Names up to this many bytes are stored inline, without a heap allocation.
pub const INLINE_NAME_LEN: usize = 24;

/// The identity of a producer: a 64-bit number or a name.
///
/// ```
/// use producer_state::ProducerId;
/// let numeric = ProducerId::from(4242u64);
/// let named = ProducerId::from("p1");
/// assert_eq!(numeric.as_numeric(), Some(4242));
/// assert_eq!(named.as_name(), Some("p1"));
/// assert_ne!(ProducerId::from(7u64), ProducerId::from("7"));
/// ```
#[derive(Clone)]
pub struct ProducerId(Repr);

#[derive(Clone)]
enum Repr {
    Numeric(u64),
    /// `bytes[..len]` is the name; the rest is zero. Read as the words at
    /// offsets 0, 8 and 16 (see [`ProducerId::inline_words`]).
    Inline {
        len: u8,
        bytes: [u8; INLINE_NAME_LEN],
    },
    Shared(Arc<str>),
}

/// The 8 bytes of `b` at `i` as a little-endian word.
#[inline(always)]
fn get8(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

/// A name of up to 24 bytes as three little-endian words, zero past the
/// end, read with whole-word loads (overlapping at the tail) rather than
/// byte copies.
#[inline(always)]
fn pack(b: &[u8]) -> [u64; 3] {
    let len = b.len();
    if len < 8 {
        return [pack_short(b), 0, 0];
    }
    // The last 8 bytes, shifted down to the part past `from`.
    let tail = |from: usize| get8(b, len - 8) >> (8 * (from + 8 - len));
    let w1 = if len >= 16 {
        get8(b, 8)
    } else if len > 8 {
        tail(8)
    } else {
        0
    };
    let w2 = if len > 16 { tail(16) } else { 0 };
    [get8(b, 0), w1, w2]
}

/// A name of under 8 bytes as a little-endian word.
#[inline]
fn pack_short(b: &[u8]) -> u64 {
    b.iter().rev().fold(0, |acc, &x| (acc << 8) | u64::from(x))
}

impl ProducerId {
    /// A numeric producer id, as Kafka brokers assign them.
    pub const fn numeric(id: u64) -> Self {
        ProducerId(Repr::Numeric(id))
    }

    /// A named producer id.
    #[inline(always)]
    pub fn named(name: &str) -> Self {
        let b = name.as_bytes();
        let len = b.len();
        if len <= INLINE_NAME_LEN {
            let [w0, w1, w2] = pack(b);
            let mut bytes = [0u8; INLINE_NAME_LEN];
            bytes[0..8].copy_from_slice(&w0.to_le_bytes());
            bytes[8..16].copy_from_slice(&w1.to_le_bytes());
            bytes[16..24].copy_from_slice(&w2.to_le_bytes());
            // `len <= 24`, so the cast cannot truncate.
            ProducerId(Repr::Inline {
                len: len as u8,
                bytes,
            })
        } else {
            ProducerId::long(name)
        }
    }

    /// A name too long to store inline: kept behind an `Arc`. Out of line
    /// so that converting a short name inlines at every call site.
    #[cold]
    #[inline(never)]
    fn long(name: &str) -> Self {
        ProducerId(Repr::Shared(Arc::from(name)))
    }

    /// An inline name's length and words; `None` for numbers and long names.
    #[inline(always)]
    pub(crate) fn inline_words(&self) -> Option<(u8, [u64; 3])> {
        match &self.0 {
            Repr::Inline { len, bytes } => {
                let w = |i: usize| {
                    let mut x = [0u8; 8];
                    x.copy_from_slice(&bytes[i..i + 8]);
                    u64::from_le_bytes(x)
                };
                Some((*len, [w(0), w(8), w(16)]))
            }
            _ => None,
        }
    }

    /// A long (heap) name's bytes; `None` for numbers and inline names.
    #[inline]
    pub(crate) fn shared_name(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Shared(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The number, if this is a numeric id.
    #[inline(always)]
    pub fn as_numeric(&self) -> Option<u64> {
        match self.0 {
            Repr::Numeric(n) => Some(n),
            _ => None,
        }
    }

    /// The name, if this is a named id.
    pub fn as_name(&self) -> Option<&str> {
        match &self.0 {
            Repr::Numeric(_) => None,
            Repr::Inline { len, bytes } => std::str::from_utf8(&bytes[..*len as usize]).ok(),
            Repr::Shared(s) => Some(s),
        }
    }

    /// The name's bytes, if this is a named id (no UTF-8 check: hot path).
    pub(crate) fn name_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Numeric(_) => None,
            Repr::Inline { len, bytes } => Some(&bytes[..*len as usize]),
            Repr::Shared(s) => Some(s.as_bytes()),
        }
    }
}

impl From<u64> for ProducerId {
    #[inline(always)]
    fn from(id: u64) -> Self {
        ProducerId::numeric(id)
    }
}

/// Kafka's wire type for a producer id is `INT64`, with `-1`
/// (`NO_PRODUCER_ID`) meaning "none": a broker passes the request's field
/// straight in, and a negative id is refused rather than turned into a
/// huge unsigned one.
///
/// ```
/// use producer_state::ProducerId;
/// assert_eq!(ProducerId::try_from(4000i64), Ok(ProducerId::from(4000u64)));
/// assert!(ProducerId::try_from(-1i64).is_err());
/// ```
impl TryFrom<i64> for ProducerId {
    type Error = NegativeProducerId;

    #[inline]
    fn try_from(id: i64) -> Result<Self, NegativeProducerId> {
        u64::try_from(id)
            .map(ProducerId::numeric)
            .map_err(|_| NegativeProducerId(id))
    }
}

/// A Kafka producer id below zero (`-1` is Kafka's "no producer id"): it
/// names no producer, so it has no state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("producer id {0} is negative: Kafka uses -1 for \"no producer id\", which has no state")]
pub struct NegativeProducerId(pub i64);

impl From<&str> for ProducerId {
    #[inline(always)]
    fn from(name: &str) -> Self {
        ProducerId::named(name)
    }
}

impl From<&String> for ProducerId {
    fn from(name: &String) -> Self {
        ProducerId::named(name)
    }
}

impl From<String> for ProducerId {
    fn from(name: String) -> Self {
        if name.len() <= INLINE_NAME_LEN {
            ProducerId::named(&name)
        } else {
            ProducerId(Repr::Shared(Arc::from(name)))
        }
    }
}

impl From<&ProducerId> for ProducerId {
    fn from(id: &ProducerId) -> Self {
        id.clone()
    }
}

impl PartialEq for ProducerId {
    fn eq(&self, other: &Self) -> bool {
        match (self.as_numeric(), other.as_numeric()) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.name_bytes() == other.name_bytes(),
            _ => false,
        }
    }
}

impl Eq for ProducerId {}

impl Hash for ProducerId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self.as_numeric() {
            Some(n) => {
                state.write_u8(0);
                state.write_u64(n);
            }
            None => {
                state.write_u8(1);
                state.write(self.name_bytes().unwrap_or_default());
            }
        }
    }
}

impl Ord for ProducerId {
    /// Numeric ids sort before names; numbers by value, names by bytes.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.as_numeric(), other.as_numeric()) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => self.name_bytes().cmp(&other.name_bytes()),
        }
    }
}

impl PartialOrd for ProducerId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.as_numeric(), self.as_name()) {
            (Some(n), _) => write!(f, "{n}"),
            (None, Some(s)) => f.write_str(s),
            (None, None) => f.write_str("<invalid utf-8>"),
        }
    }
}

impl fmt::Debug for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.as_numeric(), self.as_name()) {
            (Some(n), _) => write!(f, "ProducerId({n})"),
            (None, Some(s)) => write!(f, "ProducerId({s:?})"),
            (None, None) => f.write_str("ProducerId(<invalid utf-8>)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_producer_id_is_four_words() {
        assert_eq!(std::mem::size_of::<ProducerId>(), 32);
    }

    #[test]
    fn packing_keeps_every_byte_of_every_short_length() {
        let source: String = ('a'..='z').chain('A'..='Z').collect();
        for len in 0..=INLINE_NAME_LEN {
            for start in 0..3 {
                let name = &source[start..start + len];
                let id = ProducerId::from(name);
                assert_eq!(id.as_name(), Some(name), "len {len}");
                let (l, w) = id.inline_words().unwrap();
                assert_eq!(usize::from(l), len);
                let mut expect = [0u8; 24];
                expect[..len].copy_from_slice(name.as_bytes());
                let got: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
                assert_eq!(got, expect, "len {len}");
            }
        }
        let multibyte = "ñandú-ölçü-日本";
        assert_eq!(ProducerId::from(multibyte).as_name(), Some(multibyte));
    }

    #[test]
    fn inline_and_shared_names_compare_by_content() {
        let long = "a-producer-name-longer-than-twenty-two-bytes";
        let a = ProducerId::from(long);
        let b = ProducerId::from(long.to_string());
        assert!(matches!(a.0, Repr::Shared(_)));
        assert_eq!(a, b);
        assert_eq!(a.as_name(), Some(long));
        let short = ProducerId::from("x".repeat(INLINE_NAME_LEN));
        assert_eq!(ProducerId::from("xy"), ProducerId::from(String::from("xy")));
        assert!(matches!(short.0, Repr::Inline { .. }));
        assert_eq!(short.as_name().map(str::len), Some(INLINE_NAME_LEN));
        let just_over = ProducerId::from("x".repeat(INLINE_NAME_LEN + 1).as_str());
        assert!(matches!(just_over.0, Repr::Shared(_)));
        assert_ne!(short, just_over);
    }

    #[test]
    fn numbers_and_names_are_distinct_and_ordered() {
        let mut set = HashSet::new();
        set.insert(ProducerId::from(7u64));
        set.insert(ProducerId::from("7"));
        set.insert(ProducerId::from(String::from("7")));
        assert_eq!(set.len(), 2);
        assert!(ProducerId::from(u64::MAX) < ProducerId::from(""));
        assert!(ProducerId::from("a") < ProducerId::from("b"));
        assert_eq!(ProducerId::from(7u64).to_string(), "7");
        assert_eq!(
            format!("{:?}", ProducerId::from("p1")),
            "ProducerId(\"p1\")"
        );
    }
}
