//! `producer-state-broker --dir DIR --listen HOST:PORT [--advertise HOST:PORT] [--partitions N]`
//!
//! Prints `listening on ADDR` to stdout once it accepts connections, logs
//! to stderr (level from `BROKER_LOG`: error, warn, info (default), debug,
//! trace), and shuts down cleanly on SIGTERM or SIGINT: stops accepting,
//! lets every connection finish its current request, closes every
//! partition's producer state.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use producer_state_broker::{Broker, Config, server};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: producer-state-broker --dir DIR --listen HOST:PORT \
                     [--advertise HOST:PORT] [--partitions N]";

struct Args {
    dir: PathBuf,
    listen: String,
    advertise: Option<String>,
    partitions: i32,
}

fn parse_args() -> Result<Args, String> {
    let mut dir = None;
    let mut listen = None;
    let mut advertise = None;
    let mut partitions = 4;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--listen" => listen = Some(value()?),
            "--advertise" => advertise = Some(value()?),
            "--partitions" => {
                let v = value()?;
                partitions = v
                    .parse::<i32>()
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| format!("--partitions {v}: expected 1 to 10000"))?;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        dir: dir.ok_or("--dir is required")?,
        listen: listen.ok_or("--listen is required")?,
        advertise,
        partitions,
    })
}

fn split_host_port(s: &str) -> Result<(String, i32), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?}: expected HOST:PORT"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("{s:?}: bad port"))?;
    Ok((host.trim_matches(['[', ']']).to_string(), i32::from(port)))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let level = match std::env::var("BROKER_LOG").as_deref() {
        Ok("error") => tracing::Level::ERROR,
        Ok("warn") => tracing::Level::WARN,
        Ok("debug") => tracing::Level::DEBUG,
        Ok("trace") => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(false)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "starting the runtime failed");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let listener = TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", args.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let (advertised_host, advertised_port) = match &args.advertise {
        Some(a) => split_host_port(a)?,
        None => (local.ip().to_string(), i32::from(local.port())),
    };
    let config = Config {
        dir: args.dir,
        advertised_host,
        advertised_port,
        partitions: args.partitions,
    };
    let broker = tokio::task::spawn_blocking(move || Broker::open(config))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let broker = Arc::new(broker);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        let _ = stop_tx.send(true);
    });
    tracing::info!(listen = %local, advertise = %format!("{}:{}", broker.config().advertised_host, broker.config().advertised_port), "broker ready");
    println!("listening on {local}");
    let _ = std::io::stdout().flush();
    server::serve(broker.clone(), listener, stop_rx).await;
    tracing::info!(stats = %broker.stats.summary(), timings = %broker.timing_summary(), "stopped");
    let broker =
        Arc::try_unwrap(broker).map_err(|_| "broker still in use at shutdown".to_string())?;
    tokio::task::spawn_blocking(move || broker.close())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}
