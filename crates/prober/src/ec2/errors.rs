//! What EC2's error codes mean to the pool: a capacity hold (of the type in its market, or of
//! every type when the subnets are out of addresses), a quota hold (of the type's quota group),
//! a rate limit with backoff, or a plain error carrying EC2's code and message.
//!
//! The classes follow Arvados' EC2 driver: `InsufficientInstanceCapacity` and an `Unsupported`
//! "requested instance type" are the type's capacity; subnet-specific errors (a code naming a
//! subnet, a capacity code, an `InvalidParameter*` whose message speaks of a subnet or of free
//! addresses) send the create to the next subnet; `VcpuLimitExceeded`,
//! `InstanceLimitExceeded` and `MaxSpotInstanceCountExceeded` are quota; throttling codes
//! back off from 1 s, doubling to 1 min, until a call goes through.

use crate::ProberError;
use crate::capacity::{CapacityScope, InstanceType};
use std::time::Duration;

/// The first wait after a throttled call.
pub(crate) const THROTTLE_MIN: Duration = Duration::from_secs(1);
/// The longest wait after throttled calls.
pub(crate) const THROTTLE_MAX: Duration = Duration::from_secs(60);

/// An error EC2 answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ec2Error {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl std::fmt::Display for Ec2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            f.write_str(&self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// EC2 (or the endpoint) answered with an error.
    Ec2(Ec2Error),
    /// No answer, or one that is not EC2's.
    Transport(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Ec2(error) => error.fmt(f),
            CallError::Transport(detail) => f.write_str(detail),
        }
    }
}

impl CallError {
    fn ec2(&self) -> Option<&Ec2Error> {
        match self {
            CallError::Ec2(error) => Some(error),
            CallError::Transport(_) => None,
        }
    }
}

/// The codes AWS's SDKs treat as throttling.
const THROTTLE_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "RequestThrottled",
    "SlowDown",
    "EC2ThrottledException",
];

/// Codes that are the account's or the type family's limit.
const QUOTA_CODES: &[&str] =
    &["VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"];

/// Codes that say the subnets have no address left.
const ADDRESS_CODES: &[&str] =
    &["InsufficientFreeAddressesInSubnet", "InsufficientAddressCapacity"];

pub(crate) fn is_throttle(error: &CallError) -> bool {
    error.ec2().is_some_and(|e| THROTTLE_CODES.contains(&e.code.as_str()))
}

/// Whether another subnet might not fail this way.
pub(crate) fn is_subnet_specific(error: &CallError) -> bool {
    let Some(Ec2Error { code, message }) = error.ec2() else { return false };
    let speaks_of_subnet = message.contains(" subnet ")
        || message.contains("sufficient free Ipv4 addresses")
        || message.contains("sufficient free ipv4 addresses")
        || message.contains("sufficient free Ipv6 addresses")
        || message.contains("sufficient free ipv6 addresses");
    code.contains("Subnet")
        || code == "InsufficientInstanceCapacity"
        || code == "InsufficientVolumeCapacity"
        || code == "Unsupported"
        || (code.contains("InvalidParameter") && speaks_of_subnet)
}

/// The capacity a failed create says is missing: this type (in its market) or, for a subnet
/// out of addresses, every type.
pub(crate) fn capacity_scope(error: &CallError) -> Option<CapacityScope> {
    let Ec2Error { code, message } = error.ec2()?;
    if code == "InsufficientInstanceCapacity"
        || (code == "Unsupported" && message.contains("requested instance type"))
    {
        Some(CapacityScope::InstanceType)
    } else if ADDRESS_CODES.contains(&code.as_str()) {
        Some(CapacityScope::AllTypes)
    } else {
        None
    }
}

pub(crate) fn is_quota(error: &CallError) -> bool {
    error.ec2().is_some_and(|e| QUOTA_CODES.contains(&e.code.as_str()))
}

/// The wait after throttled calls: 1 s after the first, doubling to 1 min, back to none after
/// a call that was not throttled.
#[derive(Debug, Default)]
pub(crate) struct Backoff(parking_lot::Mutex<Duration>);

impl Backoff {
    /// The wait after one more throttled call.
    pub(crate) fn throttled(&self) -> Duration {
        let mut wait = self.0.lock();
        *wait = if wait.is_zero() { THROTTLE_MIN } else { (*wait * 2).min(THROTTLE_MAX) };
        *wait
    }

    /// A call went through (or failed otherwise): the next throttle starts over.
    pub(crate) fn reset(&self) {
        *self.0.lock() = Duration::ZERO;
    }
}

