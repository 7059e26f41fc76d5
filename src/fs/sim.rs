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

use super::{DirEntry, EntryKind, FileSystem, LockGuard, ReadFile, WriteFile};

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

/// The simulated file system. Clones share the same state.
#[derive(Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct Node {
    data: Vec<u8>,
    /// `data[..synced]` is durable, unless `durable` holds an older image
    /// (an overwrite or truncation of synced bytes not synced since).
    synced: usize,
    durable: Option<Vec<u8>>,
}

impl Node {
    fn durable_image(&self) -> &[u8] {
        match &self.durable {
            Some(d) => d,
            None => &self.data[..self.synced],
        }
    }

    /// Before synced bytes change, keep their durable image.
    fn preserve(&mut self) {
        if self.durable.is_none() {
            self.durable = Some(self.data[..self.synced].to_vec());
        }
    }
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
}

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

struct SimRead(Cursor<Vec<u8>>);

impl Read for SimRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl ReadFile for SimRead {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.get_ref().len() as u64)
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

impl WriteFile for SimWrite {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let delay = self.fs.lock().write_delay_per_mib;
        if !delay.is_zero() {
            // A slow disk: the caller is held up, other threads are not.
            std::thread::sleep(delay.mul_f64(buf.len() as f64 / f64::from(1u32 << 20)));
        }
        let mut st = self.fs.lock();
        let go = st.op()?;
        let node = st.node(self.inode)?;
        match go {
            Go::Proceed => {
                node.data.extend_from_slice(buf);
                Ok(())
            }
            Go::Partial => {
                node.data.extend_from_slice(&buf[..buf.len() / 2]);
                Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "simulated ENOSPC after a partial write",
                ))
            }
        }
    }

    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut st = self.fs.lock();
        let go = st.op()?;
        let node = st.node(self.inode)?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let n = match go {
            Go::Proceed => buf.len(),
            Go::Partial => buf.len() / 2,
        };
        if start < node.synced {
            node.preserve();
        }
        let end = start + n;
        if node.data.len() < end {
            node.data.resize(end, 0);
        }
        node.data[start..end].copy_from_slice(&buf[..n]);
        match go {
            Go::Proceed => Ok(()),
            Go::Partial => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "simulated ENOSPC after a partial write",
            )),
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let (delay, len) = {
            let mut st = self.fs.lock();
            st.op()?;
            let delay = st.sync_delay;
            (delay, st.node(self.inode)?.data.len())
        };
        // Like a disk, an fsync takes time while other threads keep writing;
        // only what was written before the call becomes durable.
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut st = self.fs.lock();
        let node = st.node(self.inode)?;
        if node.data.len() >= len && node.durable.is_none() {
            node.synced = node.synced.max(len);
        } else {
            node.synced = node.data.len().min(len);
            node.durable = None;
        }
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut st = self.fs.lock();
        st.op()?;
        let node = st.node(self.inode)?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        if len < node.synced {
            node.preserve();
            node.synced = len;
        }
        node.data.resize(len, 0);
        Ok(())
    }

    fn try_clone(&self) -> io::Result<Box<dyn WriteFile>> {
        Ok(Box::new(SimWrite {
            fs: self.fs.clone(),
            inode: self.inode,
        }))
    }
}

