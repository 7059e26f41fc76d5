//! Unit tests of `segment`, in a file of their own beside it (they see its
//! private items through `use super::*`).

#![allow(clippy::indexing_slicing)]

use super::*;
use crate::batch::AppendRequest;
use crate::wal::frame::seal;
use crate::wal::record::encode;
use crate::wal::window::last_nonzero;
use std::io::Cursor;

const IDS: Ids = Ids { store: 1, salt: 2 };
/// One record of one append.
const REC: usize = 35;

fn seed() -> u32 {
    frame::seed(&header(10, IDS, APPENDED_VERSION)[12..36])
}

/// Appends one write of one record per request (no packing: the tests
/// count 35-byte records) to the segment `f`, sealed `unsynced` bytes
/// past the durable end; returns its length.
fn write_at(f: &mut Vec<u8>, reqs: &[AppendRequest], unsynced: u32) -> usize {
    let mut b = Vec::new();
    for r in reqs {
        let mut no_open_record = usize::MAX;
        encode(&mut b, &mut no_open_record, r);
    }
    seal(&mut b, seed(), f.len() as u64, unsynced);
    f.extend_from_slice(&b);
    b.len()
}

fn segment(writes: &[Vec<AppendRequest>]) -> Vec<u8> {
    let mut f = header(10, IDS, APPENDED_VERSION);
    for w in writes {
        write_at(&mut f, w, 0);
    }
    f
}

fn reqs(n: i32) -> Vec<AppendRequest> {
    (0..n)
        .map(|i| AppendRequest::single(1u64, 0, 0, i))
        .collect()
}

fn run(bytes: &[u8]) -> (Vec<u64>, End) {
    let s = scanned(bytes);
    (s.1, s.0.end)
}

fn scanned(bytes: &[u8]) -> (Scan, Vec<u64>) {
    let mut seen = Vec::new();
    let s = scan(
        Path::new("x.wal"),
        Cursor::new(bytes),
        bytes.len() as u64,
        |_| Ok(()),
        |pos, _, _, _| {
            seen.push(pos);
            Ok(())
        },
    )
    .ok()
    .expect("header is fine");
    (s, seen)
}

#[test]
fn a_clean_segment_numbers_its_records_from_the_header() {
    let f = segment(&[reqs(3), reqs(2)]);
    let (s, seen) = scanned(&f);
    assert_eq!(seen, vec![10, 11, 12, 13, 14]);
    assert_eq!(s.end, End::Clean);
    assert_eq!(s.store, Some(1));
    assert!(!s.closed);
}

#[test]
fn a_close_marker_at_the_end_says_the_segment_was_closed() {
    let mut f = segment(&[reqs(3)]);
    let mut m = Vec::new();
    record::encode_close(&mut m);
    seal(&mut m, seed(), f.len() as u64, 0);
    f.extend_from_slice(&m);
    let (s, seen) = scanned(&f);
    assert!(s.closed && s.end == End::Clean && seen.len() == 3);
    // Records after it: closed once, but not at the end.
    write_at(&mut f, &reqs(1), 0);
    assert!(!scanned(&f).0.closed);
}

#[test]
fn a_record_missing_moved_or_repeated_is_damage_where_it_happened() {
    let f = segment(&[reqs(2), reqs(3)]);
    let second = HEADER_LEN + REC;
    // Removed: what follows is not where it was written.
    let mut gone = f.clone();
    gone.drain(second..second + REC);
    let (seen, end) = run(&gone);
    assert_eq!(seen.len(), 1);
    assert_eq!(
        end,
        End::MidLog {
            offset: second as u64,
            kind: Corruption::MisplacedRecord {
                written_at: (second + REC) as u64
            },
            later: second as u64,
        }
    );
    // Repeated.
    let mut twice = f.clone();
    let copy = f[second..second + REC].to_vec();
    twice.splice(second + REC..second + REC, copy);
    let (seen, end) = run(&twice);
    assert_eq!(seen.len(), 2);
    assert!(
        matches!(end, End::MidLog { offset, kind: Corruption::MisplacedRecord { written_at }, .. }
            if offset as usize == second + REC && written_at as usize == second),
        "{end:?}"
    );
    // A damaged record followed by one that moved: mid-log, even
    // though the moved one was written before the damage was durable.
    let mut both = gone.clone();
    both[HEADER_LEN + 20] ^= 1;
    let (seen, end) = run(&both);
    assert!(seen.is_empty());
    assert!(matches!(end, End::MidLog { offset, .. } if offset as usize == HEADER_LEN));
}

#[test]
fn a_record_of_another_segment_does_not_verify() {
    let f = segment(&[reqs(3)]);
    let mut other = header(10, Ids { store: 1, salt: 3 }, APPENDED_VERSION);
    other.extend_from_slice(&f[HEADER_LEN..]);
    let (seen, end) = run(&other);
    assert!(seen.is_empty());
    assert!(matches!(end, End::Torn { offset, .. } if offset as usize == HEADER_LEN));
}

