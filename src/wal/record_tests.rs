//! Unit tests of `record`, in a file of their own beside it (they see its
//! private items through `use super::*`).

#![allow(clippy::indexing_slicing)]

use super::*;
use crate::batch::Batch;
use crate::wal::frame::{MIN_LEN, seal, seed};

const V3: fn() -> Layout = || Layout::of(3);

fn append(op: LogOp) -> AppendRequest {
    match op {
        LogOp::Append(r) => r,
        other => panic!("not an append: {other:?}"),
    }
}

fn samples() -> Vec<AppendRequest> {
    vec![
        AppendRequest::single(7u64, 3, 1, 42),
        AppendRequest::batch(
            u64::MAX,
            -1,
            i16::MIN,
            Batch::new(0, i32::MAX, i64::MIN, -1),
        ),
        AppendRequest::single("p1", 0, 0, 0),
        AppendRequest::single("", i32::MAX, -1, 5),
        AppendRequest::batch(
            "x".repeat(300),
            2,
            9,
            Batch::new(5, 9, 77, 1_700_000_000_000),
        ),
    ]
}

fn sd(salt: u64) -> u32 {
    seed(&salt.to_le_bytes())
}

/// Encodes `reqs` in order as one write at offset 0 of a segment
/// seeded by `salt`.
fn write(reqs: &[AppendRequest], salt: u64, unsynced: u32) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut open = usize::MAX;
    for r in reqs {
        encode(&mut buf, &mut open, r);
    }
    seal(&mut buf, sd(salt), 0, unsynced);
    buf
}

/// Decodes every record of `buf` (written at offset 0): (offset,
/// appends) per record.
fn read(buf: &[u8], salt: u64, layout: Layout) -> Vec<(usize, Vec<AppendRequest>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let d = decode(&buf[at..], sd(salt), layout, at as u64).unwrap();
        assert!(plausible(&buf[at..], layout));
        assert_eq!(unsynced_offset(&buf[at..], layout), Some(1000 + at as u32));
        out.push((at, d.ops.map(append).collect()));
        at += d.len;
    }
    out
}

/// The records of a version-3 write `buf` as a version 1 or 2 writer
/// laid them out: no offset field, the CRC seeded by `salt`.
fn old_layout(buf: &[u8], salt: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let len = u32::from_le_bytes(buf[at + 4..at + 8].try_into().unwrap()) as usize;
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&((len - 4) as u32).to_le_bytes());
        out.extend_from_slice(&buf[at + 12..at + len]);
        let c = crc32c::crc32c_append(sd(salt), &out[start + 4..]);
        out[start..start + 4].copy_from_slice(&c.to_le_bytes());
        at += len;
    }
    out
}

#[test]
fn records_round_trip_and_know_their_distance_from_the_durable_end() {
    let reqs = samples();
    let buf = write(&reqs, 99, 1000);
    let records = read(&buf, 99, V3());
    assert_eq!(records.len(), reqs.len());
    let all: Vec<AppendRequest> = records.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(all, reqs);
    // The salt is part of the checksum: another segment's record fails.
    assert!(matches!(
        decode(&buf, sd(98), V3(), 0),
        Err(Bad::Invalid(Corruption::ChecksumMismatch { .. }))
    ));
}

#[test]
fn a_record_found_at_another_offset_than_it_states_is_misplaced() {
    let reqs = samples();
    let buf = write(&reqs, 7, 0);
    let second = decode(&buf, sd(7), V3(), 0).unwrap().len;
    // The second record read where the first was: it verifies, but it
    // says where it was written.
    assert_eq!(
        decode(&buf[second..], sd(7), V3(), 0).unwrap_err(),
        Bad::Misplaced(Corruption::MisplacedRecord {
            written_at: second as u64
        })
    );
    // Sealed for another place, the same bytes are at home there.
    let mut moved = buf[second..].to_vec();
    seal(&mut moved, sd(7), 4096, 0);
    assert!(decode(&moved, sd(7), V3(), 4096).is_ok());
    assert!(matches!(
        decode(&moved, sd(7), V3(), second as u64),
        Err(Bad::Misplaced(_))
    ));
}

