//! The Raft log file across restarts: what was appended comes back; a
//! torn tail (an append cut by a crash, never acknowledged) is cut and
//! reported; damage followed by valid records is refused, since a replica
//! must not forget entries it acknowledged; truncate and purge survive a
//! reopen; the vote survives a reopen; a committed hint a crash left
//! beyond the log is dropped; crafted bytes behind damage cost what
//! benign ones cost.

use std::io::Write;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, Vote};
use producer_state_raft::command::MAX_COMMAND_BYTES;
use producer_state_raft::{
    Append, Command, Faults, LogStore, OpenLogError, Replica, Router, TypeConfig,
};

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: if index.is_multiple_of(5) {
            EntryPayload::Blank
        } else {
            EntryPayload::Normal(Command::Append(Append::batch(
                index,
                (index % 3) as i32,
                0,
                0,
                9,
                index as i64,
            )))
        },
    }
}

async fn all(log: &mut LogStore) -> Vec<Entry<TypeConfig>> {
    log.try_get_log_entries(0..u64::MAX).await.unwrap()
}

fn log_path(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("raft.log")
}

/// A closed log of entries 1..=10 of term 1, written in two appends (so
/// two writes: 1..=5, then 6..=10), its file's bytes, and where the second
/// write starts.
async fn ten_entries() -> (tempfile::TempDir, Vec<u8>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((1..=5).map(|i| entry(1, i)))
        .await
        .unwrap();
    let second = std::fs::metadata(log_path(dir.path())).unwrap().len() as usize;
    log.blocking_append((6..=10).map(|i| entry(1, i)))
        .await
        .unwrap();
    drop(log);
    let full = std::fs::read(log_path(dir.path())).unwrap();
    (dir, full, second)
}

#[tokio::test]
async fn entries_and_the_vote_come_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!(opened.entries, 0);
    let written: Vec<_> = (1..=20).map(|i| entry(2, i)).collect();
    log.blocking_append(written.clone()).await.unwrap();
    let vote = Vote::new_committed(2, 1);
    log.save_vote(&vote).await.unwrap();
    drop(log);
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!((opened.entries, opened.torn_bytes), (20, 0));
    assert_eq!(all(&mut log).await, written);
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(written[19].log_id));
}

#[tokio::test]
async fn a_torn_tail_is_cut_and_reported_and_the_log_goes_on() {
    let (dir, full, _) = ten_entries().await;
    // Every cut inside the last record leaves the first nine.
    let (mut probe, _) = LogStore::open(dir.path()).unwrap();
    let nine = all(&mut probe).await[..9].to_vec();
    drop(probe);
    let last_len = {
        let d = tempfile::tempdir().unwrap();
        let (mut l, _) = LogStore::open(d.path()).unwrap();
        let header = std::fs::metadata(log_path(d.path())).unwrap().len();
        l.blocking_append([entry(1, 10)]).await.unwrap();
        (std::fs::metadata(log_path(d.path())).unwrap().len() - header) as usize
    };
    let tenth = full.len() - last_len;
    for cut in tenth + 1..full.len() {
        std::fs::write(log_path(dir.path()), &full[..cut]).unwrap();
        let (mut log, opened) = LogStore::open(dir.path()).unwrap();
        assert_eq!(opened.torn_bytes as usize, cut - tenth);
        assert_eq!(all(&mut log).await, nine, "cut at {cut}");
        // The file was cut: an append now follows record 9 directly (a
        // write of its own, so only its write start differs).
        log.blocking_append([entry(1, 10)]).await.unwrap();
        drop(log);
        let now = std::fs::read(log_path(dir.path())).unwrap();
        assert_eq!((now.len(), &now[..tenth]), (full.len(), &full[..tenth]));
        let (mut log, _) = LogStore::open(dir.path()).unwrap();
        assert_eq!(all(&mut log).await.len(), 10);
    }
    // Garbage after the last record (a write that never finished).
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(log_path(dir.path()))
        .unwrap();
    f.write_all(&[0xAB; 37]).unwrap();
    drop(f);
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!((opened.entries, opened.torn_bytes), (10, 37));
    assert_eq!(all(&mut log).await.len(), 10);
}

