//! A figure: which way is better, and how it is written.

/// Whether a larger figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Better {
    Higher,
    Lower,
}

/// A figure with the digits that mean something at its size.
pub(crate) fn figure(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}
