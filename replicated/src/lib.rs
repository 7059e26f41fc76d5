//! producer-state as a replicated state machine on openraft.
//!
//! A partition that lives on three brokers survives the loss of one, and a
//! producer's retry that reaches the new leader after a failover must
//! still be answered `DUPLICATE` with the original offset. This crate runs
//! the producer-state classifier as the state machine of an openraft group
//! (the 0.9 line, storage-v2 traits):
//!
//! - a [`Command`] (one append, or an `append_all` group) is proposed
//!   unclassified; every replica classifies it when it applies the
//!   committed entry ([`command::apply`]), so all replicas compute the same
//!   outcomes from the same log, and the leader answers the client with
//!   the outcome of its own apply;
//! - the offset of an accepted append is its place in the log
//!   ([`command::offset_of`]), the same on every replica;
//! - the Raft log ([`LogStore`]) is the only write-ahead log: the state is
//!   in memory and made durable by snapshots in the core crate's own
//!   checksummed format, which hold the applied log id beside the state
//!   ([`StateMachine`]); after a restart the snapshot is loaded and the
//!   committed entries after it are applied once;
//! - a lagging or new replica is sent that snapshot; it is verified before
//!   it replaces anything ([`state::verify_snapshot`]);
//! - the producer lifecycle is entries too: [`Command::Expire`] carries the
//!   time its proposer read (no replica reads a clock while applying),
//!   [`Command::RemovePartition`] forgets a partition, and
//!   [`Command::ImportPartition`] adds one exported from another group
//!   ([`Cluster::export_partition`]); each is answered with how many keys
//!   it removed or added ([`LifecycleOutcome`]). A store's `truncate_to`
//!   has no counterpart: a replica applies only committed entries, which
//!   are never truncated (docs/scaling.md, "Lifecycle operations").
//!
//! [`Proposer`] batches concurrent requests into shared entries (openraft
//! 0.9 commits one log append per fsync, so without it concurrent
//! producers share no fsync). [`Cluster`] runs replicas in one process over a [`Router`] that can
//! drop, delay, duplicate and reorder messages and cut links: the tests
//! and the `replicated` example use it.
//!
//! Across processes, [`Node`] runs one replica on its own directory and
//! listens on one loopback address for its peers and its clients (the
//! `producer-state-node` binary is a thin layer over it), replicas talk
//! over TCP in frames of a versioned binary encoding ([`wire`],
//! [`transport`]), and [`Client`] finds the leader and retries a command
//! across leader changes, unchanged, so that a retry is answered
//! `DUPLICATE` with the original offset. The durability reasoning, the
//! transport's measurement and the measured costs are in
//! docs/scaling.md; the bytes of the files in docs/format.md.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use producer_state_raft::{Append, Cluster, ClusterOptions, Command, Outcome};
//!
//! let dir = tempfile::tempdir()?;
//! let cluster = Cluster::start(dir.path(), ClusterOptions::default()).await?;
//! let batch = Command::Append(Append::batch(42u64, 0, 0, 0, 9, 1_700_000_000_000));
//! let (_, first) = cluster.submit(batch.clone()).await?;
//! let (_, retry) = cluster.submit(batch).await?;
//! let Outcome::Accepted { offset } = first.outcomes[0] else { unreachable!() };
//! assert_eq!(retry.outcomes[0], Outcome::Duplicate { original: Some((offset, 1_700_000_000_000)) });
//!
//! // A day later (by the batch's timestamp), the producer expires on every replica.
//! let (_, keys) = cluster.submit(Command::Expire {
//!     now_ms: 1_700_000_000_000 + 86_400_000,
//!     expiration_ms: 86_400_000,
//! }).await.map(|(at, r)| (at, r.lifecycle))?;
//! assert_eq!(keys, Some(producer_state_raft::LifecycleOutcome::Expired { keys: 1 }));
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]
// openraft's trait methods return its `StorageError` (224 bytes); the
// helpers that build one return it too rather than box and unbox it.
#![allow(clippy::result_large_err)]

mod client;
pub mod command;
mod log;
mod log_file;
pub mod network;
mod node;
mod proposer;
mod server;
pub mod state;
pub mod transport;
pub mod wire;
mod writer;

use std::io::Read;
use std::path::Path;

use producer_state::fs::FileSystem;

pub use client::{Client, ClientError, ClientOptions, ClientStats};
pub use command::{Append, Command, LifecycleOutcome, Outcome, Producer, Response};
pub use log::{LogOpened, LogStore, OpenLogError};
pub use network::{Faults, Router};
pub use node::{Cluster, ClusterObserver, ClusterOptions, Replica, StartError, SubmitError};
pub use proposer::{Answer, Proposer, ProposerOptions};
pub use server::{Node, NodeOptions, run_node};
pub use state::{ApplyObserver, SnapshotError, StateMachine};
pub use transport::{TcpNetwork, TransportOptions};
pub use wire::Status;
pub use writer::LogStats;

/// A replica's id.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The openraft type configuration of a producer-state group.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Replaces `dir/name` with `bytes`: a temporary file, written (and
/// fsync'ed when `durable`), renamed over the old one, and the directory
/// fsync'ed when `durable`. A crash leaves the old file or the new one.
pub(crate) fn write_atomically(
    fs: &dyn FileSystem,
    dir: &Path,
    name: &str,
    bytes: &[u8],
    durable: bool,
) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    if fs.kind(&tmp)?.is_some() {
        fs.remove_file(&tmp)?;
    }
    let mut f = fs.create_new(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_data()?;
    }
    drop(f);
    fs.rename(&tmp, &dir.join(name))?;
    if durable {
        fs.sync_dir(dir)?;
    }
    Ok(())
}

/// The bytes of `path`, or `None` if it does not exist.
pub(crate) fn read_file(fs: &dyn FileSystem, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    if fs.kind(path)?.is_none() {
        return Ok(None);
    }
    let mut f = fs.open_read(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}
