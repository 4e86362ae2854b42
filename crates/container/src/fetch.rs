//! Fetching an image from any source: a layout or an archive on the node's files (blocking
//! work, on tokio's blocking pool), or a registry over the network.

use crate::error::ContainerError;
use crate::image::StoredImage;
use crate::reference::{ImageRef, ImageSource};
use crate::registry::{self, RegistryOptions};
use crate::store::ImageStore;
use std::sync::Arc;

/// The image under `reference`: the stored one unless `again`, else fetched from its source
/// and stored.
pub async fn fetch(
    store: &Arc<ImageStore>,
    reference: &ImageRef,
    registries: &RegistryOptions,
    again: bool,
) -> Result<StoredImage, ContainerError> {
    let blocking = |work: Box<dyn FnOnce() -> Result<StoredImage, ContainerError> + Send>| async move {
        tokio::task::spawn_blocking(work).await.map_err(|e| ContainerError::Pull {
            reference: String::new(),
            reason: format!("the image's preparation did not finish: {e}"),
        })?
    };
    if !again {
        let (store, text) = (store.clone(), reference.as_str().to_owned());
        if let Some(image) =
            tokio::task::spawn_blocking(move || store.get(&text)).await.map_err(|e| {
                ContainerError::Pull { reference: String::new(), reason: e.to_string() }
            })??
        {
            return Ok(image);
        }
    }
    match reference.source() {
        ImageSource::Registry(registry_ref) => {
            let image = registry::pull(store, reference.as_str(), registry_ref, registries).await?;
            let store = store.clone();
            blocking(Box::new(move || store.record(image))).await
        }
        _ => {
            let (store, reference) = (store.clone(), reference.clone());
            blocking(Box::new(move || store.pull(&reference))).await
        }
    }
}
