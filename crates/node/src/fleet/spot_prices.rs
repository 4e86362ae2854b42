//! Spot prices: a preemptible EC2 type costs what EC2's spot market asks for its provider type
//! now, not the price configured for it. While a replica leads, it asks EC2 at once and then
//! every `spot_price_refresh`, and prices the pool's types with the answers, so workers' prices,
//! the price metric and the cost of new attempts follow the market. An ask that fails, times
//! out or finds no price is logged, and the type keeps the price it had: the configured one
//! until EC2 has answered, the last answer after.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use wharf_prober::{Ec2InstanceSet, Pool};

/// What keeps the spot prices of `pool`'s preemptible types, asking `set` every `every`, each
/// ask bounded by `deadline`; it runs until dropped or aborted. `None` without a preemptible
/// type.
pub(super) fn keeper(
    pool: Pool,
    set: Arc<Ec2InstanceSet>,
    every: Duration,
    deadline: Duration,
) -> Option<impl Future<Output = ()> + Send + 'static> {
    // Types of one provider type share its price: one ask each.
    let mut by_provider: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for it in pool.instance_types().into_iter().filter(|it| it.preemptible) {
        by_provider.entry(it.provider_type).or_default().push(it.name);
    }
    if by_provider.is_empty() {
        return None;
    }
    Some(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            for (provider_type, names) in &by_provider {
                if let Some(price) = ask(&set, provider_type, deadline).await {
                    for name in names {
                        pool.set_price(name, price);
                    }
                }
            }
        }
    })
}

/// The latest spot price of `provider_type`, or `None` (logged) if EC2 gives none in time.
async fn ask(
    set: &Ec2InstanceSet,
    provider_type: &str,
    deadline: Duration,
) -> Option<wharf_prober::Price> {
    match tokio::time::timeout(deadline, set.spot_price(provider_type)).await {
        Ok(Ok(Some(price))) => return Some(price),
        Ok(Ok(None)) => {
            tracing::warn!(provider_type, "EC2 reports no spot price; the type's price stays");
        }
        Ok(Err(error)) => {
            tracing::warn!(provider_type, %error, "cannot get the spot price; the type's price stays");
        }
        Err(_) => {
            tracing::warn!(
                provider_type,
                ?deadline,
                "no spot price in time; the type's price stays"
            );
        }
    }
    None
}
