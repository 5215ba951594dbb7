//! The `dtlto-reapi` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use dtlto_reapi::cli::{Cli, Command};
use dtlto_reapi::{check, config, distribute, explain, wrapper};

fn main() -> ExitCode {
    // The reaper is started at every link that compiles locally and shares the link's cores with
    // the first compile: it skips building the command-line parser (30% of its start-up's CPU).
    #[cfg(unix)]
    if std::env::args_os()
        .skip(1)
        .eq([dtlto_reapi::executor::reaper::SUBCOMMAND])
    {
        return dtlto_reapi::executor::reaper::run();
    }
    // Invoked as `<driver>-dtlto`: `dtlto-reapi link <driver> ARGS`.
    let mut argv = std::env::args_os();
    if let Some(driver) = argv.next().as_deref().and_then(wrapper::wrapped_driver) {
        let args: Vec<_> = argv.collect();
        return report(Err(wrapper::exec(
            &driver,
            &args,
            wrapper::verbose_from_env(),
        )));
    }
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        #[cfg(unix)]
        Some(Command::Serve(args)) => {
            dtlto_reapi::logging::init(false);
            report(dtlto_reapi::server::run(args))
        }
        #[cfg(windows)]
        Some(Command::Serve { .. }) => report(Err(anyhow::anyhow!(
            "serve: the REAPI server runs on Linux only (it isolates actions with Linux namespaces); \
             run it on a Linux machine and point this distributor at it with --remote"
        ))),
        #[cfg(unix)]
        Some(Command::ReapLocalCompiles) => dtlto_reapi::executor::reaper::run(),
        Some(Command::Link(args)) => {
            let verbose = args.verbose || wrapper::verbose_from_env();
            report(Err(wrapper::exec(&args.driver, &args.args, verbose)))
        }
        Some(Command::Explain(args)) => {
            report(explain::run(&args.old, &args.new).map(|text| print!("{text}")))
        }
        Some(Command::Config(args)) => {
            let sub = matches.subcommand().map_or(&matches, |(_, m)| m);
            report(
                config::resolve(&args.settings, sub)
                    .and_then(|r| r.report())
                    .map(|text| print!("{text}")),
            )
        }
        Some(Command::Check(args)) => {
            let sub = matches.subcommand().map_or(&matches, |(_, m)| m);
            match config::resolve(&args.settings, sub) {
                Ok(resolved) => check::run(
                    &resolved.settings,
                    args.compiler.as_deref(),
                    &args.compiler_prepend_arg,
                ),
                Err(e) => report(Err(e)),
            }
        }
        None => {
            let Some(job_file) = cli.job_file else {
                eprintln!(
                    "dtlto-reapi: error: no job file given (usage: dtlto-reapi [OPTIONS] <JOB_FILE>; see --help)"
                );
                return ExitCode::from(2);
            };
            match config::resolve(&cli.settings, &matches) {
                Ok(resolved) => distribute::run(&job_file, &resolved.settings),
                Err(e) => report(Err(e)),
            }
        }
    }
}

/// Exit status and one error line for the subcommands.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dtlto-reapi: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