#[tokio::test]
async fn damage_before_a_later_write_is_refused_and_in_the_last_write_is_cut() {
    let (dir, full, second) = ten_entries().await;
    let (mut probe, _) = LogStore::open(dir.path()).unwrap();
    let written = all(&mut probe).await;
    drop(probe);
    // A bit flipped anywhere in the header or the first write, which the
    // second write follows (so the first was fsync'ed): refused, never a
    // panic, never a shorter log.
    for at in 0..second {
        let mut bad = full.clone();
        bad[at] ^= 0x20;
        std::fs::write(log_path(dir.path()), &bad).unwrap();
        match LogStore::open(dir.path()) {
            Err(OpenLogError::Corrupt { offset, .. }) => assert!(offset as usize <= at),
            Err(e) => panic!("flip at {at}: {e}"),
            Ok(_) => panic!("flip at {at} was accepted"),
        }
    }
    // In the last write, damage looks like that write torn by a crash
    // before its fsync (its sectors persisted out of order): the log is cut
    // there, keeping the first write and whole records before the damage.
    for at in second..full.len() {
        let mut bad = full.clone();
        bad[at] ^= 0x20;
        std::fs::write(log_path(dir.path()), &bad).unwrap();
        let (mut log, opened) = LogStore::open(dir.path()).unwrap();
        let kept = all(&mut log).await;
        assert!(
            kept.len() >= 5 && kept.len() < 10,
            "flip at {at}: {}",
            kept.len()
        );
        assert_eq!(kept[..], written[..kept.len()], "flip at {at}");
        assert!(opened.torn_bytes > 0);
    }
}

#[tokio::test]
async fn truncate_and_purge_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((1..=3000).map(|i| entry(1, i)))
        .await
        .unwrap();
    // A new leader's log replaces 2901.. with entries of term 2.
    log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 2901))
        .await
        .unwrap();
    log.blocking_append((2901..=2950).map(|i| entry(2, i)))
        .await
        .unwrap();
    let before = std::fs::metadata(log_path(dir.path())).unwrap().len();
    // A snapshot at 2000: the log below it goes, and the file is rewritten.
    let purged = LogId::new(CommittedLeaderId::new(1, 1), 2000);
    log.purge(purged).await.unwrap();
    let after = std::fs::metadata(log_path(dir.path())).unwrap().len();
    assert!(after < before / 2, "{after} of {before} bytes kept");
    let want = all(&mut log).await;
    assert_eq!(want.len(), 950);
    assert_eq!(want[0].log_id.index, 2001);
    assert_eq!(want[949], entry(2, 2950));
    drop(log);
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!(opened.entries, 950);
    assert_eq!(all(&mut log).await, want);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(purged));
    // A snapshot installed past the end of the log purges everything; the
    // log then starts after the snapshot.
    let far = LogId::new(CommittedLeaderId::new(3, 2), 5000);
    log.purge(far).await.unwrap();
    log.blocking_append((5001..=5003).map(|i| entry(3, i)))
        .await
        .unwrap();
    drop(log);
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    let left = all(&mut log).await;
    assert_eq!(
        left.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        [5001, 5002, 5003]
    );
}

