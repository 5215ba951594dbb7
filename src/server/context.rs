//! State every service shares (instance name, storage, faults, limits) and the checks and status
//! conversions every RPC makes, so that each service applies them the same way.

use super::digest::BlobDigest;
use super::faults::Faults;
use super::hostile::Hostile;
use super::stats::Stats;
use super::storage::Storage;
use super::throttle::Throttle;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Action, Command, Digest, digest_function,
};
use bazel_remote_apis::google::{protobuf::Any, rpc};
use prost::Message;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, PreconditionViolation, StatusExt};

pub struct Context {
    pub instance_name: String,
    pub storage: Storage,
    pub faults: Faults,
    pub hostile: Hostile,
    /// Largest total of blob bytes one BatchUpdateBlobs or BatchReadBlobs may carry.
    pub max_batch_bytes: u64,
    /// The newest REAPI 2.x minor version advertised in the capabilities.
    pub api_minor_version: i32,
    /// Whether actions are executed (`--no-execution` makes the server a cache only).
    pub exec_enabled: bool,
    /// The platform properties the workers offer (`--platform`); `None` accepts any.
    pub platform: Option<Vec<(String, String)>>,
    /// Whether zstd transfers are offered and accepted.
    pub compression: bool,
    pub stats: Stats,
    pub throttle: Throttle,
}

impl Context {
    /// The bytes of a referenced blob for inlining in a response; None when absent or larger than
    /// a batch (clients then fetch it from the CAS, as the REAPI allows).
    pub fn inline(&self, digest: Option<&Digest>) -> Result<Option<Vec<u8>>, Status> {
        let Some(digest) = digest else {
            return Ok(None);
        };
        let digest = BlobDigest::from_proto(digest)?;
        if digest.size > self.max_batch_bytes {
            return Ok(None);
        }
        Ok(self.storage.blob(&digest)?.map(|data| data.to_vec()))
    }

    /// The start of every RPC: fault injection, then the instance name and digest function.
    pub async fn enter(
        &self,
        rpc: &'static str,
        instance_name: &str,
        digest_function: i32,
    ) -> Result<(), Status> {
        self.misbehave(rpc).await?;
        self.check_instance(instance_name)?;
        check_digest_function(digest_function)
    }

    /// The call counted, then fault injection at the start of an RPC: a `--fault-slow` delay, then
    /// the faults.
    pub async fn misbehave(&self, rpc: &'static str) -> Result<(), Status> {
        self.stats.called(rpc);
        self.hostile.slow_down(rpc).await;
        self.faults.enter(rpc).await
    }

    /// Refuses an action asking for a platform property no worker offers, as a scheduler without
    /// a matching worker does.
    pub fn check_platform(&self, action: &Action, command: &Command) -> Result<(), Status> {
        let Some(offered) = &self.platform else {
            return Ok(());
        };
        #[allow(deprecated)] // Command.platform: older clients put the properties there
        let asked = action.platform.iter().chain(command.platform.iter());
        for property in asked.flat_map(|p| &p.properties) {
            if !offered
                .iter()
                .any(|(name, value)| *name == property.name && *value == property.value)
            {
                let offered: Vec<String> =
                    offered.iter().map(|(n, v)| format!("{n}={v}")).collect();
                return Err(Status::failed_precondition(format!(
                    "no worker offers platform property {}={} (the workers offer {})",
                    property.name,
                    property.value,
                    offered.join(", ")
                )));
            }
        }
        Ok(())
    }

    pub fn check_instance(&self, instance_name: &str) -> Result<(), Status> {
        if instance_name == self.instance_name {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "unknown instance {instance_name:?}; this server serves {:?}",
                self.instance_name
            )))
        }
    }
}

/// Accepts SHA-256, or the unset value which means the server's default (also SHA-256).
pub fn check_digest_function(value: i32) -> Result<(), Status> {
    match digest_function::Value::try_from(value) {
        Ok(digest_function::Value::Unknown | digest_function::Value::Sha256) => Ok(()),
        _ => Err(Status::invalid_argument(format!(
            "digest function {value} is not supported; this server uses SHA256"
        ))),
    }
}

/// FAILED_PRECONDITION naming each missing blob the way REAPI clients look for it, so that they
/// can upload what is missing and retry.
pub fn missing_blobs(what: &str, digests: &[BlobDigest]) -> Status {
    let violations: Vec<_> = digests
        .iter()
        .map(|d| {
            PreconditionViolation::new(
                "MISSING",
                format!("blobs/{}/{}", d.hash, d.size),
                "blob is not in the CAS",
            )
        })
        .collect();
    Status::with_error_details(
        Code::FailedPrecondition,
        format!("{what}: {} blob(s) missing from the CAS", digests.len()),
        ErrorDetails::with_precondition_failure(violations),
    )
}

/// The google.rpc.Status carried inside responses, details included.
pub fn rpc_status(status: &Status) -> rpc::Status {
    if !status.details().is_empty() {
        // tonic-types puts the whole google.rpc.Status, details and all, in the details bytes.
        if let Ok(full) = rpc::Status::decode(status.details()) {
            return full;
        }
    }
    rpc::Status {
        code: status.code() as i32,
        message: status.message().to_owned(),
        details: Vec::new(),
    }
}

pub fn ok_status() -> rpc::Status {
    rpc::Status::default()
}

/// Packs a message into an Any of the given fully qualified proto type.
pub fn pack<M: Message>(type_name: &str, message: &M) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value: message.encode_to_vec(),
    }
}

/// Runs blocking work (disk, hashing, compression) off the async threads.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    blocking_unless_small(u64::MAX, work).await
}

/// Runs work on about `bytes` bytes off the async threads unless it is small (see
/// [`crate::runtime::run_sized`]).
pub async fn blocking_unless_small<T: Send + 'static>(
    bytes: u64,
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    crate::runtime::run_sized(bytes, work)
        .await
        .map_err(|e| Status::internal(format!("blocking task failed: {e}")))?
}
