//! The one error type of the REAPI client.
//!
//! Callers need three things from a failure: a message that names the server, the RPC and the gRPC
//! code; whether the remote side is at fault (so a local fallback may take over); and, for an
//! Execute refused because inputs are missing, which blobs to upload again.

use std::path::PathBuf;

use prost::Message as _;
use tonic::Code;
use tonic_types::StatusExt as _;

use super::digest::{self, Digest};

/// A failure of the REAPI client.
#[derive(Debug, thiserror::Error)]
pub enum ReapiError {
    /// The connection options are wrong (bad endpoint, header, TLS file). Nothing was sent.
    #[error("REAPI configuration: {0}")]
    Config(String),

    /// The server at `endpoint` lacks something this client needs (SHA-256, execution, AC writes).
    #[error("REAPI server {endpoint}: {what}")]
    Unsupported { endpoint: String, what: String },

    /// No connection could be opened to the server (TCP, socket or TLS).
    #[error("cannot connect to {endpoint}: {what}")]
    Connect { endpoint: String, what: String },

    /// A credential helper failed or answered nonsense.
    #[error("credential helper {helper} {what}")]
    CredentialHelper { helper: String, what: String },

    /// A credential helper did not answer in time, and was killed.
    #[error("credential helper {helper} did not answer within {timeout:?} and was killed")]
    CredentialHelperTimeout {
        helper: String,
        timeout: std::time::Duration,
    },

    /// An RPC failed with a gRPC status (after any retries).
    #[error("{rpc} on {endpoint} failed with {}: {message}{}", code_name(*.code), retries_note(*.retries))]
    Rpc {
        rpc: &'static str,
        endpoint: String,
        code: Code,
        message: String,
        retries: u32,
        /// Blobs the server reported missing (FAILED_PRECONDITION with `MISSING` violations).
        missing_blobs: Vec<Digest>,
    },

    /// The server sent a blob whose content does not match its digest, twice.
    #[error("{endpoint} sent corrupt data for blob {digest}: {what}")]
    Integrity {
        endpoint: String,
        digest: String,
        what: String,
    },

    /// The server answered something the protocol does not allow.
    #[error("{rpc} on {endpoint}: invalid response: {what}")]
    Protocol {
        rpc: &'static str,
        endpoint: String,
        what: String,
    },

    /// A local file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The canonical name of a gRPC code (`PERMISSION_DENIED`), as servers' documentation and logs
/// spell it, rather than tonic's `PermissionDenied`.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Whether a call that failed with `code` may succeed when repeated.
pub fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::ResourceExhausted
            | Code::DeadlineExceeded
            | Code::Aborted
            // Connection resets and HTTP/2 stream errors surface as these two.
            | Code::Internal
            | Code::Unknown
            // The client never gives up on a call it still awaits (abandoning one drops it), so a
            // CANCELLED that reaches the caller is the transport's: hyper reports a request lost
            // with its HTTP/2 connection as "operation was canceled". Seen under ~200 concurrent
            // calls on one connection; every call here is idempotent, so repeating it is safe.
            | Code::Cancelled
    )
}

fn retries_note(retries: u32) -> String {
    match retries {
        0 => String::new(),
        1 => " (after 1 retry)".to_string(),
        n => format!(" (after {n} retries)"),
    }
}

impl ReapiError {
    /// Builds the error for a failed RPC, picking the missing blobs out of the status details.
    pub(crate) fn rpc(
        rpc: &'static str,
        endpoint: &str,
        status: &tonic::Status,
        retries: u32,
    ) -> Self {
        ReapiError::Rpc {
            rpc,
            endpoint: endpoint.to_string(),
            code: status.code(),
            message: status.message().to_string(),
            retries,
            missing_blobs: missing_blobs(status),
        }
    }

