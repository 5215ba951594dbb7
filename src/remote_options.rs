//! How to reach the cluster, from the settings: the one place that turns `--remote`,
//! `--remote-header`, the credential helpers, TLS files, timeouts and retries into the REAPI
//! client's [`ConnectionOptions`]. Links (the remote executor) and `check` both connect through it,
//! so `check` proves the connection a link makes; `reapi/` itself knows no settings or flags.

use anyhow::{Result, bail};

use crate::reapi::ConnectionOptions;
use crate::settings::{Compression, Settings};

/// Connection options from the settings; an error when the mode needs a server and none is given.
pub fn connection_options(settings: &Settings) -> Result<ConnectionOptions> {
    let Some(endpoint) = &settings.remote else {
        bail!(
            "--mode={} needs --remote=URL",
            serde_json::to_value(settings.mode)?.as_str().unwrap_or("?")
        );
    };
    let mut options = ConnectionOptions::new(endpoint.as_str());
    options.instance_name = settings.instance_name.clone();
    options.headers = settings
        .remote_header
        .iter()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    options.credential_helpers = settings
        .credential_helper
        .iter()
        .map(|h| h.helper.clone())
        .collect();
    options.credential_helper_timeout = settings.credential_helper_timeout;
    options.tls.ca_cert = settings.tls_ca_cert.clone();
    options.tls.client_cert = settings.tls_client_cert.clone();
    options.tls.client_key = settings.tls_client_key.clone();
    options.timeout = settings.remote_timeout;
    options.execute_timeout = settings.remote_execute_timeout;
    options.max_retries = settings.remote_retries;
    options.correlated_invocations_id = settings.invocation_id.clone();
    // Every job in flight may hold a call (an Execute stream), plus a few transfers.
    options.concurrent_calls = settings.remote_jobs + settings.jobs;
    options.compression = settings.remote_compression != Compression::Off;
    // zstd was 7% of a cold link's CPU against a server on this machine, and bought nothing.
    options.compress_near = settings.remote_compression == Compression::On;
    Ok(options)
}
