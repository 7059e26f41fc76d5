//! Filling a fresh state from a snapshot at the speed of reading it.
//!
//! The state is sized from the header's entry count before the first
//! entry, so no table rehashes and no window arena moves while loading;
//! each entry's window is decoded straight into the arena slot its key
//! will own (an entry decoded on the stack was copied twice on its way
//! there), its key hashed once and inserted with one probe, with no
//! allocation per entry (but for names too long to store inline); a
//! block's keys are counted in their partitions once per run of one
//! partition. Entries arrive in the order the writer's shards and tables held
//! them, so consecutive inserts land in neighbouring buckets of one shard:
//! the tables fill front to back, not at random.
//!
//! A big version-4 file loads on two threads. Its entries come in blocks
//! of one shard each, so a block can be handed whole to a second thread,
//! which decodes it and inserts its keys into that shard, while the first
//! reads the file, checks the CRC and does the same with the blocks it
//! keeps. A shard belongs to the thread that took its first block (later
//! blocks of it follow), and a block goes to the second thread only when
//! it has room in its queue (two blocks): whichever thread is behind does
//! less. The work that does not shrink with a better format, filling
//! about 150 MB of fresh table and window memory at 1M keys (page
//! faults), is so split between the cores. An earlier try that handed
//! single decoded entries over (~150 bytes each) was slower than one
//! thread: the hand-over cost more than the inserts it moved; a block is
//! about a 256th of the file.

use std::io::Read;
use std::path::Path;
use std::sync::mpsc;

use crate::engine::entry::ProducerEntry;
use crate::engine::hash::HashedKey;
use crate::engine::shards::{SHARDS, ShardMut, Shards};
use crate::error::{Corruption, Error, Result};
use crate::fs::FileSystem;
use crate::id::ProducerId;
use crate::snapshot::meta::Meta;
use crate::snapshot::{self, Block};

/// Files at least this long load on two threads (version 4, not Kafka
/// mode). The 1M-key files of `snapshot_bench` (37 and 61 MB) load at
/// roughly 4 ms per MiB on one thread, and starting a thread costs tens
/// of microseconds, so a few MiB already pay for it; smaller files are
/// not worth a thread's start or the risk that the other core is busy.
const TWO_THREADS_FROM: u64 = 4 << 20;

/// The [`snapshot::Sink`] that builds the state.
struct Loader<'a> {
    path: &'a Path,
    shards: Shards,
    meta: Meta,
    /// The header's entry count.
    entries: u64,
    /// Load only this partition's keys, transactions and aborted lists
    /// (a partition's truncation base); the file is verified whole.
    only: Option<i32>,
}

impl snapshot::Sink for Loader<'_> {
    fn begin(&mut self, header: &snapshot::Header) {
        self.entries = header.entries;
        // A Kafka-mode state's keys go to its engine (see `kafka`); one
        // partition's keys are a few of the header's.
        if !header.kafka && self.only.is_none() {
            // Every key may have a window; room that stays unused is
            // address space, not memory, until keys get windows later.
            self.shards = Shards::with_capacity(header.entries, header.entries);
        }
    }

    fn meta(&mut self, meta: Meta) {
        self.meta = meta;
    }

    fn kafka(&mut self, mut kafka: crate::engine::kafka::state::KafkaState) {
        let room = match self.only {
            Some(p) => {
                kafka.retain_partition(p);
                0
            }
            None => self.entries,
        };
        self.meta.kafka = Some(Box::new(
            crate::engine::ProducerStateManager::from_kafka_side(kafka, room),
        ));
    }

    fn only(&self) -> Option<i32> {
        self.only
    }

    #[inline]
    fn entry(
        &mut self,
        hash: u64,
        id: ProducerId,
        p: i32,
        e: ProducerEntry,
        act: i64,
    ) -> Result<()> {
        if self.only.is_some_and(|o| o != p) {
            return Ok(());
        }
        if let Some(k) = &mut self.meta.kafka {
            return if k.insert_loaded(&id, p, &e) {
                Ok(())
            } else {
                Err(Error::corrupt(self.path, 0, Corruption::DuplicateKey))
            };
        }
        if self
            .shards
            .insert_new(HashedKey::hashed(hash, &id, p), &e, act)
        {
            Ok(())
        } else {
            Err(Error::corrupt(self.path, 0, Corruption::DuplicateKey))
        }
    }
}

/// A snapshot loaded: its header, store section and state.
pub(crate) struct Loaded {
    pub header: snapshot::Header,
    pub meta: Meta,
    pub shards: Shards,
}

