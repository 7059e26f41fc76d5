//! Installs the Prometheus recorder, runs a small workload on a store in a
//! temporary directory, and prints what a scrape of `/metrics` would get.
//!
//! ```sh
//! cargo run -p producer-state-prometheus --example prometheus
//! ```
//!
//! The recorder must be installed before stores open: a store resolves its
//! metric handles when it opens (docs/metrics.md).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = producer_state_prometheus::builder()?.install_recorder()?;
    let dir = tempfile::tempdir()?;
    let (store, answers) = producer_state_prometheus::workload(dir.path())?;
    eprintln!("workload answered {answers:?}; the scrape text follows\n");
    print!("{}", handle.render());
    store.close()?;
    Ok(())
}
