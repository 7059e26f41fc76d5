//! The fields of a frame's body (the module docs of [`super`] list them):
//! strings, votes, log ids, entries and a command's response, each
//! written and read back with its counts and lengths checked against the
//! bytes left before anything is allocated.

use openraft::{CommittedLeaderId, Entry, LeaderId, LogId, Vote};

use super::MIN_ENTRY;
use crate::command::{LifecycleOutcome, Outcome, Reader, Response};
use crate::log_file;
use crate::{NodeId, TypeConfig};

pub(super) fn put_u32_len(out: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
    let n = u32::try_from(n).map_err(|_| std::io::Error::other("a length past u32"))?;
    out.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

pub(super) fn put_str(out: &mut Vec<u8>, s: &str) -> std::io::Result<()> {
    put_u32_len(out, s.len())?;
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

pub(super) fn get_str(r: &mut Reader<'_>) -> Result<String, &'static str> {
    let n = r.u32()? as usize;
    let b = r.take(n)?;
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| "a string not UTF-8")
}

pub(super) fn put_vote(out: &mut Vec<u8>, v: &Vote<NodeId>) {
    out.extend_from_slice(&v.leader_id.term.to_le_bytes());
    out.extend_from_slice(&v.leader_id.node_id.to_le_bytes());
    out.push(u8::from(v.committed));
}

pub(super) fn get_vote(r: &mut Reader<'_>) -> Result<Vote<NodeId>, &'static str> {
    let term = r.u64()?;
    let node_id = r.u64()?;
    let committed = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err("a vote's committed flag"),
    };
    Ok(Vote {
        leader_id: LeaderId { term, node_id },
        committed,
    })
}

pub(super) fn put_log_id(out: &mut Vec<u8>, l: &LogId<NodeId>) {
    out.extend_from_slice(&l.leader_id.term.to_le_bytes());
    out.extend_from_slice(&l.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(&l.index.to_le_bytes());
}

pub(super) fn get_log_id(r: &mut Reader<'_>) -> Result<LogId<NodeId>, &'static str> {
    let term = r.u64()?;
    let node = r.u64()?;
    let index = r.u64()?;
    Ok(LogId::new(CommittedLeaderId::new(term, node), index))
}

pub(super) fn put_opt_log_id(out: &mut Vec<u8>, l: &Option<LogId<NodeId>>) {
    match l {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            put_log_id(out, l);
        }
    }
}

pub(super) fn get_opt_log_id(r: &mut Reader<'_>) -> Result<Option<LogId<NodeId>>, &'static str> {
    match r.u8()? {
        0 => Ok(None),
        1 => get_log_id(r).map(Some),
        _ => Err("a log id's presence flag"),
    }
}

pub(super) fn put_entries(out: &mut Vec<u8>, entries: &[Entry<TypeConfig>]) -> std::io::Result<()> {
    put_u32_len(out, entries.len())?;
    for e in entries {
        put_log_id(out, &e.log_id);
        let at = out.len();
        out.extend_from_slice(&[0u8; 4]);
        log_file::encode_payload(&e.payload, out)?;
        let n = out.len() - at - 4;
        let n = u32::try_from(n).map_err(|_| std::io::Error::other("an entry past u32"))?;
        out[at..at + 4].copy_from_slice(&n.to_le_bytes());
    }
    Ok(())
}

pub(super) fn get_entries(r: &mut Reader<'_>) -> Result<Vec<Entry<TypeConfig>>, &'static str> {
    let n = r.u32()? as usize;
    // Bounded by the bytes there before anything is allocated.
    if n > r.0.len() / MIN_ENTRY {
        return Err("more entries than bytes");
    }
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let log_id = get_log_id(r)?;
        let len = r.u32()? as usize;
        let payload = log_file::decode_payload(r.take(len)?)
            .map_err(|why| why.unwrap_or("an entry's payload"))?;
        entries.push(Entry { log_id, payload });
    }
    Ok(entries)
}

pub(super) fn put_response(out: &mut Vec<u8>, resp: &Response) -> std::io::Result<()> {
    put_u32_len(out, resp.outcomes.len())?;
    for o in &resp.outcomes {
        match o {
            Outcome::Accepted { offset } => {
                out.push(0);
                out.extend_from_slice(&offset.to_le_bytes());
            }
            Outcome::Duplicate { original } => {
                out.push(1);
                match original {
                    None => out.push(0),
                    Some((offset, ts)) => {
                        out.push(1);
                        out.extend_from_slice(&offset.to_le_bytes());
                        out.extend_from_slice(&ts.to_le_bytes());
                    }
                }
            }
            Outcome::OutOfOrder { reason } => {
                out.push(2);
                put_str(out, reason)?;
            }
            Outcome::FencedEpoch { current_epoch } => {
                out.push(3);
                out.extend_from_slice(&current_epoch.to_le_bytes());
            }
        }
    }
    match &resp.lifecycle {
        None => out.push(0),
        Some(l) => {
            out.push(1);
            match l {
                LifecycleOutcome::Expired { keys } => {
                    out.push(0);
                    out.extend_from_slice(&keys.to_le_bytes());
                }
                LifecycleOutcome::PartitionRemoved { keys } => {
                    out.push(1);
                    out.extend_from_slice(&keys.to_le_bytes());
                }
                LifecycleOutcome::Imported { keys } => {
                    out.push(2);
                    out.extend_from_slice(&keys.to_le_bytes());
                }
                LifecycleOutcome::ImportRefused { reason } => {
                    out.push(3);
                    put_str(out, reason)?;
                }
            }
        }
    }
    Ok(())
}

pub(super) fn get_response(r: &mut Reader<'_>) -> Result<Response, &'static str> {
    let n = r.u32()? as usize;
    // Every outcome takes at least its tag and a byte.
    if n > r.0.len() / 2 {
        return Err("more outcomes than bytes");
    }
    let mut outcomes = Vec::with_capacity(n);
    for _ in 0..n {
        outcomes.push(match r.u8()? {
            0 => Outcome::Accepted {
                offset: r.u64()? as i64,
            },
            1 => Outcome::Duplicate {
                original: match r.u8()? {
                    0 => None,
                    1 => Some((r.u64()? as i64, r.u64()? as i64)),
                    _ => return Err("a duplicate's original flag"),
                },
            },
            2 => Outcome::OutOfOrder {
                reason: get_str(r)?,
            },
            3 => Outcome::FencedEpoch {
                current_epoch: r.u16()? as i16,
            },
            _ => return Err("an outcome tag"),
        });
    }
    let lifecycle = match r.u8()? {
        0 => None,
        1 => Some(match r.u8()? {
            0 => LifecycleOutcome::Expired { keys: r.u64()? },
            1 => LifecycleOutcome::PartitionRemoved { keys: r.u64()? },
            2 => LifecycleOutcome::Imported { keys: r.u64()? },
            3 => LifecycleOutcome::ImportRefused {
                reason: get_str(r)?,
            },
            _ => return Err("a lifecycle outcome tag"),
        }),
        _ => return Err("a lifecycle flag"),
    };
    Ok(Response {
        outcomes,
        lifecycle,
    })
}