/// Loads and verifies the snapshot file at `path` into a fresh state.
pub(crate) fn load_file(fs: &dyn FileSystem, path: &Path) -> Result<Loaded> {
    load_file_of(fs, path, None)
}

/// [`load_file`], keeping with `only` that partition's state alone: the
/// whole file is read and its CRC checked, but the other partitions' keys,
/// transactions and aborted lists are not built, and their entries in a
/// version-4 file are passed over by their framing, not decoded
/// ([`snapshot::Sink::only`]): a partition's truncation, whose cost then
/// follows the partition's keys more than the store's. Its store section
/// is the whole store's.
pub(crate) fn load_file_of(fs: &dyn FileSystem, path: &Path, only: Option<i32>) -> Result<Loaded> {
    let file = fs.open_read(path).map_err(Error::at("open", path))?;
    let len = file.len().map_err(Error::at("stat", path))?;
    load_with(path, file, len, TWO_THREADS_FROM, only)
}

/// [`load`], on two threads if the body has at least `two_from` bytes;
/// with `only`, that partition's state alone ([`load_file_of`]).
fn load_with(
    path: &Path,
    file: impl Read,
    len: u64,
    two_from: u64,
    only: Option<i32>,
) -> Result<Loaded> {
    let mut loader = Loader {
        path,
        shards: Shards::default(),
        meta: Meta::default(),
        entries: 0,
        only,
    };
    // Small reads (headers) are buffered; a block's bytes, mostly longer
    // than the buffer, go straight from the file into the block.
    let mut r = std::io::BufReader::with_capacity(64 << 10, file);
    let mut pre = snapshot::read_prelude(path, &mut r, len, &mut loader)?;
    // One partition's keys go through the sink's filter, block by block.
    if pre.header.version >= snapshot::VERSION_4 && !pre.header.kafka && only.is_none() {
        if len >= two_from {
            two_threads(path, &mut r, &mut pre, &mut loader.shards)?;
        } else {
            one_thread(path, &mut r, &mut pre, &mut loader.shards)?;
        }
    } else {
        snapshot::read_rest(path, &mut r, &mut pre, &mut loader)?;
    }
    let header = pre.header;
    let mut meta = loader.meta;
    if header.version < snapshot::VERSION_5 {
        meta.ends = held_ends(&loader.shards, meta.kafka.as_deref());
    }
    Ok(Loaded {
        header,
        meta,
        shards: loader.shards,
    })
}

/// A snapshot older than version 5 has no partition ends: lower bounds
/// from the batch offsets its keys hold (`snapshot::ends`).
fn held_ends(
    shards: &Shards,
    kafka: Option<&crate::engine::ProducerStateManager>,
) -> crate::snapshot::ends::Ends {
    let strict = (0..SHARDS).flat_map(|i| shards.shard(i).iter());
    let kafka = kafka.into_iter().flat_map(|k| k.iter());
    crate::snapshot::ends::Ends::derived(strict.chain(kafka).filter_map(|(_, p, e)| {
        let newest = e
            .retained_batches()
            .filter_map(|b| b.metadata)
            .map(|m| m.offset)
            .max()?;
        Some((p, newest))
    }))
}

/// The version-4 blocks after the prelude, each decoded into its shard on
/// this thread (a file too small for a helper's start to pay).
fn one_thread(
    path: &Path,
    r: impl Read,
    pre: &mut snapshot::Prelude,
    shards: &mut Shards,
) -> Result<()> {
    let mut mine: Vec<ShardMut<'_>> = shards.shards_mut().collect();
    snapshot::read_blocks(path, r, pre, |block| {
        match mine.get_mut(usize::from(block.shard)) {
            Some(shard) => snapshot::load_block(path, block, shard),
            None => Err(Error::Internal("a block of no shard")),
        }
    })
}

/// Who fills a shard.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Nobody,
    Reader,
    Helper,
}

/// A block for the helper thread, with its shard the first time.
type Job<'s> = (Block, Option<ShardMut<'s>>);

