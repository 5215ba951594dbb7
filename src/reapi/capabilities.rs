//! What the server can do, read once when the client connects.
//!
//! Everything later depends on it: the batch size limit shapes every CAS transfer, execution and
//! action cache writes may be switched off, and the API version decides how outputs are declared.

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::build::bazel::semver::SemVer;

use super::compression::ZSTD;
use super::error::ReapiError;

/// The batch limit assumed when the server sets none (gRPC's default message limit).
pub const DEFAULT_MAX_BATCH_BYTES: usize = 4 << 20;

/// Batches never grow beyond this, whatever the server allows, to bound memory per request.
const MAX_BATCH_BYTES_CAP: usize = 64 << 20;

/// The server's abilities as far as this client cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCapabilities {
    /// Most bytes in one BatchUpdateBlobs/BatchReadBlobs request or response.
    pub max_batch_bytes: usize,
    /// Whether the server executes actions (a cache-only server does not).
    pub exec_enabled: bool,
    /// Whether clients may write to the action cache.
    pub ac_update_enabled: bool,
    /// The newest REAPI version the server speaks, `(major, minor)`.
    pub high_api_version: (i32, i32),
    /// Whether the server reads and writes zstd through ByteStream's `compressed-blobs` (and so
    /// may answer BatchReadBlobs compressed).
    pub zstd: bool,
    /// Whether BatchUpdateBlobs accepts zstd-compressed blobs.
    pub zstd_batch_update: bool,
}

impl ServerCapabilities {
    /// Whether the server understands `Command.output_paths` (REAPI 2.1); older ones need
    /// `output_files`.
    pub fn supports_output_paths(&self) -> bool {
        self.high_api_version >= (2, 1)
    }

    /// Interprets a GetCapabilities answer from `endpoint`; fails if SHA-256 is not offered.
    pub(crate) fn from_proto(
        endpoint: &str,
        caps: &re::ServerCapabilities,
    ) -> Result<Self, ReapiError> {
        let cache = caps.cache_capabilities.clone().unwrap_or_default();
        let sha256 = re::digest_function::Value::Sha256 as i32;
        let exec = caps.execution_capabilities.as_ref();
        let exec_enabled = exec.is_some_and(|e| e.exec_enabled);
        let offers_sha256 = cache.digest_functions.contains(&sha256)
            || exec.is_some_and(|e| {
                e.digest_function == sha256 || e.digest_functions.contains(&sha256)
            });
        if !offers_sha256 {
            let offered: Vec<&str> = cache
                .digest_functions
                .iter()
                .map(|&f| {
                    re::digest_function::Value::try_from(f)
                        .map(|v| v.as_str_name())
                        .unwrap_or("unknown")
                })
                .collect();
            return Err(ReapiError::Unsupported {
                endpoint: endpoint.to_string(),
                what: format!(
                    "does not offer SHA-256 digests (it offers: {}); dtlto-reapi needs SHA-256",
                    if offered.is_empty() {
                        "none".to_string()
                    } else {
                        offered.join(", ")
                    }
                ),
            });
        }
        let max_batch_bytes = match usize::try_from(cache.max_batch_total_size_bytes) {
            Ok(0) | Err(_) => DEFAULT_MAX_BATCH_BYTES,
            Ok(n) => n.min(MAX_BATCH_BYTES_CAP),
        };
        let version = |v: &Option<SemVer>| v.as_ref().map(|v| (v.major, v.minor));
        Ok(ServerCapabilities {
            max_batch_bytes,
            exec_enabled,
            ac_update_enabled: cache
                .action_cache_update_capabilities
                .is_some_and(|u| u.update_enabled),
            high_api_version: version(&caps.high_api_version)
                .or(version(&caps.deprecated_api_version))
                .unwrap_or((2, 0)),
            zstd: cache.supported_compressors.contains(&ZSTD),
            zstd_batch_update: cache.supported_batch_update_compressors.contains(&ZSTD),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(functions: &[re::digest_function::Value], max_batch: i64) -> re::ServerCapabilities {
        re::ServerCapabilities {
            cache_capabilities: Some(re::CacheCapabilities {
                digest_functions: functions.iter().map(|&f| f as i32).collect(),
                max_batch_total_size_bytes: max_batch,
                action_cache_update_capabilities: Some(re::ActionCacheUpdateCapabilities {
                    update_enabled: true,
                }),
                ..Default::default()
            }),
            execution_capabilities: Some(re::ExecutionCapabilities {
                exec_enabled: true,
                ..Default::default()
            }),
            high_api_version: Some(SemVer {
                major: 2,
                minor: 3,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reads_limits_and_flags() {
        use re::digest_function::Value::*;
        let c = ServerCapabilities::from_proto("e", &caps(&[Sha256], 1000)).unwrap();
        assert_eq!(
            c,
            ServerCapabilities {
                max_batch_bytes: 1000,
                exec_enabled: true,
                ac_update_enabled: true,
                high_api_version: (2, 3),
                zstd: false,
                zstd_batch_update: false,
            }
        );
        assert!(c.supports_output_paths());
        let c = ServerCapabilities::from_proto("e", &caps(&[Sha1, Sha256], 0)).unwrap();
        assert_eq!(c.max_batch_bytes, DEFAULT_MAX_BATCH_BYTES);
        let c = ServerCapabilities::from_proto("e", &caps(&[Sha256], i64::MAX)).unwrap();
        assert_eq!(c.max_batch_bytes, MAX_BATCH_BYTES_CAP);

        let mut old = caps(&[Sha256], 0);
        old.execution_capabilities = None;
        old.high_api_version = None;
        let c = ServerCapabilities::from_proto("e", &old).unwrap();
        assert!(!c.exec_enabled && !c.supports_output_paths());

        let mut zstd = caps(&[Sha256], 0);
        let cache = zstd.cache_capabilities.as_mut().unwrap();
        cache.supported_compressors = vec![ZSTD];
        let c = ServerCapabilities::from_proto("e", &zstd).unwrap();
        assert!(c.zstd && !c.zstd_batch_update);
    }

    #[test]
    fn sha256_is_required() {
        use re::digest_function::Value::*;
        let mut no_sha = caps(&[Md5, Sha1], 0);
        no_sha.execution_capabilities = None;
        let err = ServerCapabilities::from_proto("grpc://re:1", &no_sha)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("grpc://re:1") && err.contains("MD5, SHA1") && err.contains("SHA-256"),
            "{err}"
        );
    }
}
