//! The capacity model: instance types, and what holds the pool's creates back.
//!
//! An [`InstanceType`] names a cloud type (`provider_type`), says whether it is preemptible
//! (spot), and may belong to a quota group (such as an EC2 family sharing one vCPU quota).
//! `Holds` remembers what the cloud said and answers, for a type, whether a create may be
//! tried now, or which [`HoldReason`] holds it, as Arvados' pool does:
//! - **max instances**: instances plus creates in flight reached the configured limit;
//! - **quota**: a quota refusal with no instances holds creates for a TTL; with instances, until
//!   a sync sees fewer of them;
//! - **capacity**: a capacity refusal holds creates for a TTL, scoped as the cloud says: the
//!   type (preemptible apart from on-demand of the same provider type), its quota group, or
//!   every type;
//! - **rate limit**: the cloud's retry time;
//! - **creates in flight**: at most `max_concurrent_creates` at once.
//!
//! Pure data over [`Moment`]s: the pool owns one under its lock, feeds it the time, and asks
//! `Holds::take_ended` when a hold ended so that subscribers hear of it at once.

use crate::clock::Moment;
use crate::resources::Resources;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::time::Duration;
use wharf_state::duration::Formatted;

/// A kind of instance the pool can create.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceType {
    /// Its name in the configuration, saved in each instance's `InstanceType` tag.
    pub name: String,
    /// The cloud's name for it (`m5.large`); several types may share one (a preemptible and
    /// an on-demand type, say).
    pub provider_type: String,
    /// Preemptible (spot): the cloud's capacity for it is apart from on-demand capacity of
    /// the same provider type.
    pub preemptible: bool,
    /// Types that share a quota (an instance family's vCPU limit): a capacity refusal scoped
    /// to the group holds creates of every type in it. `None`: in no group.
    pub quota_group: Option<String>,
    /// What an instance of it has for work, if known: a scheduler creates the smallest type
    /// that fits work no worker has room for, as Arvados' does.
    pub resources: Option<Resources>,
    /// What an instance of it costs per hour, if known.
    pub price: Option<Price>,
}

/// An hourly price, held in millionths of the currency unit: exact, and usable as a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Price {
    micros_per_hour: u64,
}

impl Price {
    /// `amount` per hour; `None` for a negative, infinite or NaN amount, or one above
    /// 10^12 an hour.
    pub fn per_hour(amount: f64) -> Option<Price> {
        let micros = (amount * 1e6).round();
        // In range and rounded, the cast is exact (and out of range it is not used).
        (amount.is_finite() && (0.0..=1e18).contains(&micros))
            .then_some(Price { micros_per_hour: micros as u64 })
    }

    /// The amount per hour in millionths, as records keep it exactly.
    pub fn micros_per_hour(self) -> u64 {
        self.micros_per_hour
    }

    /// The amount per hour.
    pub fn hourly(self) -> f64 {
        self.micros_per_hour as f64 / 1e6
    }

    /// What `used` of an instance at this price costs.
    pub fn cost(self, used: Duration) -> f64 {
        self.hourly() * used.as_secs_f64() / 3600.0
    }
}

impl fmt::Display for Price {
    /// `0.0208`: the amount with no trailing zeros.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (units, micros) = (self.micros_per_hour / 1_000_000, self.micros_per_hour % 1_000_000);
        if micros == 0 {
            return write!(f, "{units}");
        }
        let fraction = format!("{micros:06}");
        write!(f, "{units}.{}", fraction.trim_end_matches('0'))
    }
}

impl InstanceType {
    /// An on-demand type whose provider type is its name, in no quota group.
    pub fn new(name: &str) -> InstanceType {
        InstanceType {
            name: name.to_owned(),
            provider_type: name.to_owned(),
            preemptible: false,
            quota_group: None,
            resources: None,
            price: None,
        }
    }

    /// The same type, with what an instance of it has for work.
    pub fn with_resources(mut self, resources: Resources) -> InstanceType {
        self.resources = Some(resources);
        self
    }

    /// The same type, at `price` per hour.
    pub fn with_price(mut self, price: Price) -> InstanceType {
        self.price = Some(price);
        self
    }
}

/// Which creates a capacity refusal holds, as the cloud reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapacityScope {
    /// Every instance type.
    AllTypes,
    /// The provider type asked for (its preemptible or on-demand kind only).
    InstanceType,
    /// Every type in the quota group of the type asked for.
    QuotaGroup,
}