#[tokio::test]
async fn crafted_bytes_after_damage_cost_no_more_than_ff_bytes() {
    // Behind the last record, 1 MiB of `ff` bytes (no offset claims a
    // record: every length field reads 2^32 - 1), or of `01 00 01 00 00 00
    // 00 00` repeated: then every eighth offset claims a command record of
    // 65,537 bytes whose length, kind and write start (the same eight bytes,
    // 32 bytes on) are plausible, so only its checksum can refuse it, which
    // a search computing it in full pays 64 KiB for (8 GiB in all). Both are
    // a torn tail, and both must open in about the same time: the crafted
    // bytes at most 3 times as long (the best of five opens of each,
    // interleaved, in this run, against noise).
    const TAIL: usize = 1 << 20;
    let (dir, full, _) = ten_entries().await;
    let open = |tail: &[u8]| {
        let mut bytes = full.clone();
        bytes.extend_from_slice(tail);
        std::fs::write(log_path(dir.path()), &bytes).unwrap();
        let t = std::time::Instant::now();
        let (log, opened) = LogStore::open(dir.path()).unwrap();
        let took = t.elapsed();
        drop(log);
        assert_eq!((opened.entries, opened.torn_bytes), (10, TAIL as u64));
        took
    };
    let ff = vec![0xffu8; TAIL];
    let crafted = [0x01u8, 0x00, 0x01, 0x00, 0, 0, 0, 0].repeat(TAIL / 8);
    let (mut f, mut c) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        f.push(open(&ff));
        c.push(open(&crafted));
    }
    let (f, c) = (f.into_iter().min().unwrap(), c.into_iter().min().unwrap());
    eprintln!("open behind {TAIL} bytes: ff bytes {f:?}, crafted {c:?}");
    assert!(
        c <= 3 * f,
        "crafted bytes took {c:?} to open, ff bytes {f:?}: more than 3 times as long"
    );
}

#[tokio::test]
async fn a_write_torn_by_a_crash_after_a_truncation_is_cut_not_refused() {
    // Entries 1..=10 go out in one write. A new leader truncates the log
    // at 6 and appends 6..=20 of its term in one write, whose fsync never
    // returns: the machine stops, and the write's sectors reach the disk
    // out of order (its first 444 bytes, six records, read back as zeros;
    // the rest arrived). Nothing of that write was acknowledged, so the
    // log must open with 1..=5 and cut the rest, as after any torn write;
    // the records left of the first write must not pass for the write
    // before a later one.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((1..=10).map(|i| entry(1, i)))
        .await
        .unwrap();
    log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 6))
        .await
        .unwrap();
    let torn_at = std::fs::metadata(log_path(dir.path())).unwrap().len() as usize;
    log.blocking_append((6..=20).map(|i| entry(2, i)))
        .await
        .unwrap();
    let kept = all(&mut log).await[..5].to_vec();
    drop(log);
    let mut bytes = std::fs::read(log_path(dir.path())).unwrap();
    let record = (bytes.len() - torn_at) / 15;
    bytes[torn_at..torn_at + 6 * record].fill(0);
    std::fs::write(log_path(dir.path()), &bytes).unwrap();
    let (mut log, opened) = match LogStore::open(dir.path()) {
        Ok(l) => l,
        Err(e) => panic!("a torn write after a truncation was refused: {e}"),
    };
    assert_eq!(all(&mut log).await, kept);
    assert_eq!(opened.torn_bytes as usize, bytes.len() - torn_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_hint_beyond_the_log_is_dropped_and_the_replica_starts() {
    // openraft 0.9 commits on a follower up to what it accepted from the
    // leader, before its own append of those entries is flushed, and the
    // hint is written without an fsync. A machine crash can then keep the
    // hint (8) and lose the unsynced entries (6..=8) of a log that starts
    // at 0, as openraft's does: the replica must
    // still start, and learn the commit from the leader again.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((0..=5).map(|i| entry(1, i)))
        .await
        .unwrap();
    log.save_committed(Some(LogId::new(CommittedLeaderId::new(1, 1), 8)))
        .await
        .unwrap();
    drop(log);
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    assert_eq!(log.read_committed().await.unwrap(), None);
    drop(log);
    let config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..openraft::Config::default()
    };
    let router = Router::new(Faults::none(), 0);
    let started = Replica::start(
        1,
        dir.path(),
        &router,
        std::sync::Arc::new(config.validate().unwrap()),
        None,
    )
    .await;
    let replica = match started {
        Ok(r) => r,
        Err(e) => panic!("the replica does not start: {e}"),
    };
    assert_eq!(replica.state().0, None);
    replica.raft().shutdown().await.unwrap();

    // A hint the log holds is kept.
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    let at_3 = LogId::new(CommittedLeaderId::new(1, 1), 3);
    log.save_committed(Some(at_3)).await.unwrap();
    drop(log);
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    assert_eq!(log.read_committed().await.unwrap(), Some(at_3));
}

