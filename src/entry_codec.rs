//! One key's bytes: the entry encoding shared by snapshots (versions 2 to
//! 4), the log's set-entries records and partition exports.
//!
//! An entry is a shape byte, the key, the fixed fields (partition, epoch,
//! last sequence and, from version 3, the key's last activity) and the
//! retained batches as spans and deltas in per-entry widths. Version 4
//! drops the activity's 8 bytes when it is the newest stored batch's
//! timestamp (a shape bit says so): it always is for a key whose last
//! append was a batch, since that is the time the store takes. The reader
//! checks one length per entry and then reads every field at a fixed
//! offset with no allocation, which is what keeps loading a snapshot at
//! the speed of reading it. The layout is in docs/format.md ("Entries").

#![deny(clippy::indexing_slicing)]

use crate::codec::Put;
use crate::entry::{Head, ProducerEntry, RETAINED_BATCHES, Window};
use crate::error::Corruption;
use crate::id::ProducerId;
use crate::info::ProducerInfo;

/// The longest entry with an activity: a 65,535-byte name and a full
/// window with 8-byte deltas.
pub(crate) const MAX_ENTRY: usize =
    1 + 2 + u16::MAX as usize + 18 + 2 + RETAINED_BATCHES * 4 + 16 + (RETAINED_BATCHES - 1) * 16;

// Versions 2 to 4 (docs/format.md, "Entries").
const SHAPE_NAMED: u8 = 1 << 3;
/// Version 4: the activity is not stored; it is the timestamp of the
/// newest batch with metadata (which the entry must have). Versions 2
/// and 3 refuse it.
const SHAPE_ACT_IS_TS: u8 = 1 << 7;
/// Reserved for per-key sections a later version may add after an entry
/// (transaction state): version 3 writes 0 and refuses 1.
const SHAPE_SECTIONS: u8 = 1 << 6;
/// Bytes of a span for each span width class.
const SPAN_BYTES: [usize; 4] = [0, 1, 2, 4];
/// Bytes of an offset or timestamp delta for each delta width class.
const DELTA_BYTES: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 8];

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// The `w`-byte little-endian integer at `at`. The caller checked that
/// `buf` holds it; with 8 bytes to spare this is one load and a mask.
#[inline(always)]
fn uint_at(buf: &[u8], at: usize, w: usize) -> u64 {
    let mut a = [0u8; 8];
    match buf.get(at..at + 8) {
        Some(b) => a.copy_from_slice(b),
        None => {
            if let (Some(dst), Some(src)) = (a.get_mut(..w), buf.get(at..at + w)) {
                dst.copy_from_slice(src);
            }
        }
    }
    u64::from_le_bytes(a) & ((1u128 << (8 * w)) - 1) as u64
}

/// Which entry encoding: what the activity field is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// Snapshot version 2: no activity.
    V2,
    /// Snapshot version 3, key-state records, exports: 8 bytes always.
    V3,
    /// Snapshot version 4: 8 bytes, or none with [`SHAPE_ACT_IS_TS`].
    V4,
}

/// Appends one entry's encoding to `buf`: version 2's without
/// `activity`, version 3's (the key's last activity after the last
/// sequence) with it.
pub(crate) fn encode_entry(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    e: &ProducerEntry,
    activity: Option<i64>,
) {
    match activity {
        None => encode(buf, id, partition, e, Form::V2, 0),
        Some(a) => encode(buf, id, partition, e, Form::V3, a),
    }
}

/// Appends one entry's version-4 encoding to `buf`.
#[cfg(test)]
pub(crate) fn encode_entry_v4(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    e: &ProducerEntry,
    activity: i64,
) {
    encode(buf, id, partition, e, Form::V4, activity);
}

fn encode(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    e: &ProducerEntry,
    form: Form,
    activity: i64,
) {
    encode_parts(buf, id, partition, &e.head, &e.window, form, activity);
}

/// Appends one version-4 entry of a key whose head and window are read
/// where they lie (a snapshot reads the window in the map's arena, not a
/// copy of it).
#[inline]
pub(crate) fn encode_v4_parts(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    head: &Head,
    window: &Window,
    activity: i64,
) {
    encode_parts(buf, id, partition, head, window, Form::V4, activity);
}

/// The width class of a span needing `b` bytes (0 to 4; `SPAN_BYTES`).
const SPAN_CLASS: [u8; 9] = [0, 1, 2, 3, 3, 3, 3, 3, 3];
/// The width class of a delta needing `b` bytes (0 to 8; `DELTA_BYTES`).
const DELTA_CLASS: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 7];

