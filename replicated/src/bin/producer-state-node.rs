//! One replica of a producer-state group as a process.
//!
//! `producer-state-node --id N --dir DIR --listen ADDR --members
//! 1=ADDR,2=ADDR,3=ADDR [--heartbeat-ms 50] [--snapshot-every 5000]
//! [--keep-logs 500] [--in-flight 2] [--threads 0] [--allow-remote]`
//!
//! Runs replica N on DIR, serving its peers and clients on ADDR, in the
//! group of the members named (each with the address the others reach it
//! at); prints `READY N ADDR` once it listens and runs until SIGINT or
//! SIGTERM. Three of them make a group (docs/scaling.md, "Three
//! processes").

fn main() {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("usage: {}", producer_state_raft::NodeOptions::USAGE);
        return;
    }
    let options = match producer_state_raft::NodeOptions::from_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "producer-state-node: {e}\nusage: {}",
                producer_state_raft::NodeOptions::USAGE
            );
            std::process::exit(2);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if options.threads > 0 {
        runtime.worker_threads(options.threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("producer-state-node: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(producer_state_raft::run_node(options)) {
        eprintln!("producer-state-node: {e}");
        std::process::exit(1);
    }
}
