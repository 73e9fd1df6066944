//! The local binary: wiring only. Logs and config as the product's binary has them,
//! then one command on the `--db` file with the simulator. A start that cannot be
//! completed logs one line naming what is wrong and exits non-zero (2 when it refused:
//! nothing was done).

mod cli;

use charge_once::config::Config;
use charge_once::telemetry;
use clap::Parser as _;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    telemetry::init();
    let cli = cli::Cli::parse();
    let failure = cli.command.failure_status();
    let result = match Config::from_env() {
        Ok(config) => cli::run(cli, &config).await,
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(0) => {}
        Ok(status) => std::process::exit(status),
        Err(e) => {
            // `{:#}` keeps the whole cause chain on one line.
            tracing::error!(error = format!("{e:#}"), "charge-once-local stopped");
            std::process::exit(cli::exit_status(failure, &e));
        }
    }
}
