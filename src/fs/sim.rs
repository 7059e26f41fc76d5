//! A simulated file system that can crash.
//!
//! It keeps, per file, the bytes written and how much of them is durable,
//! and per directory, the entries as seen now and as they would survive a
//! crash. `sync_data` makes a file's bytes durable; `sync_dir` makes a
//! directory's creations, renames and removals durable. A crash image
//! ([`SimFs::crash_image`]) keeps only durable state, plus, if asked, part
//! of the unsynced tail of each file: a prefix (a torn write) or a random
//! subset of its 512-byte sectors (a write whose sectors reached the disk
//! out of order).
//!
//! Every mutating call (create, write, sync, truncate, rename, remove)
//! counts as one operation; a [`Fault`] can be set for any operation index.
//! Directories are durable as soon as they are created.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::{self, Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::file_system::{DirEntry, EntryKind, FileSystem, LockGuard, ReadFile, WriteFile};
use super::sim_node::{Image, Node, Op, Unsynced, mix, survivor};

/// What happens at the chosen operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The operation fails with this error kind and has no effect; later
    /// operations work.
    Error(io::ErrorKind),
    /// A write writes the first half of its bytes, then fails with
    /// `StorageFull` (ENOSPC mid-write); other operations fail with no effect.
    PartialWrite,
    /// The machine stops: this operation and every later one fail and have
    /// no effect. Take [`SimFs::crash_image`] to see what survived.
    Crash,
}

/// The simulated file system. Clones share the same state.
#[derive(Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    nodes: HashMap<u64, Node>,
    next_inode: u64,
    /// Files as visible now, and as a crash would leave them.
    visible: BTreeMap<PathBuf, u64>,
    durable: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    ops: u64,
    faults: BTreeMap<u64, Fault>,
    crashed: bool,
    sync_delay: std::time::Duration,
    /// How long writing one MiB takes (scaled to the write's size).
    write_delay_per_mib: std::time::Duration,
    /// Every call that needs a new file descriptor fails with `EMFILE`
    /// (the process is at its `RLIMIT_NOFILE`), with no effect.
    descriptors_exhausted: bool,
    /// Calls that asked for a new file descriptor (opens, creates,
    /// duplicated handles, directory syncs, lock files), refused or not.
    descriptor_requests: u64,
}

/// `EMFILE` on Linux and the BSDs: the process has no file descriptor left.
const EMFILE: i32 = 24;

fn crash_error() -> io::Error {
    io::Error::other("simulated crash: the machine is down")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

/// What the fault plan says about one mutating operation.
enum Go {
    Proceed,
    Partial,
}

impl State {
    /// Counts a call that needs a new file descriptor, and refuses it with
    /// `EMFILE` while descriptors are exhausted. Not a mutating operation:
    /// fault indices and crash points stay where they were.
    fn descriptor(&mut self) -> io::Result<()> {
        self.descriptor_requests += 1;
        if self.descriptors_exhausted {
            return Err(io::Error::from_raw_os_error(EMFILE));
        }
        Ok(())
    }

    /// Counts one mutating operation and applies the fault set for it.
    fn op(&mut self) -> io::Result<Go> {
        let n = self.ops;
        self.ops += 1;
        if self.crashed {
            return Err(crash_error());
        }
        match self.faults.remove(&n) {
            None => Ok(Go::Proceed),
            Some(Fault::Error(kind)) => Err(io::Error::new(
                kind,
                format!("simulated failure of operation {n}"),
            )),
            Some(Fault::PartialWrite) => Ok(Go::Partial),
            Some(Fault::Crash) => {
                self.crashed = true;
                Err(crash_error())
            }
        }
    }

    /// [`State::op`] for an operation that is not a write: a
    /// [`Fault::PartialWrite`] makes it fail with no effect, like the
    /// other faults (it has no half to do).
    fn op_whole(&mut self) -> io::Result<()> {
        match self.op()? {
            Go::Proceed => Ok(()),
            Go::Partial => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "simulated ENOSPC (a partial-write fault on an operation that is not a write)",
            )),
        }
    }

    fn parent_exists(&self, path: &Path) -> io::Result<()> {
        let parent = path.parent().unwrap_or(Path::new(""));
        if parent.as_os_str().is_empty() || self.dirs.contains(parent) {
            Ok(())
        } else {
            Err(not_found(parent))
        }
    }

    fn node(&mut self, inode: u64) -> io::Result<&mut Node> {
        self.nodes
            .get_mut(&inode)
            .ok_or_else(|| io::Error::other("simulated file handle refers to no file"))
    }
}

