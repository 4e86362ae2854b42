//! `wharf var put|get|list|delete`: the node's variables, which task templates read with
//! `nomadVar` and `key`.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::client::{ApiPath, Client};
use clap::Subcommand;
use hyper::Method;
use std::collections::BTreeMap;
use std::process::ExitCode;
use wharf_store::Variable;

#[derive(Debug, Subcommand)]
pub enum VarCommand {
    /// Set a variable's items (all of them: items not named are dropped).
    Put {
        /// Its path, such as app/db.
        path: String,
        /// Its items, as name=value.
        #[arg(required = true, value_parser = parse_item)]
        items: Vec<(String, String)>,
    },
    /// Show a variable's items.
    Get {
        /// Its path.
        path: String,
    },
    /// List the variables under a prefix.
    List {
        /// Only paths that start with this.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Remove a variable.
    Delete {
        /// Its path.
        path: String,
    },
    /// Replace every variable with a fleet's set, read as JSON on stdin
    /// (`{"source_index": N, "variables": {"path": {"name": "value"}}}`), unless the agent
    /// holds that copy or a later one: what a fleet runs on its workers.
    Sync,
}

fn parse_item(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not name=value")),
    }
}

fn var_path(path: &str) -> ApiPath {
    ApiPath::v1(std::iter::once("var").chain(path.split('/')))
}

/// Runs `wharf var ...`.
pub(crate) async fn var(
    client: &Client,
    command: VarCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        VarCommand::Put { path, items } => {
            let items: BTreeMap<String, String> = items.into_iter().collect();
            let body = serde_json::json!({ "items": items });
            let variable: Variable = client.json(Method::PUT, var_path(&path), Some(body)).await?;
            print_variable(&variable, json)?;
        }
        VarCommand::Get { path } => {
            let variable: Variable = client.json(Method::GET, var_path(&path), None).await?;
            print_variable(&variable, json)?;
        }
        VarCommand::List { prefix } => {
            let path = ApiPath::v1(["vars"]).query("prefix", &prefix);
            let variables: Vec<Variable> = client.json(Method::GET, path, None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&variables)?);
            } else {
                for variable in variables {
                    println!("{}", variable.path);
                }
            }
        }
        VarCommand::Delete { path } => {
            client.call(Method::DELETE, var_path(&path), None).await?;
        }
        VarCommand::Sync => {
            let mut input = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut input)?;
            let sync: wharf_store::VariableSync = serde_json::from_slice(&input)
                .map_err(|e| anyhow::anyhow!("the variables on stdin: {e}"))?;
            let body = serde_json::to_value(&sync)?;
            let synced: crate::variables::Synced =
                client.json(Method::PUT, ApiPath::v1(["vars"]), Some(body)).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&synced)?);
            } else if synced.taken {
                println!("taken: the fleet's variables as of index {}", sync.source_index);
            } else {
                println!(
                    "kept: this node holds the fleet's variables as of index {}",
                    synced.source_index.unwrap_or_default()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_variable(variable: &Variable, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(variable)?);
    } else {
        for (name, value) in &variable.items {
            println!("{name}={value}");
        }
    }
    Ok(())
}
