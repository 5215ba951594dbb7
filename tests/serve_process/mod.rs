//! How the tests start `dtlto-reapi serve` and learn where it listens: the command line, and the
//! address in the server's first stdout line (`listening on grpc://HOST:PORT` or
//! `listening on unix://PATH`). The link tests' synchronous server (`common`) and the gRPC tests'
//! asynchronous one (`support_server`) both build on this, each including it with `#[path]`.

use std::ffi::OsStr;
use std::fmt::Debug;
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "../isolation/mod.rs"]
pub mod isolation;

/// How long the server may take to print its address.
pub const STARTUP: Duration = Duration::from_secs(30);

/// `dtlto-reapi serve ARGS` with stdin closed and stdout piped (its first line is the address);
/// stderr is the caller's choice. Unless ARGS choose a listener (`--listen`, or `--default-listen`
/// for the server's own default, a unix socket in a private directory), the server listens on
/// loopback TCP: the tests talk to it as to a remote cluster.
pub fn command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<S> = args.into_iter().collect();
    let listen = args.iter().map(AsRef::as_ref).find(|a| {
        a.to_str()
            .is_some_and(|a| a.starts_with("--listen") || a == "--default-listen")
    });
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtlto-reapi"));
    isolation::isolate(&mut cmd).arg("serve");
    if listen.is_none() {
        cmd.arg("--listen=127.0.0.1:0");
    }
    cmd.args(args.iter().filter(|a| a.as_ref() != "--default-listen"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    cmd
}

/// The address (`grpc://HOST:PORT` or `unix://PATH`) in `line`, the first line `cmd` printed;
/// panics naming `cmd` when the line says anything else.
pub fn address(cmd: &impl Debug, line: &str) -> String {
    match line.trim().strip_prefix("listening on ") {
        Some(address) if address.starts_with("grpc://") || address.starts_with("unix://") => {
            address.to_owned()
        }
        _ => panic!(
            "{cmd:?} printed {line:?} instead of `listening on grpc://HOST:PORT` or `listening on unix://PATH`"
        ),
    }
}
