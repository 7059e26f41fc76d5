//! Which keys a full table evicts: the least recently active.
//!
//! The order is total and depends on the state alone: a key's last
//! activity, then the key's 64-bit hash (the store's fixed hash,
//! `map::hash_key`, the one the removed-key filter uses), then, for keys
//! that share both, its producer id (numbers before names, as
//! [`ProducerId`] orders) and its partition. So the victims of an eviction
//! are exactly determined by the state, whatever structure finds them, and
//! a store that recovered picks the same ones as one that never stopped.
//! (Replay does not pick at all: the log names the victims.) The hash
//! rather than the id breaks ties because a key's place is then two plain
//! integers, its *rank*: a 16-byte `Copy` value that is compared, sorted
//! and merged without building a [`ProducerId`] or reading a name.
//!
//! Finding the victims without a scan of the whole table per eviction, and
//! without a linked list through every slot (16 bytes more per key, about
//! 35 with the table's spare room): each shard keeps a sorted list of the
//! ranks of up to [`CANDIDATES`] of its least active keys, built by one
//! pass over the shard, and a bound: every key of the shard whose rank is
//! at or below the bound is listed, or was taken from the list before.
//!
//! An eviction of `n` keys does not merge the 256 lists one rank at a time
//! (a heap operation per victim, each reading a different list: the
//! largest cost before this design). Below the least bound of the lists
//! every rank is known, so it finds the `n`-th least rank by a selection
//! over the lists' first ranks and takes, from each list at once, its
//! ranks up to that threshold; when a list's bound comes first, the ranks
//! up to it are taken, that list is rebuilt from the keys ranked above its
//! bound (so a victim taken but not yet removed is never listed twice), and
//! the next round goes on. It then looks each victim's slot up by its hash,
//! 32 at a time: first their control bytes, then their slots, each a loop
//! of independent loads so that the cache misses overlap, then the loop
//! that resolves them while they are in L1. Under the buffered policies
//! that loop also removes them ([`Order::remove_victims`]), each in the
//! same probe of the table that finds it (`StateMap::remove_with_hash`),
//! not a lookup and then a removal by key. The victims come out shard by
//! shard (their log record lists them so; the set is what the order
//! defines).
//!
//! A list entry whose key has since been touched or removed finds no key
//! with that rank and is passed over; a key whose new rank falls at or
//! below its shard's bound (a batch with an old timestamp, a clock set
//! back, a new key in the same millisecond) is inserted into the list,
//! which drops its greatest rank if full and lowers the bound to the one
//! before. Under steady churn at 1M keys a rebuild reads about 4,000 slots
//! for 1,024 victims, and keeps (and hashes) only those up to twice the
//! last list's span of activity above its floor.
//!
//! Keys with records in flight are never victims: the caller excludes them,
//! and they are passed over (their records, once applied, rank them again).
//! Keys that share a rank (activity and 64-bit hash) are taken together, in
//! id and partition order, so an eviction may take more keys than asked
//! when such keys come last: never otherwise.

use crate::engine::shards::{Map, SHARDS, Shards, WARM_CHUNK, shard_of};
use crate::id::ProducerId;

/// Ranks a shard's list holds at most: 16 KiB a shard, 4 MiB for all.
const CANDIDATES: usize = 1024;

/// A key's place in eviction order: its activity (sign bit flipped, so
/// that unsigned order is signed order) above its hash.
type Rank = u128;

/// The bound of a list that holds every key of its shard.
const COMPLETE: Rank = Rank::MAX;

#[inline(always)]
fn rank(act: i64, hash: u64) -> Rank {
    (u128::from((act as u64) ^ (1 << 63)) << 64) | u128::from(hash)
}

#[inline(always)]
fn rank_act(r: Rank) -> i64 {
    (((r >> 64) as u64) ^ (1 << 63)) as i64
}

#[inline(always)]
fn rank_hash(r: Rank) -> u64 {
    r as u64
}