#[test]
fn a_close_marker_holds_no_append() {
    let mut buf = write(&samples()[..1], 3, 1000);
    let at = buf.len();
    let mut marker = Vec::new();
    encode_close(&mut marker);
    seal(&mut marker, sd(3), at as u64, 1000 + at as u32);
    buf.extend_from_slice(&marker);
    assert_eq!(marker.len(), HEADER);
    let d = decode(&buf[at..], sd(3), V3(), at as u64).unwrap();
    assert!(d.close && d.ops.len() == 0 && d.len == HEADER);
    assert!(plausible(&buf[at..], V3()));
    // Versions before 3 have none: kind 5 is unknown there.
    assert!(!plausible(&buf[at..], Layout::of(2)));
    assert_eq!(read(&buf, 3, V3()).len(), 2);
}

#[test]
fn a_taken_buffer_forgets_where_its_open_record_was() {
    // The first write leaves a kind-1 record open at offset 30.
    let mut p = RecordBuf::default();
    p.push(&AppendRequest::single("a", 0, 0, 0));
    p.push(&AppendRequest::single(1u64, 0, 0, 0));
    assert_eq!(read(&sealed(p.take(Vec::new())), 5, V3()).len(), 2);
    // In the next write, a name whose bytes at that offset look like
    // an open kind-1 record: length 27 (to the end of the buffer) at
    // +4, kind 1 at +16. The numeric append must start its own record.
    let mut name = b"aaaaaaaaaaaaaaa".to_vec();
    name.extend_from_slice(&27u32.to_le_bytes());
    name.extend_from_slice(b"bbbbbbbb\x01");
    let named = AppendRequest::single(String::from_utf8(name).unwrap(), 0, 0, 0);
    let numeric = AppendRequest::single(1u64 << 40, 0, 0, 0);
    p.push(&named);
    assert_eq!(p.len(), 30 + 27);
    p.push(&numeric);
    let records = read(&sealed(p.take(Vec::new())), 5, V3());
    assert_eq!(records, vec![(0, vec![named]), (57, vec![numeric])]);
    // So does a cleared one.
    p.push(&AppendRequest::single(1u64, 0, 0, 1));
    p.clear();
    p.push(&AppendRequest::single("q", 0, 0, 0));
    p.push(&AppendRequest::single(2u64, 0, 0, 0));
    assert_eq!(read(&sealed(p.take(Vec::new())), 5, V3()).len(), 2);
}

/// `buf` sealed as [`read`] expects (segment 5, 1000 bytes unsynced).
fn sealed(mut buf: Vec<u8>) -> Vec<u8> {
    seal(&mut buf, sd(5), 0, 1000);
    buf
}

#[test]
fn numeric_single_appends_in_a_row_share_a_record() {
    let n = |k: u64, s: i32| AppendRequest::single(k, 1, 2, s);
    let named = AppendRequest::single("p", 0, 0, 0);
    let reqs = vec![n(1, 0), n(2, 0), n(1, 1), named.clone(), n(3, 0)];
    let buf = write(&reqs, 5, 1000);
    let records = read(&buf, 5, V3());
    let lens: Vec<usize> = records.iter().map(|(_, r)| r.len()).collect();
    assert_eq!(lens, vec![3, 1, 1]);
    assert_eq!(records[1].0, 35 + 2 * 18);
    assert_eq!(buf.len(), 35 + 2 * 18 + 30 + 35);
    let all: Vec<AppendRequest> = records.into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(all, reqs);

    // A full record is closed and a new one started.
    let many: Vec<AppendRequest> = (0..MAX_PACKED as i32 + 5).map(|s| n(9, s)).collect();
    let buf = write(&many, 5, 1000);
    let records = read(&buf, 5, V3());
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].1.len(), MAX_PACKED);
    assert_eq!(records[1].0, MAX_PACKED_LEN);

    // A stale hint (the buffer was swapped or cleared) is not trusted.
    let mut buf = Vec::new();
    let mut open = 12_345;
    encode(&mut buf, &mut open, &n(1, 0));
    encode(&mut buf, &mut open, &n(1, 1));
    assert_eq!(open, 0);
    assert_eq!(buf.len(), 35 + 18);
    buf.clear();
    encode(&mut buf, &mut open, &named);
    encode(&mut buf, &mut open, &n(1, 2));
    assert_eq!(buf.len(), 30 + 35);
}

