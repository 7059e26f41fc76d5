//! The main job: append, crash, recover, print the outcomes.
//!
//! 1. The four rules, one example of each, through the durable store.
//! 2. A child process (this program again) appends to the same directory
//!    and prints every acknowledged append; after a while it is killed with
//!    SIGKILL, mid-append.
//! 3. The store is reopened: the recovery report, then the outcomes of
//!    retrying the last acknowledged appends (DUPLICATE), of a zombie from
//!    the old epoch (FENCED_EPOCH) and of a new session (ACCEPTED).
//!
//! `cargo run --example demo` uses a temporary directory;
//! `cargo run --example demo -- --dir PATH` keeps the store in PATH (for
//! example to look at it with the inspect-snapshot tool). The samples of
//! that in README.md and docs/inspect.md are checked by
//! inspect/tests/docs.rs, which rebuilds this history step by step: a
//! change to the steps here goes there too.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use producer_state::{Batch, ProducerStateStore, StoreOptions};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PARTITIONS: i32 = 4;
const USAGE: &str = "usage: cargo run --example demo [-- --dir PATH]";

fn main() -> Result<()> {
    let mut keep = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value: {USAGE}"))
        };
        match arg.as_str() {
            "--child" => return child(Path::new(&value()?)),
            "--dir" => keep = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}: {USAGE}").into()),
        }
    }
    let tmp = tempfile::tempdir()?;
    let dir = keep.clone().unwrap_or_else(|| tmp.path().join("store"));
    println!("store directory: {}\n", dir.display());

    println!("== the four rules, through the durable store");
    {
        let store = ProducerStateStore::open(&dir)?;
        let steps: [(i16, i32, &str); 6] = [
            (0, 0, ""),
            (0, 1, ""),
            (0, 1, "retry of the above"),
            (0, 5, "gap: 2, 3, 4 missing"),
            (1, 0, "new session restarts at 0"),
            (0, 2, "stale epoch: a zombie"),
        ];
        for (epoch, sequence, why) in steps {
            let outcome = store.append("p1", 0, epoch, sequence)?;
            let note = if why.is_empty() {
                String::new()
            } else {
                format!("  ({why})")
            };
            println!("append(\"p1\", 0, epoch {epoch}, sequence {sequence}) -> {outcome}{note}");
        }
        store.close()?;
    }

    println!("\n== a producer process appends, and is killed with SIGKILL mid-way");
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--child", &dir.to_string_lossy()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut last: BTreeMap<i32, (i32, String)> = BTreeMap::new();
    let mut acks = 0;
    for line in BufReader::new(child.stdout.take().ok_or("no child stdout")?).lines() {
        let line = line?;
        let mut f = line.split_whitespace();
        if f.next() != Some("ACK") {
            continue;
        }
        let partition: i32 = f.next().ok_or("bad line")?.parse()?;
        let sequence: i32 = f.next().ok_or("bad line")?.parse()?;
        last.insert(partition, (sequence, line.clone()));
        acks += 1;
        if acks == 2000 {
            child.kill()?; // SIGKILL: no clean shutdown, an append in flight
            break;
        }
    }
    child.wait()?;
    println!("producer \"orders\" (epoch 2) was acknowledged {acks} appends, then killed");

    println!("\n== reopen: recovery");
    let store = ProducerStateStore::open(&dir)?;
    println!("{}", store.recovery_report());

    println!("\n== the producer's retries after the crash");
    for (&partition, (sequence, _)) in &last {
        let outcome = store.append_batch("orders", partition, 2, batch(*sequence))?;
        println!(
            "retry append_batch(\"orders\", {partition}, epoch 2, sequence {sequence}) -> {outcome}"
        );
    }
    println!("\n== a zombie from the old session, and the new session");
    let zombie = store.append("orders", 0, 1, 0)?;
    println!(
        "append(\"orders\", 0, epoch 1, sequence 0) -> {zombie}  (the previous epoch: a zombie)"
    );
    let fresh = store.append("orders", 0, 3, 0)?;
    println!("append(\"orders\", 0, epoch 3, sequence 0) -> {fresh}  (a new session)");
    let stale = store.append("orders", 0, 2, last.get(&0).map_or(0, |l| l.0) + 1)?;
    println!("append(\"orders\", 0, epoch 2, next sequence) -> {stale}  (epoch 2 is now fenced)");
    if let Some(path) = store.snapshot()? {
        println!(
            "\nsnapshot written: {} (the next recovery starts from it)",
            path.display()
        );
    }
    store.close()?;
    if keep.is_some() {
        println!("\nkept the store in {}", dir.display());
    }
    Ok(())
}

/// The batch a producer sends with `sequence` (one record per batch here),
/// at the offset a broker would have written it.
fn batch(sequence: i32) -> Batch {
    Batch::new(
        sequence,
        sequence,
        1_000 + i64::from(sequence),
        1_700_000_000_000 + i64::from(sequence),
    )
}

/// The producer process: appends batches round-robin over the partitions
/// with default options (every acknowledged append fsync'ed) until killed.
fn child(dir: &Path) -> Result<()> {
    let store = ProducerStateStore::open_with(dir, StoreOptions::default())?;
    let mut out = std::io::stdout().lock();
    // The previous epoch of this producer, so the parent can show a zombie.
    store.append("orders", 0, 1, 0)?;
    for i in 0.. {
        let partition = i % PARTITIONS;
        let sequence = i / PARTITIONS;
        let outcome = store.append_batch("orders", partition, 2, batch(sequence))?;
        if outcome.is_accepted() {
            writeln!(out, "ACK {partition} {sequence}")?;
            out.flush()?;
        }
    }
    Ok(())
}
