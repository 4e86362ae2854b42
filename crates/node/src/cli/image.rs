//! `wharf image list | pull | rm`: the container driver's image store on the node.

// A command line's output is its interface.
#![allow(clippy::print_stdout)]

use crate::client::{ApiPath, Client};
use clap::Subcommand;
use hyper::Method;
use std::process::ExitCode;
use wharf_container::StoredImage;

#[derive(Debug, Subcommand)]
pub(crate) enum ImageCommand {
    /// The stored images: reference, manifest digest, layers, size.
    List,
    /// Store an image now (`oci:/path:tag`, `docker-archive:/path.tar`, or a registry
    /// reference such as `registry:5000/app:1.2`), fetched again if
    /// it is already there.
    Pull {
        /// The image reference.
        reference: String,
    },
    /// Remove a stored image (and the layers no other image uses).
    Rm {
        /// The image reference.
        reference: String,
    },
}

/// Runs `wharf image ...`.
pub(crate) async fn image(
    client: &Client,
    command: ImageCommand,
    json: bool,
) -> anyhow::Result<ExitCode> {
    match command {
        ImageCommand::List => {
            let images: Vec<StoredImage> =
                client.json(Method::GET, ApiPath::v1(["images"]), None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else {
                println!("{:<50} {:<20} {:>6} {:>12}", "REFERENCE", "MANIFEST", "LAYERS", "BYTES");
                for image in images {
                    let short = image.manifest.strip_prefix("sha256:").unwrap_or(&image.manifest);
                    println!(
                        "{:<50} {:<20} {:>6} {:>12}",
                        image.reference,
                        &short[..short.len().min(12)],
                        image.layers.len(),
                        image.size
                    );
                }
            }
        }
        ImageCommand::Pull { reference } => {
            let body = serde_json::json!({ "reference": reference });
            let image: StoredImage =
                client.json(Method::POST, ApiPath::v1(["images"]), Some(body)).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&image)?);
            } else {
                println!("{} {}", image.reference, image.manifest);
            }
        }
        ImageCommand::Rm { reference } => {
            let path = ApiPath::v1(["images"]).query("reference", &reference);
            client.call(Method::DELETE, path, None).await?;
            if !json {
                println!("removed {reference}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