impl fmt::Display for CapacityScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CapacityScope::AllTypes => "every instance type",
            CapacityScope::InstanceType => "this instance type",
            CapacityScope::QuotaGroup => "this quota group",
        })
    }
}

/// Why the pool does not try a create now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldReason {
    /// Instances and creates in flight reached `max_instances`.
    MaxInstances {
        /// The limit.
        limit: usize,
    },
    /// The cloud refused a create for quota.
    Quota {
        /// Held until fewer than this many instances exist (a refusal with instances).
        until_fewer_than: Option<usize>,
        /// Held this much longer (a refusal with none).
        retry_in: Option<Duration>,
    },
    /// The cloud had no capacity.
    Capacity {
        /// For what.
        scope: CapacityScope,
        /// Held this much longer.
        retry_in: Duration,
    },
    /// The cloud asked us to slow down.
    RateLimit {
        /// Held this much longer.
        retry_in: Duration,
    },
    /// `max_concurrent_creates` are in flight.
    CreatesInFlight {
        /// The limit.
        limit: usize,
    },
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldReason::MaxInstances { limit } => write!(f, "at max instances ({limit})"),
            HoldReason::Quota { until_fewer_than: Some(n), .. } => {
                write!(f, "at quota until fewer than {n} instances exist")
            }
            HoldReason::Quota { retry_in, .. } => {
                write!(f, "at quota for {}", Formatted(retry_in.unwrap_or_default()))
            }
            HoldReason::Capacity { scope, retry_in } => {
                write!(f, "at capacity for {scope} for {}", Formatted(*retry_in))
            }
            HoldReason::RateLimit { retry_in } => {
                write!(f, "rate limited for {}", Formatted(*retry_in))
            }
            HoldReason::CreatesInFlight { limit } => write!(f, "{limit} creates in flight"),
        }
    }
}

/// What one capacity hold covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CapacityKey {
    All,
    Group(String),
    Type { provider_type: String, preemptible: bool },
}

impl CapacityKey {
    fn of_type(it: &InstanceType) -> CapacityKey {
        CapacityKey::Type { provider_type: it.provider_type.clone(), preemptible: it.preemptible }
    }

    fn scope(&self) -> CapacityScope {
        match self {
            CapacityKey::All => CapacityScope::AllTypes,
            CapacityKey::Group(_) => CapacityScope::QuotaGroup,
            CapacityKey::Type { .. } => CapacityScope::InstanceType,
        }
    }
}

/// How the pool counts its instances for the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Workers (instances listed or created).
    pub(crate) instances: usize,
    /// Creates in flight not yet seen as workers.
    pub(crate) creating: usize,
}

impl Counts {
    pub(crate) fn total(self) -> usize {
        self.instances + self.creating
    }
}

/// The limits and hold times the pool was configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) max_instances: usize,
    pub(crate) max_concurrent_creates: usize,
    pub(crate) quota_error_ttl: Duration,
    pub(crate) capacity_error_ttl: Duration,
}

/// What the cloud said about a create (or a list), as far as holds go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    Quota,
    Capacity(CapacityScope),
    RateLimited(Duration),
}

/// A configured limit: zero means no limit, as in Arvados' configuration (`MaxInstances: 0`,
/// `MaxConcurrentInstanceCreateOps: 0`), so a configuration carried over behaves the same.
pub(crate) fn limit(configured: usize) -> usize {
    if configured == 0 { usize::MAX } else { configured }
}

/// The pool's create holds.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    quota_until: Option<Moment>,
    quota_until_fewer: Option<usize>,
    capacity_until: HashMap<CapacityKey, Moment>,
    create_rate_limited_until: Option<Moment>,
    list_rate_limited_until: Option<Moment>,
    /// Ends of holds subscribers have not yet been told of.
    ends: BinaryHeap<Reverse<Moment>>,
}