#[test]
fn a_cut_anywhere_in_the_last_write_is_a_torn_tail() {
    let f = segment(&[reqs(3), reqs(4)]);
    let last_write = f.len() - 4 * REC;
    for cut in last_write + 1..f.len() {
        let (seen, end) = run(&f[..cut]);
        // At a record boundary only whole records remain: a clean end.
        let boundary = (cut - last_write).is_multiple_of(REC);
        assert_eq!(matches!(end, End::Clean), boundary, "cut {cut}: {end:?}");
        assert!(
            boundary || matches!(end, End::Torn { .. }),
            "cut {cut}: {end:?}"
        );
        assert_eq!(seen.len(), 3 + (cut - last_write) / REC);
    }
}

/// A preallocated segment (version 6, the flag set) holding `writes`,
/// zeros up to `len`, and `bytes` written at each offset of `at`.
fn preallocated(writes: &[Vec<AppendRequest>], len: usize, at: &[(usize, &[u8])]) -> Vec<u8> {
    let mut f = header_with(10, IDS, VERSION, true, false);
    for w in writes {
        write_at(&mut f, w, 0);
    }
    f.resize(len, 0);
    for (offset, bytes) in at {
        f[*offset..offset + bytes.len()].copy_from_slice(bytes);
    }
    f
}

#[test]
fn the_room_of_a_preallocated_segment_is_told_apart_from_its_torn_bytes() {
    // Clean: the records, then zeros to the end, all of them room.
    let records = HEADER_LEN + 3 * REC;
    let f = preallocated(&[reqs(3)], 4096, &[]);
    let (s, seen) = scanned(&f);
    assert_eq!((seen.len(), &s.end), (3, &End::Clean));
    assert_eq!(
        (s.valid_len, s.room),
        (records as u64, (4096 - records) as u64)
    );

    // Torn: 17 bytes of a half-written record after the records (its last
    // byte not zero), then room. Over three of the scan's 1 MiB windows,
    // so that the zeros after the torn bytes are counted across windows.
    let len = 3 << 20;
    let f = preallocated(&[reqs(3)], len, &[(records, &[0x5a; 17])]);
    let (s, _) = scanned(&f);
    assert!(
        matches!(s.end, End::Torn { offset, .. } if offset as usize == records),
        "{:?}",
        s.end
    );
    assert_eq!(s.room, (len - records - 17) as u64);

    // Torn bytes far apart (a torn write, and bytes near the end of the
    // room): only the zeros after the last of them are room.
    let late = len - 100;
    let f = preallocated(&[reqs(3)], len, &[(records, &[0x5a; 17]), (late, &[7; 10])]);
    let (s, _) = scanned(&f);
    assert!(matches!(s.end, End::Torn { .. }), "{:?}", s.end);
    assert_eq!(s.room, 90);

    // The torn bytes' last byte is the file's: no room.
    let f = preallocated(&[reqs(3)], len, &[(len - 3, &[1, 2, 3])]);
    let (s, _) = scanned(&f);
    assert!(matches!(s.end, End::Torn { .. }), "{:?}", s.end);
    assert_eq!(s.room, 0);

    // A segment that grows by appends has no room, zeros or not.
    let mut f = segment(&[reqs(3)]);
    f.extend_from_slice(&[0x5a; 17]);
    f.resize(4096, 0);
    let (s, _) = scanned(&f);
    assert!(matches!(s.end, End::Torn { .. }), "{:?}", s.end);
    assert_eq!(s.room, 0);
}

#[test]
fn last_nonzero_finds_the_last_byte_that_is_not_zero() {
    assert_eq!(last_nonzero(&[]), None);
    assert_eq!(last_nonzero(&[0; 100]), None);
    for len in 1..40 {
        for at in 0..len {
            let mut b = vec![0u8; len];
            b[at] = 9;
            if at > 0 {
                b[0] = 1;
            }
            assert_eq!(last_nonzero(&b), Some(at), "len {len}, at {at}");
        }
    }
}

#[test]
fn damage_followed_by_a_later_write_is_mid_log() {
    let f = segment(&[reqs(3), reqs(2)]);
    let mut bad = f.clone();
    bad[HEADER_LEN + REC + 20] ^= 1; // second record of the first write
    let (seen, end) = run(&bad);
    assert_eq!(seen, vec![10]);
    assert!(matches!(end, End::MidLog { offset, later, .. }
            if offset as usize == HEADER_LEN + REC && later as usize == HEADER_LEN + 3 * REC));
}

