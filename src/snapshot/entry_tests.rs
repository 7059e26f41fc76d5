//! Unit tests of `entry`, in a file of their own beside it (they see its
//! private items through `use super::*`).

#![allow(clippy::indexing_slicing)]

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
            seq = crate::engine::rules::next_sequence(last);
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
            // Then with bytes after it: a few (the view is still a
            // padded copy) and a view's worth (the view is `buf`'s
            // own), set bits that no field may pick up.
            for after in [9, VIEW] {
                let mut longer = b.clone();
                longer.extend(std::iter::repeat_n(0xff, after));
                let (_, _, de, da, len) = decode(&longer, form).unwrap().unwrap();
                assert_eq!((&de, da, len), (&e, want, b.len()), "{after} after");
            }
            for cut in 0..b.len() {
                assert!(
                    decode(&b[..cut], form).is_none_or(|r| r.is_err()),
                    "cut {cut}"
                );
                // Its framing alone never reads past what is there.
                assert_eq!(measure(&b[..cut], form), None, "cut {cut}");
            }
            // Measured, it is the partition and the length decoded,
            // with or without bytes after it.
            assert_eq!(measure(&b, form), Some(Ok((p, b.len()))));
            let mut longer = b.clone();
            longer.extend([0xff; 9]);
            assert_eq!(measure(&longer, form), Some(Ok((p, b.len()))));
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
fn windows_wrapped_at_every_ring_position_round_trip() {
    // An entry's ring wraps after five batches: its newest batch may
    // lie in any slot. Every batch with metadata (the encoder's path
    // without a branch per batch), and every third one without.
    for plain_every in [0, 3] {
        let mut e = ProducerEntry::start(0, 0, 0, None);
        let mut last = -1i32;
        for b in 0..13i64 {
            let meta =
                (plain_every == 0 || b % plain_every != 0).then_some(crate::batch::BatchMetadata {
                    offset: 1000 + b * 7,
                    timestamp: 5000 - b * 3,
                });
            let first = last + 1;
            last = first + if meta.is_some() { (b % 3) as i32 } else { 0 };
            e.accept(b == 0, 0, first, last, meta);
            for form in [Form::V3, Form::V4] {
                let mut buf = Vec::new();
                encode(&mut buf, &ProducerId::numeric(9), 1, &e, form, 42);
                let (_, _, d, a, len) = decode(&buf, form).unwrap().unwrap();
                assert_eq!((&d, a, len), (&e, 42, buf.len()), "{plain_every} {b}");
                let mut again = Vec::new();
                encode(&mut again, &ProducerId::numeric(9), 1, &d, form, 42);
                assert_eq!(again, buf);
            }
        }
    }
}

/// Whether a decoder refused its bytes as a bad field.
fn bad_field<T>(decoded: Option<Result<T, Corruption>>) -> bool {
    matches!(decoded, Some(Err(Corruption::BadField(_))))
}

#[test]
fn a_window_that_does_not_fit_its_last_sequence_is_refused() {
    // Two batches with metadata, 0..=9 and 10..=19 (spans 9 and 9),
    // and one without (20..=20 needs span 0), on both paths of the
    // window's decoding (every batch with metadata, or not).
    let meta = |o| {
        Some(crate::batch::BatchMetadata {
            offset: o,
            timestamp: o,
        })
    };
    for plain_newest in [false, true] {
        let mut e = ProducerEntry::start(0, 0, 9, meta(1));
        e.accept(false, 0, 10, 19, meta(2));
        if plain_newest {
            e.accept(false, 0, 20, 20, None);
        }
        let mut b = Vec::new();
        encode_entry_v4(&mut b, &ProducerId::numeric(1), 0, &e, 0);
        assert!(decode(&b, Form::V4).unwrap().is_ok());
        // The last sequence (bytes 15..19) below what the spans need.
        let mut short = b.clone();
        short[15..19].copy_from_slice(&(if plain_newest { 15 } else { 5i32 }).to_le_bytes());
        assert!(bad_field(decode(&short, Form::V4)), "{plain_newest}");
        if plain_newest {
            // A span for the batch without metadata (span class 1:
            // shape bits 4-5; the spans follow the 2-byte layout).
            let mut spanned = b.clone();
            assert_eq!(spanned[0] >> 4 & 3, 1);
            assert_eq!(spanned[19 + 8 + 2], 0);
            spanned[19 + 8 + 2] = 1;
            assert!(bad_field(decode(&spanned, Form::V4)));
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
    assert!(bad_field(decode(&flagged, Form::V4)));
    assert!(bad_field(measure(&flagged, Form::V4)));
}

#[test]
fn measuring_checks_the_framing_but_not_the_window() {
    let mut e = ProducerEntry::start(0, 0, 0, None);
    let meta = Some(crate::batch::BatchMetadata {
        offset: 10,
        timestamp: 20,
    });
    e.accept(true, 0, 0, 4, meta);
    e.accept(false, 0, 5, 9, meta);
    let mut b = Vec::new();
    encode_entry_v4(&mut b, &ProducerId::numeric(1), 3, &e, 20);
    assert_eq!(measure(&b, Form::V4), Some(Ok((3, b.len()))));
    // Shape bits and layout words no version defines: refused by both.
    for bit in [SHAPE_SECTIONS, 7] {
        let mut bad = b.clone();
        bad[0] |= bit;
        assert!(bad_field(measure(&bad, Form::V4)), "{bit}");
        assert!(bad_field(decode(&bad, Form::V4)), "{bit}");
    }
    let layout_at = 1 + 8 + 10;
    let mut bad = b.clone();
    bad[layout_at + 1] |= 0x80;
    assert!(bad_field(measure(&bad, Form::V4)));
    assert!(bad_field(decode(&bad, Form::V4)));
    // A window whose values do not fit its last sequence: only a
    // decode sees it (a reader that passes the key over needs none of
    // its values).
    let mut short = b.clone();
    short[1 + 8 + 6..1 + 8 + 10].copy_from_slice(&3i32.to_le_bytes());
    assert!(bad_field(decode(&short, Form::V4)));
    assert_eq!(measure(&short, Form::V4), Some(Ok((3, b.len()))));
}

#[test]
fn the_reserved_sections_bit_is_refused_and_the_longest_entry_fits() {
    let e = ProducerEntry::start(0, 0, 0, None);
    let mut b = Vec::new();
    encode_entry(&mut b, &ProducerId::numeric(1), 0, &e, Some(5));
    b[0] |= SHAPE_SECTIONS;
    assert!(bad_field(decode_entry(&b, true)));
    assert!(bad_field(measure(&b, Form::V3)));
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
