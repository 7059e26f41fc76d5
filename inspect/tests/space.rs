//! Preallocated segments: the bytes that hold records and the room
//! (zeros) a segment was given are reported apart, in the file table, for
//! a segment on its own, and in a torn tail recovery would cut.

mod common;

use common::{files, json, run, s};
use producer_state::{ProducerStateStore, StoreOptions};

/// A store whose one segment is preallocated (64 KiB, the first size)
/// and holds a few records; its segment and the bytes they take.
fn store(dir: &std::path::Path) -> (std::path::PathBuf, u64) {
    let st = ProducerStateStore::open_with(dir, StoreOptions::default()).unwrap();
    for i in 0..20 {
        st.append(7u64, 0, 0, i).unwrap();
    }
    st.close().unwrap();
    let seg = files(dir, ".wal").pop().unwrap();
    let (code, v) = json(&[s(&seg)]);
    assert_eq!(code, 0, "{v}");
    let used = v["used_bytes"].as_u64().unwrap();
    (seg, used)
}

#[test]
fn a_clean_preallocated_segment_shows_its_records_and_its_room_apart() {
    let d = tempfile::tempdir().unwrap();
    let (seg, used) = store(d.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    assert_eq!(len, 64 << 10, "the first preallocated size");
    // The records end where the zeros start, and nothing after them is
    // anything but zeros.
    let bytes = std::fs::read(&seg).unwrap();
    assert_ne!(bytes[used as usize - 1], 0);
    assert!(bytes[used as usize..].iter().all(|&b| b == 0));
    assert!(used > 40 && used < 2000, "{used}");

    let (_, v) = json(&[s(&seg)]);
    assert_eq!(v["bytes"], len);
    assert_eq!(v["preallocated_bytes"], len - used);
    let (_, out, _) = run(&[s(&seg)]);
    assert!(
        out.contains(&format!(
            "bytes:     {used} written (header, records, any torn write), {} preallocated",
            len - used
        )),
        "{out}"
    );

    let (code, v) = json(&[s(d.path())]);
    assert_eq!(code, 0);
    let f = &v["files"][0];
    assert_eq!(f["name"], seg.file_name().unwrap().to_str().unwrap());
    assert_eq!(
        (f["bytes"].as_u64(), f["used_bytes"].as_u64()),
        (Some(len), Some(used))
    );
    assert_eq!(f["preallocated_bytes"], len - used);
    // The table's BYTES column is the bytes used; the room has its own.
    let (_, out, _) = run(&[s(d.path())]);
    let row = out
        .lines()
        .find(|l| l.starts_with("segment "))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[5], used.to_string(), "{out}");
    assert_eq!(cells[6], (len - used).to_string(), "{out}");
    assert!(out.contains("BYTES  PREALLOCATED"), "{out}");
}

#[test]
fn a_torn_tail_in_a_preallocated_segment_counts_the_torn_bytes_not_the_room() {
    let d = tempfile::tempdir().unwrap();
    let (seg, used) = store(d.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    // Half a record written into the room: a torn write.
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[used as usize..used as usize + 17].fill(0x5a);
    std::fs::write(&seg, &bytes).unwrap();

    let (code, out, err) = run(&[s(d.path())]);
    assert_eq!(code, 4, "{out}{err}");
    let room = len - used - 17;
    assert!(
        out.contains(&format!(
            "would truncate 17 bytes of torn tail from {} at byte {used}, and the {room} bytes of preallocated room (zeros) after them",
            seg.display()
        )),
        "{out}"
    );
    let (_, v) = json(&[s(d.path())]);
    let t = &v["recovery"]["torn_tail"];
    assert_eq!(
        (t["offset"].as_u64(), t["bytes"].as_u64()),
        (Some(used), Some(len - used))
    );
    assert_eq!(
        (t["record_bytes"].as_u64(), t["preallocated_bytes"].as_u64()),
        (Some(17), Some(room))
    );
    let r = &v["recovery"]["repairs"][0];
    assert_eq!(r["repair"], "truncate");
    assert_eq!(
        (r["record_bytes"].as_u64(), r["preallocated_bytes"].as_u64()),
        (Some(17), Some(room))
    );
    assert_eq!(v["files"][0]["used_bytes"], used + 17);

    // Recovery itself reports the same split, and cuts both.
    let st = ProducerStateStore::open(d.path()).unwrap();
    let torn = st.recovery_report().torn_tail.clone().expect("a torn tail");
    assert_eq!(
        (torn.offset, torn.bytes, torn.preallocated),
        (used, len - used, room)
    );
    st.close().unwrap();
}