#[test]
fn sectors_lost_out_of_order_inside_the_last_write_are_torn() {
    // One big last write: zero its first half, keep the second.
    let f = segment(&[reqs(2), reqs(40)]);
    let start = HEADER_LEN + 2 * REC;
    let mut bad = f.clone();
    for b in &mut bad[start + 10..start + 600] {
        *b = 0;
    }
    let (seen, end) = run(&bad);
    assert_eq!(seen.len(), 2);
    assert!(matches!(end, End::Torn { offset, .. } if offset as usize == start));
}

#[test]
fn a_hole_in_several_unsynced_writes_is_torn_but_in_synced_bytes_is_mid_log() {
    // Three writes; only the first was fsync'ed: the second and third
    // were issued before anything after the first was durable (their
    // records count their distance from the end of the first write).
    let mut f = header(10, IDS, APPENDED_VERSION);
    let mut unsynced = 0u32;
    for (n, fsynced) in [(2, true), (3, false), (3, false)] {
        let len = write_at(&mut f, &reqs(n), unsynced);
        unsynced = if fsynced { 0 } else { unsynced + len as u32 };
    }
    // Lose a sector of the second write while the third survives: the
    // crash left a hole in bytes never fsync'ed. Torn, cut at the hole.
    let hole = HEADER_LEN + 2 * REC + 40;
    let mut bad = f.clone();
    bad[hole] ^= 0xff;
    let (seen, end) = run(&bad);
    assert_eq!(seen.len(), 3);
    assert!(matches!(end, End::Torn { offset, .. } if offset as usize == HEADER_LEN + 3 * REC));
    // The same hole in the first write, which the second was written
    // after it was durable: damage in the middle of the log.
    let mut bad = f.clone();
    bad[HEADER_LEN + 40] ^= 0xff;
    let (seen, end) = run(&bad);
    assert_eq!(seen.len(), 1);
    assert!(matches!(end, End::MidLog { offset, .. } if offset as usize == HEADER_LEN + REC));
}

#[test]
fn a_packed_record_counts_every_append_and_tears_whole() {
    // Two writes, each one kind-1 record of several appends.
    let packed = |f: &mut Vec<u8>, n: i32| {
        let mut b = Vec::new();
        let mut open = 0;
        for r in reqs(n) {
            encode(&mut b, &mut open, &r);
        }
        seal(&mut b, seed(), f.len() as u64, 0);
        f.extend_from_slice(&b);
    };
    let mut f = header(10, IDS, APPENDED_VERSION);
    packed(&mut f, 3);
    let last = f.len();
    packed(&mut f, 5);
    assert_eq!(f.len(), last + REC + 4 * 18);
    let mut at = Vec::new();
    let s = scan(
        Path::new("x"),
        Cursor::new(&f),
        f.len() as u64,
        |_| Ok(()),
        |pos, off, nth, _| {
            at.push((pos, off, nth));
            Ok(())
        },
    )
    .ok()
    .unwrap();
    assert_eq!(s.records, 8);
    assert_eq!(s.version, APPENDED_VERSION);
    assert_eq!(at[2], (12, HEADER_LEN as u64, 2));
    assert_eq!(at[3], (13, last as u64, 0));
    // A cut anywhere in the last record loses all of its appends.
    for cut in last + 1..f.len() {
        let (seen, end) = run(&f[..cut]);
        assert_eq!(seen.len(), 3, "cut {cut}");
        assert!(matches!(end, End::Torn { offset, .. } if offset as usize == last));
    }
}

#[test]
fn a_version_2_segment_is_read_in_its_layout() {
    // Header: magic, version 2, flags, first position, CRC of 0..20.
    let mut f = MAGIC.to_vec();
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&0u16.to_le_bytes());
    f.extend_from_slice(&10u64.to_le_bytes());
    let c = crc32c::crc32c(&f);
    f.extend_from_slice(&c.to_le_bytes());
    // A kind-1 record of two appends: CRC, length 49, unsynced 0, kind.
    let mut r = Vec::new();
    r.extend_from_slice(&49u32.to_le_bytes());
    r.extend_from_slice(&0u32.to_le_bytes());
    r.push(1);
    for seq in 0..2i32 {
        r.extend_from_slice(&1u64.to_le_bytes());
        r.extend_from_slice(&[0; 6]);
        r.extend_from_slice(&seq.to_le_bytes());
    }
    let c = crc32c::crc32c_append(crc32c::crc32c(&10u64.to_le_bytes()), &r);
    f.extend_from_slice(&c.to_le_bytes());
    f.extend_from_slice(&r);
    let (s, seen) = scanned(&f);
    assert_eq!((s.version, s.store, s.end), (2, None, End::Clean));
    assert_eq!(seen, vec![10, 11]);
}

