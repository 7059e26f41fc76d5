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
use crate::engine::entry::{Head, ProducerEntry, RETAINED_BATCHES, Window};
use crate::engine::info::ProducerInfo;
use crate::error::Corruption;
use crate::id::ProducerId;

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

// Over 100 lines on purpose: every snapshot write runs it once a key (1M
// times for 1M keys), and its steps share the widths it computes once
// (spans, deltas) and the one output slice it stores into with whole-word
// stores; split, the pieces would recompute or pass them around, which the
// encoder's per-key instruction counts (docs/performance.md) measure.
#[inline]
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
    // Each delta pair once: for the widths, then for the output.
    let mut deltas = [(0u64, 0u64); RETAINED_BATCHES - 1];
    let (mut max_do, mut max_dt) = (0u64, 0u64);
    for (d, (a, b)) in deltas
        .iter_mut()
        .zip(metas.iter().zip(metas.iter().skip(1)))
    {
        *d = (zigzag(a.0.wrapping_sub(b.0)), zigzag(a.1.wrapping_sub(b.1)));
        max_do |= d.0;
        max_dt |= d.1;
    }
    let deltas = deltas.get(..m.saturating_sub(1)).unwrap_or_default();
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
    let numeric = id.as_numeric();
    let shape = n as u8
        | if numeric.is_none() { SHAPE_NAMED } else { 0 }
        | (s as u8) << 4
        | if act_is_ts { SHAPE_ACT_IS_TS } else { 0 };
    // A name is written field by field; a numeric id (the common key)
    // goes into the room below with the other fixed-width fields.
    if numeric.is_none() {
        let name = id.name_bytes().unwrap_or_default();
        buf.put_u8(shape);
        buf.put_u16(name.len() as u16);
        buf.extend_from_slice(name);
    }
    // The rest has a bounded length: room for the longest is zeroed at
    // the end of `buf` in fixed-length pieces (a copy of a run-time length
    // is a `memmove` call), each field is then one whole 8-byte store that
    // advances by the field's width (a copy of a run-time width per field
    // cost a call each), and `buf` is cut back to what was used. Written in
    // place: an entry built on the stack and copied over was read back
    // across its unaligned stores, which the CPU cannot forward (a stall
    // per piece).
    let at = buf.len();
    buf.reserve(ROOM);
    for _ in 0..ROOM / 32 {
        buf.extend_from_slice(&[0u8; 32]);
    }
    // The room is exactly `ROOM` bytes (made just above); the spare is
    // never used, but keeps this path free of a panic.
    let mut spare: [u8; ROOM];
    let b = match buf
        .get_mut(at..)
        .and_then(|b| <&mut [u8; ROOM]>::try_from(b).ok())
    {
        Some(b) => b,
        None => {
            spare = [0u8; ROOM];
            &mut spare
        }
    };
    let mut out = Out { b, n: 0 };
    if let Some(v) = numeric {
        out.put(u64::from(shape), 1);
        out.put(v, 8);
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
        // Spans of width 0 (one-record batches) take no bytes.
        if sw != 0 {
            for &span in spans {
                out.put(u64::from(span), sw);
            }
        }
        if let Some(&(offset, timestamp)) = metas.first() {
            out.put(offset as u64, 8);
            out.put(timestamp as u64, 8);
        }
        for &(d_o, d_t) in deltas {
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

/// The room at the end of the output an entry's fields are stored into:
/// exactly [`ROOM`] bytes, so that a store at an offset masked to 127
/// is in bounds by construction (no check per field; the fields end by
/// byte 129, the last store starts by byte 121).
struct Out<'a> {
    b: &'a mut [u8; ROOM],
    n: usize,
}

impl Out<'_> {
    /// Appends the low `w` (at most 8) bytes of `v`, little-endian.
    #[inline(always)]
    fn put(&mut self, v: u64, w: usize) {
        let o = self.n & 127;
        if let Some(at) = self.b.get_mut(o..o + 8) {
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

/// How many bytes of an entry, from the end of its id, the decoder
/// reads through one fixed-size view: the fixed fields (at most 18) and
/// the window (at most 2 + 5 x 4 + 16 + 4 x 16 = 102) end by byte 120,
/// and every read is a whole 8-byte load at an offset masked to 127, so
/// each load is in bounds by construction (no check per field).
const VIEW: usize = 136;

/// Masks of the low `w` bytes, by `w & 15` (0 to 8; the rest never used).
const LOW: [u64; 16] = [
    0,
    0xff,
    0xffff,
    0xff_ffff,
    0xffff_ffff,
    0xff_ffff_ffff,
    0xffff_ffff_ffff,
    0xff_ffff_ffff_ffff,
    u64::MAX,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
];

/// The `w`-byte (at most 8) little-endian integer at `off` of a view.
/// `off & 127` keeps the 8-byte load inside the view, so the compiler
/// drops the bounds check; the decoder's offsets stay below 121.
#[inline(always)]
fn ld(v: &[u8; VIEW], off: usize, w: usize) -> u64 {
    let o = off & 127;
    let mut a = [0u8; 8];
    if let Some(b) = v.get(o..o + 8) {
        a.copy_from_slice(b);
    }
    u64::from_le_bytes(a) & LOW.get(w & 15).copied().unwrap_or(0)
}

/// Decodes one entry of `form` at the start of `buf`; `None` if the bytes
/// end first (the caller reads more), `Err` if they are not a valid entry.
/// Once the shape says how long the entry is, one length check covers
/// every field, and each field is then a load and a mask at an offset in
/// a fixed-size view of the entry ([`VIEW`]); nothing is allocated (but
/// for names too long to store inline).
#[inline]
pub(crate) fn decode(buf: &[u8], form: Form) -> Option<std::result::Result<Decoded, Corruption>> {
    let mut window = Window::EMPTY;
    Some(
        decode_into(buf, form, &mut window)?.map(|(id, partition, head, act, len)| {
            (id, partition, ProducerEntry { head, window }, act, len)
        }),
    )
}

/// The shape byte of an entry of `form`, checked: how many batches its
/// window holds and whether its activity is its newest batch's timestamp
/// ([`SHAPE_ACT_IS_TS`]).
#[inline(always)]
fn shape_of(shape: u8, form: Form) -> std::result::Result<(usize, bool), Corruption> {
    let n = usize::from(shape & 7);
    if shape & SHAPE_SECTIONS != 0 {
        return Err(Corruption::BadField(
            "entry shape (per-key sections: none defined in this version)",
        ));
    }
    let act_is_ts = form == Form::V4 && shape & SHAPE_ACT_IS_TS != 0;
    if (shape & 0xc0 != 0 && !act_is_ts) || n > RETAINED_BATCHES {
        return Err(Corruption::BadField("entry shape"));
    }
    Ok((n, act_is_ts))
}

/// Whether the entry stores its activity, and the bytes of its fixed
/// fields (partition, epoch, last sequence, and the activity if stored).
#[inline(always)]
fn fixed_of(form: Form, act_is_ts: bool) -> (bool, usize) {
    let activity = form == Form::V3 || (form == Form::V4 && !act_is_ts);
    (activity, if activity { 18 } else { 10 })
}

/// An activity taken from the newest batch's timestamp needs a batch with
/// metadata (`mask`: the batches that have them).
#[inline(always)]
fn activity_of_mask(act_is_ts: bool, mask: u8) -> std::result::Result<(), Corruption> {
    if act_is_ts && mask == 0 {
        return Err(Corruption::BadField(
            "entry shape (activity of a batch timestamp the entry does not have)",
        ));
    }
    Ok(())
}

/// A window's widths, from the entry's shape and its 2-byte layout word.
struct Widths {
    /// The batches with metadata.
    mask: u8,
    /// Bytes of a span, of an offset delta, of a timestamp delta.
    sw: usize,
    ow: usize,
    tw: usize,
    /// Bytes of the window after the layout word.
    need: usize,
}

/// The widths of a window of `n` batches, the layout word checked.
#[inline(always)]
fn widths(shape: u8, n: usize, layout: u16) -> std::result::Result<Widths, Corruption> {
    let mask = (layout & 0x1f) as u8;
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
        return Err(Corruption::BadField("entry layout"));
    }
    let need = n * sw + if m > 0 { 16 + (m - 1) * (ow + tw) } else { 0 };
    Ok(Widths {
        mask,
        sw,
        ow,
        tw,
        need,
    })
}

/// The partition of the entry of `form` at the start of `buf` and the
/// bytes it takes, from its shape, key length, partition and layout word
/// alone: [`decode`]'s checks of the entry's framing, none of its key's
/// bytes or window's values. For a reader that passes over the entry
/// unread (a partition's truncation base, over the other partitions'
/// keys); `None` if the bytes end first.
#[inline]
pub(crate) fn measure(
    buf: &[u8],
    form: Form,
) -> Option<std::result::Result<(i32, usize), Corruption>> {
    let shape = *buf.first()?;
    let (n, act_is_ts) = match shape_of(shape, form) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let start = if shape & SHAPE_NAMED == 0 {
        9
    } else {
        3 + usize::from(u16::from_le_bytes([*buf.get(1)?, *buf.get(2)?]))
    };
    let (_, fixed) = fixed_of(form, act_is_ts);
    let mut len = start + fixed;
    if buf.len() < len {
        return None;
    }
    let partition = uint_at(buf, start, 4) as u32 as i32;
    let mut mask = 0;
    if n > 0 {
        if buf.len() < len + 2 {
            return None;
        }
        let w = match widths(shape, n, uint_at(buf, len, 2) as u16) {
            Ok(w) => w,
            Err(e) => return Some(Err(e)),
        };
        mask = w.mask;
        len += 2 + w.need;
        if buf.len() < len {
            return None;
        }
    }
    if let Err(e) = activity_of_mask(act_is_ts, mask) {
        return Some(Err(e));
    }
    Some(Ok((partition, len)))
}

/// A key decoded by [`decode_into`]: key, head (its window is where the
/// caller put it), last activity and the bytes it took.
pub(crate) type DecodedHead = (ProducerId, i32, Head, i64, usize);

/// [`decode`] with the window written into `window` (which must be
/// [`Window::EMPTY`]) rather than returned: a snapshot's load decodes
/// straight into the slot of the map's arena the key will own (an entry
/// returned by value, 112 bytes, was copied twice on its way there). The
/// window's metadata are read and stored in one pass, each delta as its
/// batch is stored.
// Over 100 lines on purpose: the reopen of a snapshot runs it once a key,
// decoding straight into the arena slot in one pass; its checks and stores
// share the widths and positions read from the entry's first bytes.
#[inline]
pub(crate) fn decode_into(
    buf: &[u8],
    form: Form,
    window: &mut Window,
) -> Option<std::result::Result<DecodedHead, Corruption>> {
    let shape = *buf.first()?;
    let (n, act_is_ts) = match shape_of(shape, form) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let (id, start) = if shape & SHAPE_NAMED == 0 {
        if buf.len() < 9 {
            return None;
        }
        (ProducerId::numeric(uint_at(buf, 1, 8)), 9)
    } else {
        let len = usize::from(u16::from_le_bytes([*buf.get(1)?, *buf.get(2)?]));
        match std::str::from_utf8(buf.get(3..3 + len)?) {
            Ok(name) => (ProducerId::named(name), 3 + len),
            Err(_) => return Some(Err(Corruption::BadField("producer name (not UTF-8)"))),
        }
    };
    // `VIEW` bytes of `buf` from `start`: `buf`'s own when it has them
    // (all but the last entries of a block), else a copy padded with
    // zeros (zeroed only then). Lengths are checked against `buf`, never
    // against the view.
    let pad: [u8; VIEW];
    let v = match buf
        .get(start..start + VIEW)
        .and_then(|b| <&[u8; VIEW]>::try_from(b).ok())
    {
        Some(v) => v,
        None => {
            let mut p = [0u8; VIEW];
            let rest = buf.get(start..).unwrap_or_default();
            let n = rest.len().min(VIEW);
            if let (Some(d), Some(s)) = (p.get_mut(..n), rest.get(..n)) {
                d.copy_from_slice(s);
            }
            pad = p;
            &pad
        }
    };
    // From here, offsets are from `start`; `have` bytes are really there.
    let have = buf.len() - start;
    let (activity, fixed) = fixed_of(form, act_is_ts);
    if have < fixed {
        return None;
    }
    let partition = ld(v, 0, 4) as u32 as i32;
    let epoch = ld(v, 4, 2) as u16 as i16;
    let last = ld(v, 6, 4) as u32 as i32;
    let mut act = if activity { ld(v, 10, 8) as i64 } else { 0 };
    let mut at = fixed;
    let mut mask = 0u8;
    let (mut sw, mut ow, mut tw, mut spans, mut metas) = (0, 0, 0, 0, 0);
    if n > 0 {
        if have < at + 2 {
            return None;
        }
        let w = match widths(shape, n, ld(v, at, 2) as u16) {
            Ok(w) => w,
            Err(e) => return Some(Err(e)),
        };
        at += 2;
        (mask, sw, ow, tw) = (w.mask, w.sw, w.ow, w.tw);
        let need = w.need;
        let m = mask.count_ones() as usize;
        if have < at + need {
            return None;
        }
        // The spans at `at`, the newest metadata after them, then the
        // delta pairs, each `ow + tw` bytes.
        spans = at;
        metas = at + n * sw;
        at += need;
        if act_is_ts && m > 0 {
            act = ld(v, metas + 8, 8) as i64;
        }
    }
    if let Err(e) = activity_of_mask(act_is_ts, mask) {
        return Some(Err(e));
    }
    // The spans, then the metadata, newest first, packed: each asked for
    // in order, each a load at a fixed offset of the view; the metadata
    // by their deltas, as they are asked for.
    let m = mask.count_ones() as usize;
    let mut cur = if m > 0 {
        (ld(v, metas, 8) as i64, ld(v, metas + 8, 8) as i64)
    } else {
        (0, 0)
    };
    let mut d = metas + 16;
    let head = Head::fill_newest_first(
        epoch,
        last,
        n,
        mask,
        window,
        |k| ld(v, spans + k * sw, sw) as u32,
        |j| {
            if j > 0 {
                let d_o = unzigzag(ld(v, d, ow));
                let d_t = unzigzag(ld(v, d + ow, tw));
                cur = (cur.0.wrapping_sub(d_o), cur.1.wrapping_sub(d_t));
                d += ow + tw;
            }
            cur
        },
    );
    let Some(head) = head else {
        return Some(Err(Corruption::BadField("entry (sequences inconsistent)")));
    };
    Some(Ok((id, partition, head, act, start + at)))
}

#[cfg(test)]
#[path = "entry_tests.rs"]
mod tests;
