//! Validates a policy file without serving it, for CI: exits 0 and prints a summary for a
//! valid file, or exits 1 and prints the error (file, line, field) for an invalid one.
//!
//! ```sh
//! cargo run --example policy_check examples/policy.toml
//! cargo run --example policy_check policy.yaml --keys ip,user,tenant   # check key names too
//! ```
//!
//! Without `--keys`, key names are not checked: the application registers them, and a layer
//! refuses a policy naming one it lacks.

use std::io::Write as _;
use std::process::ExitCode;

use ratewarden_tower::policy::{Policy, load_file};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(file), keys) = (args.next(), parse_keys(args)) else {
        eprintln!("usage: policy_check FILE [--keys NAME,NAME,...]");
        return ExitCode::from(2);
    };
    let policy = match load_file(&file) {
        Ok(policy) => policy,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(keys) = &keys {
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        if let Err(err) = policy.validate(&names) {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    }
    // Written at once, and a reader that stops early (`| head`) is no failure.
    let _ = writeln!(
        std::io::stdout().lock(),
        "{file}: valid\n{}",
        summary(&policy)
    );
    ExitCode::SUCCESS
}

fn parse_keys(mut args: impl Iterator<Item = String>) -> Option<Vec<String>> {
    match args.next().as_deref() {
        Some("--keys") => Some(
            args.next()
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect(),
        ),
        _ => None,
    }
}

fn summary(policy: &Policy) -> String {
    let mut text = format!(
        "  {} rules, match {:?}, default {}",
        policy.rules().len(),
        policy.get_match_mode(),
        policy.default_rule().get_action().as_str()
    );
    for limit in policy.limits() {
        text += &format!(
            "\n  limit {:?}: key {:?}, quota {}",
            limit.name(),
            limit.key(),
            limit.quota()
        );
    }
    text += &format!(
        "\n  allow list: {} entries, deny list: {} entries",
        policy.allowed().len(),
        policy.denied().len()
    );
    text
}