#[derive(Default)]
struct ShardOrder {
    /// Ranks in ascending order; those before `head` were taken.
    list: Vec<Rank>,
    head: usize,
    /// Every key of the shard whose rank is at or below this is in
    /// `list[head..]`, or was taken from the list (chosen, or passed over
    /// while in flight). `COMPLETE`: every key of the shard.
    bound: Rank,
    built: bool,
    /// The activities the last list spanned, when it did not hold the
    /// whole shard: a rebuild's guess of how far above its floor to look.
    span: Option<i64>,
}

/// The ranks at or above `floor` of the keys of `map` whose activity
/// `keep` accepts, into `scratch`.
fn fill(
    scratch: &mut Vec<Rank>,
    map: &Map,
    floor: Rank,
    keep: impl Fn(crate::engine::map::Activity) -> bool,
) {
    scratch.clear();
    scratch.reserve(map.len());
    map.for_each_extra_hashed(keep, |a, h| {
        let r = rank(a.ms(), h);
        if r >= floor {
            scratch.push(r);
        }
    });
}

impl ShardOrder {
    /// Lists the least ranks of the shard's keys ranked at or above
    /// `floor` (all of them when they are few).
    fn rebuild(&mut self, map: &Map, floor: Rank, scratch: &mut Vec<Rank>, cap: usize) {
        // Under churn the next `cap` ranks of a shard span about the
        // activities the last list spanned: a scan that keeps only the
        // keys up to twice that above the floor (and hashes only those)
        // usually still finds `cap` of them, which are then exactly the
        // least. If it does not, the whole shard is read again.
        let lo = rank_act(floor);
        if let Some(span) = self.span {
            let hi = lo.saturating_add(span.saturating_mul(2).saturating_add(1));
            fill(scratch, map, floor, move |a| (lo..=hi).contains(&a.ms()));
            // Exactly `cap` is not enough: a list that holds every key it
            // saw must hold every key of the shard above its floor.
            if scratch.len() <= cap {
                fill(scratch, map, floor, move |a| a.ms() >= lo);
            }
        } else {
            fill(scratch, map, floor, move |a| a.ms() >= lo);
        }
        let complete = scratch.len() <= cap;
        if !complete {
            scratch.select_nth_unstable(cap - 1);
            scratch.truncate(cap);
        }
        scratch.sort_unstable();
        if self.list.capacity() == 0 {
            self.list.reserve_exact(cap);
        }
        self.list.clear();
        self.list.extend_from_slice(scratch);
        self.head = 0;
        self.bound = match self.list.last() {
            Some(&last) if !complete => last,
            _ => COMPLETE,
        };
        self.span = match (self.list.first(), self.list.last()) {
            (Some(&a), Some(&b)) if !complete => {
                Some(rank_act(b).saturating_sub(rank_act(a)).max(0))
            }
            _ => None,
        };
        self.built = true;
    }

    /// The least rank not yet taken, rebuilding the list when it ran out
    /// and keys are ranked above its bound.
    #[inline]
    fn next(&mut self, map: &Map, scratch: &mut Vec<Rank>, cap: usize) -> Option<Rank> {
        if let Some(&r) = self.list.get(self.head) {
            return Some(r);
        }
        if self.bound == COMPLETE {
            return None;
        }
        self.rebuild(map, self.bound + 1, scratch, cap);
        self.list.first().copied()
    }

    /// The ranks not yet taken.
    fn rest(&self) -> &[Rank] {
        self.list.get(self.head..).unwrap_or_default()
    }

    /// A key now ranked `r`, at or below the bound: listed in its place.
    fn insert(&mut self, r: Rank, cap: usize) {
        if self.list.len() >= cap {
            if self.head > 0 {
                self.list.drain(..self.head);
                self.head = 0;
            } else {
                // Full: the greatest rank leaves; its key (or keys) lie
                // above the new bound unless one of its rank is still
                // listed, which resolves to all of them.
                self.list.pop();
                match self.list.last() {
                    Some(&last) => self.bound = last,
                    None => {
                        self.built = false;
                        return;
                    }
                }
                if r > self.bound {
                    return;
                }
            }
        }
        let at = self.head + self.rest().partition_point(|&x| x < r);
        self.list.insert(at, r);
    }
}

