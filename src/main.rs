use clap::Parser;

/// `dtlto-reapi serve`: parsed apart until the full command line lands.
#[derive(Parser)]
#[command(name = "dtlto-reapi serve")]
struct Serve {
    #[command(flatten)]
    args: dtlto_reapi::server::ServeArgs,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return dtlto_reapi::server::run(Serve::parse_from(&args[1..]).args);
    }
    Ok(())
}
