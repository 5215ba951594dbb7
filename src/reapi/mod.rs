//! The REAPI v2 client: channel and auth, capabilities, CAS, action cache, execution, metadata, retry.
