//! What every RPC carries besides its message: the REAPI `RequestMetadata` (which tool, which link,
//! which action) and the user's extra headers (typically credentials).
//!
//! Header values may be given as `env:VAR` so that secrets stay off command lines and out of
//! process listings; no error or debug output ever contains a header's value.

use std::sync::Arc;

use bazel_remote_apis::build::bazel::remote::execution::v2::{RequestMetadata, ToolDetails};
use prost::Message as _;
use tonic::metadata::{BinaryMetadataValue, MetadataMap};

use super::credentials::Credentials;
use super::error::ReapiError;
use super::headers::{Header, resolve_header};

/// The binary header that carries a serialized `RequestMetadata`.
const REQUEST_METADATA_HEADER: &str = "build.bazel.remote.execution.v2.requestmetadata-bin";

/// The mnemonic servers show for every action of this tool.
const ACTION_MNEMONIC: &str = "ThinLTOBackend";

/// Per-call identification: which action and which target (module) a call is made for.
/// Both may be empty for calls that serve no single action.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The action's digest hash (servers correlate calls and logs by it).
    pub action_id: String,
    /// The module the action compiles.
    pub target_id: String,
}

/// The headers and identifiers sent with every call of one client.
#[derive(Clone)]
pub(crate) struct CallMetadata {
    /// The configured extra headers.
    headers: Vec<Header>,
    /// From a credential helper; a header also given in `headers` is not taken from here.
    pub(crate) credentials: Arc<Credentials>,
    tool_invocation_id: String,
    correlated_invocations_id: String,
}

impl std::fmt::Debug for CallMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallMetadata")
            .field("headers", &self.header_names())
            .field("credentials", &self.credentials)
            .field("tool_invocation_id", &self.tool_invocation_id)
            .field("correlated_invocations_id", &self.correlated_invocations_id)
            .finish()
    }
}

impl CallMetadata {
    /// Validates the extra headers, resolving `env:VAR` values from the environment.
    pub(crate) fn new(
        headers: &[(String, String)],
        credentials: Arc<Credentials>,
        tool_invocation_id: &str,
        correlated_invocations_id: Option<&str>,
    ) -> Result<Self, ReapiError> {
        let headers = headers
            .iter()
            .map(|(name, value)| resolve_header(name, value, |var| std::env::var(var)))
            .collect::<Result<_, _>>()?;
        Ok(CallMetadata {
            headers,
            credentials,
            tool_invocation_id: tool_invocation_id.to_string(),
            correlated_invocations_id: correlated_invocations_id.unwrap_or_default().to_string(),
        })
    }

    /// The names of the configured extra headers (never their values).
    pub(crate) fn header_names(&self) -> Vec<String> {
        self.headers
            .iter()
            .map(|(k, _)| k.as_str().to_string())
            .collect()
    }

    /// Whether any call carries credentials (headers from the command line or a helper).
    pub(crate) fn sends_headers(&self) -> bool {
        !self.headers.is_empty() || !self.credentials.headers().is_empty()
    }

    /// Adds the extra headers and the `RequestMetadata` for `ctx` to `map`.
    pub(crate) fn apply(&self, map: &mut MetadataMap, ctx: &CallContext) {
        for (name, value) in &self.headers {
            map.insert(name.clone(), value.clone());
        }
        // A header given on the command line wins over the helper's, as in Bazel.
        for (name, value) in self.credentials.headers().iter() {
            if !self.headers.iter().any(|(given, _)| given == name) {
                map.append(name.clone(), value.clone());
            }
        }
        let metadata = RequestMetadata {
            tool_details: Some(ToolDetails {
                tool_name: env!("CARGO_PKG_NAME").to_string(),
                tool_version: env!("CARGO_PKG_VERSION").to_string(),
            }),
            action_id: ctx.action_id.clone(),
            tool_invocation_id: self.tool_invocation_id.clone(),
            correlated_invocations_id: self.correlated_invocations_id.clone(),
            action_mnemonic: ACTION_MNEMONIC.to_string(),
            target_id: ctx.target_id.clone(),
            configuration_id: String::new(),
        };
        map.insert_bin(
            REQUEST_METADATA_HEADER,
            BinaryMetadataValue::from_bytes(&metadata.encode_to_vec()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reapi::headers::tests::env;
    use crate::reapi::headers::{header_key, header_value};

    #[test]
    fn every_call_carries_request_metadata_and_headers() {
        let from_helper = [("x-api-key", "helper"), ("x-more", "1"), ("x-more", "2")]
            .iter()
            .map(|(k, v)| (header_key(k).unwrap(), header_value(k, v).unwrap()))
            .collect();
        let meta = CallMetadata {
            headers: vec![resolve_header("x-api-key", "env:TOKEN", env).unwrap()],
            credentials: Arc::new(Credentials::fixed(from_helper)),
            tool_invocation_id: "inv".into(),
            correlated_invocations_id: "corr".into(),
        };
        assert!(!format!("{meta:?}").contains("s3cret"));
        let mut map = MetadataMap::new();
        let ctx = CallContext {
            action_id: "abc".into(),
            target_id: "m.o".into(),
        };
        meta.apply(&mut map, &ctx);
        // The command line's header wins over the helper's; a helper may send several values.
        assert_eq!(
            map.get_all("x-api-key").iter().collect::<Vec<_>>(),
            ["s3cret"]
        );
        assert_eq!(map.get_all("x-more").iter().collect::<Vec<_>>(), ["1", "2"]);
        let raw = map
            .get_bin(REQUEST_METADATA_HEADER)
            .unwrap()
            .to_bytes()
            .unwrap();
        let decoded = RequestMetadata::decode(raw).unwrap();
        assert_eq!(decoded.tool_details.unwrap().tool_name, "dtlto-reapi");
        assert_eq!(
            (
                decoded.action_id.as_str(),
                decoded.target_id.as_str(),
                decoded.action_mnemonic.as_str()
            ),
            ("abc", "m.o", "ThinLTOBackend")
        );
        assert_eq!(
            (
                decoded.tool_invocation_id.as_str(),
                decoded.correlated_invocations_id.as_str()
            ),
            ("inv", "corr")
        );
    }
}