/// A file's bytes as they were when it was opened; the zeros of a
/// preallocated file are made up as they are read.
struct SimRead(Cursor<Vec<u8>>, usize);

impl Read for SimRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        let at = self.0.position() as usize;
        let zeros = buf.len().min(self.1.saturating_sub(at));
        buf[..zeros].fill(0);
        self.0.set_position((at + zeros) as u64);
        Ok(zeros)
    }
}

impl ReadFile for SimRead {
    fn len(&self) -> io::Result<u64> {
        Ok(self.1 as u64)
    }

    fn skip(&mut self, n: u64) -> io::Result<()> {
        let at = self.0.position().saturating_add(n);
        self.0.set_position(at);
        Ok(())
    }
}

struct SimWrite {
    fs: SimFs,
    inode: u64,
}

struct SimLock {
    fs: SimFs,
    path: PathBuf,
}

impl LockGuard for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.fs.lock().locks.remove(&self.path);
    }
}

impl SimWrite {
    /// A slow disk: the caller is held up, other threads are not.
    fn write_delay(&self, n: usize) {
        let delay = self.fs.lock().write_delay_per_mib;
        if !delay.is_zero() {
            std::thread::sleep(delay.mul_f64(n as f64 / f64::from(1u32 << 20)));
        }
    }

    /// Writes `buf` at `at` (`None`: the end), half of it on a partial fault.
    fn write(&mut self, at: Option<u64>, buf: &[u8]) -> io::Result<()> {
        self.write_delay(buf.len());
        let mut st = self.fs.lock();
        let go = st.op()?;
        let node = st.node(self.inode)?;
        let start = match at {
            Some(at) => usize::try_from(at).map_err(io::Error::other)?,
            None => node.len(),
        };
        let n = match go {
            Go::Proceed => buf.len(),
            Go::Partial => buf.len() / 2,
        };
        node.change(Op::Write(start, buf[..n].to_vec()));
        match go {
            Go::Proceed => Ok(()),
            Go::Partial => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "simulated ENOSPC after a partial write",
            )),
        }
    }
}

impl WriteFile for SimWrite {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.write(None, buf)
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write(Some(offset), buf)
    }

    /// One operation, however many zeros (a real file system takes many
    /// writes; what survives a crash is modelled the same way).
    fn write_zeros(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let n = usize::try_from(len).map_err(io::Error::other)?;
        self.write_delay(n);
        let mut st = self.fs.lock();
        let go = st.op()?;
        let node = st.node(self.inode)?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        match go {
            Go::Proceed => {
                node.change(Op::Zero(start, n));
                Ok(())
            }
            Go::Partial => {
                node.change(Op::Zero(start, n / 2));
                Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "simulated ENOSPC after a partial write",
                ))
            }
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let (delay, upto) = {
            let mut st = self.fs.lock();
            st.op_whole()?;
            let delay = st.sync_delay;
            (delay, st.node(self.inode)?.next)
        };
        // Like a disk, an fsync takes time while other threads keep writing;
        // only what was written before the call becomes durable.
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut st = self.fs.lock();
        st.node(self.inode)?.sync(upto);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut st = self.fs.lock();
        st.op_whole()?;
        let node = st.node(self.inode)?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        node.change(Op::SetLen(len));
        Ok(())
    }

    fn try_clone(&self) -> io::Result<Box<dyn WriteFile>> {
        self.fs.lock().descriptor()?;
        Ok(Box::new(SimWrite {
            fs: self.fs.clone(),
            inode: self.inode,
        }))
    }
}

impl SimFs {
    /// An empty file system.
    pub fn new() -> SimFs {
        SimFs::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state as it was at the
        // panic; the simulation is for tests, so keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mutating operations performed (or attempted) so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// While `exhausted`, every call that needs a new file descriptor
    /// (opening, creating, duplicating a handle, syncing a directory,
    /// taking a lock) fails with `EMFILE` and has no effect, as when the
    /// process is at its `RLIMIT_NOFILE`; handles already open keep working.
    pub fn set_descriptors_exhausted(&self, exhausted: bool) {
        self.lock().descriptors_exhausted = exhausted;
    }

    /// Calls so far that needed a new file descriptor, refused or not: a
    /// store's steady state should add none.
    pub fn descriptor_requests(&self) -> u64 {
        self.lock().descriptor_requests
    }

    /// Sets `fault` for the operation with index `op` (0 = the first
    /// operation ever on this file system).
    pub fn set_fault(&self, op: u64, fault: Fault) {
        self.lock().faults.insert(op, fault);
    }

    /// Drops every fault set but not yet reached.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Makes every `sync_data` take this long (default zero), the lock on
    /// the simulated disk released meanwhile, so concurrent writers queue
    /// up behind an fsync as they do on a real disk.
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        self.lock().sync_delay = delay;
    }

