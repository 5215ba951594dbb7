//! Collatz sequences: the library crate of the example workspace.

/// The number of steps from `n` down to 1.
pub fn steps(mut n: u64) -> u32 {
    let mut steps = 0;
    while n > 1 {
        n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
        steps += 1;
    }
    steps
}

/// The start below `limit` with the longest sequence, and its length.
pub fn longest_below(limit: u64) -> (u64, u32) {
    (1..limit)
        .map(|n| (n, steps(n)))
        .fold((1, 0), |best, cur| if cur.1 > best.1 { cur } else { best })
}
