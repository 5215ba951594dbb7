//! The Capabilities service: tells clients what this server implements (SHA-256, the batch size
//! limit, zstd unless `--no-compression`, execution and action-cache updates enabled, REAPI 2.0 to
//! 2.3, or to an older 2.N on request).

use super::compression;
use super::context::Context;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionCacheUpdateCapabilities, CacheCapabilities, ExecutionCapabilities,
    GetCapabilitiesRequest, ServerCapabilities, capabilities_server::Capabilities, digest_function,
    symlink_absolute_path_strategy,
};
use bazel_remote_apis::build::bazel::semver::SemVer;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct CapabilitiesService(pub Arc<Context>);

fn version(minor: i32) -> Option<SemVer> {
    Some(SemVer {
        major: 2,
        minor,
        ..Default::default()
    })
}

#[tonic::async_trait]
impl Capabilities for CapabilitiesService {
    async fn get_capabilities(
        &self,
        request: Request<GetCapabilitiesRequest>,
    ) -> Result<Response<ServerCapabilities>, Status> {
        self.0
            .enter("GetCapabilities", &request.get_ref().instance_name, 0)
            .await?;
        let sha256 = digest_function::Value::Sha256 as i32;
        Ok(Response::new(ServerCapabilities {
            cache_capabilities: Some(CacheCapabilities {
                digest_functions: vec![sha256],
                action_cache_update_capabilities: Some(ActionCacheUpdateCapabilities {
                    update_enabled: true,
                }),
                max_batch_total_size_bytes: i64::try_from(self.0.max_batch_bytes)
                    .unwrap_or(i64::MAX),
                // Input symlinks with absolute targets are refused when materializing.
                symlink_absolute_path_strategy: symlink_absolute_path_strategy::Value::Disallowed
                    as i32,
                supported_compressors: compression::offered(self.0.compression),
                supported_batch_update_compressors: compression::offered(self.0.compression),
                ..Default::default()
            }),
            execution_capabilities: Some(ExecutionCapabilities {
                digest_function: sha256,
                exec_enabled: self.0.exec_enabled,
                digest_functions: vec![sha256],
                ..Default::default()
            }),
            low_api_version: version(0),
            high_api_version: version(self.0.api_minor_version),
            ..Default::default()
        }))
    }
}