impl Holds {
    /// Whether a create of `it` may be tried now, or why not.
    pub(crate) fn check(
        &self,
        it: &InstanceType,
        counts: Counts,
        limits: &Limits,
        now: Moment,
    ) -> Result<(), HoldReason> {
        let max = limit(limits.max_instances);
        if counts.total() >= max {
            return Err(HoldReason::MaxInstances { limit: max });
        }
        if let Some(reason) = self.quota(counts, now) {
            return Err(reason);
        }
        if let Some((key, until)) = self.capacity(it, now) {
            return Err(HoldReason::Capacity { scope: key.scope(), retry_in: until.since(now) });
        }
        if let Some(until) = self.create_rate_limited_until.filter(|until| now < *until) {
            return Err(HoldReason::RateLimit { retry_in: until.since(now) });
        }
        let in_flight = limit(limits.max_concurrent_creates);
        if counts.creating >= in_flight {
            return Err(HoldReason::CreatesInFlight { limit: in_flight });
        }
        Ok(())
    }

    /// Whether creates are held for quota (the configured maximum or the cloud's).
    pub(crate) fn at_quota(&self, counts: Counts, limits: &Limits, now: Moment) -> bool {
        counts.total() >= limit(limits.max_instances) || self.quota(counts, now).is_some()
    }

    fn quota(&self, counts: Counts, now: Moment) -> Option<HoldReason> {
        if let Some(n) = self.quota_until_fewer.filter(|n| counts.total() >= *n) {
            return Some(HoldReason::Quota { until_fewer_than: Some(n), retry_in: None });
        }
        let until = self.quota_until.filter(|until| now < *until)?;
        Some(HoldReason::Quota { until_fewer_than: None, retry_in: Some(until.since(now)) })
    }

    /// Whether creates of `it` are held for capacity.
    pub(crate) fn at_capacity(&self, it: &InstanceType, now: Moment) -> bool {
        self.capacity(it, now).is_some()
    }

    fn capacity(&self, it: &InstanceType, now: Moment) -> Option<(&CapacityKey, Moment)> {
        let group = it.quota_group.clone().map(CapacityKey::Group);
        [Some(CapacityKey::All), group, Some(CapacityKey::of_type(it))]
            .into_iter()
            .flatten()
            .filter_map(|key| self.capacity_until.get_key_value(&key))
            .filter(|(_, until)| now < **until)
            .max_by_key(|(_, until)| **until)
            .map(|(key, until)| (key, *until))
    }

    /// Learns from the cloud's refusal of a create of `it`. `others` counts the instances and
    /// the other creates in flight.
    pub(crate) fn refused(
        &mut self,
        refusal: &Refusal,
        it: &InstanceType,
        others: usize,
        limits: &Limits,
        now: Moment,
    ) {
        match refusal {
            Refusal::Quota if others == 0 => {
                // Nothing runs that could end: wait, then try again.
                self.quota_until_fewer = None;
                self.hold_until(now + limits.quota_error_ttl, |h| &mut h.quota_until);
            }
            Refusal::Quota => {
                self.quota_until_fewer =
                    Some(self.quota_until_fewer.map_or(others, |n| n.min(others)));
                self.quota_until = None;
            }
            Refusal::Capacity(scope) => {
                let key = match scope {
                    CapacityScope::AllTypes => CapacityKey::All,
                    CapacityScope::QuotaGroup => match &it.quota_group {
                        Some(group) => CapacityKey::Group(group.clone()),
                        // A type in no group is its own group.
                        None => CapacityKey::of_type(it),
                    },
                    CapacityScope::InstanceType => CapacityKey::of_type(it),
                };
                let until = now + limits.capacity_error_ttl;
                self.capacity_until.insert(key, until);
                self.ends.push(Reverse(until));
            }
            Refusal::RateLimited(retry_after) => {
                self.hold_until(now + *retry_after, |h| &mut h.create_rate_limited_until);
            }
        }
    }

    /// Learns that the cloud rate-limits lists.
    pub(crate) fn list_refused(&mut self, retry_after: Duration, now: Moment) {
        self.hold_until(now + retry_after, |h| &mut h.list_rate_limited_until);
    }

    /// How much longer lists are held, if they are.
    pub(crate) fn list_held(&self, now: Moment) -> Option<Duration> {
        self.list_rate_limited_until.filter(|until| now < *until).map(|until| until.since(now))
    }

    fn hold_until(&mut self, until: Moment, field: impl FnOnce(&mut Holds) -> &mut Option<Moment>) {
        let slot = field(self);
        *slot = Some(slot.map_or(until, |old| old.max(until)));
        self.ends.push(Reverse(until));
    }

    /// A sync counted `counts`: a quota hold waiting for fewer instances ends if there are.
    /// Returns whether it ended.
    pub(crate) fn synced(&mut self, counts: Counts) -> bool {
        if self.quota_until_fewer.is_some_and(|n| counts.total() < n) {
            self.quota_until_fewer = None;
            return true;
        }
        false
    }

