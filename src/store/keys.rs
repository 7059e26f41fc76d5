//! The keys the rules see: the committed state, the keys with appends in
//! flight, and the pre-images a running snapshot needs.

use super::*;

/// A key with appends in flight (queued or written, not yet durable).
pub(super) struct Pending {
    pub(super) hash: u64,
    pub(super) id: ProducerId,
    pub(super) partition: i32,
    /// The key's state once everything in flight is applied.
    pub(super) entry: ProducerEntry,
    /// Position and group of the key's last record in flight.
    pub(super) lsn: u64,
    pub(super) group: u64,
}

/// A queued record waiting to be applied once durable (`Always`).
pub(super) struct Queued {
    pub(super) hash: u64,
    pub(super) request: AppendRequest,
    pub(super) lsn: u64,
}

/// A snapshot in progress: the position and which shards are encoded.
pub(super) struct Capture {
    pub(super) position: u64,
    pub(super) done: [bool; SHARDS],
    /// Per shard: entries as they were at `position`, for keys changed since
    /// (`None`: the key did not exist at `position`).
    pub(super) pre: Vec<HashMap<(ProducerId, i32), Option<ProducerEntry>>>,
}

/// What submitting one request under `Always` came to.
pub(super) enum Submit {
    Done(BatchOutcome),
    /// Accepted and queued at this position, in this group: wait for it.
    Queued {
        group: u64,
        lsn: u64,
    },
    /// The key has records in flight up to this position (in this group)
    /// and the request is not their continuation: wait, then classify again.
    Wait {
        group: u64,
        lsn: u64,
    },
}

impl State {
    pub(super) fn overlay_find(
        &self,
        hash: u64,
        id: &ProducerId,
        partition: i32,
    ) -> Option<&Pending> {
        self.overlay
            .find(hash, |p| p.partition == partition && p.id == *id)
    }

    /// Saves the entry of a key about to change if a snapshot needs it as
    /// it was at the snapshot's position.
    pub(super) fn save_pre_image(&mut self, hash: u64, id: &ProducerId, partition: i32, lsn: u64) {
        let Some(c) = &mut self.capture else { return };
        let s = shard_of(hash);
        if c.done[s] || lsn < c.position {
            return;
        }
        let shards = &self.shards;
        c.pre[s]
            .entry((id.clone(), partition))
            .or_insert_with(|| shards.get(hash, id, partition));
    }

    pub(super) fn enqueue_record(&mut self, r: &AppendRequest) -> u64 {
        let before = self.buf.len();
        self.buf.push(r);
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        self.since_snapshot.0 += 1;
        self.since_snapshot.1 += (self.buf.len() - before) as u64;
        lsn
    }

    /// `Always`: classifies against the in-flight state if the key has one,
    /// else the committed state; queues an accepted request.
    pub(super) fn submit_durable(&mut self, hash: u64, r: &AppendRequest) -> Submit {
        let (base, in_flight) = match self.overlay_find(hash, &r.producer_id, r.partition) {
            Some(p) => (Some(p.entry), Some((p.group, p.lsn))),
            None => (self.shards.get(hash, &r.producer_id, r.partition), None),
        };
        let outcome = rules::classify(
            base.map(|e| e.current()),
            r.epoch,
            r.first,
            r.last,
            |f, l| base.and_then(|e| e.find(f, l)),
        );
        if !outcome.is_accepted() {
            return match in_flight {
                Some((group, lsn)) => Submit::Wait { group, lsn },
                None => Submit::Done(outcome),
            };
        }
        let entry = match base {
            Some(mut e) => {
                e.accept(r.epoch > e.epoch(), r.epoch, r.first, r.last, r.metadata);
                e
            }
            None => ProducerEntry::start(r.epoch, r.first, r.last, r.metadata),
        };
        let lsn = self.enqueue_record(r);
        let group = self.group;
        self.queued.push(Queued {
            hash,
            request: r.clone(),
            lsn,
        });
        match self.overlay.find_mut(hash, |p| {
            p.partition == r.partition && p.id == r.producer_id
        }) {
            Some(p) => {
                p.entry = entry;
                p.lsn = lsn;
                p.group = group;
            }
            None => {
                self.overlay.insert_unique(
                    hash,
                    Pending {
                        hash,
                        id: r.producer_id.clone(),
                        partition: r.partition,
                        entry,
                        lsn,
                        group,
                    },
                    |p| p.hash,
                );
            }
        }
        Submit::Queued { group, lsn }
    }

    /// Buffered policies: classify, apply and queue the record at once.
    #[inline]
    pub(super) fn submit_buffered(&mut self, hash: u64, r: &AppendRequest) -> BatchOutcome {
        if self.capture.is_some() {
            // If the append is rejected, the pre-image equals the current
            // entry, which is harmless.
            let lsn = self.next_lsn;
            self.save_pre_image(hash, &r.producer_id, r.partition, lsn);
        }
        let outcome = self.shards.append(hash, r);
        if outcome.is_accepted() {
            self.enqueue_record(r);
        }
        outcome
    }

    /// `Always`: applies a durable group to the committed state.
    pub(super) fn apply_group(&mut self, group: Vec<Queued>) -> std::result::Result<(), String> {
        for q in group {
            let r = &q.request;
            self.save_pre_image(q.hash, &r.producer_id, r.partition, q.lsn);
            let outcome = self.shards.append(q.hash, r);
            if !outcome.is_accepted() {
                return Err(format!(
                    "internal error: the durable record at position {} did not apply ({outcome})",
                    q.lsn
                ));
            }
            if let Ok(entry) = self.overlay.find_entry(q.hash, |p| {
                p.partition == r.partition && p.id == r.producer_id
            }) && entry.get().lsn == q.lsn
            {
                entry.remove();
            }
        }
        Ok(())
    }
}
