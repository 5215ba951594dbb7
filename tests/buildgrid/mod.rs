//! A BuildGrid 0.4.4 server (from PyPI, installed by `scripts/buildgrid.sh`) started by a test on
//! loopback, so that dtlto-reapi's client is tested against a REAPI implementation it was not
//! written with. The server is storage-only (`cache.yml` beside this file: CAS, ByteStream and
//! an action cache in memory; BuildGrid's execution service would need PostgreSQL and workers).
//!
//! BuildGrid cannot report a port it picked itself, so the test picks a free one, and tries another
//! when BuildGrid finds it taken. The server is ready when it writes its `--pid-file`, which it does
//! only once its gRPC server has started. A missing or broken install fails the test, never skips it.

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use dtlto_reapi::reapi::{Client, ConnectionOptions, ServerCapabilities};
use tempfile::TempDir;

use crate::common::tools;

/// The configuration template; see its comments.
const CONFIG: &str = include_str!("cache.yml");

/// What BuildGrid (gRPC's Python server) prints when it cannot bind its address, e.g. a port taken
/// since the test probed it.
const PORT_TAKEN: &str = "Failed to bind to address";

/// How long `bgd server start` may take to serve (Python imports are slow on a loaded machine).
const STARTUP: Duration = Duration::from_secs(60);

/// A running BuildGrid server, killed when dropped; its log is printed if the test panics.
pub struct BuildGrid {
    child: Child,
    url: String,
    instance_name: String,
    /// Holds the configuration, the PID file and the log.
    dir: TempDir,
}

impl BuildGrid {
    /// Starts a server whose single instance is `instance_name` (may be empty); its action cache
    /// accepts updates from clients when `allow_updates`.
    pub fn start(instance_name: &str, allow_updates: bool) -> BuildGrid {
        let dir = tempfile::Builder::new()
            .prefix("buildgrid-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let config = dir.path().join("buildgrid.yml");
        let mut last_log = String::new();
        for _ in 0..5 {
            let address = format!("127.0.0.1:{}", free_port());
            let text = CONFIG
                .replace("@ADDRESS@", &address)
                .replace("@INSTANCE@", instance_name)
                .replace("@ALLOW_UPDATES@", &allow_updates.to_string());
            fs::write(&config, text)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", config.display()));
            let mut child = spawn(dir.path(), &config);
            match wait_until_serving(&mut child, dir.path()) {
                Ok(()) => {
                    return BuildGrid {
                        child,
                        url: format!("grpc://{address}"),
                        instance_name: instance_name.to_owned(),
                        dir,
                    };
                }
                Err(log) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    assert!(log.contains(PORT_TAKEN), "BuildGrid did not start: {log}");
                    last_log = log;
                }
            }
        }
        panic!("BuildGrid found every port it was given taken: {last_log}")
    }

    /// `grpc://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The instance that serves the CAS, ByteStream and the action cache.
    pub fn instance_name(&self) -> &str {
        &self.instance_name
    }

    /// What BuildGrid advertises, as dtlto-reapi's client reads it.
    pub fn capabilities(&self) -> ServerCapabilities {
        let mut options = ConnectionOptions::new(self.url.clone());
        options.instance_name = self.instance_name.clone();
        options.timeout = Duration::from_secs(30);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start a tokio runtime: {e}"));
        match runtime.block_on(Client::connect(&options)) {
            Ok(client) => client.capabilities().clone(),
            Err(e) => panic!(
                "cannot connect to BuildGrid at {}: {e}\n{}",
                self.url,
                self.log()
            ),
        }
    }

    /// Everything the server printed so far.
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }
}

impl Drop for BuildGrid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("--- BuildGrid log ---\n{}", self.log());
        }
    }
}

/// Runs `bgd server start` in `dir`, its output going to `dir/log`.
fn spawn(dir: &Path, config: &Path) -> Child {
    let log_path = dir.join("log");
    let log = File::create(&log_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
    let log_err = log
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot share {}: {e}", log_path.display()));
    let mut cmd = Command::new(tools::bgd());
    // `-vv` logs at INFO: each request, and each ByteStream transfer and action-cache update
    // that completed, which the tests read as the server's own account of what it received.
    cmd.args(["server", "start", "-vv", "--pid-file"])
        .arg(dir.join("pid"))
        .arg(config)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Waits for `dir/pid`, which `child` writes once it serves; on an early exit or a timeout,
/// returns why, with the log.
fn wait_until_serving(child: &mut Child, dir: &Path) -> Result<(), String> {
    let pid_file = dir.join("pid");
    let started = Instant::now();
    loop {
        if fs::read_to_string(&pid_file).is_ok_and(|pid| !pid.trim().is_empty()) {
            return Ok(());
        }
        match child.try_wait() {
            Ok(Some(status)) => return Err(format!("bgd exited ({status}):\n{}", read_log(dir))),
            Ok(None) if started.elapsed() > STARTUP => {
                return Err(format!(
                    "bgd is not serving after {STARTUP:?}:\n{}",
                    read_log(dir)
                ));
            }
            Ok(None) => thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("cannot wait for bgd: {e}")),
        }
    }
}

fn read_log(dir: &Path) -> String {
    fs::read_to_string(dir.join("log")).unwrap_or_default()
}

/// A port nobody listens on at the moment (BuildGrid may still lose it to another process).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or_else(|e| panic!("cannot find a free port on 127.0.0.1: {e}"))
}