    /// Makes every `write` take `per_mib` for each MiB it writes (a slow
    /// disk), with the simulated disk released meanwhile.
    pub fn set_write_delay(&self, per_mib: std::time::Duration) {
        self.lock().write_delay_per_mib = per_mib;
    }

    /// True once a [`Fault::Crash`] has happened.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The state a crash right now would leave: durable directory entries
    /// and durable bytes, plus what `unsynced` keeps. A new, independent
    /// file system with no faults, locks or crash.
    pub fn crash_image(&self, unsynced: Unsynced) -> SimFs {
        let st = self.lock();
        Self::image(&st, &st.durable, unsynced)
    }

    /// As [`SimFs::crash_image`], but each directory change made since the
    /// last directory sync (a file created, removed or renamed) survives
    /// or not on its own, chosen by `seed`: nothing orders them, so a
    /// store must fsync the directory wherever one change has to be
    /// durable before another is made. A name taken over by another file
    /// brings the rename that freed it. Not modelled: several changes to
    /// one name between two syncs (a file created then renamed shows only
    /// under its last name, and a rename over a file then away from it may
    /// bring the replaced file back); the store syncs the directory
    /// between such steps.
    pub fn crash_image_reordered(&self, unsynced: Unsynced, seed: u64) -> SimFs {
        let st = self.lock();
        let mut names = st.durable.clone();
        let mut n = 0u64;
        let mut survives = || {
            n += 1;
            mix(seed, n).is_multiple_of(2)
        };
        // Names that are new or name another file now; a rename takes the
        // file's old names with it.
        for (path, &inode) in &st.visible {
            if st.durable.get(path) == Some(&inode) || !survives() {
                continue;
            }
            names.retain(|p, i| *i != inode || st.visible.get(p) == Some(&inode));
            // The file this name held, if it lives on under another name,
            // was renamed there first.
            if let Some(&old) = st.durable.get(path) {
                for (q, _) in st.visible.iter().filter(|&(_, &i)| i == old) {
                    names.insert(q.clone(), old);
                }
            }
            names.insert(path.clone(), inode);
        }
        // Names removed (a renamed file's old name went with its new one).
        for (path, &inode) in &st.durable {
            let gone = !st.visible.contains_key(path);
            let renamed = st.visible.values().any(|&i| i == inode);
            if gone && !renamed && survives() {
                names.remove(path);
            }
        }
        Self::image(&st, &names, unsynced)
    }

    /// The state a crash leaves when `names` are the directory entries
    /// that survive.
    fn image(st: &State, names: &BTreeMap<PathBuf, u64>, unsynced: Unsynced) -> SimFs {
        let mut out = State {
            dirs: st.dirs.clone(),
            ..State::default()
        };
        for (i, (path, inode)) in names.iter().enumerate() {
            let Some(node) = st.nodes.get(inode) else {
                continue;
            };
            let data = survivor(node, unsynced, |s: u64| mix(s, i as u64));
            let new_inode = out.next_inode;
            out.next_inode += 1;
            out.nodes.insert(
                new_inode,
                Node {
                    now: data.clone(),
                    durable: data,
                    ..Node::default()
                },
            );
            out.visible.insert(path.clone(), new_inode);
            out.durable.insert(path.clone(), new_inode);
        }
        SimFs {
            state: Arc::new(Mutex::new(out)),
        }
    }

