//! Why a store is poisoned: the failure of a group's write or fsync, and
//! the error each append then gets.

use std::io;
use std::path::PathBuf;

use crate::error::Error;

/// Why the store is poisoned.
#[derive(Clone)]
pub(super) struct Failure {
    pub(super) op: &'static str,
    pub(super) path: PathBuf,
    kind: io::ErrorKind,
    message: String,
    /// Positions of the records lost with the failed group (and queued
    /// behind it).
    pub(super) group: (u64, u64),
}

impl Failure {
    pub(super) fn from_error(e: &Error, group: (u64, u64)) -> Failure {
        match e {
            Error::Io { op, path, source } => Failure {
                op,
                path: path.clone(),
                kind: source.kind(),
                message: source.to_string(),
                group,
            },
            other => Failure {
                op: "write",
                path: PathBuf::new(),
                kind: io::ErrorKind::Other,
                message: other.to_string(),
                group,
            },
        }
    }

    /// The error an append whose record has position `pos` gets.
    pub(super) fn error_for(&self, pos: Option<u64>) -> Error {
        match pos {
            Some(l) if (self.group.0..self.group.1).contains(&l) => Error::Io {
                op: self.op,
                path: self.path.clone(),
                source: io::Error::new(self.kind, self.message.clone()),
            },
            _ => Error::Poisoned {
                op: self.op,
                path: self.path.clone(),
                kind: self.kind,
            },
        }
    }
}