/// The bytes `v` needs, 0 to 8.
#[inline(always)]
fn bytes_needed(v: u64) -> usize {
    (64 - v.leading_zeros() as usize).div_ceil(8)
}

#[inline]
#[allow(clippy::too_many_arguments)]
fn encode_parts(
    buf: &mut Vec<u8>,
    id: &ProducerId,
    partition: i32,
    head: &Head,
    window: &Window,
    form: Form,
    activity: i64,
) {
    // The retained batches, newest first.
    let (n, spans, mask, metas) = head.newest_first(window);
    let mask = u16::from(mask);
    let m = mask.count_ones() as usize;
    let spans = spans.get(..n).unwrap_or_default();
    let max_span = spans.iter().fold(0u32, |a, &s| a | s);
    let metas = metas.get(..m).unwrap_or_default();
    let deltas = |(a, b): (&(i64, i64), &(i64, i64))| {
        (zigzag(a.0.wrapping_sub(b.0)), zigzag(a.1.wrapping_sub(b.1)))
    };
    let (mut max_do, mut max_dt) = (0u64, 0u64);
    for (d_o, d_t) in metas.iter().zip(metas.iter().skip(1)).map(deltas) {
        max_do |= d_o;
        max_dt |= d_t;
    }
    // Or-ing the values needs as many bytes as the largest of them.
    let s = usize::from(
        SPAN_CLASS
            .get(bytes_needed(u64::from(max_span)))
            .copied()
            .unwrap_or(3),
    );
    let o = usize::from(DELTA_CLASS.get(bytes_needed(max_do)).copied().unwrap_or(7));
    let t = usize::from(DELTA_CLASS.get(bytes_needed(max_dt)).copied().unwrap_or(7));
    let act_is_ts = form == Form::V4 && metas.first().is_some_and(|m| m.1 == activity);
    let shape = n as u8
        | if id.as_numeric().is_none() {
            SHAPE_NAMED
        } else {
            0
        }
        | (s as u8) << 4
        | if act_is_ts { SHAPE_ACT_IS_TS } else { 0 };
    // The rest has a bounded length: room for the longest is zeroed at
    // the end of `buf` in fixed-length pieces (a copy of a run-time length
    // is a `memmove` call), each field is then one whole 8-byte store that
    // advances by the field's width (a copy of a run-time width per field
    // cost a call each), and `buf` is cut back to what was used. Written in
    // place: an entry built on the stack and copied over was read back
    // across its unaligned stores, which the CPU cannot forward (a stall
    // per piece).
    let named = match id.as_numeric() {
        Some(_) => None,
        None => {
            let name = id.name_bytes().unwrap_or_default();
            buf.put_u8(shape);
            buf.put_u16(name.len() as u16);
            buf.extend_from_slice(name);
            Some(())
        }
    };
    let at = buf.len();
    buf.reserve(ROOM);
    for _ in 0..ROOM / 32 {
        buf.extend_from_slice(&[0u8; 32]);
    }
    let mut out = Out {
        b: buf.get_mut(at..).unwrap_or_default(),
        n: 0,
    };
    if named.is_none() {
        out.put(u64::from(shape), 1);
        out.put(id.as_numeric().unwrap_or_default(), 8);
    }
    out.put(u64::from(partition as u32), 4);
    out.put(u64::from(head.epoch as u16), 2);
    out.put(u64::from(head.last as u32), 4);
    if form == Form::V3 || (form == Form::V4 && !act_is_ts) {
        out.put(activity as u64, 8);
    }
    if n > 0 {
        out.put(u64::from(mask | (o as u16) << 5 | (t as u16) << 8), 2);
        let (sw, ow, tw) = (
            SPAN_BYTES.get(s).copied().unwrap_or(4),
            DELTA_BYTES.get(o).copied().unwrap_or(8),
            DELTA_BYTES.get(t).copied().unwrap_or(8),
        );
        for &span in spans {
            out.put(u64::from(span), sw);
        }
        if let Some(&(offset, timestamp)) = metas.first() {
            out.put(offset as u64, 8);
            out.put(timestamp as u64, 8);
        }
        for (d_o, d_t) in metas.iter().zip(metas.iter().skip(1)).map(deltas) {
            out.put(d_o, ow);
            out.put(d_t, tw);
        }
    }
    let used = out.n;
    buf.truncate(at + used);
}