    /// The gRPC code, when the failure came from the server.
    pub fn code(&self) -> Option<Code> {
        match self {
            ReapiError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// For FAILED_PRECONDITION because inputs are missing from the CAS: the missing blobs (the
    /// caller may upload them and try once more). `None` for any other failure.
    pub fn missing_blobs(&self) -> Option<&[Digest]> {
        match self {
            ReapiError::Rpc {
                code: Code::FailedPrecondition,
                missing_blobs,
                ..
            } if !missing_blobs.is_empty() => Some(missing_blobs),
            _ => None,
        }
    }

    /// Whether the remote infrastructure failed (unreachable, overloaded, timing out, internal
    /// errors, corrupt data) rather than the request or the local configuration being wrong.
    /// A local fallback is reasonable for these and only these.
    pub fn is_infrastructure(&self) -> bool {
        match self {
            // What was worth retrying, once the retries ran out, plus lost data.
            ReapiError::Rpc { code, .. } => is_transient(*code) || *code == Code::DataLoss,
            ReapiError::Integrity { .. }
            | ReapiError::Protocol { .. }
            | ReapiError::Connect { .. } => true,
            ReapiError::Config(_)
            | ReapiError::CredentialHelper { .. }
            | ReapiError::CredentialHelperTimeout { .. }
            | ReapiError::Unsupported { .. }
            | ReapiError::Io { .. } => false,
        }
    }
}

/// The digests named by `MISSING` precondition violations (`blobs/{hash}/{size}`) in `status`.
fn missing_blobs(status: &tonic::Status) -> Vec<Digest> {
    let Some(failure) = status.get_details_precondition_failure() else {
        return Vec::new();
    };
    failure
        .violations
        .iter()
        .filter(|v| v.r#type == "MISSING")
        .filter_map(|v| parse_blob_subject(&v.subject))
        .collect()
}

/// Parses `blobs/{hash}/{size}`.
fn parse_blob_subject(subject: &str) -> Option<Digest> {
    let rest = subject.strip_prefix("blobs/")?;
    let (hash, size) = rest.split_once('/')?;
    let d = Digest {
        hash: hash.to_string(),
        size_bytes: size.parse().ok()?,
    };
    digest::is_valid(&d).then_some(d)
}

/// Turns a `google.rpc.Status` carried inside a message (an Operation's error, an ExecuteResponse's
/// status) into a `tonic::Status` with the same details, so one code path reads both.
pub(crate) fn status_from_proto(status: &bazel_remote_apis::google::rpc::Status) -> tonic::Status {
    tonic::Status::with_details(
        Code::from_i32(status.code),
        status.message.clone(),
        status.encode_to_vec().into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    #[test]
    fn missing_blobs_are_read_from_precondition_failure() {
        let d = digest::of_bytes(b"input");
        let mut details = ErrorDetails::new();
        details.add_precondition_failure_violation(
            "MISSING",
            format!("blobs/{}/{}", d.hash, d.size_bytes),
            "not in CAS",
        );
        details.add_precondition_failure_violation("MISSING", "blobs/zz/1", "malformed");
        details.add_precondition_failure_violation("OTHER", "x", "ignored");
        let status =
            tonic::Status::with_error_details(Code::FailedPrecondition, "missing", details);
        let err = ReapiError::rpc("Execute", "grpc://h:1", &status, 0);
        assert_eq!(err.missing_blobs(), Some(&[d][..]));
        assert!(!err.is_infrastructure());
        assert!(
            err.to_string()
                .contains("Execute on grpc://h:1 failed with FAILED_PRECONDITION: missing")
        );

        // The same status travelling as a google.rpc.Status inside a message.
        let proto = bazel_remote_apis::google::rpc::Status::decode(status.details()).unwrap();
        let again = ReapiError::rpc("Execute", "e", &status_from_proto(&proto), 2);
        assert_eq!(again.missing_blobs(), err.missing_blobs());
        assert!(again.to_string().ends_with("(after 2 retries)"));
    }

    #[test]
    fn infrastructure_classification() {
        let e = |code| ReapiError::rpc("X", "e", &tonic::Status::new(code, "m"), 0);
        assert!(e(Code::Unavailable).is_infrastructure());
        assert!(e(Code::DeadlineExceeded).is_infrastructure());
        assert!(!e(Code::PermissionDenied).is_infrastructure());
        assert!(!e(Code::FailedPrecondition).is_infrastructure());
        assert_eq!(e(Code::FailedPrecondition).missing_blobs(), None);
        assert!(!ReapiError::Config("x".into()).is_infrastructure());
    }

    #[test]
    fn classification() {
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Cancelled,
        ] {
            assert!(is_transient(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::Unimplemented,
            Code::AlreadyExists,
        ] {
            assert!(!is_transient(code), "{code:?}");
        }
    }
}
