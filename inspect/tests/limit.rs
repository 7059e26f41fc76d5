//! `--limit N`: at most N keys and N records are listed (a 64 MiB segment
//! holds millions of records, hundreds of MB of JSON), while the counts
//! and the verdict still cover everything.

mod common;

use common::{files, json, run, s};
use producer_state::{Batch, ProducerStateStore, StoreOptions};

#[test]
fn limit_bounds_the_listed_records_and_keys_not_the_counts() {
    let d = tempfile::tempdir().unwrap();
    let st = ProducerStateStore::open_with(d.path(), StoreOptions::default()).unwrap();
    for i in 0..300i32 {
        let k = (i % 30) as u64;
        st.append_batch(k, 0, 0, Batch::new(i / 30, i / 30, i64::from(i), 1_000))
            .unwrap();
    }
    st.close().unwrap();
    let seg = files(d.path(), ".wal").pop().unwrap();

    // Without a limit: everything, and no total (nothing was cut).
    let (code, v) = json(&[s(&seg)]);
    assert_eq!(code, 0);
    assert_eq!(v["records"].as_array().unwrap().len(), 300);
    assert!(v.get("records_total").is_none(), "{}", v["records_total"]);

    let (code, v) = json(&[s(&seg), "--limit", "7"]);
    assert_eq!(code, 0);
    let recs = v["records"].as_array().unwrap();
    assert_eq!(recs.len(), 7);
    assert_eq!(recs[6]["position"], 6, "the first seven, in log order");
    assert_eq!(v["records_total"], 300);
    assert_eq!(v["entry_count"], 300, "every record is still counted");
    let (_, out, _) = run(&[s(&seg), "--limit", "7"]);
    assert!(out.contains("(7 of 300 records shown: --limit)"), "{out}");
    // The filter applies first: the total is of the kept records.
    let (_, v) = json(&[s(&seg), "--limit", "4", "--producer", "3"]);
    assert_eq!(v["records"].as_array().unwrap().len(), 4);
    assert_eq!(v["records_total"], 10);

    // Keys of a store and of a snapshot.
    let (code, v) = json(&[s(d.path()), "--limit", "5"]);
    assert_eq!(code, 0);
    let e = v["entries"].as_array().unwrap();
    assert_eq!(
        (
            e.len(),
            v["entries_total"].as_u64(),
            v["entry_count"].as_u64()
        ),
        (5, Some(30), Some(30))
    );
    assert_eq!(e[4]["producer_id"], "4", "the first five by id");
    let (_, out, _) = run(&[s(d.path()), "--limit", "5"]);
    assert!(out.contains("(5 of 30 keys shown: --limit)"), "{out}");
    let (_, v) = json(&[s(d.path()), "--limit", "30"]);
    assert!(v.get("entries_total").is_none(), "nothing cut: {v}");
}