/// The version-4 blocks after the prelude, read, checked and half
/// inserted on this thread, half handed to a helper (see the module
/// docs). On an error the state is partly filled: the caller drops it.
fn two_threads(
    path: &Path,
    r: impl Read,
    pre: &mut snapshot::Prelude,
    shards: &mut Shards,
) -> Result<()> {
    let mut mine: Vec<Option<ShardMut<'_>>> = shards.shards_mut().map(Some).collect();
    std::thread::scope(|s| {
        let (to_helper, jobs) = mpsc::sync_channel::<Job<'_>>(2);
        let (give_back, spare) = mpsc::channel::<Vec<u8>>();
        let helper = s.spawn(move || -> Result<()> {
            let mut held: Vec<Option<ShardMut<'_>>> = (0..SHARDS).map(|_| None).collect();
            for (block, shard) in jobs {
                let slot = held.get_mut(usize::from(block.shard));
                let Some(slot) = slot else {
                    return Err(Error::Internal("a block of no shard"));
                };
                if shard.is_some() {
                    *slot = shard;
                }
                let Some(shard) = slot.as_mut() else {
                    return Err(Error::Internal("a block of a shard the helper lacks"));
                };
                snapshot::load_block(path, &block, shard)?;
                // The reader reads the next blocks into it.
                let _ = give_back.send(block.bytes);
            }
            Ok(())
        });
        let mut owner = [Owner::Nobody; SHARDS];
        // The helper stopped taking blocks: it failed, and says why.
        let helper_gone = || Error::Internal("the loading helper stopped");
        let read = snapshot::read_blocks(path, r, pre, |block| {
            let i = usize::from(block.shard);
            let (Some(who), Some(slot)) = (owner.get_mut(i), mine.get_mut(i)) else {
                return Err(Error::Internal("a block of no shard"));
            };
            let swap = |block: &mut Block| Block {
                shard: block.shard,
                count: block.count,
                at: block.at,
                bytes: std::mem::replace(&mut block.bytes, spare.try_recv().unwrap_or_default()),
            };
            match *who {
                Owner::Reader => match slot.as_mut() {
                    Some(shard) => snapshot::load_block(path, block, shard),
                    None => Err(Error::Internal("a shard the reader lacks")),
                },
                Owner::Helper => to_helper
                    .send((swap(block), None))
                    .map_err(|_| helper_gone()),
                Owner::Nobody => match to_helper.try_send((swap(block), slot.take())) {
                    Ok(()) => {
                        *who = Owner::Helper;
                        Ok(())
                    }
                    Err(mpsc::TrySendError::Full((b, shard))) => {
                        // The helper is busy: this shard is the reader's.
                        *slot = shard;
                        *who = Owner::Reader;
                        *block = b;
                        match slot.as_mut() {
                            Some(shard) => snapshot::load_block(path, block, shard),
                            None => Err(Error::Internal("a shard the reader lacks")),
                        }
                    }
                    Err(mpsc::TrySendError::Disconnected(_)) => Err(helper_gone()),
                },
            }
        });
        drop(to_helper);
        let helped = helper
            .join()
            .unwrap_or(Err(Error::Internal("the loading helper panicked")));
        // The helper's error first: it is what stopped the reader, or it
        // lies in a block before the reader's (the helper is at most two
        // blocks behind).
        helped.and(read)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Batch;
    use crate::engine::ProducerStateManager;
    use std::io::Cursor;

    /// A snapshot of `keys` keys with windows, in blocks of every shard.
    fn file(keys: u64) -> Vec<u8> {
        let mut m = ProducerStateManager::new();
        for k in 0..keys {
            for b in 0..(k % 6) as i32 {
                m.append_batch(k, (k % 3) as i32, 0, Batch::new(b, b, i64::from(b), 7));
            }
            if k % 6 == 0 {
                m.append(k, 0, 1, 0);
            }
        }
        m.append("named", 0, 0, 0);
        m.encode_snapshot(9).unwrap()
    }

    fn state(l: &Loaded) -> Vec<(ProducerId, i32, ProducerEntry, i64)> {
        let mut v: Vec<_> = (0..SHARDS)
            .flat_map(|i| l.shards.infos(i))
            .map(|i| (i.producer_id, i.partition, i.entry, i.last_activity))
            .collect();
        v.sort_by_key(|a| (a.0.to_string(), a.1));
        v
    }

    #[test]
    fn two_threads_load_what_one_thread_loads() {
        let bytes = file(20_000);
        let p = Path::new("s");
        let len = bytes.len() as u64;
        let one = load_with(p, Cursor::new(&bytes), len, u64::MAX, None).unwrap();
        let two = load_with(p, Cursor::new(&bytes), len, 0, None).unwrap();
        assert_eq!(one.header, two.header);
        assert_eq!(one.shards.len(), 20_001);
        assert_eq!(state(&one), state(&two));
        // Each shard counts its keys per partition (keys come in runs of
        // one partition, counted once a run): as many as it holds.
        for l in [&one, &two] {
            for i in 0..SHARDS {
                for p in 0..4 {
                    let held = l.shards.infos(i).filter(|k| k.partition == p).count();
                    assert_eq!(l.shards.partition_count(i, p) as usize, held, "{i} {p}");
                }
            }
        }
    }

    #[test]
    fn one_partitions_load_is_the_whole_loads_keys_of_it() {
        let p = Path::new("s");
        // A strict-mode file, and a Kafka-mode one (its keys go to the
        // engine) of the same appends.
        let strict = file(3_000);
        let mut k = ProducerStateManager::with_semantics(crate::semantics::Semantics::Kafka);
        for id in 0..600u64 {
            k.append_batch(id, (id % 3) as i32, 0, Batch::new(0, 1, id as i64, 7));
        }
        let kafka = k.encode_snapshot(9).unwrap();
        let kafka_keys = |l: &Loaded| {
            let mut v: Vec<_> = l.meta.kafka.as_deref().unwrap().iter().collect();
            v.sort_by_key(|(id, p, _)| (id.to_string(), *p));
            v
        };
        let whole =
            load_with(p, Cursor::new(&strict), strict.len() as u64, u64::MAX, None).unwrap();
        let whole_k =
            load_with(p, Cursor::new(&kafka), kafka.len() as u64, u64::MAX, None).unwrap();
        for part in 0..4 {
            let one =
                load_with(p, Cursor::new(&strict), strict.len() as u64, 0, Some(part)).unwrap();
            let mut want = state(&whole);
            want.retain(|k| k.1 == part);
            assert_eq!(state(&one), want, "{part}");
            assert_eq!(one.header, whole.header);
            let one = load_with(p, Cursor::new(&kafka), kafka.len() as u64, 0, Some(part)).unwrap();
            let mut want = kafka_keys(&whole_k);
            want.retain(|k| k.1 == part);
            assert_eq!(kafka_keys(&one), want, "{part}");
            assert_eq!(kafka_keys(&one).len(), if part < 3 { 200 } else { 0 });
        }
    }

    #[test]
    fn two_threads_find_the_damage_one_thread_finds() {
        let bytes = file(3_000);
        let p = Path::new("s");
        let len = bytes.len() as u64;
        // A flip in every 97th byte: both refuse it as corruption.
        for at in (0..bytes.len()).step_by(97) {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            // And so does one partition's load, which passes over the
            // others' keys.
            for (two_from, only) in [(u64::MAX, None), (0, None), (0, Some(1))] {
                match load_with(p, Cursor::new(&b), len, two_from, only) {
                    Err(e) => assert!(e.is_corruption(), "{at}: {e}"),
                    Ok(_) => panic!("{at}: a damaged file loaded"),
                }
            }
        }
        // A key twice (the same block twice, the header and CRC fixed
        // up): a duplicate, on either thread.
        let dup = with_first_block_twice(&bytes);
        for (two_from, only) in [(u64::MAX, None), (0, None), (0, Some(0))] {
            let e = load_with(p, Cursor::new(&dup), dup.len() as u64, two_from, only)
                .err()
                .unwrap();
            assert!(
                matches!(
                    e,
                    Error::Corrupt {
                        kind: Corruption::DuplicateKey,
                        ..
                    }
                ),
                "{e}"
            );
        }
    }

    /// `bytes` (a seed file) with its first block repeated after it.
    fn with_first_block_twice(bytes: &[u8]) -> Vec<u8> {
        let body_len = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
        let section = u32::from_le_bytes(bytes[48..52].try_into().unwrap()) as usize;
        let first = 48 + 4 + section;
        let count = u32::from_le_bytes(bytes[first + 2..first + 6].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[first + 6..first + 10].try_into().unwrap()) as usize;
        let block = &bytes[first..first + 10 + len];
        let mut out = bytes[..first + 10 + len].to_vec();
        out.extend_from_slice(block);
        out.extend_from_slice(&bytes[first + 10 + len..48 + body_len]);
        let entries = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) + u64::from(count);
        out[24..32].copy_from_slice(&entries.to_le_bytes());
        out[32..40].copy_from_slice(&((body_len + block.len()) as u64).to_le_bytes());
        let hcrc = crc32c::crc32c(&out[..40]);
        out[40..44].copy_from_slice(&hcrc.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}
