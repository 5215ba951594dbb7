//! Which option to check for which failure: the one place that names command-line options in the
//! messages of REAPI client errors, for links and `check` alike, and in what `check` advises when
//! one of its steps fails.
//!
//! The client (`reapi`) says what failed and how (an RPC and its gRPC code, a credential helper
//! that timed out); only here is that mapped to the settings a user can change.

use anyhow::Error;
use tonic::Code;

use crate::reapi::ReapiError;

/// The error's message followed by what to check, as a link or `check` shows it.
pub fn describe(e: &ReapiError) -> String {
    format!("{e}{}", for_error(e))
}

/// [`describe`] for an error that may have come from the REAPI client, context included.
pub fn describe_any(e: &Error) -> String {
    let advice = e
        .chain()
        .find_map(|cause| cause.downcast_ref::<ReapiError>())
        .map_or("", for_error);
    format!("{e:#}{advice}")
}

/// What to check, in parentheses after the message, for the failures that point at the
/// configuration (missing input blobs are no configuration problem: they are uploaded again).
fn for_error(e: &ReapiError) -> &'static str {
    match e {
        ReapiError::Rpc {
            rpc,
            code,
            missing_blobs,
            ..
        } => match code {
            Code::Unauthenticated => {
                " (the server did not accept the credentials: check --remote-header and \
                 --credential-helper)"
            }
            Code::PermissionDenied => {
                " (the credentials may not do this: check --remote-header, --credential-helper \
                 and --instance-name; read-only credentials need --mode=cache-only \
                 --remote-upload=false)"
            }
            Code::NotFound if *rpc == "GetCapabilities" => {
                " (the server does not know this instance: check --instance-name)"
            }
            Code::FailedPrecondition if *rpc == "Execute" && missing_blobs.is_empty() => {
                " (no worker may take this action: check --platform against what the workers \
                 offer)"
            }
            _ => "",
        },
        ReapiError::CredentialHelperTimeout { .. } => " (see --credential-helper-timeout)",
        _ => "",
    }
}

/// `check`: what to do when the connection (or its TLS session) cannot be opened.
pub const CHECK_CONNECTION: &str = "check that the server runs and that --remote names it \
     (grpc://HOST:PORT without TLS, grpcs://HOST:PORT with TLS, --tls-ca-cert for a private CA)";

/// `check`: what to do when the server does not execute actions in remote mode.
pub const CHECK_NO_EXECUTION: &str = "use --mode=cache-only: compiles run locally and results are \
     shared through the server's cache";

/// `check`: what to do when the first call fails with `e`, and the step to blame when it is not
/// authentication itself (a wrong instance name shows up in the first call).
pub fn check_first_call(e: &ReapiError, instance_name: &str) -> (Option<&'static str>, String) {
    match e {
        ReapiError::CredentialHelper { .. } => (
            None,
            "fix the credential helper (run it by hand: `PATH get` with {\"uri\": \"...\"} on \
             stdin) or --credential-helper"
                .to_owned(),
        ),
        ReapiError::Rpc {
            code: Code::Unauthenticated | Code::PermissionDenied,
            ..
        } => (
            None,
            "the server refused the credentials: give the header it expects with \
             --remote-header=NAME=env:VAR (is the variable set?) or --credential-helper"
                .to_owned(),
        ),
        ReapiError::Rpc {
            code: Code::NotFound | Code::InvalidArgument,
            ..
        } => (
            Some("instance name"),
            format!(
                "the server does not serve instance {instance_name:?}: set --instance-name to the \
                 instance its administrator configured"
            ),
        ),
        _ => (
            Some("first call"),
            "see the error above; is --remote the REAPI endpoint of the cluster?".to_owned(),
        ),
    }
}

/// `check`: what to do when writing to or reading from the CAS fails with `e`.
pub fn check_cas(e: &ReapiError) -> &'static str {
    match e.code() {
        Some(Code::PermissionDenied) => {
            "the credentials may not write to the CAS: use read-write credentials, or \
             --mode=cache-only --remote-upload=false where links should only read"
        }
        _ => "see the error above",
    }
}

/// `check`: what to do when uploading or executing the probe action fails with `e`.
pub fn check_execution(e: &ReapiError) -> &'static str {
    match e.code() {
        Some(Code::FailedPrecondition | Code::InvalidArgument | Code::Unavailable) => {
            "no worker takes this action: check --platform against the properties the cluster's \
             workers offer, and --instance-name"
        }
        Some(Code::Unimplemented) => "this server does not execute actions: use --mode=cache-only",
        _ => "see the error above",
    }
}

/// `check`: what to do when the compiler ran on a worker and failed; `uploaded` when it went with
/// the action, `why_not_uploaded` when upload mode was wanted but impossible.
pub fn check_compiler_failed(uploaded: bool, why_not_uploaded: Option<&str>) -> String {
    match (uploaded, why_not_uploaded) {
        (true, _) => "the compiler was uploaded with the action and still did not run: the \
             workers may be another architecture or operating system (select matching ones with \
             --platform), or try --toolchain=worker with a worker image that has the compiler"
            .to_owned(),
        (false, Some(why_not)) => format!("it could not be uploaded: {why_not}"),
        (false, None) => "the workers cannot run this compiler: give --remote-compiler the \
             compiler's path on the workers, or --platform properties that select workers (a \
             container image) that have it"
            .to_owned(),
    }
}

/// `check`: what to do when the compiler cannot be identified on this machine.
pub const CHECK_COMPILER: &str = "give --compiler the compiler a link uses (and check \
     --toolchain, --remote-compiler, --platform)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_failures_name_the_options_to_check() {
        let e = |code| ReapiError::rpc("X", "e", &tonic::Status::new(code, "m"), 0);
        let auth = describe(&e(Code::Unauthenticated));
        assert!(auth.contains("--credential-helper"), "{auth}");
        let denied = describe(&e(Code::PermissionDenied));
        assert!(denied.contains("--instance-name"), "{denied}");
        assert_eq!(
            describe(&e(Code::Unavailable)),
            e(Code::Unavailable).to_string()
        );
        let unmatched = ReapiError::rpc(
            "Execute",
            "e",
            &tonic::Status::failed_precondition("no worker"),
            0,
        );
        assert!(describe(&unmatched).contains("--platform"), "{unmatched}");
        let slow = ReapiError::CredentialHelperTimeout {
            helper: "/h".into(),
            timeout: std::time::Duration::from_secs(1),
        };
        let slow = describe_any(&anyhow::Error::new(slow).context("connecting"));
        assert!(
            slow.starts_with("connecting: credential helper /h did not answer within 1s")
                && slow.ends_with("(see --credential-helper-timeout)"),
            "{slow}"
        );
    }
}
