//! `@file` arguments (response files), expanded the way gcc and clang expand them on Unix, so that
//! the linker wrapper decides on the options a driver will really see: build systems put long link
//! lines, `-flto=thin` and `-fuse-ld=lld` included, in response files.
//!
//! An argument `@PATH` is replaced by the arguments in the file at PATH (relative to the working
//! directory), which may name further response files; one that cannot be read stays as it is, as
//! the drivers keep it. The quoting is GNU's (gcc's `buildargv`, LLVM's `TokenizeGNUCommandLine`):
//! whitespace separates arguments, `'…'` and `"…"` quote, and a backslash takes the next character
//! literally, inside quotes too. No crate implements exactly this (shell-word splitters treat
//! backslashes in single quotes differently), hence the few lines here.

use std::ffi::OsString;

use crate::platform::os_string_from_bytes;

/// How deeply response files may name response files (a cycle stops here).
const MAX_DEPTH: usize = 32;

/// `args` with every readable `@file` replaced by its arguments, recursively.
pub fn expand(args: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len());
    expand_into(args, 0, &mut out);
    out
}

fn expand_into(args: &[OsString], depth: usize, out: &mut Vec<OsString>) {
    for arg in args {
        let contents = match arg.as_encoded_bytes().strip_prefix(b"@") {
            Some(path) if !path.is_empty() && depth < MAX_DEPTH => {
                std::fs::read(os_string_from_bytes(path.to_vec())).ok()
            }
            _ => None,
        };
        match contents {
            Some(text) => expand_into(&split(&text), depth + 1, out),
            None => out.push(arg.clone()),
        }
    }
}

/// A response file's text as arguments (GNU quoting, see the module's documentation).
fn split(text: &[u8]) -> Vec<OsString> {
    let mut args = Vec::new();
    // `Some` once an argument has started, so that `""` is an empty argument.
    let mut current: Option<Vec<u8>> = None;
    let mut quote = None;
    let mut bytes = text.iter().copied();
    while let Some(byte) = bytes.next() {
        match (quote, byte) {
            (_, b'\\') => {
                if let Some(next) = bytes.next() {
                    current.get_or_insert_default().push(next);
                }
            }
            (Some(open), _) if byte == open => quote = None,
            (Some(_), _) => current.get_or_insert_default().push(byte),
            (None, b'\'' | b'"') => {
                quote = Some(byte);
                current.get_or_insert_default();
            }
            (None, _) if byte.is_ascii_whitespace() => {
                if let Some(arg) = current.take() {
                    args.push(os_string_from_bytes(arg));
                }
            }
            (None, _) => current.get_or_insert_default().push(byte),
        }
    }
    args.extend(current.map(os_string_from_bytes));
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn splits_like_gcc_and_clang() {
        let text = br#"  -flto=thin	-fuse-ld=lld
"a b.o" 'c "d".o' e\ f.o "g\"h" 'i\'j' "" k"l m"n
"#;
        assert_eq!(
            strings(split(text)),
            [
                "-flto=thin",
                "-fuse-ld=lld",
                "a b.o",
                "c \"d\".o",
                "e f.o",
                "g\"h",
                "i'j",
                "",
                "kl mn"
            ]
        );
        assert!(split(b" \n\t ").is_empty());
    }

    #[test]
    fn expands_recursively_and_keeps_what_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("inner.rsp");
        let outer = dir.path().join("outer.rsp");
        std::fs::write(&inner, "-fuse-ld=lld 'x y.o'").unwrap();
        std::fs::write(&outer, format!("-flto=thin @{}\n", inner.display())).unwrap();
        // A response file naming itself stops at the depth limit.
        let looping = dir.path().join("loop.rsp");
        std::fs::write(&looping, format!("@{}", looping.display())).unwrap();
        let args: Vec<OsString> = [
            "main.o".to_owned(),
            format!("@{}", outer.display()),
            "@/nonexistent.rsp".to_owned(),
            "@".to_owned(),
            format!("@{}", looping.display()),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let expanded = strings(expand(&args));
        assert_eq!(
            expanded[..6],
            [
                "main.o",
                "-flto=thin",
                "-fuse-ld=lld",
                "x y.o",
                "@/nonexistent.rsp",
                "@"
            ]
        );
        assert_eq!(expanded[6..], [format!("@{}", looping.display())]);
    }
}
