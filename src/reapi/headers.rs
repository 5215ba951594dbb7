//! Call headers: a header argument split into name and value, the name and value checked as gRPC
//! metadata, and `env:VAR` values resolved from the environment.
//!
//! Used by the configured extra headers (`metadata`) and by credential helpers' answers
//! (`credentials`). No error ever contains a header's value: it may be a secret.

use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};

use super::error::ReapiError;

/// One call header, validated.
pub(crate) type Header = (AsciiMetadataKey, AsciiMetadataValue);

/// Splits a `NAME=VALUE` header argument at its first `=`; the error says what is wrong, for the
/// caller to prefix with where the argument came from.
pub fn parse_header_arg(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.to_string()))
        }
        // Never shown: without an `=` the whole argument may be a secret pasted alone.
        _ => Err(
            "is not of the form NAME=VALUE (or NAME=env:VAR); not shown, as it may be a secret"
                .to_string(),
        ),
    }
}

/// Checks a header name's form; the error says what is wrong with it.
pub fn check_header_name(name: &str) -> Result<(), String> {
    match header_key(name) {
        Ok(_) => Ok(()),
        Err(ReapiError::Config(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks one header and resolves its value; `env` looks up environment variables.
pub(crate) fn resolve_header<E>(
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
pub(crate) mod tests {
    use super::*;

    pub(crate) fn env(var: &str) -> Result<String, ()> {
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
}