#[test]
fn older_versions_are_read_in_their_layout() {
    // Version 2: the same records without the offset field.
    let reqs = samples();
    let v2 = old_layout(&write(&reqs, 4, 0), 4);
    let mut at = 0;
    let mut got = Vec::new();
    while at < v2.len() {
        let d = decode(&v2[at..], sd(4), Layout::of(2), at as u64).unwrap();
        assert!(plausible(&v2[at..], Layout::of(2)));
        got.extend(d.ops.map(append));
        at += d.len;
    }
    assert_eq!(got, reqs);
    assert!(decode(&v2, sd(4), V3(), 0).is_err());

    // Version 1 holds one append per record.
    let one = AppendRequest::single(1u64, 0, 0, 0);
    let buf = old_layout(&write(&[one.clone(), one], 0, 0), 0);
    assert_eq!(buf.len(), 49);
    assert!(matches!(
        decode(&buf, sd(0), Layout::of(1), 0),
        Err(Bad::Invalid(Corruption::BadLength(49)))
    ));
    assert!(!plausible(&buf, Layout::of(1)));
    assert_eq!(decode(&buf, sd(0), Layout::of(2), 0).unwrap().ops.len(), 2);
    let one = old_layout(&write(&[AppendRequest::single(1u64, 0, 0, 0)], 0, 0), 0);
    assert_eq!(decode(&one, sd(0), Layout::of(1), 0).unwrap().ops.len(), 1);
}

#[test]
fn zeros_never_parse_and_nothing_panics() {
    for layout in [Layout::of(1), Layout::of(2), V3()] {
        assert!(matches!(
            decode(&[0u8; 64], 0, layout, 0),
            Err(Bad::Invalid(Corruption::BadLength(0)))
        ));
        assert!(matches!(
            decode(&[0u8; 5], 0, layout, 0),
            Err(Bad::Incomplete(_))
        ));
        assert!(!plausible(&[0u8; 64], layout));
    }
    let n = |s| AppendRequest::single(3u64, 0, 0, s);
    let mut marker = Vec::new();
    encode_close(&mut marker);
    seal(&mut marker, sd(0), 0, 0);
    for buf in [
        write(&[samples()[1].clone()], 0, 0),
        write(&[n(0), n(1), n(2)], 0, 0),
        marker,
    ] {
        for cut in 0..buf.len() {
            assert!(
                matches!(decode(&buf[..cut], sd(0), V3(), 0), Err(Bad::Incomplete(_))),
                "cut {cut}"
            );
        }
        for bit in 0..buf.len() * 8 {
            let mut b = buf.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&b, sd(0), V3(), 0).is_err(), "bit {bit}");
        }
    }
}

#[test]
fn sizes_are_as_documented() {
    let size = |r: AppendRequest| write(&[r], 0, 0).len();
    assert_eq!(size(AppendRequest::single(1u64, 0, 0, 0)), 35);
    assert_eq!(
        size(AppendRequest::batch(1u64, 0, 0, Batch::new(0, 0, 0, 0))),
        55
    );
    assert_eq!(size(AppendRequest::single("p1", 0, 0, 0)), 31);
    assert_eq!(MIN_LEN, 17);
    assert_eq!(MAX_APPEND_LEN, 65_584);
    assert_eq!(MAX_LEN, 65_675);
    assert_eq!(Layout::of(5).max_len(), 65_675);
    assert_eq!(Layout::of(4).max_len(), 65_584);
    assert_eq!(MAX_PACKED_LEN, 65_537);
    assert_eq!(Layout::of(2).min_len(), 25);
    assert_eq!(Layout::of(2).max_len(), 65_580);
}

