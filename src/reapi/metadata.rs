//! What every RPC carries besides its message: the REAPI `RequestMetadata` (which tool, which link,
//! which action) and the user's extra headers (typically credentials).
//!
//! Header values may be given as `env:VAR` so that secrets stay off command lines and out of
//! process listings; no error or debug output ever contains a header's value.

use std::sync::Arc;

use bazel_remote_apis::build::bazel::remote::execution::v2::{RequestMetadata, ToolDetails};
use prost::Message as _;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, BinaryMetadataValue, MetadataMap};

use super::credentials::{Credentials, Header};
use super::error::ReapiError;

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

/// Splits a `NAME=VALUE` header argument at its first `=`.
pub fn parse_header_arg(arg: &str) -> Result<(String, String), ReapiError> {
    match arg.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.to_string()))
        }
        // Never shown: without an `=` the whole argument may be a secret pasted alone.
        _ => Err(ReapiError::Config(
            "a --remote-header is not of the form NAME=VALUE (or NAME=env:VAR); not shown, as it \
             may be a secret"
                .to_string(),
        )),
    }
}

/// The headers and identifiers sent with every call of one client.
#[derive(Clone)]
pub(crate) struct CallMetadata {
    /// From `--remote-header`.
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

    /// The names of the `--remote-header` headers (never their values).
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

/// Checks one header and resolves its value; `env` looks up environment variables.
fn resolve_header<E>(
    name: &str,
    value: &str,
    env: impl Fn(&str) -> Result<String, E>,
) -> Result<Header, ReapiError> {
    let key = header_key(name)?;
    let resolved = match value.strip_prefix("env:") {
        Some(var) => env(var).map_err(|_| {
            ReapiError::Config(format!(
                "header `{name}` takes its value from environment variable `{var}`, which is not set (or not UTF-8)"
            ))
        })?,
        None => value.to_string(),
    };
    let value = header_value(name, &resolved).map_err(ReapiError::Config)?;
    Ok((key, value))
}

/// A header name as gRPC metadata (lower case; `-bin` headers are refused).
pub(crate) fn header_key(name: &str) -> Result<AsciiMetadataKey, ReapiError> {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with("-bin") {
        return Err(ReapiError::Config(format!(
            "header `{name}`: binary (-bin) headers are not supported"
        )));
    }
    AsciiMetadataKey::from_bytes(lower.as_bytes()).map_err(|_| {
        ReapiError::Config(format!(
            "header name `{name}` is not a valid HTTP/2 header name"
        ))
    })
}

/// A header value as gRPC metadata; the error never shows the value.
pub(crate) fn header_value(name: &str, value: &str) -> Result<AsciiMetadataValue, String> {
    AsciiMetadataValue::try_from(value)
        .map_err(|_| format!("header `{name}`: the value is not a valid header value"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazel_remote_apis::build::bazel::remote::execution::v2::RequestMetadata;

    fn env(var: &str) -> Result<String, ()> {
        match var {
            "TOKEN" => Ok("s3cret".to_string()),
            "BAD" => Ok("line\nbreak".to_string()),
            _ => Err(()),
        }
    }

    #[test]
    fn header_args_split_at_first_equals() {
        assert_eq!(
            parse_header_arg("a=b=c").unwrap(),
            ("a".into(), "b=c".into())
        );
        assert_eq!(
            parse_header_arg("x-key=env:K").unwrap(),
            ("x-key".into(), "env:K".into())
        );
        assert_eq!(
            parse_header_arg("empty=").unwrap(),
            ("empty".into(), "".into())
        );
        let err = parse_header_arg("s3cret-token").unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(parse_header_arg("=v").is_err());
    }

    #[test]
    fn env_values_resolve_and_errors_never_show_values() {
        let (k, v) = resolve_header("Authorization", "env:TOKEN", env).unwrap();
        assert_eq!(
            (k.as_str(), v.to_str().unwrap()),
            ("authorization", "s3cret")
        );
        let (_, v) = resolve_header("x-plain", "literal", env).unwrap();
        assert_eq!(v.to_str().unwrap(), "literal");

        let err = resolve_header("x-key", "env:UNSET_VAR", env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("UNSET_VAR") && err.contains("x-key"), "{err}");
        let err = resolve_header("x-key", "env:BAD", env)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("line"), "{err}");
        let err = resolve_header("x-key", "sec\u{7}ret", env)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("sec"), "{err}");
        assert!(resolve_header("bad name", "v", env).is_err());
        assert!(resolve_header("x-bin", "v", env).is_err());
    }

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
