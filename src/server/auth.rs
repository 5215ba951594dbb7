//! Authentication for `serve`, as real clusters do it with API keys: every call must carry the
//! headers `--require-header` names, or gets UNAUTHENTICATED before any service sees it. It exists
//! to test clients' credentials, credential helpers and `dtlto-reapi check`: a value `file:PATH`
//! is read again at every call (so a test can rotate the key), and `--fault-expire-credentials N`
//! makes every accepted value expire after N calls (so a client must fetch new credentials mid-link).
//! Values are never printed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use tonic::service::Interceptor;
use tonic::{Request, Status};

/// One `--require-header NAME=VALUE`.
#[derive(Debug, Clone)]
pub struct RequiredHeader {
    name: String,
    value: Expected,
}

#[derive(Debug, Clone)]
enum Expected {
    Literal(String),
    /// The file's content, trimmed, read at each call.
    File(PathBuf),
}

impl FromStr for RequiredHeader {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let Some((name, value)) = s.split_once('=').filter(|(n, _)| !n.is_empty()) else {
            return Err("expected NAME=VALUE or NAME=file:PATH".to_string());
        };
        let value = match value.strip_prefix("file:") {
            Some(path) => Expected::File(PathBuf::from(path)),
            None => Expected::Literal(value.to_string()),
        };
        Ok(RequiredHeader {
            name: name.to_ascii_lowercase(),
            value,
        })
    }
}

/// The interceptor every service sits behind.
#[derive(Clone)]
pub struct Auth(Arc<Inner>);

struct Inner {
    required: Vec<RequiredHeader>,
    /// Calls one credential value is accepted for (`--fault-expire-credentials`).
    expire_after: Option<u32>,
    /// Calls accepted so far, per value.
    uses: Mutex<HashMap<String, u32>>,
}

impl Auth {
    pub fn new(required: &[RequiredHeader], expire_after: Option<u32>) -> Auth {
        Auth(Arc::new(Inner {
            required: required.to_vec(),
            expire_after,
            uses: Mutex::new(HashMap::new()),
        }))
    }

    fn check(&self, request: &Request<()>) -> Result<(), Status> {
        let mut presented = String::new();
        for required in &self.0.required {
            let expected = match &required.value {
                Expected::Literal(value) => value.clone(),
                Expected::File(path) => std::fs::read_to_string(path)
                    .map_err(|e| Status::internal(format!("cannot read {}: {e}", path.display())))?
                    .trim()
                    .to_string(),
            };
            let given = request
                .metadata()
                .get_all(required.name.as_str())
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find(|v| *v == expected);
            let Some(given) = given else {
                return Err(Status::unauthenticated(format!(
                    "missing or wrong credentials: header `{}`",
                    required.name
                )));
            };
            presented.push_str(given);
            presented.push('\n');
        }
        if let Some(limit) = self.0.expire_after {
            let mut uses = self
                .0
                .uses
                .lock()
                .map_err(|_| Status::internal("credential counter poisoned"))?;
            let used = uses.entry(presented).or_default();
            if *used >= limit {
                return Err(Status::unauthenticated(
                    "credentials expired (--fault-expire-credentials)",
                ));
            }
            *used += 1;
        }
        Ok(())
    }
}

impl Interceptor for Auth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(&request)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&'static str, &'static str)]) -> Request<()> {
        let mut request = Request::new(());
        for (k, v) in headers {
            request.metadata_mut().append(*k, v.parse().unwrap());
        }
        request
    }

    #[test]
    fn required_headers_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t1\n").unwrap();
        let required: Vec<RequiredHeader> = [
            "X-Key=k".to_string(),
            format!("tok=file:{}", token.display()),
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let auth = Auth::new(&required, Some(2));
        let good = || request(&[("x-key", "k"), ("tok", "t1")]);
        assert!(auth.check(&good()).is_ok());
        let err = auth.check(&request(&[("x-key", "k")])).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(err.message().contains("tok") && !err.message().contains("t1"));
        assert!(auth.check(&good()).is_ok());
        // Accepted twice: expired now, until the value changes.
        assert_eq!(
            auth.check(&good()).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        std::fs::write(&token, "t2").unwrap();
        assert!(auth.check(&good()).is_err());
        assert!(
            auth.check(&request(&[("x-key", "k"), ("tok", "t2")]))
                .is_ok()
        );
        assert!("novalue".parse::<RequiredHeader>().is_err());
    }
}
