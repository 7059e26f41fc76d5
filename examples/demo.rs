//! The task's example, printed append by append.

use producer_state::ProducerStateManager;

fn main() {
    let mut mgr = ProducerStateManager::new();
    let steps: [(i16, i32, &str); 6] = [
        (0, 0, ""),
        (0, 1, ""),
        (0, 1, "retry of the above"),
        (0, 5, "gap: 2, 3, 4 missing"),
        (1, 0, "new session restarts at 0"),
        (0, 2, "stale epoch: a zombie"),
    ];
    for (epoch, sequence, why) in steps {
        let outcome = mgr.append("p1", 0, epoch, sequence);
        let note = if why.is_empty() {
            String::new()
        } else {
            format!("  ({why})")
        };
        println!(
            "append(\"p1\", partition 0, epoch {epoch}, sequence {sequence}) -> {outcome}{note}"
        );
    }
}
