//! One side of a snapshot at a time, for a profiler (callgrind counts
//! instructions, which the shared host's load does not move).
//!
//! `snapprof build DIR KEYS BATCHES` builds a store of `KEYS` keys with
//! `BATCHES` one-record batches each (as `snapshot_bench` builds them) and
//! snapshots it; then, each alone, `snapprof write DIR` takes one more
//! snapshot (its open included: profile `ProducerStateStore::snapshot`
//! with `--toggle-collect`), `snapprof read DIR` decodes the newest
//! snapshot with the library's reader (nothing inserted) and
//! `snapprof reopen DIR` opens the store (loads the snapshot). E.g.
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*ProducerStateStore*snapshot*' \
//!     target/release/examples/snapprof write /tmp/s5
//! ```

use std::path::Path;

use producer_state::fs::StdFs;
use producer_state::{Batch, ProducerStateStore};

use producer_state_bench::snapshot_store::{T0, build, opts};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: snapprof build DIR KEYS BATCHES | write DIR | read DIR | reopen DIR";
    let (Some(what), Some(dir)) = (args.get(1), args.get(2)) else {
        return Err(usage.into());
    };
    let dir = Path::new(dir);
    match what.as_str() {
        "build" => {
            let keys: u64 = args.get(3).ok_or(usage)?.parse()?;
            let batches: u64 = args.get(4).ok_or(usage)?.parse()?;
            build(dir, keys, batches)?;
        }
        "write" => {
            let store = ProducerStateStore::open_with(dir, opts())?;
            // One more batch, so there is something to snapshot.
            let s = store.get(0, 0).ok_or("key 0 missing")?.last_sequence() + 1;
            let at = 1 << 40;
            assert!(
                store
                    .append_batch(0, 0, 0, Batch::new(s, s, at, T0 + at))?
                    .is_accepted()
            );
            store.sync()?;
            store.snapshot()?.ok_or("no snapshot taken")?;
            store.close()?;
        }
        "read" => {
            let newest = std::fs::read_dir(dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "snap"))
                .max()
                .ok_or("no snapshot")?;
            let s = producer_state::inspect::decode_snapshot(&StdFs, &newest)?;
            println!("{} entries", s.entries);
        }
        "reopen" => {
            let store = ProducerStateStore::open_with(dir, opts())?;
            println!("{} keys", store.len());
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