/// What a failed call of `operation` is to the pool, creating `instance_type` (for a create).
pub(crate) fn to_prober_error(
    error: &CallError,
    operation: &'static str,
    instance_type: Option<&InstanceType>,
    backoff: &Backoff,
) -> ProberError {
    if is_throttle(error) {
        return ProberError::RateLimited { retry_after: backoff.throttled() };
    }
    backoff.reset();
    let detail = error.to_string();
    if is_quota(error) {
        // A limit of the type's family holds that family's types (its quota group); with no
        // group configured, every create waits.
        return match instance_type.and_then(|t| t.quota_group.as_ref()) {
            Some(_) => ProberError::Capacity { scope: CapacityScope::QuotaGroup, detail },
            None => ProberError::Quota { detail },
        };
    }
    if let Some(scope) = capacity_scope(error) {
        return ProberError::Capacity { scope, detail };
    }
    ProberError::Cloud { operation, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ec2(code: &str, message: &str) -> CallError {
        CallError::Ec2(Ec2Error { code: code.into(), message: message.into() })
    }

    /// Arvados' TestIsErrorSubnetSpecific.
    #[test]
    fn ec2_is_error_subnet_specific() {
        assert!(!is_subnet_specific(&CallError::Transport("misc error".into())));
        assert!(is_subnet_specific(&ec2("InsufficientInstanceCapacity", "")));
        assert!(is_subnet_specific(&ec2("InsufficientVolumeCapacity", "")));
        let full = "Not enough free addresses in subnet subnet-abcdefg\n\tstatus code: 400";
        assert!(is_subnet_specific(&ec2("InsufficientFreeAddressesInSubnet", full)));
        // EC2 sometimes says the same with a generic code.
        assert!(is_subnet_specific(&ec2("InvalidParameterValue", full)));
        let no_ips = "There aren't sufficient free Ipv4 addresses or prefixes";
        assert!(is_subnet_specific(&ec2("Client.InvalidParameterValue", no_ips)));
        assert!(is_subnet_specific(&ec2("InvalidParameterValue", no_ips)));
        assert!(is_subnet_specific(&ec2("ClientInvalidParameterValue", no_ips)));
        assert!(!is_subnet_specific(&ec2(
            "InvalidParameterValue",
            "Some other invalid parameter error"
        )));
        assert!(is_subnet_specific(&ec2("InvalidSubnetID.NotFound", "bogus subnet id")));
    }

    /// Arvados' TestWrapError: throttles are rate limits, limits are quota, and capacity is
    /// the type's (or, for vCPU limits, the quota group's).
    #[test]
    fn ec2_wrap_error() {
        let backoff = Backoff::default();
        let tiny = InstanceType::new("tiny");
        let grouped = InstanceType { quota_group: Some("standard".into()), ..tiny.clone() };
        let wrap =
            |e: &CallError, t: &InstanceType| to_prober_error(e, "create", Some(t), &backoff);
        assert!(matches!(wrap(&ec2("Throttling", ""), &tiny), ProberError::RateLimited { .. }));
        assert!(matches!(
            wrap(&ec2("InstanceLimitExceeded", ""), &tiny),
            ProberError::Quota { .. }
        ));
        let unsupported = "Your requested instance type (t3.micro) is not supported in your \
                           requested Availability Zone (us-east-1e).";
        for (code, message, scope) in [
            ("InsufficientInstanceCapacity", "", CapacityScope::InstanceType),
            ("Unsupported", unsupported, CapacityScope::InstanceType),
            (
                "VcpuLimitExceeded",
                "You have requested more vCPU capacity",
                CapacityScope::QuotaGroup,
            ),
            ("MaxSpotInstanceCountExceeded", "", CapacityScope::QuotaGroup),
            ("InsufficientFreeAddressesInSubnet", "subnet is full", CapacityScope::AllTypes),
        ] {
            match wrap(&ec2(code, message), &grouped) {
                ProberError::Capacity { scope: got, detail } => {
                    assert_eq!(got, scope, "{code}");
                    assert!(detail.starts_with(code), "{code}: {detail}");
                }
                other => panic!("{code}: expected capacity, got {other:?}"),
            }
        }
        match wrap(&ec2("InvalidAMIID.NotFound", "no such image"), &tiny) {
            ProberError::Cloud { operation, detail } => {
                assert_eq!(
                    (operation, detail.as_str()),
                    ("create", "InvalidAMIID.NotFound: no such image")
                );
            }
            other => panic!("expected a plain error, got {other:?}"),
        }
    }

    /// Throttled calls wait 1 s, then twice as long each time up to a minute; any other answer
    /// starts over.
    #[test]
    fn ec2_throttle_backoff_doubles_to_a_minute() {
        let backoff = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| backoff.throttled().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let _ = to_prober_error(&ec2("InvalidParameterValue", "x"), "list", None, &backoff);
        assert_eq!(backoff.throttled(), THROTTLE_MIN);
    }
}
