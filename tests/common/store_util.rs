//! Helpers for store tests: options over a simulated file system, and
//! comparing a store's state with the reference model.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use producer_state::fs::SimFs;
use producer_state::{
    AppendRequest, Batch, FsyncPolicy, ManualClock, ProducerStateStore, StoreOptions,
};

use super::model::{Model, same_info};

pub fn dir() -> PathBuf {
    PathBuf::from("/store")
}

/// Small segments and frequent snapshots, so a short workload rolls
/// segments and takes snapshots several times; snapshots inline, a fixed
/// clock and no background expiration, so runs are deterministic (the
/// same IO operations every time). The clock stands at 0, the log clock
/// of a new store: single-sequence appends log no clock record, so an
/// append-only history writes exactly the records it always did.
pub fn sim_opts(fs: &SimFs) -> StoreOptions {
    StoreOptions::default()
        .file_system(Arc::new(fs.clone()))
        .fsync(FsyncPolicy::Always)
        .segment_size(4096)
        .snapshot_every_records(Some(400))
        .snapshot_every_bytes(None)
        .background_snapshots(false)
        .clock(Arc::new(ManualClock::new(0)))
        .expiration_interval(None)
}

/// A deterministic workload of `n` appends over a few keys: mostly in
/// order, with retries, gaps, new sessions and zombies, single and batch.
pub fn workload(n: usize) -> Vec<AppendRequest> {
    let mut model = Model::default();
    let mut out = Vec::with_capacity(n);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = (x % 5) as u8;
        let (id, partition): (producer_state::ProducerId, i32) = match key {
            0 => (1u64.into(), 0),
            1 => (1u64.into(), 1),
            2 => ("p1".into(), 0),
            3 => (u64::MAX.into(), 7),
            _ => ("a-name-longer-than-twenty-four-bytes".into(), 2),
        };
        let (epoch, last) = model
            .entry(&(id.clone(), partition))
            .map_or((0, -1), |e| (e.epoch, e.last));
        let roll = (x >> 8) % 100;
        let (epoch, first) = match roll {
            0..80 => (epoch, last + 1),
            80..86 => (epoch, last.max(0)),
            86..90 => (epoch, last + 3),
            90..95 => (epoch + 1, 0),
            _ => (epoch - 1, last + 1),
        };
        let req = if (x >> 20).is_multiple_of(2) {
            AppendRequest::single(id, partition, epoch, first)
        } else {
            let len = ((x >> 24) % 3) as i32;
            AppendRequest::batch(
                id,
                partition,
                epoch,
                Batch::new(
                    first,
                    first + len,
                    i as i64 * 10,
                    1_700_000_000_000 + i as i64,
                ),
            )
        };
        model.append(&req);
        out.push(req);
    }
    out
}

/// True when the store holds exactly the model's state, each key's last
/// activity included.
pub fn matches(store: &ProducerStateStore, model: &Model) -> bool {
    if store.len() != model.keys.len() {
        return false;
    }
    model.keys.iter().all(|((id, p), m)| {
        store
            .describe(id.clone(), *p)
            .is_some_and(|i| same_info(&i, m))
    })
}

/// A description of the difference, for assertion messages.
pub fn diff(store: &ProducerStateStore, model: &Model) -> String {
    let mut out = format!(
        "store {} keys, model {} keys\n",
        store.len(),
        model.keys.len()
    );
    for ((id, p), m) in &model.keys {
        let i = store.describe(id.clone(), *p);
        if !i.as_ref().is_some_and(|i| same_info(i, m)) {
            out += &format!("  {id}/{p}: store {i:?}, model {m:?}\n");
        }
    }
    out
}

pub fn path(p: &str) -> PathBuf {
    Path::new("/store").join(p)
}
