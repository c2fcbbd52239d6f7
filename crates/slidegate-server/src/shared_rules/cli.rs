//! `slidegate rules push` and `slidegate rules show`: the rules of every instance started
//! with `--rules-from-redis`, stored in and read from their Redis.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::{diff, format_ms};
use crate::config::Config;
use crate::redact::redact;
use crate::shared_store::{MAX_DOCUMENT_BYTES, Store, StoredRules, parse_stored, validate_push};

/// `slidegate rules`.
#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RulesCommand {
    /// Validate a rules file as `serve` would and store its [[rules]] and [inline] in Redis:
    /// every instance started with --rules-from-redis applies them within a second.
    Push {
        #[command(flatten)]
        at: At,
        /// The rules file, of [[rules]] and [inline] only.
        file: PathBuf,
    },
    /// Print the rules stored in Redis as TOML, after a comment with their version and push.
    Show {
        #[command(flatten)]
        at: At,
    },
}

/// Where the instances' Redis is.
#[derive(Debug, clap::Args)]
struct At {
    /// The instances' Redis: a standalone server or any node of a Cluster.
    #[arg(long)]
    redis: String,
    /// The instances' key prefix (`[backend] prefix`).
    #[arg(long, default_value = slidegate::redis::DEFAULT_PREFIX)]
    prefix: String,
}

impl At {
    async fn store(&self) -> anyhow::Result<Store> {
        crate::config::check_redis_url(&self.redis).map_err(|m| anyhow::anyhow!("--redis: {m}"))?;
        if self.prefix.contains(['{', '}']) {
            anyhow::bail!("--prefix: must not contain `{{` or `}}` (hash tags)");
        }
        Store::at(&self.redis, &self.prefix).await.with_context(|| format!("connecting {}", redact(&self.redis)))
    }
}

/// Runs a `slidegate rules` command: exit code 0 when done, 1 when `show` finds nothing.
pub async fn run(args: RulesArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        RulesCommand::Push { at, file } => push(&at, &file).await,
        RulesCommand::Show { at } => show(&at).await,
    }
}

async fn push(at: &At, file: &std::path::Path) -> anyhow::Result<ExitCode> {
    let path = file.display().to_string();
    let text = crate::file::read_text(file, MAX_DOCUMENT_BYTES, "rules").with_context(|| path.clone())?;
    let config = validate_push(&text, &path)?;
    let store = at.store().await?;
    let from = store.client_address().await?;
    let (version, previous) = store.push_rules(&text, crate::overrides::now_ms(), &from).await?;
    println!("pushed rules version {version}: {} rules, from {from}", config.rules.len());
    match previous {
        None => println!("the first rules pushed under prefix {:?}", at.prefix),
        Some(previous) => print_changes(&previous, &config),
    }
    Ok(ExitCode::SUCCESS)
}

/// What the push changed, from the rules it replaced.
fn print_changes(previous: &StoredRules, config: &Config) {
    println!(
        "replaces version {}, pushed {} from {}",
        previous.version,
        format_ms(previous.pushed_at_ms),
        previous.pushed_from
    );
    match parse_stored(previous) {
        Ok(old) => {
            let changes = diff::changes((&old.rules, &old.inline), (&config.rules, &config.inline));
            if changes.is_empty() {
                println!("no change");
            }
            for line in changes {
                println!("{line}");
            }
        }
        Err(e) => println!("(the rules it replaces are not readable by this slidegate: {e})"),
    }
}

async fn show(at: &At) -> anyhow::Result<ExitCode> {
    let Some(stored) = at.store().await?.rules().await? else {
        eprintln!("no rules stored under prefix {:?}: push some with `slidegate rules push`", at.prefix);
        return Ok(ExitCode::from(1));
    };
    println!(
        "# slidegate rules version {}, pushed {} from {}",
        stored.version,
        format_ms(stored.pushed_at_ms),
        stored.pushed_from
    );
    let text = match &stored.text {
        Ok(text) => text,
        Err(why) => {
            eprintln!("the stored rules document cannot be read: {why}");
            return Ok(ExitCode::from(1));
        }
    };
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    Ok(ExitCode::SUCCESS)
}
