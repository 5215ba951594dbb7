//! The disk cache in real links: a relink is served from `--disk-cache` in every mode, links running
//! at the same time share it safely, and it is consulted before the cluster.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Linked, Project, Server, chain_with_archive, ran_only};

/// Links `project` with the disk cache in `cache` plus `extra` options; returns the link and how
/// many jobs ran where.
fn link(
    project: &Project,
    output: &str,
    cache: &Path,
    extra: &[String],
) -> (Linked, BTreeMap<String, usize>) {
    let linked = project
        .link(output)
        .distributor_arg(format!("--disk-cache={}", cache.display()))
        .distributor_args(extra)
        .stats_json()
        .save_temps()
        .run();
    linked.assert_success();
    let ran = linked.stats().ran();
    (linked, ran)
}

#[test]
fn a_local_relink_comes_from_the_disk_cache() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, ran) = link(&project, "one/app", cache.path(), &[]);
    assert_eq!(first.run_program(), expected);
    assert_eq!(ran, ran_only("local", 4));
    let (second, ran) = link(&project, "two/app", cache.path(), &[]);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));
    assert_eq!(
        first.native_object_contents(),
        second.native_object_contents()
    );
    second.assert_stderr_contains("4 disk-cache hits");
}

#[test]
fn concurrent_links_share_one_disk_cache() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    std::thread::scope(|scope| {
        let links: Vec<_> = (0..3)
            .map(|i| {
                let (project, cache) = (&project, cache.path());
                scope.spawn(move || link(project, &format!("par{i}/app"), cache, &[]))
            })
            .collect();
        for handle in links {
            let (linked, _) = handle.join().expect("link thread");
            assert_eq!(linked.run_program(), expected);
        }
    });
    let (last, ran) = link(&project, "after/app", cache.path(), &[]);
    assert_eq!(last.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));
}

#[test]
fn the_disk_cache_is_consulted_before_the_cluster_and_filled_from_it() {
    let (project, expected) = chain_with_archive(3);
    let server = Server::start(["--hide".to_owned(), project.dir().display().to_string()]);
    let remote = [format!("--remote={}", server.url())];
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, ran) = link(&project, "one/app", cache.path(), &remote);
    assert_eq!(first.run_program(), expected);
    assert_eq!(ran, ran_only("remote", 4));
    let (second, ran) = link(&project, "two/app", cache.path(), &remote);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));

    // The same Actions as local mode: what a remote link put in the disk cache serves a local one.
    let (third, ran) = link(&project, "three/app", cache.path(), &[]);
    assert_eq!(third.run_program(), expected);
    assert_eq!(ran, ran_only("disk-cache", 4));
}

#[test]
fn a_damaged_disk_cache_never_yields_a_wrong_object() {
    let (project, expected) = chain_with_archive(3);
    let cache = tempfile::tempdir().expect("tempdir");
    let (first, _) = link(&project, "one/app", cache.path(), &[]);
    // Flip a byte in every stored blob: each hit must be detected as corrupt and recompiled.
    for shard in std::fs::read_dir(cache.path().join("cas")).expect("cas") {
        for blob in std::fs::read_dir(shard.expect("entry").path()).expect("shard") {
            let path = blob.expect("blob").path();
            let mut bytes = std::fs::read(&path).expect("read");
            if let Some(b) = bytes.first_mut() {
                *b ^= 0xff;
                std::fs::write(&path, &bytes).expect("write");
            }
        }
    }
    let (second, ran) = link(&project, "two/app", cache.path(), &[]);
    assert_eq!(second.run_program(), expected);
    assert_eq!(ran, ran_only("local", 4));
    assert_eq!(
        first.native_object_contents(),
        second.native_object_contents()
    );
}