/// A partition's replay passes over exactly the records that hold one
/// operation on another partition, in every kind that has one (numeric
/// and named appends, Kafka batches and markers), and stops at what it
/// must decode: its own partition's records, records of several
/// appends (kind 1), records of other kinds, a record that says it was
/// written elsewhere, and a record the window holds only part of.
#[test]
fn a_partition_replay_passes_over_the_records_of_other_partitions_only() {
    use crate::engine::kafka::txn::Marker;
    use crate::wal::txn_op;
    let batch = |id: ProducerId, p: i32| AppendRequest::batch(id, p, 0, Batch::new(0, 0, 5, 6));
    let mut buf = Vec::new();
    let mut open = usize::MAX;
    // Five records of partition 1: every kind with one partition.
    encode(&mut buf, &mut open, &batch(ProducerId::numeric(1), 1));
    encode(&mut buf, &mut open, &AppendRequest::single("a", 1, 0, 0));
    encode(&mut buf, &mut open, &batch(ProducerId::named("bb"), 1));
    txn_op::encode_batch(&mut buf, &batch(ProducerId::numeric(2), 1), true);
    txn_op::encode_marker(
        &mut buf,
        &ProducerId::named("c"),
        1,
        0,
        &Marker::commit(0, 7, 8),
    );
    let five = buf.len();
    // Then one of partition 0.
    encode(&mut buf, &mut open, &batch(ProducerId::numeric(3), 0));
    let six = buf.len();
    // Then two numeric singles of partition 1, packed in one record.
    encode(&mut buf, &mut open, &AppendRequest::single(4u64, 1, 0, 0));
    encode(&mut buf, &mut open, &AppendRequest::single(5u64, 1, 0, 0));
    seal(&mut buf, sd(9), 0, 0);
    let kafka = Layout::of(6).with_kafka(true);
    assert_eq!(pass_over(&buf, sd(9), kafka, 0, 0), (5, five));
    // The first decodes to what it was: the bytes are a valid record.
    assert!(decode(&buf, sd(9), kafka, 0).is_ok());
    assert_eq!(
        pass_over(&buf[five..], sd(9), kafka, five as u64, 0),
        (0, 0)
    );
    assert_eq!(
        pass_over(&buf[five..], sd(9), kafka, five as u64, 1),
        (1, six - five)
    );
    assert_eq!(pass_over(&buf[six..], sd(9), kafka, six as u64, 0), (0, 0));
    // Without the Kafka flag, the transaction kinds are decoded.
    assert_eq!(pass_over(&buf, sd(9), Layout::of(6), 0, 0).0, 3);
    // Before version 3 nothing says where a record was written.
    assert_eq!(pass_over(&buf, sd(9), Layout::of(2), 0, 0), (0, 0));
    // Read as if written elsewhere: off the record boundaries.
    assert_eq!(pass_over(&buf, sd(9), kafka, 1, 0), (0, 0));
    // A window cut inside the third record stops before it.
    let one = u32_at(&buf, AT_LEN).unwrap() as usize;
    let second_end = one + u32_at(&buf[one..], AT_LEN).unwrap() as usize;
    assert_eq!(
        pass_over(&buf[..second_end + 3], sd(9), kafka, 0, 0),
        (2, second_end)
    );
    // Another segment's seed: no checksum holds, nothing is passed over.
    assert_eq!(pass_over(&buf, sd(8), kafka, 0, 0), (0, 0));
    // A flip in the second record's partition field (after its header and
    // its name: 2 + 1 bytes) that makes it name partition 0's neighbour
    // 3: its checksum no longer holds, so it is not passed over but
    // decoded, and the decode refuses it. Without the check, a replay of
    // partition 1 would have passed over one of its own records.
    let mut flipped = buf.clone();
    flipped[one + HEADER + 3] ^= 2;
    assert_eq!(
        pass_over(&flipped[one..], sd(9), kafka, one as u64, 1),
        (0, 0)
    );
    assert_eq!(pass_over(&flipped, sd(9), kafka, 0, 0), (1, one));
    assert!(decode(&flipped[one..], sd(9), kafka, one as u64).is_err());
}