/// The eviction order of the whole state (see the module docs).
pub(crate) struct Order {
    shards: Vec<ShardOrder>,
    /// A rebuild's work space (the ranks of one shard).
    scratch: Vec<Rank>,
    /// Ranks a list holds at most: [`CANDIDATES`], fewer in tests.
    cap: usize,
}

impl Default for Order {
    fn default() -> Self {
        Order::with_candidates(CANDIDATES)
    }
}

impl Order {
    fn with_candidates(cap: usize) -> Order {
        Order {
            shards: (0..SHARDS).map(|_| ShardOrder::default()).collect(),
            scratch: Vec::new(),
            cap: cap.max(1),
        }
    }

    /// The key with hash `hash` was created, appended to or set, and now
    /// has activity `act`.
    #[inline]
    pub(crate) fn note(&mut self, act: i64, hash: u64) {
        let Some(o) = self.shards.get_mut(shard_of(hash)) else {
            return;
        };
        let r = rank(act, hash);
        if o.built && r <= o.bound {
            o.insert(r, self.cap);
        }
    }

    /// The next `n` victims in eviction order among the keys of `shards`
    /// that `excluded` does not rule out, shard by shard (fewer if the
    /// state holds fewer; more only when the last ones share their rank
    /// with others, see the module docs).
    pub(crate) fn victims(
        &mut self,
        shards: &Shards,
        n: usize,
        excluded: impl Fn(u64, &ProducerId, i32) -> bool,
    ) -> Vec<(u64, ProducerId, i32)> {
        self.pick(Access::Read(shards), n, excluded)
    }

    /// [`Order::victims`], each removed from `shards` as soon as it is
    /// found, while its slot is in cache: where nothing needs the victims'
    /// states after their removal is decided (the buffered policies, no
    /// snapshot capturing pre-images), this saves bringing every slot in
    /// a second time to remove it.
    pub(crate) fn remove_victims(
        &mut self,
        shards: &mut Shards,
        n: usize,
        excluded: impl Fn(u64, &ProducerId, i32) -> bool,
    ) -> Vec<(u64, ProducerId, i32)> {
        self.pick(Access::Remove(shards), n, excluded)
    }

    fn pick(
        &mut self,
        mut access: Access<'_>,
        n: usize,
        excluded: impl Fn(u64, &ProducerId, i32) -> bool,
    ) -> Vec<(u64, ProducerId, i32)> {
        let mut out: Vec<(u64, ProducerId, i32)> = Vec::with_capacity(n.min(1 << 16));
        if n == 0 {
            return out;
        }
        let Order {
            shards: lists,
            scratch,
            cap,
        } = self;
        let cap = *cap;
        let shards = access.shards();
        // The shards whose lists have ranks left (rebuilt if they ran out).
        let mut active: Vec<usize> = Vec::with_capacity(SHARDS);
        for (i, o) in lists.iter_mut().enumerate() {
            let map = shards.shard(i);
            if map.len() == 0 {
                continue;
            }
            if !o.built {
                o.rebuild(map, 0, scratch, cap);
            }
            if o.next(map, scratch, cap).is_some() {
                active.push(i);
            }
        }
        let mut batch: Vec<Rank> = Vec::with_capacity(n.min(1 << 16));
        while out.len() < n && !active.is_empty() {
            // The least ranks, as many as victims are missing (some may
            // find no key: touched, removed, or in flight).
            batch.clear();
            let shards = access.shards();
            take(
                lists,
                &mut active,
                shards,
                scratch,
                cap,
                n - out.len(),
                &mut batch,
            );
            if batch.is_empty() {
                break;
            }
            let mut last = None;
            let mut hashes = [0u64; WARM_CHUNK];
            for chunk in batch.chunks(WARM_CHUNK) {
                // Their slots, brought into cache ahead of the loop that
                // reads them, a chunk at a time (see `Shards::warm_hashes`).
                for (h, &r) in hashes.iter_mut().zip(chunk) {
                    *h = rank_hash(r);
                }
                access
                    .shards()
                    .warm_hashes(hashes.get(..chunk.len()).unwrap_or_default());
                for &r in chunk {
                    // Equal ranks are adjacent; the first resolves them all.
                    if last.replace(r) == Some(r) {
                        continue;
                    }
                    let (act, h) = (rank_act(r), rank_hash(r));
                    let start = out.len();
                    match &mut access {
                        // Found and removed in one probe of the table.
                        Access::Remove(shards) => {
                            shards.remove_with_hash(
                                h,
                                |id, p, a| a.ms() == act && !excluded(h, id, p),
                                &mut out,
                            );
                        }
                        Access::Read(shards) => {
                            for (id, p, a) in shards.shard(shard_of(h)).keys_with_hash(h) {
                                if a.ms() == act && !excluded(h, &id, p) {
                                    out.push((h, id, p));
                                }
                            }
                        }
                    }
                    if let Some(same) = out.get_mut(start..)
                        && same.len() > 1
                    {
                        same.sort_unstable_by(|x, y| (&x.1, x.2).cmp(&(&y.1, y.2)));
                    }
                }
            }
        }
        out
    }
}

