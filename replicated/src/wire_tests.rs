//! Tests of `wire.rs`.

use super::*;
use crate::command::{Append, LifecycleOutcome, Outcome, Response};
use openraft::{CommittedLeaderId, LeaderId};
use openraft::{EntryPayload, Membership, StoredMembership};
use std::collections::BTreeSet;

fn log_id(term: u64, node: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn vote() -> Vote<NodeId> {
    Vote {
        leader_id: LeaderId {
            term: 7,
            node_id: 2,
        },
        committed: true,
    }
}

fn entries() -> Vec<Entry<TypeConfig>> {
    vec![
        Entry {
            log_id: log_id(1, 1, 0),
            payload: EntryPayload::Membership(Membership::new(
                vec![BTreeSet::from([1, 2, 3])],
                None,
            )),
        },
        Entry {
            log_id: log_id(1, 1, 1),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(2, 3, 2),
            payload: EntryPayload::Normal(Command::AppendAll(vec![
                Append::batch("orders", -1, 3, 0, 9, 1_700_000_000_000),
                Append::single(u64::MAX, i32::MAX, i16::MIN, 5),
            ])),
        },
    ]
}

fn meta() -> SnapshotMeta<NodeId, BasicNode> {
    SnapshotMeta {
        last_log_id: Some(log_id(2, 3, 2)),
        last_membership: StoredMembership::new(
            Some(log_id(1, 1, 0)),
            Membership::new(vec![BTreeSet::from([1, 2, 3])], None),
        ),
        snapshot_id: "2-3-2-1".into(),
    }
}

fn requests() -> Vec<Request> {
    vec![
        Request::AppendEntries(AppendEntriesRequest {
            vote: vote(),
            prev_log_id: Some(log_id(1, 1, 1)),
            leader_commit: None,
            entries: entries(),
        }),
        Request::AppendEntries(AppendEntriesRequest {
            vote: vote(),
            prev_log_id: None,
            leader_commit: Some(log_id(9, 9, 9)),
            entries: Vec::new(),
        }),
        Request::Vote(VoteRequest {
            vote: vote(),
            last_log_id: Some(log_id(3, 1, 44)),
        }),
        Request::SnapshotChunk(SnapshotChunk {
            vote: vote(),
            meta: meta(),
            total: 10,
            offset: 4,
            data: vec![1, 2, 3, 4, 5, 6],
        }),
        Request::Submit(Command::Append(Append::batch(1u64, 0, 0, 0, 4, 9))),
        Request::Status,
        Request::Entries { from: 3, max: 100 },
        Request::Export,
    ]
}

fn replies() -> Vec<Reply> {
    let answer = Answer {
        log_id: log_id(4, 2, 17),
        first_slot: 3,
        response: Response {
            outcomes: vec![
                Outcome::Accepted { offset: 17 << 16 },
                Outcome::Duplicate { original: None },
                Outcome::Duplicate {
                    original: Some((-1, i64::MIN)),
                },
                Outcome::OutOfOrder {
                    reason: "gap".into(),
                },
                Outcome::FencedEpoch { current_epoch: -2 },
            ],
            lifecycle: None,
        },
    };
    let lifecycle = |l| {
        Reply::Submit(SubmitReply::Answered(Answer {
            log_id: log_id(1, 1, 1),
            first_slot: 0,
            response: Response {
                outcomes: Vec::new(),
                lifecycle: Some(l),
            },
        }))
    };
    vec![
        Reply::AppendEntries(AppendEntriesResponse::Success),
        Reply::AppendEntries(AppendEntriesResponse::PartialSuccess(None)),
        Reply::AppendEntries(AppendEntriesResponse::PartialSuccess(Some(log_id(1, 2, 3)))),
        Reply::AppendEntries(AppendEntriesResponse::Conflict),
        Reply::AppendEntries(AppendEntriesResponse::HigherVote(vote())),
        Reply::Vote(VoteResponse {
            vote: vote(),
            vote_granted: true,
            last_log_id: None,
        }),
        Reply::Snapshot(SnapshotAck::Received { next: 1 << 40 }),
        Reply::Snapshot(SnapshotAck::Installed { vote: vote() }),
        Reply::Submit(SubmitReply::Answered(answer)),
        lifecycle(LifecycleOutcome::Expired { keys: 3 }),
        lifecycle(LifecycleOutcome::PartitionRemoved { keys: 0 }),
        lifecycle(LifecycleOutcome::Imported { keys: u64::MAX }),
        lifecycle(LifecycleOutcome::ImportRefused {
            reason: "conflict".into(),
        }),
        Reply::Submit(SubmitReply::NotLeader {
            leader: Some(3),
            addr: "127.0.0.1:7003".into(),
        }),
        Reply::Submit(SubmitReply::NotLeader {
            leader: None,
            addr: String::new(),
        }),
        Reply::Submit(SubmitReply::Unknown {
            reason: "leader changed".into(),
        }),
        Reply::Submit(SubmitReply::Invalid {
            reason: "too long".into(),
        }),
        Reply::Status(Status {
            id: 2,
            term: 9,
            leader: Some(1),
            last_applied: Some(log_id(9, 1, 100)),
            last_log_index: Some(101),
            members: vec![(1, "a".into()), (2, "b".into())],
            snapshots_installed: 3,
            snapshots_refused: 1,
            log_fsyncs: 77,
        }),
        Reply::Entries(entries()),
        Reply::Export {
            last_applied: None,
            snapshot: vec![9; 40],
        },
        Reply::Failed("busy".into()),
    ]
}

fn parse(bytes: &[u8]) -> Result<Frame, FrameError> {
    let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(len, bytes.len() - 4);
    parse_frame(&bytes[4..])
}

#[test]
fn every_message_round_trips_and_every_cut_or_extra_byte_is_refused() {
    for (i, req) in requests().into_iter().enumerate() {
        let bytes = req.encode(i as u64).unwrap();
        let f = parse(&bytes).unwrap();
        assert_eq!(f.id, i as u64);
        let back = Request::decode(&f).unwrap();
        assert_eq!(format!("{back:?}"), format!("{req:?}"));
        for cut in 0..f.body.len() {
            let short = Frame {
                kind: f.kind,
                id: 0,
                body: f.body[..cut].to_vec(),
            };
            assert!(Request::decode(&short).is_err(), "{req:?} cut at {cut}");
        }
        let mut long = f.body.clone();
        long.push(0);
        let long = Frame {
            kind: f.kind,
            id: 0,
            body: long,
        };
        // An export's state runs to the end of the frame; every other
        // body is exact.
        assert!(Request::decode(&long).is_err(), "{req:?} with a byte more");
    }
    for (i, reply) in replies().into_iter().enumerate() {
        let bytes = reply.encode(i as u64).unwrap();
        let f = parse(&bytes).unwrap();
        let back = Reply::decode(&f).unwrap();
        assert_eq!(format!("{back:?}"), format!("{reply:?}"));
        for cut in 0..f.body.len() {
            let short = Frame {
                kind: f.kind,
                id: 0,
                body: f.body[..cut].to_vec(),
            };
            let decoded = Reply::decode(&short);
            // Cutting an export's state leaves a shorter state, which
            // the core crate's decoder refuses (its own checksum).
            if f.kind != Kind::ExportReply || cut < 1 {
                assert!(decoded.is_err(), "{reply:?} cut at {cut}");
            }
        }
    }
}

#[test]
fn a_damaged_frame_is_refused_by_its_checksum_and_its_head() {
    let bytes = requests()[0].encode(5).unwrap();
    for at in 4..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        assert!(parse(&bad).is_err(), "flip at {at} accepted");
    }
    // Another version, with a valid checksum, is refused by name.
    let mut other = bytes.clone();
    other[8] = VERSION + 1;
    let crc = crc32c::crc32c(&other[8..]);
    other[4..8].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(parse(&other), Err(FrameError::Version(v)) if v == VERSION + 1));
}