/// A tiny deterministic generator for crash images (splitmix64).
fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

    /// Sets `fault` for the operation with index `op` (0 = the first
    /// operation ever on this file system).
    pub fn set_fault(&self, op: u64, fault: Fault) {
        self.lock().faults.insert(op, fault);
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
            let mut data = node.durable_image().to_vec();
            if node.durable.is_none() && node.data.len() > node.synced {
                let tail = &node.data[node.synced..];
                let seed = |s: u64| mix(s, i as u64);
                match unsynced {
                    Unsynced::Drop => {}
                    Unsynced::Keep => data.extend_from_slice(tail),
                    Unsynced::TornPrefix(s) => {
                        let keep = (seed(s) % (tail.len() as u64 + 1)) as usize;
                        data.extend_from_slice(&tail[..keep]);
                    }
                    Unsynced::Sectors(s) => {
                        let start = data.len();
                        data.extend_from_slice(tail);
                        // Sectors are aligned to the file, as on a disk.
                        let mut sector_start = start - start % 512;
                        while sector_start < data.len() {
                            let end = (sector_start + 512).min(data.len());
                            if seed(s ^ sector_start as u64) % 2 == 0 {
                                for b in &mut data[sector_start.max(start)..end] {
                                    *b = 0;
                                }
                            }
                            sector_start += 512;
                        }
                    }
                }
            }
            let new_inode = out.next_inode;
            out.next_inode += 1;
            out.nodes.insert(
                new_inode,
                Node {
                    synced: data.len(),
                    data,
                    durable: None,
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
        st.nodes.get(inode).map(|n| n.data.clone())
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
            n.data = bytes.to_vec();
            n.synced = bytes.len();
            n.durable = None;
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
            .map(|(p, i)| (p.clone(), st.nodes.get(i).map_or(0, |n| n.data.len())))
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
        st.op()?;
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
                let len = st.nodes.get(i).map_or(0, |n| n.data.len() as u64);
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
        let st = self.lock();
        let inode = st.visible.get(path).ok_or_else(|| not_found(path))?;
        let data = st
            .nodes
            .get(inode)
            .map(|n| n.data.clone())
            .unwrap_or_default();
        Ok(Box::new(SimRead(Cursor::new(data))))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn WriteFile>> {
        let mut st = self.lock();
        st.op()?;
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
        let st = self.lock();
        let inode = *st.visible.get(path).ok_or_else(|| not_found(path))?;
        Ok(Box::new(SimWrite {
            fs: self.clone(),
            inode,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.op()?;
        let inode = st.visible.remove(from).ok_or_else(|| not_found(from))?;
        st.visible.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.op()?;
        st.visible
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        st.op()?;
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
mod tests {
    use super::*;

    fn setup() -> (SimFs, PathBuf) {
        let fs = SimFs::new();
        let dir = PathBuf::from("/s");
        fs.create_dir_all(&dir).unwrap();
        (fs, dir)
    }

    #[test]
    fn only_synced_bytes_and_synced_entries_survive_a_crash() {
        let (fs, dir) = setup();
        let a = dir.join("a");
        let mut f = fs.create_new(&a).unwrap();
        f.write_all(b"hello").unwrap();
        f.sync_data().unwrap();
        // Data synced but the entry not: the file is gone after a crash.
        assert_eq!(fs.crash_image(Unsynced::Keep).read_file(&a), None);
        fs.sync_dir(&dir).unwrap();
        f.write_all(b" world").unwrap();
        let img = fs.crash_image(Unsynced::Drop);
        assert_eq!(img.read_file(&a).as_deref(), Some(&b"hello"[..]));
        let img = fs.crash_image(Unsynced::Keep);
        assert_eq!(img.read_file(&a).as_deref(), Some(&b"hello world"[..]));
        let torn = fs
            .crash_image(Unsynced::TornPrefix(3))
            .read_file(&a)
            .unwrap();
        assert!(torn.starts_with(b"hello") && b"hello world".starts_with(&torn));
    }

    #[test]
    fn renames_and_removals_need_a_directory_sync() {
        let (fs, dir) = setup();
        let (tmp, fin) = (dir.join("x.tmp"), dir.join("x"));
        let mut f = fs.create_new(&tmp).unwrap();
        f.write_all(b"v2").unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(&dir).unwrap();
        fs.rename(&tmp, &fin).unwrap();
        let img = fs.crash_image(Unsynced::Keep);
        assert!(img.read_file(&tmp).is_some() && img.read_file(&fin).is_none());
        fs.sync_dir(&dir).unwrap();
        let img = fs.crash_image(Unsynced::Keep);
        assert!(img.read_file(&tmp).is_none() && img.read_file(&fin).is_some());
        fs.remove_file(&fin).unwrap();
        assert!(fs.crash_image(Unsynced::Keep).read_file(&fin).is_some());
    }

    #[test]
    fn unsynced_directory_changes_survive_in_any_combination() {
        let (fs, dir) = setup();
        let (old, tmp, new) = (dir.join("old"), dir.join("new.tmp"), dir.join("new"));
        for p in [&old, &tmp] {
            let mut f = fs.create_new(p).unwrap();
            f.write_all(b"data").unwrap();
            f.sync_data().unwrap();
        }
        fs.sync_dir(&dir).unwrap();
        // Two unsynced changes: a rename, then a removal.
        fs.rename(&tmp, &new).unwrap();
        fs.remove_file(&old).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let img = fs.crash_image_reordered(Unsynced::Drop, seed);
            let renamed = img.read_file(&new).is_some();
            // A rename is whole: the file has exactly one of its names.
            assert_ne!(renamed, img.read_file(&tmp).is_some(), "seed {seed}");
            assert_eq!(
                img.read_file(&new).or(img.read_file(&tmp)).unwrap(),
                b"data"
            );
            seen.insert((renamed, img.read_file(&old).is_none()));
        }
        // Including the removal without the rename before it.
        assert_eq!(seen.len(), 4, "{seen:?}");

        // A name taken over by a new file brings the rename that freed it:
        // the renamed file never loses all its names.
        fs.sync_dir(&dir).unwrap();
        let moved = dir.join("moved");
        fs.rename(&new, &moved).unwrap();
        let mut f = fs.create_new(&new).unwrap();
        f.write_all(b"other").unwrap();
        f.sync_data().unwrap();
        for seed in 0..64 {
            let img = fs.crash_image_reordered(Unsynced::Drop, seed);
            let data = [img.read_file(&new), img.read_file(&moved)];
            assert!(
                data.iter().any(|d| d.as_deref() == Some(&b"data"[..])),
                "seed {seed}: {data:?}"
            );
        }
    }

    #[test]
    fn truncation_and_overwrite_of_synced_bytes_are_undone_by_a_crash() {
        let (fs, dir) = setup();
        let a = dir.join("a");
        let mut f = fs.create_new(&a).unwrap();
        f.write_all(b"abcdef").unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(&dir).unwrap();
        f.set_len(2).unwrap();
        f.write_all_at(0, b"Z").unwrap();
        assert_eq!(fs.read_file(&a).as_deref(), Some(&b"Zb"[..]));
        assert_eq!(
            fs.crash_image(Unsynced::Keep).read_file(&a).as_deref(),
            Some(&b"abcdef"[..])
        );
        f.sync_data().unwrap();
        assert_eq!(
            fs.crash_image(Unsynced::Drop).read_file(&a).as_deref(),
            Some(&b"Zb"[..])
        );
    }

    #[test]
    fn faults_hit_the_chosen_operation() {
        let (fs, dir) = setup();
        let base = fs.ops();
        fs.set_fault(base + 1, Fault::Error(io::ErrorKind::Other));
        let mut f = fs.create_new(&dir.join("a")).unwrap();
        assert!(f.write_all(b"x").is_err());
        f.write_all(b"y").unwrap();
        fs.set_fault(fs.ops(), Fault::PartialWrite);
        let e = f.write_all(b"1234").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert_eq!(fs.read_file(&dir.join("a")).as_deref(), Some(&b"y12"[..]));
        fs.set_fault(fs.ops(), Fault::Crash);
        assert!(f.sync_data().is_err());
        assert!(f.write_all(b"z").is_err());
        assert!(fs.crashed());
    }

    #[test]
    fn sectors_mode_zeroes_some_sectors_of_the_unsynced_tail() {
        let (fs, dir) = setup();
        let a = dir.join("a");
        let mut f = fs.create_new(&a).unwrap();
        fs.sync_dir(&dir).unwrap();
        f.write_all(&[7u8; 100]).unwrap();
        f.sync_data().unwrap();
        f.write_all(&[9u8; 4096]).unwrap();
        let mut saw_zero = false;
        let mut saw_nine = false;
        for seed in 0..8 {
            let d = fs
                .crash_image(Unsynced::Sectors(seed))
                .read_file(&a)
                .unwrap();
            assert_eq!(d.len(), 4196);
            assert!(d[..100].iter().all(|&b| b == 7));
            saw_zero |= d[100..].contains(&0);
            saw_nine |= d[100..].contains(&9);
        }
        assert!(saw_zero && saw_nine);
    }

    #[test]
    fn locks_are_exclusive_until_dropped() {
        let (fs, dir) = setup();
        let l = fs.try_lock(&dir.join("LOCK")).unwrap();
        assert!(l.is_some());
        assert!(fs.try_lock(&dir.join("LOCK")).unwrap().is_none());
        drop(l);
        assert!(fs.try_lock(&dir.join("LOCK")).unwrap().is_some());
    }
}