/// How [`Order::pick`] reaches the state: to read it, or also to remove
/// the victims it finds.
enum Access<'a> {
    Read(&'a Shards),
    Remove(&'a mut Shards),
}

impl Access<'_> {
    fn shards(&self) -> &Shards {
        match self {
            Access::Read(s) => s,
            Access::Remove(s) => s,
        }
    }
}

/// Moves the `need` least ranks not yet taken (fewer if the lists run
/// out, more only for ranks equal to the last) from the lists of the
/// `active` shards to `batch`, shard by shard. No merge of the lists one
/// rank at a time: a threshold is found by selection, and each list gives
/// its ranks up to it at once.
///
/// Every list lists every key of its shard ranked at or below its bound,
/// so below the least bound of the lists in play every rank is known: a
/// round takes the ranks at or below `min(bound, estimate)` (the
/// `need`-th least of them, if that is fewer), which uses up at least the
/// list of that bound; that list is rebuilt from above it, and the next
/// round goes on from there.
fn take(
    lists: &mut [ShardOrder],
    active: &mut Vec<usize>,
    shards: &Shards,
    scratch: &mut Vec<Rank>,
    cap: usize,
    mut need: usize,
    batch: &mut Vec<Rank>,
) {
    // An upper bound of the `need`-th least rank: the `need`-th least of
    // each list's first ranks (half again the even share of each).
    let share = need.div_ceil(active.len().max(1));
    let first = share + share / 2 + 4;
    scratch.clear();
    for &i in active.iter() {
        if let Some(o) = lists.get(i) {
            scratch.extend(o.rest().iter().take(first));
        }
    }
    let estimate = match need.checked_sub(1) {
        Some(k) if k < scratch.len() => *scratch.select_nth_unstable(k).1,
        _ => Rank::MAX,
    };
    while need > 0 && !active.is_empty() {
        let known = active
            .iter()
            .filter_map(|&i| lists.get(i).map(|o| o.bound))
            .fold(estimate, Rank::min);
        let count: usize = active
            .iter()
            .filter_map(|&i| lists.get(i))
            .map(|o| o.rest().partition_point(|&r| r <= known))
            .sum();
        let limit = if count > need {
            scratch.clear();
            for &i in active.iter() {
                if let Some(o) = lists.get(i) {
                    let r = o.rest();
                    scratch.extend_from_slice(&r[..r.partition_point(|&x| x <= known)]);
                }
            }
            *scratch.select_nth_unstable(need - 1).1
        } else {
            known
        };
        for &i in active.iter() {
            if let Some(o) = lists.get_mut(i) {
                let r = o.rest();
                let k = r.partition_point(|&x| x <= limit);
                batch.extend_from_slice(&r[..k]);
                o.head += k;
                need = need.saturating_sub(k);
            }
        }
        // Lists used up: rebuilt from above their bound, or done.
        active.retain(|&i| {
            lists
                .get_mut(i)
                .is_some_and(|o| o.next(shards.shard(i), scratch, cap).is_some())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::entry::ProducerEntry;
    use crate::engine::hash::HashedKey;
    use crate::engine::map::hash_key;
    use crate::engine::shards::KeyTarget;

    fn install(s: &mut Shards, order: &mut Order, id: &ProducerId, p: i32, act: i64) {
        let e = ProducerEntry::start(0, 0, 0, None);
        let k = HashedKey::new(id, p);
        s.install(k, &e, act);
        order.note(act, k.hash);
    }

    fn state(keys: &[(u64, i64)]) -> Shards {
        let mut s = Shards::default();
        let e = ProducerEntry::start(0, 0, 0, None);
        for &(k, act) in keys {
            let id = ProducerId::numeric(k);
            s.install(HashedKey::new(&id, 0), &e, act);
        }
        s
    }

    /// The `n` first keys in eviction order, by sorting everything: the
    /// reference the order is checked against.
    fn expected(
        s: &Shards,
        n: usize,
        excluded: impl Fn(&ProducerId, i32) -> bool,
    ) -> Vec<(ProducerId, i32)> {
        let mut all: Vec<(i64, u64, ProducerId, i32)> = (0..SHARDS)
            .flat_map(|i| {
                s.shard(i)
                    .keys()
                    .map(|(id, p, a)| (a.ms(), hash_key(&id, p), id, p))
            })
            .filter(|(_, _, id, p)| !excluded(id, *p))
            .collect();
        all.sort();
        all.into_iter()
            .take(n)
            .map(|(_, _, id, p)| (id, p))
            .collect()
    }

    /// Victims (still in `s`) in eviction order: the order lists them
    /// shard by shard.
    fn keys(s: &Shards, v: &[(u64, ProducerId, i32)]) -> Vec<(ProducerId, i32)> {
        let mut v: Vec<(i64, u64, ProducerId, i32)> = v
            .iter()
            .map(|(h, id, p)| {
                (
                    s.activity(*h, id, *p).unwrap_or(i64::MIN),
                    *h,
                    id.clone(),
                    *p,
                )
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, _, id, p)| (id, p)).collect()
    }

    fn ids(s: &Shards, v: &[(u64, ProducerId, i32)]) -> Vec<u64> {
        keys(s, v)
            .iter()
            .map(|(id, _)| id.as_numeric().unwrap_or(u64::MAX))
            .collect()
    }

    #[test]
    fn victims_are_the_least_active_in_order_across_rebuilds() {
        // 100k keys, activities with many ties: the order falls back to
        // hashes.
        let mut s = state(
            &(0..100_000u64)
                .map(|k| (k, ((k * 7919) % 5000) as i64))
                .collect::<Vec<_>>(),
        );
        let mut order = Order::default();
        for round in 0..40 {
            let want = expected(&s, 2_100, |_, _| false);
            let got = order.victims(&s, 2_100, |_, _, _| false);
            assert_eq!(keys(&s, &got), want, "round {round}");
            for (h, id, p) in got {
                assert!(s.remove(h, &id, p));
            }
        }
        assert_eq!(s.len(), 100_000 - 40 * 2_100);
    }

    #[test]
    fn touched_keys_and_excluded_keys_are_passed_over_and_old_activity_is_listed() {
        let mut s = state(&(0..5_000u64).map(|k| (k, k as i64)).collect::<Vec<_>>());
        let mut order = Order::default();
        // Build the lists (key 0 is in flight: passed over), then touch
        // the least active keys (newer).
        let first = order.victims(&s, 1, |_, id, _| id.as_numeric() == Some(0));
        assert_eq!(ids(&s, &first), vec![1]);
        assert!(s.remove(first[0].0, &first[0].1, 0));
        for k in [0, 2, 3, 4, 5, 6, 7, 8, 9] {
            install(
                &mut s,
                &mut order,
                &ProducerId::numeric(k),
                0,
                100_000 + k as i64,
            );
        }
        let got = order.victims(&s, 5, |_, id, _| id.as_numeric() == Some(12));
        assert_eq!(ids(&s, &got), vec![10, 11, 13, 14, 15]);
        for (h, id, p) in &got {
            assert!(s.remove(*h, id, *p));
        }
        // A key set back in time goes first: it is listed in its place.
        install(&mut s, &mut order, &ProducerId::numeric(4_999), 0, -1);
        let got = order.victims(&s, 1, |_, _, _| false);
        assert_eq!(ids(&s, &got), vec![4_999]);
        assert!(s.remove(got[0].0, &got[0].1, 0));
        // Key 12 was passed over while in flight; its record, once
        // applied, ranks it again (here at its old activity).
        install(&mut s, &mut order, &ProducerId::numeric(12), 0, 12);
        let got = order.victims(&s, 3, |_, _, _| false);
        assert_eq!(ids(&s, &got), vec![12, 16, 17]);
        assert_eq!(
            keys(&s, &got),
            expected(&s, 3, |_, _| false),
            "the reference agrees"
        );
    }

    /// A tiny xorshift: the same operations in every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn victims_match_a_sort_of_everything_under_mixed_operations() {
        // Lists of one rank, a few, and the store's own: every path of
        // listing, running out, rebuilding above the bound and inserting
        // into a full list.
        for cap in [1, 3, 16, CANDIDATES] {
            mixed_operations(cap);
        }
    }

    fn mixed_operations(cap: usize) {
        // Numeric and named keys, activities bunched in a few milliseconds
        // (ties broken by hash), keys touched forward and back in time,
        // removed behind the order's back, excluded while in flight;
        // after each eviction the victims are checked against a sort of
        // every key.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut s = Shards::default();
        let mut order = Order::with_candidates(cap);
        let mut next_id = 0u64;
        let mut now = 1_000i64;
        let key = |k: u64| {
            if k.is_multiple_of(5) {
                (ProducerId::named(&format!("producer-{k}")), (k % 3) as i32)
            } else {
                (ProducerId::numeric(k), (k % 3) as i32)
            }
        };
        for round in 0..300 {
            for _ in 0..rng.below(600) {
                let (id, p) = key(next_id);
                next_id += 1;
                install(&mut s, &mut order, &id, p, now);
                if rng.below(4) == 0 {
                    now += 1;
                }
            }
            for _ in 0..rng.below(40) {
                let (id, p) = key(rng.below(next_id.max(1)));
                if s.activity(hash_key(&id, p), &id, p).is_some() {
                    let act = if rng.below(3) == 0 {
                        now - 1 - rng.below(50) as i64
                    } else {
                        now
                    };
                    install(&mut s, &mut order, &id, p, act);
                }
            }
            for _ in 0..rng.below(20) {
                let (id, p) = key(rng.below(next_id.max(1)));
                s.remove(hash_key(&id, p), &id, p);
            }
            // The keys in flight: passed over by this eviction; their
            // records, once applied, rank them again (as the store's
            // `Keys::install` does), some at their old activity.
            let flight = rng.below(7);
            let excluded = |id: &ProducerId, p: i32| {
                let h = hash_key(id, p);
                (h ^ u64::from(p as u32)) % 7 == flight && p == 1
            };
            // Fewer victims than new keys on average: the table grows to
            // tens of keys a shard.
            let n = rng.below(500) as usize;
            let mut want = expected(&s, n, excluded);
            if round % 2 == 0 {
                let got = order.victims(&s, n, |_, id, p| excluded(id, p));
                assert_eq!(keys(&s, &got), want, "lists of {cap}, round {round}");
                for (h, id, p) in got {
                    assert!(s.remove(h, &id, p));
                }
            } else {
                // Removed as they are found: the same keys, gone.
                let before = s.len();
                let got = order.remove_victims(&mut s, n, |_, id, p| excluded(id, p));
                let mut got: Vec<(ProducerId, i32)> =
                    got.into_iter().map(|(_, id, p)| (id, p)).collect();
                got.sort();
                want.sort();
                assert_eq!(got, want, "lists of {cap}, round {round}, removed");
                assert_eq!(s.len(), before - got.len());
                for (id, p) in &got {
                    assert!(s.activity(hash_key(id, *p), id, *p).is_none());
                }
            }
            let in_flight: Vec<(ProducerId, i32, i64)> = (0..SHARDS)
                .flat_map(|i| s.shard(i).keys().collect::<Vec<_>>())
                .filter(|(id, p, _)| excluded(id, *p))
                .map(|(id, p, a)| (id, p, a.ms()))
                .collect();
            for (id, p, act) in in_flight {
                let act = if rng.below(2) == 0 { act } else { now };
                install(&mut s, &mut order, &id, p, act);
            }
        }
        assert!(next_id > 50_000, "{next_id} keys");
        assert!(s.len() > 5_000, "{} keys held", s.len());
    }

    /// Two 16-byte names whose hashes are equal: their first two words are
    /// `2x, y` and `x, 2y` under the hash's constants, so the multiply
    /// that folds them gives the same product.
    fn colliding_names() -> (ProducerId, ProducerId) {
        const K0: u64 = 0x243f_6a88_85a3_08d3;
        const K1: u64 = 0x1319_8a2e_0370_7344;
        let printable = |w: u64| w.to_le_bytes().iter().all(|b| (0x21..0x7f).contains(b));
        let mut rng = Rng(7);
        // A word below 2^63 whose own and double's bytes, under `k`, are
        // printable.
        let mut find = |k: u64| loop {
            let x = (rng.next() >> 1) & !(1 << 62);
            if printable(x ^ k) && printable((2 * x) ^ k) {
                return x;
            }
        };
        let (x, y) = (find(K0), find(K1));
        let name = |a: u64, b: u64| {
            let mut bytes = (a ^ K0).to_le_bytes().to_vec();
            bytes.extend_from_slice(&(b ^ K1).to_le_bytes());
            ProducerId::named(std::str::from_utf8(&bytes).unwrap_or_default())
        };
        (name(2 * x, y), name(x, 2 * y))
    }

    #[test]
    fn keys_sharing_a_hash_and_activity_go_together_in_id_order() {
        let (a, b) = colliding_names();
        assert_ne!(a, b);
        assert_eq!(hash_key(&a, 0), hash_key(&b, 0), "the names collide");
        let (first, second) = if a < b { (a, b) } else { (b, a) };
        let mut s = Shards::default();
        let mut order = Order::default();
        for k in 0..3_000u64 {
            install(
                &mut s,
                &mut order,
                &ProducerId::numeric(k),
                0,
                10 + k as i64,
            );
        }
        // Same activity: one rank. In flight, one of them is passed over;
        // the other still goes.
        install(&mut s, &mut order, &second, 0, 5);
        install(&mut s, &mut order, &first, 0, 5);
        let got = order.victims(&s, 1, |_, id, _| *id == first);
        assert_eq!(keys(&s, &got), vec![(second.clone(), 0)]);
        assert!(s.remove(got[0].0, &second, 0));
        // Both, once the first's record is applied: taken together, in id
        // order (one more than asked).
        install(&mut s, &mut order, &second, 0, 5);
        install(&mut s, &mut order, &first, 0, 5);
        let got = order.victims(&s, 1, |_, _, _| false);
        assert_eq!(
            got.iter()
                .map(|(_, id, p)| (id.clone(), *p))
                .collect::<Vec<_>>(),
            vec![(first.clone(), 0), (second.clone(), 0)]
        );
        for (h, id, p) in &got {
            assert!(s.remove(*h, id, *p));
        }
        // Different activities: two ranks, each its own victim in order.
        install(&mut s, &mut order, &second, 0, 6);
        install(&mut s, &mut order, &first, 0, 7);
        let got = order.victims(&s, 1, |_, _, _| false);
        assert_eq!(keys(&s, &got), vec![(second.clone(), 0)]);
        assert!(s.remove(got[0].0, &second, 0));
        let got = order.victims(&s, 2, |_, _, _| false);
        assert_eq!(
            keys(&s, &got),
            vec![(first, 0), (ProducerId::numeric(0), 0)]
        );
    }
}