#[tokio::test]
async fn the_longest_valid_command_is_read_back_and_a_longer_entry_is_refused_unwritten() {
    // A group of named batches exactly at the limit `Command::validate`
    // sets; one more append takes it past.
    let named = |n: usize| Append::batch("n".repeat(n).as_str(), 0, 0, 0, 0, 0);
    let head = named(0).encoded_len();
    let share = MAX_COMMAND_BYTES / 512;
    let mut group = vec![named(share - head); 511];
    group.push(named(share - 5 - head));
    let longest = Command::AppendAll(group.clone());
    assert_eq!(longest.encoded_len(), MAX_COMMAND_BYTES);
    assert_eq!(longest.validate(), Ok(()));
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    let at = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
    let first = Entry {
        log_id: at(1),
        payload: EntryPayload::Normal(longest),
    };
    log.blocking_append([first.clone()]).await.unwrap();
    // Past the limit (only a caller that skips `validate` gets here): the
    // append fails and nothing of it is written or kept.
    group.push(Append::single(1u64, 0, 0, 0));
    assert!(Command::AppendAll(group.clone()).validate().is_err());
    let len = std::fs::metadata(log_path(dir.path())).unwrap().len();
    let too_long = Entry {
        log_id: at(2),
        payload: EntryPayload::Normal(Command::AppendAll(group)),
    };
    assert!(log.blocking_append([too_long]).await.is_err());
    assert_eq!(std::fs::metadata(log_path(dir.path())).unwrap().len(), len);
    assert_eq!(all(&mut log).await, std::slice::from_ref(&first));
    drop(log);
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!((opened.entries, opened.torn_bytes), (1, 0));
    assert_eq!(all(&mut log).await, [first]);
}

#[tokio::test]
async fn a_directory_is_opened_by_one_log_at_a_time() {
    // Two logs writing one file (a replica started twice, or restarted
    // while the old one still flushes) would interleave their records and
    // disagree on every offset. The second open is refused; once the first
    // log is dropped, its writer has finished and the directory opens.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((1..=3).map(|i| entry(1, i)))
        .await
        .unwrap();
    match LogStore::open(dir.path()) {
        Err(OpenLogError::Locked { path }) => assert_eq!(path, dir.path()),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("the directory was opened twice"),
    }
    let reader = log.clone();
    drop(log);
    assert!(
        LogStore::open(dir.path()).is_err(),
        "a clone still holds it"
    );
    drop(reader);
    let (mut log, opened) = LogStore::open(dir.path()).unwrap();
    assert_eq!(opened.entries, 3);
    assert_eq!(all(&mut log).await.len(), 3);
}

