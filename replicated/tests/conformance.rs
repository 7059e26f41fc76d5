//! openraft's own storage conformance suite (`openraft::testing::Suite`)
//! against the on-disk log and the state machine: vote, log state,
//! append, truncate, purge, apply of blank and membership entries,
//! snapshot build and install, as openraft expects of any storage.

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use producer_state_raft::{LogStore, NodeId, StateMachine, TypeConfig};

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (log, _) = LogStore::open(dir.path()).expect("open log");
        let sm = StateMachine::open(dir.path(), None).expect("open state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn the_log_and_state_machine_pass_openraft_s_storage_suite() {
    if let Err(e) = Suite::test_all(OnDisk) {
        panic!("openraft's storage suite failed: {e}");
    }
}
