//! Tests of `txn_coordinator.rs`.

use super::*;
use std::cell::RefCell;

/// (topic, partition, producer id, epoch, commit, coordinator epoch).
type Marker = (String, i32, i64, i16, bool, i32);

/// Markers recorded, or refused for the partitions listed.
#[derive(Default)]
struct Recorded {
    markers: RefCell<Vec<Marker>>,
    offsets: RefCell<Vec<(String, i64, bool)>>,
    refuse: RefCell<BTreeSet<(String, i32)>>,
}

impl Markers for Recorded {
    fn write_marker(
        &self,
        topic: &str,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> std::result::Result<(), String> {
        if self
            .refuse
            .borrow()
            .contains(&(topic.to_string(), partition))
        {
            return Err("refused".into());
        }
        self.markers.borrow_mut().push((
            topic.into(),
            partition,
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
        ));
        Ok(())
    }

    fn complete_offsets(
        &self,
        group: &str,
        producer_id: i64,
        commit: bool,
    ) -> std::result::Result<(), String> {
        self.offsets
            .borrow_mut()
            .push((group.into(), producer_id, commit));
        Ok(())
    }
}

fn ids() -> impl FnMut() -> Result<i64> {
    let mut next = 100;
    move || {
        next += 1;
        Ok(next)
    }
}

fn who(producer_id: i64, epoch: i16) -> Caller<'static> {
    Caller {
        transactional_id: "t",
        producer_id,
        epoch,
        fenced: code::PRODUCER_FENCED,
    }
}

fn parts(p: &[(&str, i32)]) -> Vec<(String, i32)> {
    p.iter().map(|(t, n)| (t.to_string(), *n)).collect()
}

#[test]
fn a_transaction_commits_aborts_and_fences_as_kafkas_state_machine() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("transactions.log");
    let mut c = TxnCoordinator::open(&path).unwrap();
    let m = Recorded::default();
    let mut new_id = ids();
    let a = c.init_producer_id("t", 60_000, &m, &mut new_id).unwrap();
    assert_eq!(
        a,
        Initialized {
            producer_id: 101,
            producer_epoch: 0
        }
    );
    // Not in a transaction: a transactional write is refused.
    assert_eq!(c.verify("t", 101, 0, "x", 0), Err(code::INVALID_TXN_STATE));
    c.add(&who(101, 0), &parts(&[("x", 0), ("x", 1)]), &[], 5)
        .unwrap();
    assert_eq!(c.verify("t", 101, 0, "x", 1), Ok(()));
    assert_eq!(c.verify("t", 101, 0, "x", 2), Err(code::INVALID_TXN_STATE));
    c.add(&who(101, 0), &[], &["g".into()], 6).unwrap();
    c.end_txn(&who(101, 0), true, &m).unwrap();
    let epoch = c.coordinator_epoch();
    assert_eq!(
        *m.markers.borrow(),
        [
            ("x".to_string(), 0, 101, 0, true, epoch),
            ("x".to_string(), 1, 101, 0, true, epoch)
        ]
    );
    assert_eq!(*m.offsets.borrow(), [("g".to_string(), 101, true)]);
    // A retry of the commit is answered, and writes nothing more.
    c.end_txn(&who(101, 0), true, &m).unwrap();
    assert_eq!(m.markers.borrow().len(), 2);
    assert_eq!(
        c.end_txn(&who(101, 0), false, &m),
        Err(code::INVALID_TXN_STATE)
    );
    // A second instance fences the first, aborting what it left open.
    c.add(&who(101, 0), &parts(&[("y", 0)]), &[], 7).unwrap();
    let b = c.init_producer_id("t", 60_000, &m, &mut new_id).unwrap();
    assert_eq!(
        b,
        Initialized {
            producer_id: 101,
            producer_epoch: 1
        }
    );
    assert_eq!(
        m.markers.borrow().last().unwrap(),
        &("y".to_string(), 0, 101, 0, false, epoch)
    );
    assert_eq!(
        c.add(&who(101, 0), &parts(&[("y", 0)]), &[], 9),
        Err(code::PRODUCER_FENCED)
    );
    assert_eq!(
        c.end_txn(&who(999, 1), true, &m),
        Err(code::INVALID_PRODUCER_ID_MAPPING)
    );
    assert_eq!(
        c.init_producer_id("t", MAX_TIMEOUT_MS + 1, &m, &mut new_id),
        Err(code::INVALID_TRANSACTION_TIMEOUT)
    );
}

#[test]
fn a_prepared_transaction_completes_after_a_restart_and_a_timeout_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("transactions.log");
    let m = Recorded::default();
    let mut new_id = ids();
    {
        let mut c = TxnCoordinator::open(&path).unwrap();
        c.init_producer_id("t", 1000, &m, &mut new_id).unwrap();
        c.add(&who(101, 0), &parts(&[("x", 0), ("x", 1)]), &[], 10)
            .unwrap();
        // The second partition refuses its marker: the commit stays
        // prepared (the crash between Prepare and Complete).
        m.refuse.borrow_mut().insert(("x".into(), 1));
        assert_eq!(
            c.end_txn(&who(101, 0), true, &m),
            Err(code::KAFKA_STORAGE_ERROR)
        );
    }
    m.refuse.borrow_mut().clear();
    let mut c = TxnCoordinator::open(&path).unwrap();
    assert_eq!(c.get("t").unwrap().state, TxnState::PrepareCommit);
    assert_eq!(c.recover(&m), 1);
    assert_eq!(c.get("t").unwrap().state, TxnState::CompleteCommit);
    let commits: Vec<_> = m.markers.borrow().iter().filter(|x| x.4).cloned().collect();
    assert_eq!(commits.len(), 3, "partition 0 twice (once per run), 1 once");
    assert_eq!(
        commits[2].5,
        commits[0].5 + 1,
        "the new run's coordinator epoch"
    );
    // A transaction older than its timeout is aborted with the epoch
    // bumped: the abandoned producer is fenced.
    c.add(&who(101, 0), &parts(&[("z", 0)]), &[], 2000).unwrap();
    assert!(c.abort_expired(2500, &m).is_empty());
    assert_eq!(c.abort_expired(3001, &m), ["t"]);
    assert_eq!(m.markers.borrow().last().unwrap().3, 1);
    assert_eq!(c.get("t").unwrap().state, TxnState::CompleteAbort);
    assert_eq!(
        c.verify("t", 101, 0, "z", 0),
        Err(code::INVALID_PRODUCER_EPOCH)
    );
    drop(c);
    let c = TxnCoordinator::open(&path).unwrap();
    assert_eq!(c.get("t").unwrap().producer_epoch, 1);
}