    /// The bytes of a file as visible now (tests read and damage files with
    /// this and [`SimFs::overwrite`]).
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.lock();
        let inode = st.visible.get(path)?;
        st.nodes.get(inode).map(|n| n.now.to_vec())
    }

    /// Replaces a file's bytes, durably, without counting an operation:
    /// for tests that damage files on purpose. Creates the file if needed.
    pub fn overwrite(&self, path: &Path, bytes: &[u8]) {
        let mut st = self.lock();
        let inode = match st.visible.get(path) {
            Some(i) => *i,
            None => {
                let i = st.next_inode;
                st.next_inode += 1;
                st.nodes.insert(i, Node::default());
                st.visible.insert(path.to_path_buf(), i);
                st.durable.insert(path.to_path_buf(), i);
                i
            }
        };
        if let Some(n) = st.nodes.get_mut(&inode) {
            n.now = Image::of(bytes.to_vec());
            n.durable = n.now.clone();
            n.pending.clear();
        }
    }

    /// Removes a file, durably, without counting an operation (tests).
    pub fn delete(&self, path: &Path) {
        let mut st = self.lock();
        st.visible.remove(path);
        st.durable.remove(path);
    }

    /// The visible files, with their lengths, in path order.
    pub fn files(&self) -> Vec<(PathBuf, usize)> {
        let st = self.lock();
        st.visible
            .iter()
            .map(|(p, i)| (p.clone(), st.nodes.get(i).map_or(0, |n| n.len())))
            .collect()
    }
}

impl fmt::Debug for SimFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("SimFs")
            .field("files", &st.visible.len())
            .field("ops", &st.ops)
            .field("crashed", &st.crashed)
            .finish()
    }
}

impl FileSystem for SimFs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        if st.dirs.contains(path) {
            return Ok(());
        }
        st.op_whole()?;
        if st.visible.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file exists at that path",
            ));
        }
        let mut p = Some(path);
        while let Some(d) = p {
            if !d.as_os_str().is_empty() {
                st.dirs.insert(d.to_path_buf());
            }
            p = d.parent();
        }
        Ok(())
    }

    fn kind(&self, path: &Path) -> io::Result<Option<EntryKind>> {
        let st = self.lock();
        Ok(if st.dirs.contains(path) {
            Some(EntryKind::Dir)
        } else if st.visible.contains_key(path) {
            Some(EntryKind::File)
        } else {
            None
        })
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let st = self.lock();
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let entry = |p: &Path, len, kind| {
            Some(DirEntry {
                name: p.file_name()?.to_str()?.to_string(),
                len,
                kind: Some(kind),
            })
        };
        // Subdirectories too, as the real file system lists them.
        let mut out: Vec<DirEntry> = st
            .visible
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, i)| {
                let len = st.nodes.get(i).map_or(0, |n| n.len() as u64);
                entry(p, len, EntryKind::File)
            })
            .chain(
                st.dirs
                    .iter()
                    .filter(|p| p.parent() == Some(dir))
                    .filter_map(|p| entry(p, 0, EntryKind::Dir)),
            )
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        let mut st = self.lock();
        st.descriptor()?;
        let inode = st.visible.get(path).ok_or_else(|| not_found(path))?;
        let (data, len) = st
            .nodes
            .get(inode)
            .map(|n| (n.now.data.clone(), n.now.len))
            .unwrap_or_default();
        Ok(Box::new(SimRead(Cursor::new(data), len)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let mut st = self.lock();
        st.descriptor()?;
        st.op_whole()?;
        st.parent_exists(path)?;
        if st.visible.contains_key(path) || st.dirs.contains(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        let inode = st.next_inode;
        st.next_inode += 1;
        st.nodes.insert(inode, Node::default());
        st.visible.insert(path.to_path_buf(), inode);
        Ok(Box::new(SimWrite {
            fs: self.clone(),
            inode,
        }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let mut st = self.lock();
        st.descriptor()?;
        let inode = *st.visible.get(path).ok_or_else(|| not_found(path))?;
        Ok(Box::new(SimWrite {
            fs: self.clone(),
            inode,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.op_whole()?;
        let inode = st.visible.remove(from).ok_or_else(|| not_found(from))?;
        st.visible.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.op_whole()?;
        st.visible
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.descriptor()?;
        st.op_whole()?;
        if !st.dirs.contains(path) {
            return Err(not_found(path));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(path);
        st.durable.retain(|p, _| !in_dir(p));
        let now: Vec<(PathBuf, u64)> = st
            .visible
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        st.durable.extend(now);
        Ok(())
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let mut st = self.lock();
        st.descriptor()?;
        if !st.locks.insert(path.to_path_buf()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock {
            fs: self.clone(),
            path: path.to_path_buf(),
        })))
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
