//! inspect-snapshot: look inside a producer-state store, or a Kafka
//! producer snapshot, without running a broker.
//!
//! A renderer over `producer_state::inspect` and `producer_state::kafka`:
//! the library reads (with the readers recovery itself uses) and decides
//! what each finding means (the verdicts and exit codes); this tool prints
//! that, as tables or JSON, from typed view structs. It reads through
//! `ReadOnlyFs(StdFs)` and takes no lock. See docs/inspect.md for the
//! output, the JSON fields and the exit codes. Only paths that hold no
//! store (a broker's directories, a Kafka log segment) are the tool's own
//! to recognise (`place.rs`): nothing in them is the library's to read.
//!
//! This file parses the command line, picks the view for the path and
//! prints it. One module per view: `snapshot.rs`, `segment.rs`,
//! `kafka_snapshot.rs`, `dir.rs` (a store directory) and `not_store.rs`
//! (a broker directory, a Kafka log segment) fill the output; `view.rs`
//! is the output's types, `state.rs` a recovered state's keys, `human.rs`
//! the tables, `filter.rs` and `progress.rs` the options' helpers.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use producer_state::fs::{ReadOnlyFs, StdFs};
use producer_state::inspect::{self, FileKind, Verdict};
use producer_state::{Error, ProducerId};

mod dir;
mod filter;
mod human;
mod kafka_snapshot;
mod not_store;
mod place;
mod progress;
mod segment;
mod snapshot;
mod state;
mod view;

use filter::{Filter, Show};
use progress::Progress;
use view::{Damage, Document, Output, SCHEMA_VERSION, Unreadable, verdict_word};

/// Inspect a producer-state snapshot, log segment or store directory, or an
/// Apache Kafka producer snapshot (`<offset>.snapshot`), read-only.
///
/// PATH is detected by name and content. A directory is listed file by
/// file, then recovery is run as a dry run (nothing is written, no lock is
/// taken) to show the state it would rebuild and what it would truncate or
/// refuse. A broker's data or partition directory is not a store: the
/// stores under it are named (`--all` inspects every one), and a Kafka log
/// segment (`<offset>.log`) is recognised but not read.
///
/// Exit codes: 0 everything verifies; 1 damage that recovery would refuse
/// (or a file of no known kind); 2 usage error; 3 a file could not be read;
/// 4 damage with which recovery still opens the store (a torn tail it
/// cuts, a snapshot it skips, damage in the log only a fallback to an
/// older snapshot would need); 5 no store here, nothing verified (a
/// directory without a store file, where opening would make a new store; a
/// broker directory without `--all`; a Kafka log segment).
#[derive(Parser, Debug)]
#[command(name = "inspect-snapshot", version)]
struct Args {
    /// A snapshot (`.snap`), a log segment (`.wal`), a store directory, or a
    /// Kafka snapshot (`.snapshot`); also recognised: a broker's data or
    /// partition directory (its stores are named) and a Kafka log segment
    /// (`.log`, not read).
    path: PathBuf,
    /// Print one JSON document instead of tables (field names in docs/inspect.md).
    #[arg(long)]
    json: bool,
    /// Print no table: exit 0 if everything verifies, else a non-zero code,
    /// with the file, byte offset and kind of damage on stderr (or, for a
    /// path that holds no store, what it is).
    #[arg(long)]
    verify: bool,
    /// Only this producer: a number for numeric ids (Kafka's may be
    /// negative), anything else for names.
    #[arg(long, value_name = "ID", allow_negative_numbers = true)]
    producer: Option<String>,
    /// Only this partition.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    partition: Option<i32>,
    /// A broker's data or partition directory: inspect every store it
    /// names, in one run (the exit code is the worst of theirs).
    #[arg(long)]
    all: bool,
    /// Show at most N keys and N records (the first N, in the order shown);
    /// the counts and the verdict still cover everything. A 64 MiB segment
    /// holds over a million records.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// The time, in milliseconds since the epoch, at which a Kafka-mode
    /// state's open transactions are judged late (hanging); default now.
    #[arg(long, value_name = "MS")]
    now: Option<i64>,
    /// Kafka's `transaction.max.timeout.ms`: an oldest open transaction
    /// whose producer is idle longer than this plus 5 minutes is late.
    #[arg(long, value_name = "MS", default_value_t = 900_000)]
    transaction_max_timeout_ms: i64,
}

const UNREADABLE: u8 = 3;

