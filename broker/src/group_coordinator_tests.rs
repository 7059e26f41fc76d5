//! Tests of `group_coordinator.rs`.

use super::*;

fn config() -> GroupConfig {
    GroupConfig {
        initial_rebalance_delay: Duration::from_millis(100),
        ..GroupConfig::default()
    }
}

fn join_req(group: &str, member: &str, session_ms: u64) -> JoinRequest {
    JoinRequest {
        group: group.into(),
        member_id: member.into(),
        client_id: "c".into(),
        session_timeout: Duration::from_millis(session_ms),
        rebalance_timeout: Duration::from_millis(2_000),
        protocol_type: "consumer".into(),
        protocols: vec![
            ("range".into(), Bytes::from_static(b"sub")),
            ("roundrobin".into(), Bytes::from_static(b"sub")),
        ],
        require_known_member_id: true,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Drives `tick` until `f` completes (at most 10 s).
async fn with_ticks<T>(c: &GroupCoordinator, f: impl std::future::Future<Output = T>) -> T {
    tokio::pin!(f);
    for _ in 0..1000 {
        tokio::select! {
            v = &mut f => return v,
            _ = tokio::time::sleep(Duration::from_millis(10)) => c.tick(Instant::now()),
        }
    }
    panic!("did not complete within 10 s");
}

/// A first JoinGroup gets MEMBER_ID_REQUIRED and an id; joining with it
/// waits for the rebalance.
async fn member(c: &GroupCoordinator, group: &str, session_ms: u64) -> String {
    let first = c
        .join(join_req(group, "", session_ms), Instant::now())
        .await;
    assert_eq!(first.error, code::MEMBER_ID_REQUIRED);
    first.member_id
}

#[test]
fn members_join_one_generation_get_the_leaders_assignment_and_rebalance_on_a_new_member() {
    let dir = tempfile::tempdir().unwrap();
    let c = std::sync::Arc::new(
        GroupCoordinator::open(&dir.path().join("offsets.log"), config()).unwrap(),
    );
    rt().block_on(async {
        let a = member(&c, "g", 10_000).await;
        let b = member(&c, "g", 10_000).await;
        let (ja, jb) = with_ticks(&c, async {
            tokio::join!(
                c.join(join_req("g", &a, 10_000), Instant::now()),
                c.join(join_req("g", &b, 10_000), Instant::now())
            )
        })
        .await;
        assert_eq!((ja.error, jb.error), (0, 0));
        assert_eq!((ja.generation, jb.generation), (1, 1));
        assert_eq!(ja.protocol.as_deref(), Some("range"));
        let (leader, follower) = if ja.leader == a { (ja, jb) } else { (jb, ja) };
        assert_eq!(leader.members.len(), 2);
        assert!(follower.members.is_empty());
        let given = vec![
            (a.clone(), Bytes::from_static(b"for a")),
            (b.clone(), Bytes::from_static(b"for b")),
        ];
        let (sl, sf) = tokio::join!(
            c.sync("g", 1, &leader.member_id, given, Instant::now()),
            c.sync("g", 1, &follower.member_id, Vec::new(), Instant::now())
        );
        assert_eq!(sl.0, 0);
        assert_eq!(sf.0, 0);
        assert_eq!(c.describe("g").unwrap().state, GroupState::Stable);
        assert_eq!(c.heartbeat("g", 1, &a, Instant::now()), 0);
        assert_eq!(
            c.heartbeat("g", 0, &a, Instant::now()),
            code::ILLEGAL_GENERATION
        );
        assert_eq!(
            c.heartbeat("g", 1, "nobody", Instant::now()),
            code::UNKNOWN_MEMBER_ID
        );
        // A third member: the others learn of the rebalance by their
        // heartbeat and rejoin; all three are in generation 2.
        let d = member(&c, "g", 10_000).await;
        let c2 = c.clone();
        let pending =
            tokio::spawn(async move { c2.join(join_req("g", &d, 10_000), Instant::now()).await });
        let rejoin = async {
            while c.heartbeat("g", 1, &a, Instant::now()) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(
                c.heartbeat("g", 1, &a, Instant::now()),
                code::REBALANCE_IN_PROGRESS
            );
            let (ja, jb) = tokio::join!(
                c.join(join_req("g", &a, 10_000), Instant::now()),
                c.join(join_req("g", &b, 10_000), Instant::now())
            );
            (pending.await.unwrap(), ja, jb)
        };
        let (jd, ja, jb) = with_ticks(&c, rejoin).await;
        assert_eq!((jd.generation, ja.generation, jb.generation), (2, 2, 2));
    });
}

#[test]
fn a_member_that_stops_heartbeating_is_removed_and_the_rest_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = GroupConfig {
        min_session_timeout: Duration::from_millis(100),
        ..config()
    };
    let c = GroupCoordinator::open(&dir.path().join("offsets.log"), cfg).unwrap();
    rt().block_on(async {
        let a = member(&c, "g", 300).await;
        let b = member(&c, "g", 300).await;
        with_ticks(&c, async {
            tokio::join!(
                c.join(join_req("g", &a, 300), Instant::now()),
                c.join(join_req("g", &b, 300), Instant::now())
            )
        })
        .await;
        // Only a heartbeats from now on.
        let alive = async {
            for _ in 0..100 {
                let code = c.heartbeat("g", 1, &a, Instant::now());
                if code == code::REBALANCE_IN_PROGRESS {
                    return c.join(join_req("g", &a, 300), Instant::now()).await;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            panic!("no rebalance after b stopped");
        };
        let j = with_ticks(&c, alive).await;
        assert_eq!(j.error, 0);
        assert_eq!(j.members.len(), 1, "only a is left");
        assert_eq!(c.describe("g").unwrap().members.len(), 1);
    });
}

fn off(o: i64) -> Committed {
    Committed {
        offset: o,
        leader_epoch: -1,
        metadata: String::new(),
    }
}

#[test]
fn offsets_are_durable_and_a_transactions_are_seen_only_once_it_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets.log");
    let tp = ("t".to_string(), 0);
    let tp1 = ("t".to_string(), 1);
    {
        let c = GroupCoordinator::open(&path, config()).unwrap();
        // No member: a simple commit (generation -1).
        c.commit("g", -1, "", &[(tp.clone(), off(10))], Instant::now())
            .unwrap();
        assert_eq!(
            c.commit("g", 3, "ghost", &[(tp.clone(), off(11))], Instant::now()),
            Err(code::UNKNOWN_MEMBER_ID)
        );
        c.txn_commit(
            "g",
            7,
            -1,
            "",
            &[(tp.clone(), off(20)), (tp1.clone(), off(5))],
        )
        .unwrap();
        let f = c.fetch("g", Some(std::slice::from_ref(&tp)), true);
        assert_eq!(f[0].2, code::UNSTABLE_OFFSET_COMMIT);
        let f = c.fetch("g", Some(std::slice::from_ref(&tp)), false);
        assert_eq!(f[0].1, Some(off(10)));
        c.txn_commit("g", 8, -1, "", &[(tp.clone(), off(99))])
            .unwrap();
        c.complete_txn("g", 8, false).unwrap();
    }
    // After a restart: the pending transaction is still pending, the
    // aborted one is gone; committing makes its offsets the group's.
    let c = GroupCoordinator::open(&path, config()).unwrap();
    assert_eq!(
        c.fetch("g", Some(std::slice::from_ref(&tp)), true)[0].2,
        code::UNSTABLE_OFFSET_COMMIT
    );
    c.complete_txn("g", 7, true).unwrap();
    let all = c.fetch("g", None, true);
    assert_eq!(
        all,
        [
            (tp.clone(), Some(off(20)), 0),
            (tp1.clone(), Some(off(5)), 0)
        ]
    );
    let long = Committed {
        metadata: "m".repeat(5000),
        ..off(1)
    };
    assert_eq!(
        c.commit("g", -1, "", &[(tp.clone(), long)], Instant::now()),
        Err(code::OFFSET_METADATA_TOO_LARGE)
    );
    assert_eq!(
        c.fetch("other", Some(std::slice::from_ref(&tp)), false)[0].1,
        None
    );
}