/// Room for the shape and numeric id (9 bytes) and the fixed fields and
/// window of one entry: at most 9 + 18 + 2 + 5 x 4 + 16 + 4 x 16 = 129
/// bytes, plus 8 so that every store is a whole word, in 32-byte pieces.
const ROOM: usize = 160;

/// The room at the end of the output an entry's fields are stored into.
struct Out<'a> {
    b: &'a mut [u8],
    n: usize,
}

impl Out<'_> {
    /// Appends the low `w` (at most 8) bytes of `v`, little-endian.
    #[inline(always)]
    fn put(&mut self, v: u64, w: usize) {
        if let Some(at) = self.b.get_mut(self.n..self.n + 8) {
            at.copy_from_slice(&v.to_le_bytes());
        }
        self.n += w;
    }
}

/// A decoded entry: key, entry, last activity (0 in version 2, which
/// has none) and the bytes it took.
pub(crate) type Decoded = (ProducerId, i32, ProducerEntry, i64, usize);

/// Decodes version-3 entries filling `bytes` exactly, as key states
/// (the key-state record, a partition export), each passed to `check`
/// with its offset. `Err` carries the offset in `bytes` of the entry that
/// is wrong and what is wrong with it (bytes that end inside an entry:
/// `BadLength` of what was left).
pub(crate) fn decode_infos(
    bytes: &[u8],
    mut check: impl FnMut(&ProducerInfo) -> std::result::Result<(), Corruption>,
) -> std::result::Result<Vec<ProducerInfo>, (usize, Corruption)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let rest = bytes.get(at..).unwrap_or_default();
        match decode_entry(rest, true) {
            Some(Ok((producer_id, partition, entry, last_activity, len))) => {
                let info = ProducerInfo {
                    producer_id,
                    partition,
                    entry,
                    last_activity,
                };
                check(&info).map_err(|kind| (at, kind))?;
                out.push(info);
                at += len;
            }
            Some(Err(kind)) => return Err((at, kind)),
            None => return Err((at, Corruption::BadLength(rest.len() as u64))),
        }
    }
    Ok(out)
}

/// Decodes one entry at the start of `buf`, of version 3 (`activity`: it
/// has the field) or 2; see [`decode`].
#[inline]
pub(crate) fn decode_entry(
    buf: &[u8],
    activity: bool,
) -> Option<std::result::Result<Decoded, Corruption>> {
    decode(buf, if activity { Form::V3 } else { Form::V2 })
}

