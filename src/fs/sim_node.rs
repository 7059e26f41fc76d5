//! One simulated file: its bytes as visible now, what certainly survives
//! a crash, the changes in between, and what a crash leaves of it
//! ([`survivor`]). `sim.rs` keeps the files and directories around them.

/// What a crash image keeps of the bytes written but not yet synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unsynced {
    /// Nothing: only synced bytes survive.
    Drop,
    /// Everything written survives (the page cache was flushed in time).
    Keep,
    /// A prefix of each file's unsynced bytes survives: `keep(n)` of them,
    /// where `keep` is derived from the seed (a torn write).
    TornPrefix(u64),
    /// The unsynced bytes keep their length but each 512-byte sector
    /// survives or reads back as zeros, chosen from the seed (sectors
    /// persisted out of order).
    Sectors(u64),
}

/// A file's bytes: `data`, then zeros up to `len` (a preallocated file
/// costs what its written bytes cost, not its length).
#[derive(Clone, Default)]
pub(super) struct Image {
    pub(super) data: Vec<u8>,
    pub(super) len: usize,
}

impl Image {
    pub(super) fn of(data: Vec<u8>) -> Image {
        Image {
            len: data.len(),
            data,
        }
    }

    pub(super) fn write(&mut self, at: usize, bytes: &[u8]) {
        let end = at + bytes.len();
        self.len = self.len.max(end);
        // Zeros past the stored bytes are already there.
        let stored = bytes
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |i| i + 1)
            .max(self.data.len().saturating_sub(at).min(bytes.len()));
        if stored == 0 {
            return;
        }
        if self.data.len() < at + stored {
            self.data.resize(at + stored, 0);
        }
        self.data[at..at + stored].copy_from_slice(&bytes[..stored]);
    }

    pub(super) fn zero(&mut self, at: usize, n: usize) {
        self.len = self.len.max(at + n);
        let end = (at + n).min(self.data.len());
        if at < end {
            self.data[at..end].fill(0);
        }
    }

    pub(super) fn set_len(&mut self, len: usize) {
        self.data.truncate(len);
        self.len = len;
    }

    pub(super) fn apply(&mut self, op: &Op) {
        match op {
            Op::Write(at, bytes) => self.write(*at, bytes),
            Op::Zero(at, n) => self.zero(*at, *n),
            Op::SetLen(len) => self.set_len(*len),
        }
    }

    pub(super) fn to_vec(&self) -> Vec<u8> {
        let mut v = self.data.clone();
        v.resize(self.len, 0);
        v
    }
}

/// A change to a file not yet made durable by an fsync.
#[derive(Clone)]
pub(super) enum Op {
    Write(usize, Vec<u8>),
    /// Zeros written (not a hole: real writes, as a preallocation does).
    Zero(usize, usize),
    SetLen(usize),
}

impl Op {
    /// Bytes it writes (a truncation counts as one unit).
    pub(super) fn weight(&self) -> usize {
        match self {
            Op::Write(_, b) => b.len(),
            Op::Zero(_, n) => *n,
            Op::SetLen(_) => 1,
        }
    }
}

/// A file: its bytes as visible now, what certainly survives a crash, and
/// the changes in between, in the order they were made (each numbered).
/// An overwrite of durable bytes is a change like an append: a crash may
/// keep it, lose it, or keep some of its sectors, and what it overwrote
/// comes back if it is lost.
#[derive(Default)]
pub(super) struct Node {
    pub(super) now: Image,
    pub(super) durable: Image,
    pub(super) pending: std::collections::VecDeque<(u64, Op)>,
    /// The number of the next change.
    pub(super) next: u64,
}

impl Node {
    pub(super) fn change(&mut self, op: Op) {
        self.now.apply(&op);
        self.pending.push_back((self.next, op));
        self.next += 1;
    }

    /// The changes numbered below `upto` are durable.
    pub(super) fn sync(&mut self, upto: u64) {
        while let Some((n, _)) = self.pending.front()
            && *n < upto
        {
            if let Some((_, op)) = self.pending.pop_front() {
                self.durable.apply(&op);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.now.len
    }
}

/// A tiny deterministic generator for crash images (splitmix64).
pub(super) fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a crash leaves of a file: its durable image with some of its
/// pending changes applied, as `unsynced` says (`seed` varies per file).
pub(super) fn survivor(node: &Node, unsynced: Unsynced, seed: impl Fn(u64) -> u64) -> Image {
    let mut img = node.durable.clone();
    match unsynced {
        Unsynced::Drop => {}
        Unsynced::Keep => node.pending.iter().for_each(|(_, op)| img.apply(op)),
        Unsynced::TornPrefix(s) => {
            // The changes in order, the last one kept cut short.
            let total: usize = node.pending.iter().map(|(_, op)| op.weight()).sum();
            let mut keep = (seed(s) % (total as u64 + 1)) as usize;
            for (_, op) in &node.pending {
                if keep == 0 {
                    break;
                }
                let w = op.weight();
                if keep >= w {
                    img.apply(op);
                    keep -= w;
                    continue;
                }
                match op {
                    Op::Write(at, b) => img.write(*at, &b[..keep]),
                    Op::Zero(at, _) => img.zero(*at, keep),
                    Op::SetLen(_) => {}
                }
                break;
            }
        }
        Unsynced::Sectors(s) => {
            // Every change lands with the length it gives the file, but
            // each 512-byte sector it touches keeps its new bytes or its
            // old ones (zeros past the durable end), chosen from the seed.
            for (n, op) in &node.pending {
                let (at, bytes): (usize, std::borrow::Cow<'_, [u8]>) = match op {
                    Op::Write(at, b) => (*at, b.as_slice().into()),
                    Op::Zero(at, len) => (*at, vec![0; *len].into()),
                    Op::SetLen(len) => {
                        if seed(s ^ n.wrapping_mul(0x5851_f42d)).is_multiple_of(2) {
                            img.set_len(*len);
                        }
                        continue;
                    }
                };
                let end = at + bytes.len();
                img.len = img.len.max(end);
                let mut sector = at - at % 512;
                while sector < end {
                    let from = sector.max(at);
                    let to = (sector + 512).min(end);
                    if !seed(s ^ (sector as u64) ^ n.wrapping_mul(0x5851_f42d)).is_multiple_of(2) {
                        img.write(from, &bytes[from - at..to - at]);
                    }
                    sector += 512;
                }
            }
        }
    }
    img
}
