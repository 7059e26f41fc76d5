//! Snapshot files split by an independent reading of docs/format.md (for
//! the golden-file tests, which compare entries as sets: their order is
//! the in-memory layout's).

// Each test crate that includes `common` uses only part of it.
#![allow(dead_code)]

/// The entries of a snapshot, each as its bytes, sorted: split by an
/// independent reading of docs/format.md, so this also checks the document.
pub fn snapshot_entries(file: &[u8]) -> Vec<Vec<u8>> {
    let count = u64::from_le_bytes(file[24..32].try_into().unwrap()) as usize;
    let body_len = u64::from_le_bytes(file[32..40].try_into().unwrap()) as usize;
    assert_eq!(file.len(), 48 + body_len + 4);
    let mut body = &file[48..48 + body_len];
    let version = u16::from_le_bytes(file[8..10].try_into().unwrap());
    let kafka = u16::from_le_bytes(file[10..12].try_into().unwrap()) & 1 != 0;
    if version >= 3 {
        // The store section: its length, then that many bytes.
        let section = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
        body = &body[4 + section..];
        // Flag bit 0: a Kafka section, its `u64` length, then that many.
        if kafka {
            let section = u64::from_le_bytes(body[..8].try_into().unwrap()) as usize;
            body = &body[8 + section..];
        }
    }
    let mut out = Vec::new();
    let mut at = 0;
    // Version 4 on: where the current block ends, and its entries left.
    let (mut block_end, mut block_left) = (0, 0u32);
    while version >= 2 && at < body.len() {
        if version >= 4 && at == block_end {
            // A block: `u16` shard, `u32` entries, `u32` bytes.
            assert_eq!(block_left, 0, "a block's count");
            let shard = u16::from_le_bytes(body[at..at + 2].try_into().unwrap());
            if kafka {
                assert_eq!(shard, 65535, "a Kafka-mode block is not one shard's");
            } else {
                assert!(shard < 256);
            }
            block_left = u32::from_le_bytes(body[at + 2..at + 6].try_into().unwrap());
            let len = u32::from_le_bytes(body[at + 6..at + 10].try_into().unwrap()) as usize;
            at += 10;
            block_end = at + len;
        }
        if version >= 4 {
            block_left -= 1;
        }
        let start = at;
        let shape = body[at];
        let batches = (shape & 7) as usize;
        at += 1 + if shape & 8 == 0 {
            8
        } else {
            2 + u16::from_le_bytes(body[at + 1..at + 3].try_into().unwrap()) as usize
        };
        at += 4 + 2 + 4; // partition, epoch, last sequence
        if version == 3 || (version >= 4 && shape & 0x80 == 0) {
            at += 8; // last activity (version 4 on: unless it is a timestamp)
        }
        if batches > 0 {
            let layout = u16::from_le_bytes(body[at..at + 2].try_into().unwrap());
            at += 2;
            let with_meta = (layout & 0x1f).count_ones() as usize;
            let span = [0, 1, 2, 4][(shape >> 4) as usize & 3];
            let delta = |c: u16| [0, 1, 2, 3, 4, 5, 6, 8][c as usize & 7];
            at += batches * span;
            if with_meta > 0 {
                at += 16 + (with_meta - 1) * (delta(layout >> 5) + delta(layout >> 8));
            }
        }
        out.push(body[start..at].to_vec());
        assert!(version < 4 || at <= block_end, "an entry past its block");
    }
    assert_eq!(block_left, 0);
    while version == 1 && at < body.len() {
        let start = at;
        at += match body[at] {
            0 => 1 + 8,
            1 => 1 + 2 + u16::from_le_bytes(body[at + 1..at + 3].try_into().unwrap()) as usize,
            k => panic!("id kind {k}"),
        };
        at += 4 + 2 + 4; // partition, epoch, last sequence
        let batches = body[at];
        at += 1;
        for _ in 0..batches {
            at += 4 + 4;
            at += 1 + if body[at] == 1 { 16 } else { 0 };
        }
        out.push(body[start..at].to_vec());
    }
    assert_eq!(out.len(), count);
    out.sort();
    out
}