#[tokio::test]
async fn a_length_past_the_bound_is_refused_before_allocation_and_short_frames_fail() {
    let mut claim = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
    claim.extend_from_slice(&[0; 16]);
    assert!(matches!(
        read_frame(&mut claim.as_slice()).await,
        Err(FrameError::TooLong(n)) if n == MAX_FRAME as u64 + 1
    ));
    // A frame that claims more than arrives: an error, not a hang or a
    // 32 MiB buffer.
    let mut liar = (MAX_FRAME as u32).to_le_bytes().to_vec();
    liar.extend_from_slice(&[0; 100]);
    assert!(matches!(
        read_frame(&mut liar.as_slice()).await,
        Err(FrameError::Io(_))
    ));
    // Clean end before a frame; two frames back to back.
    assert!(read_frame(&mut [].as_slice()).await.unwrap().is_none());
    let mut two = Request::Status.encode(1).unwrap();
    two.extend(Request::Export.encode(2).unwrap());
    let mut r = two.as_slice();
    assert_eq!(read_frame(&mut r).await.unwrap().unwrap().id, 1);
    assert_eq!(
        read_frame(&mut r).await.unwrap().unwrap().kind,
        Kind::Export
    );
    assert!(read_frame(&mut r).await.unwrap().is_none());
}

#[test]
fn counts_are_bounded_by_the_bytes_there() {
    // An AppendEntries claiming 2^32 - 1 entries in a few bytes.
    let f = frame(Kind::AppendEntries, 0, |out| {
        put_vote(out, &vote());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&u32::MAX.to_le_bytes());
        Ok(())
    })
    .unwrap();
    let f = parse(&f).unwrap();
    assert_eq!(Request::decode(&f).unwrap_err(), "more entries than bytes");
    // A frame whose body would pass the bound is not written.
    let huge = Request::Submit(Command::ImportPartition {
        export: vec![0; MAX_FRAME],
    });
    assert!(huge.encode(0).is_err());
}

#[test]
fn a_snapshot_piece_past_its_snapshot_or_with_a_bad_checksum_is_refused() {
    let mut chunk = SnapshotChunk {
        vote: vote(),
        meta: meta(),
        total: 5,
        offset: 0,
        data: vec![1, 2, 3, 4, 5, 6],
    };
    let f = parse(&Request::SnapshotChunk(chunk.clone()).encode(0).unwrap()).unwrap();
    assert_eq!(
        Request::decode(&f).unwrap_err(),
        "a snapshot piece past the snapshot's end"
    );
    chunk.total = 6;
    let mut bytes = Request::SnapshotChunk(chunk).encode(0).unwrap();
    // Flip a data byte and fix the frame CRC: the piece's own CRC
    // still catches it.
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    let crc = crc32c::crc32c(&bytes[8..]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    let f = parse(&bytes).unwrap();
    assert_eq!(
        Request::decode(&f).unwrap_err(),
        "a snapshot piece's checksum"
    );
}