    /// When the next hold ends, if any is pending.
    pub(crate) fn next_end(&self) -> Option<Moment> {
        self.ends.peek().map(|Reverse(at)| *at)
    }

    /// Forgets the hold ends at or before `now`; returns whether there were any (then the
    /// pool tells its subscribers).
    pub(crate) fn take_ended(&mut self, now: Moment) -> bool {
        let mut ended = false;
        while self.ends.peek().is_some_and(|Reverse(at)| *at <= now) {
            self.ends.pop();
            ended = true;
        }
        ended
    }
}

/// A type of the tables: its name, provider type, kind and quota group.
#[cfg(test)]
pub(crate) fn typed(
    name: &str,
    provider_type: &str,
    preemptible: bool,
    group: &str,
) -> InstanceType {
    InstanceType {
        name: name.into(),
        provider_type: provider_type.into(),
        preemptible,
        quota_group: Some(group.into()),
        resources: None,
        price: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_exact_to_a_millionth_and_cost_by_time_used() {
        let price = Price::per_hour(0.0208).unwrap();
        assert_eq!(price.to_string(), "0.0208");
        assert_eq!(Price::per_hour(2.0).unwrap().to_string(), "2");
        assert_eq!(Price::per_hour(0.1234567).unwrap().to_string(), "0.123457");
        assert!((price.cost(Duration::from_secs(1800)) - 0.0104).abs() < 1e-12);
        for bad in [-0.01, f64::NAN, f64::INFINITY, 1e13] {
            assert_eq!(Price::per_hour(bad), None, "{bad}");
        }
    }

    const LIMITS: Limits = Limits {
        max_instances: 10,
        max_concurrent_creates: 2,
        quota_error_ttl: Duration::from_secs(60),
        capacity_error_ttl: Duration::from_secs(60),
    };

    fn at(secs: u64) -> Moment {
        Moment::from_origin(Duration::from_secs(secs))
    }

    fn counts(instances: usize, creating: usize) -> Counts {
        Counts { instances, creating }
    }

    /// Arvados' `TestRateLimitError` (throttle_test.go): no hold at first; a rate limit holds
    /// until its time and no longer; its end is announced once.
    #[test]
    fn rate_limit_error() {
        let mut holds = Holds::default();
        let it = InstanceType::new("a");
        assert_eq!(holds.check(&it, counts(0, 0), &LIMITS, at(100)), Ok(()));
        holds.refused(&Refusal::RateLimited(Duration::from_secs(1)), &it, 0, &LIMITS, at(100));
        assert_eq!(
            holds.check(&it, counts(0, 0), &LIMITS, at(100)),
            Err(HoldReason::RateLimit { retry_in: Duration::from_secs(1) })
        );
        assert_eq!(holds.next_end(), Some(at(101)));
        assert!(!holds.take_ended(at(100)));
        assert!(holds.take_ended(at(101)));
        assert_eq!(holds.check(&it, counts(0, 0), &LIMITS, at(101)), Ok(()));
        assert!(!holds.take_ended(at(200)), "announced once");
    }

    #[test]
    fn holds_table() {
        let a1 = typed("a1", "a1", false, "a");
        let a1p = typed("a1-p", "a1", true, "a-p");
        let a2 = typed("a2", "a2", false, "a");
        let b3 = typed("b3", "b3", false, "b");
        // (case, refusals of a1 at t=0 with `others` counted, type checked at t, counts, want)
        type Case =
            (&'static str, Vec<(Refusal, usize)>, InstanceType, u64, Counts, Option<HoldReason>);
        let s = Duration::from_secs;
        let cases: Vec<Case> = vec![
            ("nothing learned", vec![], a1.clone(), 0, counts(3, 1), None),
            (
                "max instances",
                vec![],
                a1.clone(),
                0,
                counts(9, 1),
                Some(HoldReason::MaxInstances { limit: 10 }),
            ),
            (
                "creates in flight",
                vec![],
                a1.clone(),
                0,
                counts(0, 2),
                Some(HoldReason::CreatesInFlight { limit: 2 }),
            ),
            (
                "quota with none: held for the TTL",
                vec![(Refusal::Quota, 0)],
                a2.clone(),
                59,
                counts(0, 0),
                Some(HoldReason::Quota { until_fewer_than: None, retry_in: Some(s(1)) }),
            ),
            (
                "quota with none: over after the TTL",
                vec![(Refusal::Quota, 0)],
                a2.clone(),
                60,
                counts(0, 0),
                None,
            ),
            (
                "quota with 3: held while 3 exist, however long",
                vec![(Refusal::Quota, 3)],
                b3.clone(),
                3_600,
                counts(2, 1),
                Some(HoldReason::Quota { until_fewer_than: Some(3), retry_in: None }),
            ),
            (
                "quota with 3: over with 2",
                vec![(Refusal::Quota, 3)],
                b3.clone(),
                0,
                counts(2, 0),
                None,
            ),
            (
                "type capacity holds the type",
                vec![(Refusal::Capacity(CapacityScope::InstanceType), 0)],
                a1.clone(),
                30,
                counts(0, 0),
                Some(HoldReason::Capacity { scope: CapacityScope::InstanceType, retry_in: s(30) }),
            ),
            (
                "type capacity spares its preemptible kind",
                vec![(Refusal::Capacity(CapacityScope::InstanceType), 0)],
                a1p.clone(),
                30,
                counts(0, 0),
                None,
            ),
            (
                "type capacity spares its group",
                vec![(Refusal::Capacity(CapacityScope::InstanceType), 0)],
                a2.clone(),
                30,
                counts(0, 0),
                None,
            ),
            (
                "group capacity holds the group",
                vec![(Refusal::Capacity(CapacityScope::QuotaGroup), 0)],
                a2.clone(),
                30,
                counts(0, 0),
                Some(HoldReason::Capacity { scope: CapacityScope::QuotaGroup, retry_in: s(30) }),
            ),
            (
                "group capacity spares other groups",
                vec![(Refusal::Capacity(CapacityScope::QuotaGroup), 0)],
                b3.clone(),
                30,
                counts(0, 0),
                None,
            ),
            (
                "group capacity spares the preemptible group",
                vec![(Refusal::Capacity(CapacityScope::QuotaGroup), 0)],
                a1p.clone(),
                30,
                counts(0, 0),
                None,
            ),
            (
                "capacity for all holds every type",
                vec![(Refusal::Capacity(CapacityScope::AllTypes), 0)],
                b3.clone(),
                59,
                counts(0, 0),
                Some(HoldReason::Capacity { scope: CapacityScope::AllTypes, retry_in: s(1) }),
            ),
            (
                "capacity is over after the TTL",
                vec![(Refusal::Capacity(CapacityScope::AllTypes), 0)],
                b3.clone(),
                60,
                counts(0, 0),
                None,
            ),
            (
                "a rate limit holds every type",
                vec![(Refusal::RateLimited(s(5)), 0)],
                b3.clone(),
                4,
                counts(0, 0),
                Some(HoldReason::RateLimit { retry_in: s(1) }),
            ),
            (
                "a rate limit passes",
                vec![(Refusal::RateLimited(s(5)), 0)],
                b3.clone(),
                5,
                counts(0, 0),
                None,
            ),
        ];
        for (name, refusals, it, t, counts, want) in cases {
            let mut holds = Holds::default();
            for (refusal, others) in &refusals {
                holds.refused(refusal, &a1, *others, &LIMITS, at(0));
            }
            assert_eq!(holds.check(&it, counts, &LIMITS, at(t)).err(), want, "{name}");
        }
    }

    #[test]
    fn a_sync_with_fewer_instances_ends_the_quota_hold() {
        let mut holds = Holds::default();
        let it = InstanceType::new("a");
        holds.refused(&Refusal::Quota, &it, 4, &LIMITS, at(0));
        holds.refused(&Refusal::Quota, &it, 3, &LIMITS, at(1));
        assert!(holds.at_quota(counts(3, 0), &LIMITS, at(2)), "the lower count holds");
        assert!(!holds.synced(counts(3, 0)));
        assert!(holds.synced(counts(2, 0)));
        assert!(!holds.at_quota(counts(2, 0), &LIMITS, at(2)));
    }

    #[test]
    fn zero_limits_are_no_limits() {
        let limits = Limits { max_instances: 0, max_concurrent_creates: 0, ..LIMITS };
        let holds = Holds::default();
        let it = InstanceType::new("a");
        assert_eq!(holds.check(&it, counts(10_000, 500), &limits, at(0)), Ok(()));
    }
}
