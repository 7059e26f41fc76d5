//! Unit tests of `sim`, in a file of their own beside it (they see its
//! private items through `use super::*`).

use super::*;

fn setup() -> (SimFs, PathBuf) {
    let fs = SimFs::new();
    let dir = PathBuf::from("/s");
    fs.create_dir_all(&dir).unwrap();
    (fs, dir)
}

/// [`setup`] with a new file `a` in the directory, open for writing.
fn setup_file() -> (SimFs, PathBuf, PathBuf, Box<dyn WriteFile>) {
    let (fs, dir) = setup();
    let a = dir.join("a");
    let f = fs.create_new(&a).unwrap();
    (fs, dir, a, f)
}

/// What a crash that treats unsynced writes as `unsynced` leaves of `path`.
fn after_crash(fs: &SimFs, path: &Path, unsynced: Unsynced) -> Option<Vec<u8>> {
    fs.crash_image(unsynced).read_file(path)
}

/// Asserts that such a crash leaves `want` in `path`.
#[track_caller]
fn assert_crash_leaves(fs: &SimFs, path: &Path, unsynced: Unsynced, want: &[u8]) {
    assert_eq!(after_crash(fs, path, unsynced).as_deref(), Some(want));
}

#[test]
fn only_synced_bytes_and_synced_entries_survive_a_crash() {
    let (fs, dir, a, mut f) = setup_file();
    f.write_all(b"hello").unwrap();
    f.sync_data().unwrap();
    // Data synced but the entry not: the file is gone after a crash.
    assert_eq!(after_crash(&fs, &a, Unsynced::Keep), None);
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
    let (fs, dir, a, mut f) = setup_file();
    f.write_all(b"abcdef").unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(&dir).unwrap();
    f.set_len(2).unwrap();
    f.write_all_at(0, b"Z").unwrap();
    assert_eq!(fs.read_file(&a).as_deref(), Some(&b"Zb"[..]));
    assert_crash_leaves(&fs, &a, Unsynced::Drop, b"abcdef");
    // The page cache flushed in time: everything written survives.
    assert_crash_leaves(&fs, &a, Unsynced::Keep, b"Zb");
    f.sync_data().unwrap();
    assert_crash_leaves(&fs, &a, Unsynced::Drop, b"Zb");
}

#[test]
fn an_overwrite_of_durable_bytes_survives_whole_in_part_or_not_at_all() {
    // A preallocated file: 4 KiB of zeros, written and fsync'ed.
    let (fs, dir, a, mut f) = setup_file();
    f.write_zeros(0, 4096).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(&dir).unwrap();
    // A synced overwrite, then an unsynced one across three sectors.
    f.write_all_at(0, &[1; 100]).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(100, &[2; 1200]).unwrap();
    let new = fs.read_file(&a).unwrap();
    assert_eq!(new.len(), 4096);
    let mut durable = new.clone();
    durable[100..1300].fill(0);
    let image = |u| after_crash(&fs, &a, u).unwrap();
    assert_eq!(image(Unsynced::Drop), durable);
    assert_eq!(image(Unsynced::Keep), new);
    let (mut partly, mut prefixes) = (0, 0);
    for seed in 0..32 {
        // Sectors: each sector holds its old bytes or its new ones.
        let img = image(Unsynced::Sectors(seed));
        assert_eq!(img.len(), 4096);
        for s in (0..4096).step_by(512) {
            let sector = &img[s..s + 512];
            assert!(
                sector == &new[s..s + 512] || sector == &durable[s..s + 512],
                "seed {seed} sector {s}"
            );
        }
        partly += usize::from(img != new && img != durable);
        // A torn write keeps a prefix of the new bytes.
        let img = image(Unsynced::TornPrefix(seed));
        let kept = img[100..1300].iter().take_while(|&&b| b == 2).count();
        assert!(img[100 + kept..1300].iter().all(|&b| b == 0), "seed {seed}");
        assert_eq!((&img[..100], &img[1300..]), (&new[..100], &new[1300..]));
        prefixes += usize::from(kept > 0 && kept < 1200);
    }
    assert!(partly > 0 && prefixes > 0, "{partly} {prefixes}");
    // Reading a preallocated file gives its zeros, whatever the buffer.
    let mut r = fs.open_read(&a).unwrap();
    assert_eq!(r.len().unwrap(), 4096);
    let mut all = Vec::new();
    r.read_to_end(&mut all).unwrap();
    assert_eq!(all, new);
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
fn a_partial_write_fault_fails_an_operation_that_is_not_a_write_with_no_effect() {
    let (fs, dir, a, mut f) = setup_file();
    fs.sync_dir(&dir).unwrap();
    f.write_all(b"abc").unwrap();
    fs.set_fault(fs.ops(), Fault::PartialWrite);
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    // The fsync did not happen: a crash keeps nothing of the bytes.
    assert_crash_leaves(&fs, &a, Unsynced::Drop, b"");
    fs.set_fault(fs.ops(), Fault::PartialWrite);
    assert!(fs.rename(&a, &dir.join("b")).is_err());
    assert!(fs.read_file(&a).is_some() && fs.read_file(&dir.join("b")).is_none());
    fs.set_fault(fs.ops(), Fault::PartialWrite);
    assert!(f.set_len(1).is_err());
    assert_eq!(fs.read_file(&a).as_deref(), Some(&b"abc"[..]));
    // Without a fault, the same operations go through.
    f.sync_data().unwrap();
    assert_crash_leaves(&fs, &a, Unsynced::Drop, b"abc");
}

#[test]
fn sectors_mode_zeroes_some_sectors_of_the_unsynced_tail() {
    let (fs, dir, a, mut f) = setup_file();
    fs.sync_dir(&dir).unwrap();
    f.write_all(&[7u8; 100]).unwrap();
    f.sync_data().unwrap();
    f.write_all(&[9u8; 4096]).unwrap();
    let mut saw_zero = false;
    let mut saw_nine = false;
    for seed in 0..8 {
        let d = after_crash(&fs, &a, Unsynced::Sectors(seed)).unwrap();
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