#[tokio::test]
async fn a_record_crafted_into_a_producer_name_does_not_make_a_torn_write_refused() {
    // A producer controls the bytes of its name, which the log stores as
    // they are. Here a name holds a whole record, checksummed as the
    // format describes, that claims a write begun after the damage in
    // front of it. A crash tears the write carrying that name: the log
    // must cut the torn write as always, not take the name for a later
    // write and refuse to open (every replica torn alike would stay down).
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((1..=3).map(|i| entry(1, i)))
        .await
        .unwrap();
    let torn_at = std::fs::metadata(log_path(dir.path())).unwrap().len() as usize;
    // The name starts after the record's header (8), the entry's head
    // (33), the command tag, the producer kind and the name's length.
    let at = torn_at + 8 + 33 + 1 + 1 + 2;
    let crafted = (0u64..)
        .map(|k| {
            let mut r = Vec::new();
            r.extend_from_slice(&33u32.to_le_bytes());
            r.extend_from_slice(&[0; 4]);
            r.extend_from_slice(&(0x4141_4141_4141_4141 + k).to_le_bytes()); // term
            r.extend_from_slice(&0x4242_4242_4242_4242u64.to_le_bytes()); // node
            r.extend_from_slice(&0x4343_4343_4343_4343u64.to_le_bytes()); // index
            r.extend_from_slice(&(at as u64).to_le_bytes()); // write start
            r.push(0); // blank
            let crc = crc32c::crc32c_append(crc32c::crc32c(&r[..4]), &r[8..]);
            r[4..8].copy_from_slice(&crc.to_le_bytes());
            r
        })
        .find(|r| r.is_ascii())
        .unwrap();
    let name = String::from_utf8(crafted).unwrap();
    let carrier = Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 4),
        payload: EntryPayload::Normal(Command::Append(Append::single(name.as_str(), 0, 0, 0))),
    };
    log.blocking_append([carrier, entry(1, 5), entry(1, 6)])
        .await
        .unwrap();
    let kept = all(&mut log).await[..3].to_vec();
    drop(log);
    // The crash: the write's first bytes never reached the disk.
    let mut bytes = std::fs::read(log_path(dir.path())).unwrap();
    bytes[torn_at..torn_at + 8].fill(0);
    std::fs::write(log_path(dir.path()), &bytes).unwrap();
    let (mut log, opened) = match LogStore::open(dir.path()) {
        Ok(l) => l,
        Err(e) => panic!("a crafted name made a torn write refused: {e}"),
    };
    assert_eq!(all(&mut log).await, kept);
    assert_eq!(opened.torn_bytes as usize, bytes.len() - torn_at);
    // What the producer could not know: each log draws its own salt.
    let other = tempfile::tempdir().unwrap();
    drop(LogStore::open(other.path()).unwrap());
    let salt = |d: &std::path::Path| std::fs::read(log_path(d)).unwrap()[12..20].to_vec();
    assert_ne!(salt(dir.path()), salt(other.path()));
}

#[tokio::test]
async fn a_whole_record_with_a_command_of_a_later_build_is_refused_not_cut() {
    // A later build adds a command tag; this build meets it in the last
    // record. The record is whole (its checksum verifies under this log's
    // salt), so it is not a torn write: cutting it would make this replica
    // apply a shorter log than the others. The log refuses to open, naming
    // the reason.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = LogStore::open(dir.path()).unwrap();
    log.blocking_append((1..=3).map(|i| entry(1, i)))
        .await
        .unwrap();
    let at = std::fs::metadata(log_path(dir.path())).unwrap().len() as usize;
    let last = Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 4),
        payload: EntryPayload::Normal(Command::RemovePartition { partition: 7 }),
    };
    log.blocking_append([last]).await.unwrap();
    drop(log);
    let mut bytes = std::fs::read(log_path(dir.path())).unwrap();
    // The command's tag follows the record header (8), the entry's head
    // (32) and its kind (1); re-seal the record under the log's seed (the
    // header's CRC, bytes 20..24).
    let tag = at + 8 + 33;
    assert_eq!(bytes[tag], 4, "RemovePartition's tag");
    bytes[tag] = 200;
    let seed = u32::from_le_bytes(bytes[20..24].try_into().unwrap());
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(seed, &bytes[at..at + 4]),
        &bytes[at + 8..],
    );
    bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(log_path(dir.path()), &bytes).unwrap();
    match LogStore::open(dir.path()) {
        Err(OpenLogError::Corrupt { offset, what, .. }) => {
            assert_eq!(offset as usize, at);
            assert!(what.contains("later build"), "{what}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok((_, opened)) => panic!("opened, cutting {} bytes", opened.torn_bytes),
    }
    assert_eq!(
        std::fs::read(log_path(dir.path())).unwrap(),
        bytes,
        "nothing was cut"
    );
}
