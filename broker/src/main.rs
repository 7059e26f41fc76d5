//! `producer-state-broker --dir DIR --listen HOST:PORT [--advertise HOST:PORT] [--partitions N]
//! [--<kafka.setting> VALUE ...]` (`--help` lists every setting).
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
use std::time::Duration;

use clap::Parser;

use producer_state_broker::group_coordinator::GroupConfig;
use producer_state_broker::{Broker, Config, Limits, server};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// A Kafka-protocol broker on producer-state: exactly-once (idempotent)
/// produce for real Kafka clients.
///
/// Limits take Kafka's broker setting names (`--max.connections 500`);
/// see docs/broker.md for each, and why some defaults are not Kafka's.
#[derive(Parser, Debug)]
#[command(name = "producer-state-broker", version, about, long_about = None)]
struct Args {
    /// The data directory (created if missing).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// The address to listen on, HOST:PORT (port 0: any free port).
    #[arg(long, value_name = "HOST:PORT")]
    listen: String,
    /// The address Metadata hands out for this broker [default: the
    /// address listened on].
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Partitions of an auto-created topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    partitions: i32,
    /// The largest request frame, in bytes; a larger one closes its
    /// connection (Kafka's default).
    #[arg(long = "socket.request.max.bytes", value_name = "BYTES", default_value_t = Limits::default().socket_request_max_bytes)]
    socket_request_max_bytes: usize,
    /// Request bytes held at once over all connections (Kafka: -1, no
    /// bound); reading further requests waits for room.
    #[arg(long = "queued.max.request.bytes", value_name = "BYTES", default_value_t = Limits::default().queued_max_request_bytes)]
    queued_max_request_bytes: usize,
    /// Connections open at once; one more is closed at once (Kafka's
    /// default). Connections are also refused while taking one would leave
    /// fewer descriptors than the partitions need.
    #[arg(long = "max.connections", value_name = "N", default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// Close a connection that sends no complete request for this long
    /// (Kafka's default).
    #[arg(
        long = "connections.max.idle.ms",
        value_name = "MS",
        default_value_t = 600_000
    )]
    connections_max_idle_ms: u64,
    /// The largest record batch a produce may carry, in bytes (Kafka's
    /// default).
    #[arg(long = "message.max.bytes", value_name = "BYTES", default_value_t = Limits::default().message_max_bytes)]
    message_max_bytes: usize,
    /// The most record bytes one Fetch response holds (Kafka's default).
    #[arg(long = "fetch.max.bytes", value_name = "BYTES", default_value_t = Limits::default().fetch_max_bytes)]
    fetch_max_bytes: usize,
    /// Create topics that Metadata asks for (Kafka's default).
    #[arg(long = "auto.create.topics.enable", value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    auto_create_topics_enable: bool,
    /// Partitions the broker holds at most; auto-creation past it answers
    /// POLICY_VIOLATION (Kafka has no such setting).
    #[arg(long = "max.partitions", value_name = "N", default_value_t = Limits::default().max_partitions)]
    max_partitions: usize,
    /// The most bytes a compressed batch may decompress to while its
    /// records are counted (Kafka has no such setting).
    #[arg(long = "max.decompressed.batch.bytes", value_name = "BYTES", default_value_t = Limits::default().max_decompressed_batch_bytes)]
    max_decompressed_batch_bytes: usize,
    /// How long a new consumer group waits for more members before its
    /// first rebalance completes (Kafka's default).
    #[arg(
        long = "group.initial.rebalance.delay.ms",
        value_name = "MS",
        default_value_t = 3000
    )]
    group_initial_rebalance_delay_ms: u64,
    /// The shortest session timeout a consumer may ask for (Kafka's default).
    #[arg(
        long = "group.min.session.timeout.ms",
        value_name = "MS",
        default_value_t = 6000
    )]
    group_min_session_timeout_ms: u64,
    /// The longest session timeout a consumer may ask for (Kafka's default).
    #[arg(
        long = "group.max.session.timeout.ms",
        value_name = "MS",
        default_value_t = 1_800_000
    )]
    group_max_session_timeout_ms: u64,
    /// How long after its newest batch's timestamp a producer without an
    /// open transaction is forgotten, in ms (Kafka's default, a day). Its
    /// next batch is then accepted at any sequence, as in Kafka (KIP-360).
    #[arg(
        long = "producer.id.expiration.ms",
        value_name = "MS",
        default_value_t = 86_400_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    producer_id_expiration_ms: u64,
    /// Producer-state stores the partitions are spread over (partition key
    /// modulo N); changing it replays moved partitions' logs into their new
    /// store at the next start.
    #[arg(long = "state-shards", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    state_shards: u64,
}

impl Args {
    fn group(&self) -> GroupConfig {
        GroupConfig {
            initial_rebalance_delay: Duration::from_millis(self.group_initial_rebalance_delay_ms),
            min_session_timeout: Duration::from_millis(self.group_min_session_timeout_ms),
            max_session_timeout: Duration::from_millis(self.group_max_session_timeout_ms),
            ..GroupConfig::default()
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            socket_request_max_bytes: self.socket_request_max_bytes,
            queued_max_request_bytes: self.queued_max_request_bytes,
            max_connections: self.max_connections,
            connections_max_idle: Duration::from_millis(self.connections_max_idle_ms),
            message_max_bytes: self.message_max_bytes,
            fetch_max_bytes: self.fetch_max_bytes,
            auto_create_topics: self.auto_create_topics_enable,
            max_partitions: self.max_partitions,
            max_decompressed_batch_bytes: self.max_decompressed_batch_bytes,
        }
    }
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard
/// limit, as the JVM does for Kafka: a broker holds a descriptor per
/// connection and several per partition, and Linux's usual soft limit of
/// 1024 is far below what the hard limit allows. Returns the soft limit
/// before and after.
fn raise_open_file_limit() -> std::io::Result<(u64, u64)> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let before = limit.current.unwrap_or(u64::MAX);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)?;
    }
    Ok((before, limit.current.unwrap_or(u64::MAX)))
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
    let args = Args::parse();
    let nofile = raise_open_file_limit();
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
    match nofile {
        Ok((from, to)) if from != to => {
            tracing::info!(from, to, "raised the open-file limit to its hard limit");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
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
        group: args.group(),
        limits: args.limits(),
        dir: args.dir,
        advertised_host,
        advertised_port,
        partitions: args.partitions,
        producer_id_expiration: Duration::from_millis(args.producer_id_expiration_ms),
        state_shards: args.state_shards as usize,
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
