//! From an endpoint string and TLS files to a gRPC channel.
//!
//! Endpoints are `grpc://HOST:PORT` (plain HTTP/2), `grpcs://HOST:PORT` (TLS, with the system's
//! roots unless a CA file is given; a client certificate and key give mutual TLS) and
//! `unix:///PATH` (a local socket, e.g. a proxy that adds credentials). A bare `HOST:PORT` means
//! `grpcs://`, as it does for Bazel. The channel connects lazily, so an unreachable server shows up
//! as a retried UNAVAILABLE on the first call, not as a separate kind of error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::error::ReapiError;

/// TLS material for `grpcs://` endpoints.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// PEM file of the CA(s) that sign the server's certificate; the system roots when `None`.
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate (mutual TLS); needs `client_key`.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca_cert.is_none() && self.client_cert.is_none() && self.client_key.is_none()
    }
}

/// Where the server is, once the endpoint string is understood.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// An `http://` or `https://` URI for tonic.
    Tcp {
        uri: String,
        tls: bool,
    },
    Unix(PathBuf),
}

/// Checks an endpoint's form without connecting; the error says what is wrong with it.
pub fn check_endpoint(endpoint: &str) -> Result<(), String> {
    match parse_target(endpoint) {
        Ok(_) => Ok(()),
        Err(ReapiError::Config(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_target(endpoint: &str) -> Result<Target, ReapiError> {
    let bad = |why: &str| ReapiError::Config(format!("endpoint `{endpoint}`: {why}"));
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(bad(
                "a unix socket endpoint needs an absolute path: unix:///PATH",
            ));
        }
        return Ok(Target::Unix(PathBuf::from(path)));
    }
    let (rest, tls) = if let Some(rest) = endpoint
        .strip_prefix("grpc://")
        .or_else(|| endpoint.strip_prefix("http://"))
    {
        (rest, false)
    } else if let Some(rest) = endpoint
        .strip_prefix("grpcs://")
        .or_else(|| endpoint.strip_prefix("https://"))
    {
        (rest, true)
    } else if endpoint.contains("://") {
        return Err(bad("unknown scheme; use grpc://, grpcs:// or unix://"));
    } else {
        (endpoint, true)
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(bad(
            "expected HOST:PORT after the scheme (an instance name is a separate option)",
        ));
    }
    if authority.contains('@') {
        return Err(bad(
            "credentials do not belong in the endpoint; pass them as a header, e.g. NAME=env:VAR",
        ));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(Target::Tcp {
        uri: format!("{scheme}://{authority}"),
        tls,
    })
}

impl Target {
    /// The host of a TCP target (without brackets for IPv6), lower case.
    fn host(&self) -> Option<String> {
        let Target::Tcp { uri, .. } = self else {
            return None;
        };
        let authority = uri.split_once("://").map_or(uri.as_str(), |(_, a)| a);
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        Some(host.to_ascii_lowercase())
    }
}

/// What a credential helper is asked about for `endpoint` (`grpcs://HOST:PORT`, `grpc://HOST:PORT`
/// or `unix:///PATH`) and the host its pattern is matched against (none for a unix socket).
pub(crate) fn helper_uri(endpoint: &str) -> Result<(String, Option<String>), ReapiError> {
    let target = parse_target(endpoint)?;
    let uri = match &target {
        Target::Tcp { uri, tls } => {
            let authority = uri.split_once("://").map_or(uri.as_str(), |(_, a)| a);
            format!("{}://{authority}", if *tls { "grpcs" } else { "grpc" })
        }
        Target::Unix(path) => format!("unix://{}", path.display()),
    };
    Ok((uri, target.host()))
}

/// The host `endpoint` reaches without TLS, unless it is this machine: headers sent there travel
/// in clear text over the network.
pub(crate) fn plaintext_remote_host(endpoint: &str) -> Option<String> {
    let target = parse_target(endpoint).ok()?;
    let Target::Tcp { tls: false, .. } = target else {
        return None;
    };
    let host = target.host()?;
    (!is_loopback(&host)).then_some(host)
}

/// Whether `endpoint` is on this machine: a unix socket or a loopback address.
pub(crate) fn is_this_machine(endpoint: &str) -> bool {
    parse_target(endpoint).is_ok_and(|target| target.host().is_none_or(|host| is_loopback(&host)))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Builds the (lazily connecting) channel for `endpoint`.
pub(crate) fn channel(
    endpoint: &str,
    tls: &TlsFiles,
    timeout: Duration,
) -> Result<Channel, ReapiError> {
    Ok(configure(endpoint, tls, timeout)?.connect_lazy())
}

/// Opens a connection to `endpoint` now (TCP or the socket, and the TLS handshake), to tell
/// connection problems apart from what the first call says.
pub(crate) async fn probe(
    endpoint: &str,
    tls: &TlsFiles,
    timeout: Duration,
) -> Result<(), ReapiError> {
    let configured = configure(endpoint, tls, timeout)?;
    match tokio::time::timeout(timeout, configured.connect()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ReapiError::Connect {
            endpoint: endpoint.to_string(),
            what: error_chain(&e),
        }),
        Err(_) => Err(ReapiError::Connect {
            endpoint: endpoint.to_string(),
            what: format!("no connection within {} s", timeout.as_secs()),
        }),
    }
}

/// An error and its causes on one line (tonic's transport errors say little at the top).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let part = e.to_string();
        // Layers often repeat their cause's message.
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = e.source();
    }
    text
}

/// The endpoint for `endpoint`, with this client's settings and TLS configuration.
fn configure(endpoint: &str, tls: &TlsFiles, timeout: Duration) -> Result<Endpoint, ReapiError> {
    let target = parse_target(endpoint)?;
    let builder = match &target {
        Target::Tcp { uri, .. } => Endpoint::from_shared(uri.clone()),
        Target::Unix(path) => Endpoint::from_shared(format!("unix://{}", path.display())),
    }
    .map_err(|e| ReapiError::Config(format!("endpoint `{endpoint}`: {e}")))?;
    let builder = builder
        .user_agent(concat!(
            env!("CARGO_PKG_NAME"),
            "/",
            env!("CARGO_PKG_VERSION")
        ))
        .map_err(|e| ReapiError::Config(e.to_string()))?
        .connect_timeout(timeout)
        // TCP keepalive finds dead peers without HTTP/2 pings, which many servers (gRPC's default
        // policy allows one per 5 minutes) punish with GOAWAY when sent more often.
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .http2_keep_alive_interval(Duration::from_secs(300))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(false)
        .http2_adaptive_window(true);
    let builder = match target {
        Target::Tcp { tls: true, .. } => builder
            .tls_config(tls_config(tls)?)
            .map_err(|e| ReapiError::Config(format!("TLS setup for `{endpoint}`: {e}")))?,
        _ if !tls.is_empty() => {
            return Err(ReapiError::Config(format!(
                "TLS files were given but endpoint `{endpoint}` is not a TLS endpoint (use grpcs://HOST:PORT)"
            )));
        }
        _ => builder,
    };
    Ok(builder)
}

fn tls_config(files: &TlsFiles) -> Result<ClientTlsConfig, ReapiError> {
    let mut config = ClientTlsConfig::new();
    config = match &files.ca_cert {
        Some(path) => config.ca_certificate(Certificate::from_pem(read_pem(path)?)),
        None => config.with_native_roots(),
    };
    match (&files.client_cert, &files.client_key) {
        (Some(cert), Some(key)) => {
            Ok(config.identity(Identity::from_pem(read_pem(cert)?, read_pem(key)?)))
        }
        (None, None) => Ok(config),
        _ => Err(ReapiError::Config(
            "mutual TLS needs both a client certificate and its key".to_string(),
        )),
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, ReapiError> {
    std::fs::read(path).map_err(|source| ReapiError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(uri: &str, tls: bool) -> Target {
        Target::Tcp {
            uri: uri.to_string(),
            tls,
        }
    }

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            parse_target("grpc://127.0.0.1:8980").unwrap(),
            tcp("http://127.0.0.1:8980", false)
        );
        assert_eq!(
            parse_target("grpcs://re.example.com:443/").unwrap(),
            tcp("https://re.example.com:443", true)
        );
        assert_eq!(
            parse_target("re.example.com:443").unwrap(),
            tcp("https://re.example.com:443", true)
        );
        assert_eq!(
            parse_target("unix:///run/re.sock").unwrap(),
            Target::Unix("/run/re.sock".into())
        );
        for bad in [
            "unix://rel.sock",
            "ftp://h:1",
            "grpc://",
            "grpc://h:1/instance",
            "grpcs://u:p@h:1",
        ] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn helper_uris_and_clear_text_hosts() {
        let uri = |e| helper_uri(e).unwrap();
        assert_eq!(
            uri("re.example.com:443"),
            (
                "grpcs://re.example.com:443".into(),
                Some("re.example.com".into())
            )
        );
        assert_eq!(
            uri("grpc://[::1]:80"),
            ("grpc://[::1]:80".into(), Some("::1".into()))
        );
        assert_eq!(
            uri("unix:///run/re.sock"),
            ("unix:///run/re.sock".into(), None)
        );
        assert_eq!(
            plaintext_remote_host("grpc://Build.Lan:80").unwrap(),
            "build.lan"
        );
        for safe in [
            "grpcs://build.lan:443",
            "grpc://127.0.0.1:1",
            "grpc://localhost:1",
            "grpc://[::1]:1",
            "unix:///run/re.sock",
        ] {
            assert_eq!(plaintext_remote_host(safe), None, "{safe}");
        }
    }

    #[test]
    fn endpoints_on_this_machine_are_unix_sockets_and_loopback_addresses() {
        for local in [
            "unix:///run/re.sock",
            "grpc://127.0.0.1:1",
            "grpcs://LOCALHOST:443",
            "[::1]:80",
            "127.0.0.2:8980",
        ] {
            assert!(is_this_machine(local), "{local}");
        }
        for remote in [
            "grpcs://re.example.com:443",
            "10.0.0.1:8980",
            "grpc://[::2]:1",
            "bad://x",
        ] {
            assert!(!is_this_machine(remote), "{remote}");
        }
    }

    #[tokio::test]
    async fn tls_options_are_checked() {
        let t = Duration::from_secs(1);
        let ca = TlsFiles {
            ca_cert: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        let err = channel("grpc://127.0.0.1:1", &ca, t)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a TLS endpoint"), "{err}");
        let err = channel("unix:///tmp/x.sock", &ca, t)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a TLS endpoint"), "{err}");
        let err = channel("grpcs://127.0.0.1:1", &ca, t)
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let half = TlsFiles {
            client_cert: Some("/x".into()),
            ..Default::default()
        };
        assert!(channel("grpcs://127.0.0.1:1", &half, t).is_err());
        assert!(channel("grpc://127.0.0.1:1", &TlsFiles::default(), t).is_ok());
        assert!(channel("unix:///tmp/x.sock", &TlsFiles::default(), t).is_ok());
    }
}
