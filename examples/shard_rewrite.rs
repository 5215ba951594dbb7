//! What rewriting index shards costs, apart from everything else a link does:
//! `cargo run --release --example shard_rewrite -- DIR [REPS]` reads every file in DIR as a ThinLTO
//! index shard (e.g. the shards `bench/cold-replay.sh` captures), renames each module it records to
//! a 64-hex-digit name (as the canonical layout names modules by content), rewrites every shard
//! REPS times (5) and prints the best time per shard and a SHA-256 over the rewritten shards: two
//! builds that print the same hash rewrote every shard to the same bytes. Under
//! `valgrind --tool=callgrind`, the difference between REPS=3 and REPS=1 is the instruction count of
//! two rounds, which unlike times does not depend on what else the machine runs.

use std::collections::HashMap;
use std::time::Instant;

use dtlto_reapi::bitcode::ReadShard;
use sha2::{Digest, Sha256};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: shard_rewrite DIR [REPS]"))?;
    let reps: usize = args.next().map_or(Ok(5), |reps| reps.parse())?;
    let mut shards = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        shards.push(std::fs::read(entry?.path())?);
    }
    shards.sort();
    // The new names, made before timing: the layout gets them from the digest cache.
    let mut names: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for shard in &shards {
        for module in ReadShard::new(shard)?.modules() {
            let name = format!("{}.o", hex::encode(Sha256::digest(&module.path)));
            names
                .entry(module.path.clone())
                .or_insert(name.into_bytes());
        }
    }
    let mut best = f64::INFINITY;
    let mut outputs = String::new();
    for _ in 0..reps {
        let start = Instant::now();
        let mut hash = Sha256::new();
        for shard in &shards {
            let rewritten =
                ReadShard::new(shard)?.canonicalize(|module| names[&module.path].as_slice())?;
            hash.update(&rewritten);
        }
        best = best.min(start.elapsed().as_secs_f64() * 1000.0 / shards.len().max(1) as f64);
        outputs = hex::encode(hash.finalize());
    }
    println!(
        "{} shards, best of {reps}: {best:.4} ms per shard; rewritten shards' SHA-256 {outputs}",
        shards.len()
    );
    Ok(())
}
