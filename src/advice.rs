//! Which option to check for which failure: the one place that names command-line options in the
//! messages of REAPI client errors, for links and `check` alike.
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
            seconds: 1,
        };
        let slow = describe_any(&anyhow::Error::new(slow).context("connecting"));
        assert!(
            slow.starts_with("connecting: credential helper /h did not answer within 1 s")
                && slow.ends_with("(see --credential-helper-timeout)"),
            "{slow}"
        );
    }
}