fn run(args: &Args) -> Result<Output, Unreadable> {
    let f = Filter {
        producer: args.producer.as_ref().map(|p| match p.parse::<u64>() {
            Ok(n) => ProducerId::numeric(n),
            Err(_) => ProducerId::from(p.as_str()),
        }),
        kafka_producer: args.producer.as_ref().map(|p| p.parse::<i64>().ok()),
        partition: args.partition,
    };
    let show = Show {
        filter: &f,
        list: !args.verify,
        limit: args.limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        now_ms: args.now.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }),
        max_transaction_timeout_ms: args.transaction_max_timeout_ms,
    };
    let path = &args.path;
    let mut out = Output::new(path, "unknown", "");
    let io = |op| {
        move |e| {
            Unreadable(Error::Io {
                op,
                path: path.clone(),
                source: e,
            })
        }
    };
    let meta = std::fs::metadata(path).map_err(io("stat"))?;
    if meta.is_dir() {
        let broker = match place::holds_store_files(path).map_err(io("list"))? {
            true => None,
            false => place::broker(path).map_err(io("list"))?,
        };
        match broker {
            Some(b) => not_store::broker(path, b, args.all, &mut out, &show)?,
            None => dir::inspect(path, &mut out, &show)?,
        }
    } else {
        match inspect::detect(&ReadOnlyFs(StdFs), path) {
            Ok(Some(FileKind::Snapshot)) => snapshot::inspect(path, &mut out, &show)?,
            Ok(Some(FileKind::Segment)) => segment::inspect(path, &mut out, &show)?,
            Ok(Some(FileKind::KafkaSnapshot)) => kafka_snapshot::inspect(path, &mut out, &show)?,
            Ok(_) if not_store::kafka_log(path, &mut out).map_err(io("read"))? => {}
            // A kind this tool does not know yet (the library's list can grow).
            Ok(_) => {
                out.format = format!(
                    "unknown ({} bytes): not a snapshot, segment or Kafka snapshot",
                    meta.len()
                );
                out.damage.push(Damage {
                    file: path.display().to_string(),
                    offset: Some(0),
                    kind: "not a file of a known kind (neither name nor first bytes match)".into(),
                    severity: Verdict::Refused,
                });
            }
            Err(e) => return Err(Unreadable(e)),
        }
        // A file on its own: as bad as its worst damage.
        out.code = out
            .damage
            .iter()
            .map(|d| d.severity)
            .max()
            .unwrap_or(Verdict::Ok);
    }
    if out.not_a_store.is_none() {
        out.verdict = verdict_word(out.code);
    }
    Ok(out)
}

/// Prints the output; an error only if stdout fails.
fn print(args: &Args, out: &Output) -> io::Result<()> {
    let stdout = progress::Ticking {
        inner: io::stdout().lock(),
        written: 0,
        progress: Progress::for_output("writing the output: bytes"),
    };
    let mut w = io::BufWriter::with_capacity(1 << 16, stdout);
    if args.json {
        let doc = Document {
            schema_version: SCHEMA_VERSION,
            output: out,
        };
        serde_json::to_writer_pretty(&mut w, &doc)?;
        writeln!(w)?;
    } else if !args.verify {
        human::print(
            &mut w,
            out,
            &mut Progress::for_output("rendering the tables: rows"),
        )?;
    }
    w.flush()
}

fn main() -> ExitCode {
    progress::start();
    let args = Args::parse();
    if args.all && !std::fs::metadata(&args.path).is_ok_and(|m| m.is_dir()) {
        use clap::CommandFactory;
        Args::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--all takes a directory: a broker's data or partition directory (or a store)",
            )
            .exit();
    }
    // Writes to stderr that fail (a closed stderr) are dropped: there is
    // nowhere left to say anything.
    let mut err = io::stderr().lock();
    let out = match run(&args) {
        Ok(o) => o,
        Err(Unreadable(e)) => {
            let _ = writeln!(err, "inspect-snapshot: cannot read: {e}");
            return ExitCode::from(UNREADABLE);
        }
    };
    if let Some(what) = out.not_a_store {
        let _ = writeln!(
            err,
            "{}: {}: {}",
            what.word(),
            out.path,
            human::not_a_store_line(&out)
        );
    }
    let nested = out.inspected.iter().flat_map(|o| &o.damage);
    for d in out.damage.iter().chain(nested) {
        let _ = writeln!(
            err,
            "{}: {}{}: {}",
            if d.severity == Verdict::Refused {
                "damaged"
            } else {
                "repairable"
            },
            d.file,
            d.offset.map_or(String::new(), |o| format!(" at byte {o}")),
            d.kind
        );
    }
    match print(&args, &out) {
        Ok(()) => {}
        // The reader went away (`| head`): stop quietly, as Unix tools
        // do, with the verdict's exit code (it does not depend on how much
        // was printed).
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            let _ = writeln!(err, "inspect-snapshot: cannot write the output: {e}");
            return ExitCode::from(UNREADABLE);
        }
    }
    ExitCode::from(out.exit_code())
}
