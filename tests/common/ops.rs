//! Random appends for property tests, chosen relative to the model's state
//! so that they hit every rule often (in-order, retries of retained batches,
//! gaps, new sessions, zombies, the sequence wrap), not only rule 1.

#![allow(dead_code)]

use proptest::prelude::*;

use producer_state::{AppendRequest, Batch, ProducerId};

use super::model::Model;

#[derive(Clone, Debug)]
pub enum Seq {
    Next,
    Same,
    Back(u8),
    Ahead(u8),
    Zero,
    NearMax,
    Negative,
    Any(i32),
    /// Resend the k-th retained batch of the key, if it has one.
    Retry(u8),
}

#[derive(Clone, Debug)]
pub enum Epoch {
    Same,
    Up,
    Down,
    Extreme(i16),
}

#[derive(Clone, Debug)]
pub struct Op {
    pub key: u8,
    pub epoch: Epoch,
    pub seq: Seq,
    /// 0: single-sequence append; n: a batch of n records; 255: up to MAX.
    pub records: u8,
    pub offset: i64,
}

pub const KEYS: u8 = 6;

pub fn key(k: u8) -> (ProducerId, i32) {
    let id = match k % 3 {
        0 => ProducerId::from(1u64),
        1 => ProducerId::from(u64::MAX),
        _ => ProducerId::from("p1"),
    };
    (id, i32::from(k / 3))
}

pub fn op() -> impl Strategy<Value = Op> {
    let seq = prop_oneof![
        40 => Just(Seq::Next),
        8 => Just(Seq::Same),
        6 => (1u8..8).prop_map(Seq::Back),
        6 => (2u8..8).prop_map(Seq::Ahead),
        6 => Just(Seq::Zero),
        2 => Just(Seq::NearMax),
        1 => Just(Seq::Negative),
        2 => any::<i32>().prop_map(Seq::Any),
        10 => (0u8..6).prop_map(Seq::Retry),
    ];
    let epoch = prop_oneof![
        85 => Just(Epoch::Same),
        7 => Just(Epoch::Up),
        5 => Just(Epoch::Down),
        3 => prop_oneof![Just(i16::MAX), Just(i16::MIN), Just(-1i16), Just(0i16)].prop_map(Epoch::Extreme),
    ];
    let records = prop_oneof![
        5 => Just(0u8),
        4 => 1u8..5,
        1 => Just(255u8),
    ];
    (0..KEYS, epoch, seq, records, any::<i64>()).prop_map(|(key, epoch, seq, records, offset)| Op {
        key,
        epoch,
        seq,
        records,
        offset,
    })
}

/// Turns an op into a concrete request against the model's current state.
pub fn request(op: &Op, model: &Model) -> AppendRequest {
    let (id, partition) = key(op.key);
    let entry = model.entry(&(id.clone(), partition));
    let (cur_epoch, last) = entry.map_or((0, -1), |e| (e.epoch, e.last));
    let epoch = match op.epoch {
        Epoch::Same => cur_epoch,
        Epoch::Up => cur_epoch.saturating_add(1),
        Epoch::Down => cur_epoch.saturating_sub(1),
        Epoch::Extreme(e) => e,
    };
    if let Seq::Retry(k) = op.seq
        && let Some(b) = entry
            .and_then(|e| e.retained.as_ref())
            .and_then(|v| v.get(usize::from(k) % v.len().max(1)))
    {
        {
            return match b.2 {
                Some(m) => AppendRequest::batch(
                    id,
                    partition,
                    epoch,
                    Batch::new(b.0, b.1, m.offset, m.timestamp),
                ),
                None => AppendRequest::single(id, partition, epoch, b.0),
            };
        }
    }
    let first = match op.seq {
        Seq::Next | Seq::Retry(_) => {
            if last == i32::MAX {
                0
            } else {
                last + 1
            }
        }
        Seq::Same => last.max(0),
        Seq::Back(k) => last.saturating_sub(i32::from(k)).max(0),
        Seq::Ahead(k) => last.saturating_add(i32::from(k)),
        Seq::Zero => 0,
        Seq::NearMax => i32::MAX - 1,
        Seq::Negative => -1,
        Seq::Any(s) => s,
    };
    match op.records {
        0 => AppendRequest::single(id, partition, epoch, first),
        255 => AppendRequest::batch(
            id,
            partition,
            epoch,
            Batch::new(first, i32::MAX - 1, op.offset, op.offset / 3),
        ),
        n => {
            let last = first.saturating_add(i32::from(n) - 1);
            AppendRequest::batch(
                id,
                partition,
                epoch,
                Batch::new(first, last, op.offset, op.offset / 3),
            )
        }
    }
}