/// The search after damage as it was first written: every plausible
/// offset decoded in full, its checksum computed over its bytes.
fn reference_later_write(f: &[u8], damage: usize, seed: u32) -> Option<u64> {
    let layout = record::Layout::of(VERSION);
    let mut at = damage + 1;
    while f.len() - at >= frame::MIN_LEN {
        let b = &f[at..];
        if record::plausible(b, layout) {
            match record::decode(b, seed, layout, at as u64) {
                Ok(d) => {
                    let since = record::unsynced_offset(b, layout).unwrap() as usize;
                    if at.saturating_sub(since) > damage {
                        return Some(at as u64);
                    }
                    at += d.len;
                    continue;
                }
                Err(Bad::Misplaced(_)) => return Some(at as u64),
                Err(_) => {}
            }
        }
        at += 1;
    }
    None
}

/// The end the reference search gives `f`: where the first bad record
/// is and how it ends.
fn reference_end(f: &[u8]) -> Option<(u64, Option<u64>)> {
    let layout = record::Layout::of(VERSION);
    let seed = seed();
    let mut at = HEADER_LEN;
    while at < f.len() {
        match record::decode(&f[at..], seed, layout, at as u64) {
            Ok(d) => at += d.len,
            Err(Bad::Misplaced(_)) => return Some((at as u64, Some(at as u64))),
            Err(_) => return Some((at as u64, reference_later_write(f, at, seed))),
        }
    }
    None
}

#[test]
fn the_search_after_damage_agrees_with_decoding_every_candidate() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut kinds = [0usize; 3];
    for case in 0..300 {
        // Writes of one to twenty records, fsync'ed or not.
        let mut f = header(10, IDS, APPENDED_VERSION);
        let mut unsynced = 0u32;
        for _ in 0..1 + next() % 12 {
            let n = 1 + (next() % 20) as i32;
            let len = write_at(&mut f, &reqs(n), unsynced);
            unsynced = if next().is_multiple_of(2) {
                0
            } else {
                unsynced + len as u32
            };
        }
        // Damage: a flipped byte, a zeroed run, or crafted bytes
        // (plausible lengths and kinds every four bytes), somewhere.
        let at = HEADER_LEN + (next() as usize) % (f.len() - HEADER_LEN);
        let n = 1 + (next() as usize) % 400;
        let end = (at + n).min(f.len());
        match next() % 3 {
            0 => f[at] ^= 1 + (next() % 255) as u8,
            1 => f[at..end].fill(0),
            _ => {
                for (i, b) in f[at..end].iter_mut().enumerate() {
                    *b = [0x03, 0x40, 0, 0][i % 4];
                }
            }
        }
        let (_, got) = run(&f);
        let want = reference_end(&f);
        let got = match got {
            End::Clean => None,
            End::Torn { offset, .. } => Some((offset, None)),
            End::MidLog { offset, later, .. } => Some((offset, Some(later))),
        };
        assert_eq!(got, want, "case {case}");
        kinds[match want {
            None => 0,
            Some((_, None)) => 1,
            Some((_, Some(_))) => 2,
        }] += 1;
    }
    // Each outcome was met often enough to mean something.
    assert!(
        kinds[0] >= 3 && kinds[1] >= 30 && kinds[2] >= 30,
        "{kinds:?}"
    );
}

#[test]
fn crafted_bytes_after_damage_cost_what_zeros_cost() {
    // A header, then `03 ff 00 00` over 2 MiB: every fourth offset
    // claims a 65,283-byte named record. The checksums come from
    // prefixes, each byte fed once.
    let mut f = header(10, IDS, APPENDED_VERSION);
    f.extend([0x03u8, 0xff, 0, 0].repeat(1 << 19));
    let mut w = Window::new(Cursor::new(&f), read_past);
    w.at(0, HEADER_LEN).unwrap();
    let mut p = PrefixCrc::new(record::MAX_LEN);
    let layout = record::Layout::of(VERSION);
    let found = later_write(
        &mut w,
        HEADER_LEN as u64,
        HEADER_LEN as u64 + 1,
        seed(),
        layout,
        &mut p,
    );
    assert_eq!(found.unwrap(), None);
    assert!(p.fed > 0);
    assert!(p.fed <= f.len() as u64, "{} bytes checksummed", p.fed);
    let (seen, end) = run(&f);
    assert!(seen.is_empty());
    assert!(
        matches!(end, End::Torn { offset, .. } if offset == HEADER_LEN as u64),
        "{end:?}"
    );
}

#[test]
fn bad_headers_are_reported() {
    let f = segment(&[reqs(1)]);
    for cut in 0..HEADER_LEN {
        assert!(
            matches!(parse_header(Path::new("x"), &f[..cut]), Err(HeaderError::Short(n)) if n == cut)
        );
    }
    for byte in 0..HEADER_LEN {
        let mut b = f.clone();
        b[byte] ^= 0x40;
        assert!(
            matches!(parse_header(Path::new("x"), &b), Err(HeaderError::Bad(_))),
            "byte {byte}"
        );
    }
}