/// Decodes one entry of `form` at the start of `buf`; `None` if the bytes
/// end first (the caller reads more), `Err` if they are not a valid entry.
/// Once the shape says how long the entry is, one length check covers
/// every field, and each field is then a load and a mask at a fixed
/// offset; nothing is allocated (but for names too long to store inline).
#[inline]
pub(crate) fn decode(buf: &[u8], form: Form) -> Option<std::result::Result<Decoded, Corruption>> {
    let shape = *buf.first()?;
    let n = usize::from(shape & 7);
    if shape & SHAPE_SECTIONS != 0 {
        return Some(Err(Corruption::BadField(
            "entry shape (per-key sections: none defined in this version)",
        )));
    }
    let act_is_ts = form == Form::V4 && shape & SHAPE_ACT_IS_TS != 0;
    if (shape & 0xc0 != 0 && !act_is_ts) || n > RETAINED_BATCHES {
        return Some(Err(Corruption::BadField("entry shape")));
    }
    let (id, mut at) = if shape & SHAPE_NAMED == 0 {
        (ProducerId::numeric(uint_at(buf, 1, 8)), 9)
    } else {
        let len = usize::from(u16::from_le_bytes([*buf.get(1)?, *buf.get(2)?]));
        match std::str::from_utf8(buf.get(3..3 + len)?) {
            Ok(name) => (ProducerId::named(name), 3 + len),
            Err(_) => return Some(Err(Corruption::BadField("producer name (not UTF-8)"))),
        }
    };
    let activity = form == Form::V3 || (form == Form::V4 && !act_is_ts);
    let fixed = if activity { 18 } else { 10 };
    if buf.len() < at + fixed {
        return None;
    }
    let partition = uint_at(buf, at, 4) as u32 as i32;
    let epoch = uint_at(buf, at + 4, 2) as u16 as i16;
    let last = uint_at(buf, at + 6, 4) as u32 as i32;
    let mut act = if activity {
        uint_at(buf, at + 10, 8) as i64
    } else {
        0
    };
    at += fixed;
    let mut spans = [0u32; RETAINED_BATCHES];
    let mut meta = [(0i64, 0i64); RETAINED_BATCHES];
    let mut mask = 0u8;
    if n > 0 {
        if buf.len() < at + 2 {
            return None;
        }
        let layout = uint_at(buf, at, 2) as u16;
        at += 2;
        mask = (layout & 0x1f) as u8;
        let m = mask.count_ones() as usize;
        let sw = SPAN_BYTES
            .get(usize::from(shape >> 4 & 3))
            .copied()
            .unwrap_or(4);
        let ow = DELTA_BYTES
            .get(usize::from(layout >> 5 & 7))
            .copied()
            .unwrap_or(8);
        let tw = DELTA_BYTES
            .get(usize::from(layout >> 8 & 7))
            .copied()
            .unwrap_or(8);
        if layout >> 11 != 0 || mask >> n != 0 || (m < 2 && ow + tw != 0) {
            return Some(Err(Corruption::BadField("entry layout")));
        }
        let need = n * sw + if m > 0 { 16 + (m - 1) * (ow + tw) } else { 0 };
        if buf.len() < at + need {
            return None;
        }
        for span in spans.iter_mut().take(n) {
            *span = uint_at(buf, at, sw) as u32;
            at += sw;
        }
        let mut prev = (uint_at(buf, at, 8) as i64, uint_at(buf, at + 8, 8) as i64);
        if act_is_ts {
            act = prev.1;
        }
        at += if m > 0 { 16 } else { 0 };
        let mut j = 0;
        for (k, slot) in meta.iter_mut().enumerate().take(n) {
            if mask >> k & 1 == 0 {
                continue;
            }
            if j > 0 {
                let d_o = unzigzag(uint_at(buf, at, ow));
                let d_t = unzigzag(uint_at(buf, at + ow, tw));
                at += ow + tw;
                prev = (prev.0.wrapping_sub(d_o), prev.1.wrapping_sub(d_t));
            }
            *slot = prev;
            j += 1;
        }
    }
    if act_is_ts && mask == 0 {
        return Some(Err(Corruption::BadField(
            "entry shape (activity of a batch timestamp the entry does not have)",
        )));
    }
    Some(
        match ProducerEntry::from_newest_first(epoch, last, n, mask, &spans, &meta) {
            Some(e) => Ok((id, partition, e, act, at)),
            None => Err(Corruption::BadField("entry (sequences inconsistent)")),
        },
    )
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::batch::{BatchMetadata, RetainedBatch};

    /// Entries of every shape: window sizes 0 to 5, metadata anywhere,
    /// spans and gaps of every width, wrapped sequences, both id kinds.
    fn entries_of_every_shape() -> Vec<(ProducerId, i32, ProducerEntry)> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut out = Vec::new();
        for i in 0..3000u64 {
            let n = (rnd() % 6) as usize;
            let width = |r: u64| match r % 5 {
                0 => 0,
                1 => r >> 60,
                2 => r >> 48,
                3 => r >> 33,
                _ => r,
            };
            let mut batches = Vec::new();
            let mut seq = if i % 7 == 0 {
                i32::MAX - 3
            } else {
                (rnd() >> 40) as i32
            };
            let (mut o, mut t) = (rnd() as i64, rnd() as i64);
            for _ in 0..n {
                let meta = rnd() % 4 != 0;
                let span = if meta {
                    (width(rnd()) % 100_000) as i32
                } else {
                    0
                };
                let first = seq;
                let last = first.saturating_add(span);
                o = o.wrapping_sub(width(rnd()) as i64);
                t = t.wrapping_add(width(rnd()) as i64);
                batches.push(RetainedBatch {
                    first_sequence: first,
                    last_sequence: last,
                    metadata: meta.then_some(BatchMetadata {
                        offset: o,
                        timestamp: t,
                    }),
                });
                seq = crate::rules::next_sequence(last);
            }
            let last = batches
                .last()
                .map_or((rnd() >> 33) as i32, |b| b.last_sequence);
            let e = ProducerEntry::from_parts((rnd() >> 48) as i16, last, &batches)
                .unwrap_or_else(|| panic!("{batches:?}"));
            let id = if i % 3 == 0 {
                ProducerId::named(&"n".repeat((i % 40) as usize))
            } else {
                ProducerId::numeric(rnd())
            };
            out.push((id, rnd() as i32, e));
        }
        out
    }

    #[test]
    fn entries_of_every_shape_round_trip_even_at_the_end_of_the_buffer() {
        for (i, (id, p, e)) in entries_of_every_shape().into_iter().enumerate() {
            // Version 2 (no activity), versions 3 and 4 with activities of
            // every sign and width, and version 4 with the activity its
            // flag stands for (the newest stored timestamp), if any.
            let act = (i as i64).wrapping_mul(0x5851_f42d_4c95_7f2d);
            let newest_ts = e.retained_batches().filter_map(|b| b.metadata).last();
            let mut cases = vec![(Form::V2, 0), (Form::V3, act), (Form::V4, act)];
            if let Some(m) = newest_ts {
                cases.push((Form::V4, m.timestamp));
            }
            for (form, act) in cases {
                let want = if form == Form::V2 { 0 } else { act };
                let mut b = Vec::new();
                encode(&mut b, &id, p, &e, form, act);
                let flagged = b[0] & SHAPE_ACT_IS_TS != 0;
                assert_eq!(
                    flagged,
                    form == Form::V4 && newest_ts.is_some_and(|m| m.timestamp == act)
                );
                if form != Form::V4 {
                    let mut legacy = Vec::new();
                    encode_entry(&mut legacy, &id, p, &e, (form == Form::V3).then_some(act));
                    assert_eq!(legacy, b);
                }
                // Exactly the entry (no bytes to spare for the wide loads),
                // then with bytes after it.
                let (did, dp, de, da, len) = decode(&b, form).unwrap().unwrap();
                assert_eq!((&did, dp, &de, da, len), (&id, p, &e, want, b.len()));
                let mut longer = b.clone();
                longer.extend_from_slice(&[0xff; 9]);
                let (_, _, de, _, len) = decode(&longer, form).unwrap().unwrap();
                assert_eq!((de, len), (e, b.len()));
                for cut in 0..b.len() {
                    assert!(
                        decode(&b[..cut], form).is_none_or(|r| r.is_err()),
                        "cut {cut}"
                    );
                }
                // The flag means nothing to the older forms.
                if flagged {
                    assert!(matches!(decode(&b, Form::V3), Some(Err(_))));
                }
                // And the same state re-encodes to the same bytes.
                let mut again = Vec::new();
                encode(&mut again, &did, dp, &de, form, da);
                assert_eq!(again, b);
            }
        }
    }

    #[test]
    fn the_activity_flag_needs_a_stored_timestamp() {
        // A window-less key: its activity is stored; the flag is refused.
        let e = ProducerEntry::start(0, 0, 0, None);
        let mut b = Vec::new();
        encode_entry_v4(&mut b, &ProducerId::numeric(1), 0, &e, 7);
        assert_eq!(b.len(), 1 + 8 + 18);
        let (.., a, _) = decode(&b, Form::V4).unwrap().unwrap();
        assert_eq!(a, 7);
        let mut flagged = b.clone();
        flagged[0] |= SHAPE_ACT_IS_TS;
        flagged.truncate(1 + 8 + 10);
        assert!(matches!(
            decode(&flagged, Form::V4),
            Some(Err(Corruption::BadField(_)))
        ));
    }

    #[test]
    fn the_reserved_sections_bit_is_refused_and_the_longest_entry_fits() {
        let e = ProducerEntry::start(0, 0, 0, None);
        let mut b = Vec::new();
        encode_entry(&mut b, &ProducerId::numeric(1), 0, &e, Some(5));
        b[0] |= SHAPE_SECTIONS;
        assert!(matches!(
            decode_entry(&b, true),
            Some(Err(Corruption::BadField(_)))
        ));
        // The longest name with a full window of 8-byte deltas.
        let name = "n".repeat(u16::MAX as usize);
        let mut full = ProducerEntry::start(0, 0, 0, None);
        for k in 0..5i64 {
            let meta = Some(crate::batch::BatchMetadata {
                offset: k.wrapping_mul(i64::MAX / 3),
                timestamp: -k.wrapping_mul(i64::MAX / 5),
            });
            let first = k as i32 * 1_000_000;
            full.accept(k == 0, 0, first, first + 100_000, meta);
        }
        let mut b = Vec::new();
        encode_entry(&mut b, &ProducerId::named(&name), 1, &full, Some(1));
        assert_eq!(b.len(), MAX_ENTRY);
    }
}
