//! The program of the example workspace: prints a few Collatz facts computed by the `collatz` crate.

fn main() {
    println!("steps from 27: {}", collatz::steps(27));
    let (start, steps) = collatz::longest_below(10_000);
    println!("longest below 10000: {start} ({steps} steps)");
}
