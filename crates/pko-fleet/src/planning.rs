//! The pure planning of a replica's membership ([`crate::membership`]): which members are live ([`Liveness`],
//! client-go's rule on the watcher's own clock), which shard count prevails ([`standing`]), and what to do with each
//! shard ([`plan`], [`stand_down`]) given the desired holders of the ring, the shard table ([`crate::table`]; the
//! cached table Lease with this replica's own write the cache may not show yet, [`with_own_writes`]) and the shards
//! held. No I/O: every function here is unit-tested.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;

use crate::lease;
use crate::table::Entry;

/// Who is live, by watching membership Leases change (pure: the caller passes the clock).
#[derive(Debug, Default)]
pub struct Liveness {
    seen: HashMap<String, (Option<String>, Instant)>,
    /// When [`Liveness::live`] last looked.
    looked: Option<Instant>,
}

/// Longest time [`Liveness::live`] may go without looking before what it saw counts for nothing: a process frozen
/// (SIGSTOP, a paused VM) or starved longer did not watch the members renew meanwhile, so it cannot tell who stopped
/// renewing — it watches again for a full lease before judging anyone dead.
pub const BLIND_AFTER: Duration = Duration::from_secs(3);

impl Liveness {
    /// The live members among membership Leases `members` at `now`: a holder whose `renewTime` changed less than its
    /// `leaseDurationSeconds` ago (as first seen here), not released. After a gap of more than [`BLIND_AFTER`] since
    /// the last look, every member counts as just seen: a member is dead only once this process has watched it go
    /// un-renewed for a full lease on its own clock.
    pub fn live<'a>(&mut self, members: impl IntoIterator<Item = &'a Lease>, now: Instant) -> BTreeSet<String> {
        if self.looked.is_some_and(|t| now.saturating_duration_since(t) > BLIND_AFTER) {
            for entry in self.seen.values_mut() {
                entry.1 = now;
            }
        }
        self.looked = Some(now);
        let mut live = BTreeSet::new();
        for l in members {
            let Some(holder) = lease::holder(l) else { continue };
            let spec = l.spec.as_ref();
            let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string());
            let duration = Duration::from_secs(spec.and_then(|s| s.lease_duration_seconds).unwrap_or(15).max(1) as u64);
            let entry = self.seen.entry(holder.to_string()).or_insert_with(|| (renewed.clone(), now));
            if entry.0 != renewed {
                *entry = (renewed, now);
            }
            if now.saturating_duration_since(entry.1) < duration {
                live.insert(holder.to_string());
            }
        }
        live
    }
}

/// A live member as its membership Lease shows it: the shard count it announces ([`lease::SHARDS_ANNOTATION`]; `None`:
/// a replica older than the announcement) and since when it is a member (`acquireTime`; `None`: not known yet, counted
/// as the youngest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMember {
    /// The replica's id (`holderIdentity`).
    pub name: String,
    /// The shard count it runs with.
    pub shards: Option<u32>,
    /// When it became a member.
    pub since: Option<k8s_openapi::jiff::Timestamp>,
}

/// What a replica may do, given the shard counts its fleet's live members announce.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Standing {
    /// Its count prevails: it takes part in holding shards.
    #[default]
    Active,
    /// Another count prevails: it holds nothing (and releases what it held), so that replicas of two counts never hold
    /// shards at once; it takes part again once its count prevails.
    StandingBy {
        /// The prevailing count.
        prevailing: u32,
        /// The eldest live member, which announces it.
        eldest: String,
    },
    /// A replica of an earlier version, which holds shards through one Lease per shard and knows nothing of the shard
    /// table, is live: this replica holds nothing (and releases what it held) until every such replica has gone —
    /// they would take shards the table gives to others. A rolling upgrade from such a version hands every shard over
    /// once, when its last replica stops.
    Earlier {
        /// The live replica of the earlier version (its `<fleet>-member-<replica>` Lease).
        member: String,
    },
}

/// Whether `mine` prevails among the live `members` (pure): the count of the eldest member announcing one (earliest
/// `since`, then the smaller name; an unknown `since` is youngest); members announcing none agree with everyone. A
/// rolling change of `--shards` keeps the old count until its last replica has gone; the new one then takes only once
/// no live member of another count holds a shard ([`holding_another_count`]).
pub fn standing(mine: u32, members: &[LiveMember]) -> Standing {
    let key = |m: &&LiveMember| (m.since.is_none(), m.since, m.name.clone());
    match members.iter().filter(|m| m.shards.is_some()).min_by_key(key) {
        Some(LiveMember { name, shards: Some(n), .. }) if *n != mine => {
            Standing::StandingBy { prevailing: *n, eldest: name.clone() }
        }
        _ => Standing::Active,
    }
}

/// A live member announcing a count other than `mine` that holds a shard among `entries` (those of every shard table,
/// each count's), with its count (pure). While there is one, a replica takes no shard: an object's shard under one
/// count and under another are different tables' shards, so holders of two counts could both own it.
pub fn holding_another_count<'a>(
    mine: u32,
    members: &[LiveMember],
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Option<(String, u32)> {
    let others: HashMap<&str, u32> =
        members.iter().filter_map(|m| m.shards.filter(|n| *n != mine).map(|n| (m.name.as_str(), n))).collect();
    if others.is_empty() {
        return None;
    }
    entries.into_iter().filter_map(|e| e.holder.as_deref()).find_map(|h| others.get(h).map(|n| (h.to_string(), *n)))
}

/// The steps of replica `me` standing by (pure): let go of every shard it holds and release every shard the table still
/// gives it (drop, without a write, a held shard the table gives someone else).
pub fn stand_down(me: &str, table: &BTreeMap<u32, Entry>, held: &BTreeMap<u32, i64>) -> Vec<Step> {
    let holder = |k: &u32| table.get(k).and_then(|e| e.holder.as_deref());
    let mut steps: Vec<Step> = held.keys().filter(|k| holder(k) != Some(me)).map(|k| Step::Drop(*k)).collect();
    steps.extend(table.keys().filter(|k| holder(k) == Some(me)).map(|k| Step::Release(*k)));
    steps
}

/// The live members among the fleet's membership Leases `members`, named in `live`, as [`LiveMember`]s; `me` announces
/// `mine` whatever its Lease shows yet (pure).
pub fn live_members<'a>(
    me: &str,
    mine: u32,
    members: impl IntoIterator<Item = &'a Lease>,
    live: &BTreeSet<String>,
) -> Vec<LiveMember> {
    let mut out: Vec<LiveMember> = members
        .into_iter()
        .filter_map(|l| {
            let name = lease::holder(l).filter(|h| live.contains(*h))?.to_string();
            let since = l.spec.as_ref().and_then(|s| s.acquire_time.as_ref()).map(|t| t.0);
            let shards = if name == me { Some(mine) } else { lease::announced_shards(l) };
            Some(LiveMember { name, shards, since })
        })
        .collect();
    if !out.iter().any(|m| m.name == me) {
        out.push(LiveMember { name: me.to_string(), shards: Some(mine), since: None });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

/// A Lease this replica wrote (a shard table) that its cache may not show yet, or read fresh after a write of it was
/// refused: the resourceVersion the cache showed (`None`: none, a create) and the Lease as written or read
/// ([`lease::slim`]).
#[derive(Debug, Clone)]
pub struct OwnWrite {
    /// The resourceVersion the cache showed when the write was made (`None`: no Lease, a create).
    pub before: Option<String>,
    /// The Lease as the API server returned it.
    pub written: Arc<Lease>,
}

/// The Leases a plan reads, by key (pure): `cached`, except where this replica wrote a Lease the cache still shows as
/// it was before that write (`own`; entries the cache has caught up with are retired). Watch events arrive in order, so
/// a cache showing any version other than the one a write was guarded by shows that write or a later one.
pub fn with_own_writes(
    mut cached: BTreeMap<u32, Arc<Lease>>,
    own: &mut BTreeMap<u32, OwnWrite>,
) -> BTreeMap<u32, Arc<Lease>> {
    // From the cache alone, a replica that had just taken shards saw their Leases still naming the old holder, dropped
    // them and took them again at a new epoch, fencing their running operations.
    own.retain(|k, w| cached.get(k).and_then(|l| l.metadata.resource_version.clone()) == w.before);
    for (k, w) in own.iter() {
        cached.insert(*k, w.written.clone());
    }
    cached
}

/// `written` (slimmed) as this replica's own write over the version `before`.
pub(crate) fn own_write(before: Option<String>, mut written: Lease) -> OwnWrite {
    lease::slim(&mut written);
    OwnWrite { before, written: Arc::new(written) }
}

/// One step of a replica towards the desired assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Take the shard (never taken, released, or its holder is not live) at its next epoch.
    Take(u32),
    /// Stop acting on the shard, then release it to the live member that should hold it.
    Release(u32),
    /// Stop acting on the shard at once: the table gives it to someone else.
    Drop(u32),
}

/// The steps of replica `me` (pure): `desired` holder per shard, the shard table, `live` members, and what `me` holds.
pub fn plan(
    me: &str,
    desired: &[String],
    table: &BTreeMap<u32, Entry>,
    live: &BTreeSet<String>,
    held: &BTreeMap<u32, i64>,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for (shard, want) in desired.iter().enumerate() {
        let shard = shard as u32;
        let holder = table.get(&shard).and_then(|e| e.holder.as_deref());
        if held.contains_key(&shard) {
            if holder != Some(me) {
                steps.push(Step::Drop(shard));
            } else if want != me && live.contains(want) {
                steps.push(Step::Release(shard));
            }
        } else if holder == Some(me) && want != me {
            // the table still names us (a release that failed, or an earlier life): let it go
            steps.push(Step::Release(shard));
        } else if want == me {
            match holder {
                None => steps.push(Step::Take(shard)),
                Some(h) if h == me || !live.contains(h) => steps.push(Step::Take(shard)),
                Some(_) => {} // a live member holds it: it releases when it sees us
            }
        }
    }
    steps
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn the_plan_reads_a_replicas_own_writes_until_the_cache_shows_them_or_a_later_version() {
        let at = |holder: &str, rv: &str| {
            let mut l = lease(Some(holder), 1);
            l.metadata.resource_version = Some(rv.into());
            Arc::new(l)
        };
        let holder =
            |m: &BTreeMap<u32, Arc<Lease>>, k: u32| m.get(&k).and_then(|l| lease::holder(l)).map(str::to_string);
        let mut own: BTreeMap<u32, OwnWrite> = [
            (1, OwnWrite { before: Some("10".into()), written: at("me", "11") }),
            (2, OwnWrite { before: None, written: at("me", "12") }),
            (3, OwnWrite { before: Some("13".into()), written: at("me", "14") }),
        ]
        .into();
        // the cache: 1 as it was before the write (stale), 2 not there yet (a create), 3 moved on (another
        // replica wrote after us: the cache is the truth again), 4 never written here
        let cached: BTreeMap<u32, Arc<Lease>> =
            [(1, at("dead", "10")), (3, at("other", "20")), (4, at("other", "5"))].into();
        let read = with_own_writes(cached.clone(), &mut own);
        assert_eq!(holder(&read, 1).as_deref(), Some("me"), "the cache is behind our take");
        assert_eq!(holder(&read, 2).as_deref(), Some("me"), "our create is not in the cache yet");
        assert_eq!(holder(&read, 3).as_deref(), Some("other"), "a later write by another replica wins");
        assert_eq!(holder(&read, 4).as_deref(), Some("other"));
        assert_eq!(own.keys().copied().collect::<Vec<_>>(), [1, 2], "the write the cache moved past is retired");
        // the cache catches up: every own write is retired
        let caught_up: BTreeMap<u32, Arc<Lease>> = [(1, at("me", "11")), (2, at("me", "12"))].into();
        assert_eq!(holder(&with_own_writes(caught_up, &mut own), 1).as_deref(), Some("me"));
        assert!(own.is_empty());
        // what planning from the stale cache alone did: drop the shard just taken
        let entries = |m: &BTreeMap<u32, Arc<Lease>>| {
            m.iter()
                .map(|(k, l)| (*k, Entry { holder: lease::holder(l).map(str::to_string), epoch: 1 }))
                .collect::<BTreeMap<_, _>>()
        };
        let held = BTreeMap::from([(1, 11)]);
        let desired = vec!["x".to_string(), "me".to_string()];
        let live: BTreeSet<String> = ["me".to_string(), "x".to_string()].into();
        assert_eq!(plan("me", &desired, &entries(&cached), &live, &held), [Step::Drop(1)], "the stale cache");
        let mut own: BTreeMap<u32, OwnWrite> =
            [(1, OwnWrite { before: Some("10".into()), written: at("me", "11") })].into();
        assert_eq!(
            plan("me", &desired, &entries(&with_own_writes(cached, &mut own)), &live, &held),
            [],
            "with its own write: nothing to do"
        );
    }

    /// A Lease held by `holder`, renewed at `renewed_secs` (Unix seconds), for 15 s.
    pub(crate) fn lease(holder: Option<&str>, renewed_secs: i64) -> Lease {
        Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second(renewed_secs).unwrap_or_default(),
                )),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn after_a_blind_gap_a_member_is_judged_only_on_what_is_watched_afterwards() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(l.live([&lease(Some("a"), 1)], t0), set(&["a"]));
        for s in 1..=2 {
            l.live([&lease(Some("a"), 1)], t0 + Duration::from_secs(s));
        }
        // frozen for 20 s: its cache still shows a's renewal of before the freeze
        let woke = t0 + Duration::from_secs(22);
        assert_eq!(l.live([&lease(Some("a"), 1)], woke), set(&["a"]), "not judged dead on what it did not watch");
        assert_eq!(l.live([&lease(Some("a"), 1)], woke + Duration::from_secs(2)), set(&["a"]));
        // watched without a renewal for a full lease (15 s) since waking, looking every second
        let mut now = woke + Duration::from_secs(2);
        while now < woke + Duration::from_secs(16) {
            now += Duration::from_secs(1);
            l.live([&lease(Some("a"), 1)], now);
        }
        assert_eq!(l.live([&lease(Some("a"), 1)], now), set(&[]), "dead once watched for a full lease");
    }

    #[test]
    fn a_member_is_live_while_its_renewals_are_seen_and_dead_after_a_duration_without() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        // the membership loop looks every second (and more often on events)
        let look_until = |l: &mut Liveness, leases: &[Lease], from: u64, to: u64| {
            let mut last = BTreeSet::new();
            for s in from..=to {
                last = l.live(leases.iter(), t0 + Duration::from_secs(s));
            }
            last
        };
        assert_eq!(look_until(&mut l, &[lease(Some("a"), 1), lease(Some("b"), 1)], 0, 0), set(&["a", "b"]));
        // a renews, b does not
        assert_eq!(look_until(&mut l, &[lease(Some("a"), 2), lease(Some("b"), 1)], 1, 10), set(&["a", "b"]));
        assert_eq!(
            look_until(&mut l, &[lease(Some("a"), 3), lease(Some("b"), 1)], 11, 16),
            set(&["a"]),
            "b: 16 s without a renewal"
        );
        // a released membership is not live at once
        assert_eq!(look_until(&mut l, &[lease(None, 3)], 17, 17), set(&[]));
        // the clock of the writer does not matter: only that renewTime changes
        assert_eq!(look_until(&mut l, &[lease(Some("b"), -5000)], 18, 18), set(&["b"]));
    }

    fn shard_lease(holder: Option<&str>) -> Entry {
        Entry { holder: holder.map(str::to_string), epoch: 1 }
    }

    #[test]
    fn plan_takes_what_it_should_hold_once_free_and_releases_to_live_members() {
        let desired: Vec<String> = ["me", "me", "me", "other", "other", "me"].iter().map(|s| s.to_string()).collect();
        let live: BTreeSet<String> = ["me".to_string(), "other".to_string()].into();
        let leases: BTreeMap<u32, Entry> = [
            // 0 missing
            (1, shard_lease(None)),
            (2, shard_lease(Some("dead"))),
            (3, shard_lease(Some("me"))),
            (4, shard_lease(Some("other"))),
            (5, shard_lease(Some("other"))),
        ]
        .into();
        let held: BTreeMap<u32, i64> = [(3, 7), (4, 2)].into();
        let steps = plan("me", &desired, &leases, &live, &held);
        assert_eq!(
            steps,
            [
                Step::Take(0), // never taken
                Step::Take(1),
                Step::Take(2),    // its holder is not live
                Step::Release(3), // other should hold it and is live
                Step::Drop(4),    // the Lease names other: never act on it
                                  // 5: other holds it and is live — wait for its release
            ]
        );
    }

    #[test]
    fn a_lease_still_naming_us_is_released_when_another_should_hold_it() {
        let desired = vec!["other".to_string()];
        let live: BTreeSet<String> = ["me".to_string(), "other".to_string()].into();
        let leases: BTreeMap<u32, Entry> = [(0, shard_lease(Some("me")))].into();
        assert_eq!(
            plan("me", &desired, &leases, &live, &BTreeMap::new()),
            [Step::Release(0)],
            "a release that failed is tried again"
        );
    }

    #[test]
    fn a_shard_held_in_a_previous_life_is_taken_again_with_a_new_epoch() {
        let desired = vec!["me".to_string()];
        let live: BTreeSet<String> = ["me".to_string()].into();
        let leases: BTreeMap<u32, Entry> = [(0, shard_lease(Some("me")))].into();
        assert_eq!(plan("me", &desired, &leases, &live, &BTreeMap::new()), [Step::Take(0)]);
    }

    fn member(name: &str, shards: Option<u32>, since: Option<i64>) -> LiveMember {
        LiveMember {
            name: name.into(),
            shards,
            since: since.map(|s| k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default()),
        }
    }

    #[test]
    fn the_eldest_live_members_shard_count_prevails() {
        // one count everywhere
        assert_eq!(standing(64, &[member("a", Some(64), Some(1)), member("b", Some(64), Some(2))]), Standing::Active);
        // a rolling update to 128: the new replica is the youngest, the old count prevails
        let rolling = [
            member("old-0", Some(64), Some(10)),
            member("old-1", Some(64), Some(11)),
            member("new-0", Some(128), Some(20)),
        ];
        assert_eq!(standing(128, &rolling), Standing::StandingBy { prevailing: 64, eldest: "old-0".into() });
        assert_eq!(standing(64, &rolling), Standing::Active);
        // the last old replica gone: the new count prevails
        let done = [member("new-0", Some(128), Some(20)), member("new-1", Some(128), Some(21))];
        assert_eq!(standing(128, &done), Standing::Active);
        assert_eq!(
            standing(64, &done),
            Standing::StandingBy { prevailing: 128, eldest: "new-0".into() },
            "an old replica restarted late"
        );
        // equal times: the smaller name; an unknown time is the youngest
        assert_eq!(standing(2, &[member("b", Some(1), Some(5)), member("a", Some(2), Some(5))]), Standing::Active);
        assert_eq!(
            standing(2, &[member("a", Some(2), None), member("b", Some(1), Some(9))]),
            Standing::StandingBy { prevailing: 1, eldest: "b".into() }
        );
        // a member announcing nothing (an older replica) agrees with everyone
        assert_eq!(standing(8, &[member("old", None, Some(1)), member("me", Some(8), Some(2))]), Standing::Active);
        assert_eq!(standing(8, &[]), Standing::Active);
    }

    #[test]
    fn no_shard_is_taken_while_a_live_member_of_another_count_holds_one() {
        let members =
            [member("old", Some(64), Some(1)), member("me", Some(128), Some(2)), member("quiet", None, Some(3))];
        let entries = vec![shard_lease(Some("me")), shard_lease(None), shard_lease(Some("dead"))];
        assert_eq!(
            holding_another_count(128, &members, &entries),
            None,
            "no table names a live member of another count"
        );
        let mut entries = entries;
        entries.push(shard_lease(Some("old")));
        assert_eq!(holding_another_count(128, &members, &entries), Some(("old".into(), 64)), "the other count's table");
        assert_eq!(
            holding_another_count(64, &members, &entries),
            Some(("me".into(), 128)),
            "old's view: me holds shard 0"
        );
        assert_eq!(
            holding_another_count(128, &[member("quiet", None, Some(3))], &[shard_lease(Some("quiet"))]),
            None,
            "no count announced"
        );
    }

    #[test]
    fn a_replica_standing_by_releases_every_lease_naming_it_and_drops_the_rest() {
        let leases: BTreeMap<u32, Entry> = [
            (0, shard_lease(Some("me"))),
            (1, shard_lease(Some("other"))),
            (2, shard_lease(Some("me"))),
            (3, shard_lease(None)),
        ]
        .into();
        let held: BTreeMap<u32, i64> = [(0, 4), (1, 2)].into();
        assert_eq!(stand_down("me", &leases, &held), [Step::Drop(1), Step::Release(0), Step::Release(2)]);
        assert!(
            stand_down("me", &[(3, shard_lease(None))].into(), &BTreeMap::new()).is_empty(),
            "nothing held: nothing to do"
        );
    }

    #[test]
    fn live_members_read_their_count_and_time_from_their_membership_leases() {
        let lease_of = |holder: &str, shards: Option<&str>, acquired: i64| {
            let mut l = lease(Some(holder), 1);
            l.metadata.annotations = shards.map(|n| [(lease::SHARDS_ANNOTATION.to_string(), n.to_string())].into());
            if let Some(s) = l.spec.as_mut() {
                s.acquire_time =
                    Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(acquired).unwrap_or_default()));
            }
            l
        };
        let ls = [
            lease_of("a", Some("64"), 5),
            lease_of("b", Some("x"), 6),
            lease_of("dead", Some("8"), 1),
            lease_of("me", Some("64"), 7),
        ];
        let live: BTreeSet<String> = ["a", "b", "me"].iter().map(|s| s.to_string()).collect();
        let got = live_members("me", 128, ls.iter(), &live);
        assert_eq!(
            got,
            vec![member("a", Some(64), Some(5)), member("b", None, Some(6)), member("me", Some(128), Some(7))],
            "me announces its own count; an unreadable one is none"
        );
        let got = live_members("me", 128, ls[..1].iter(), &live);
        assert_eq!(
            got,
            vec![member("a", Some(64), Some(5)), member("me", Some(128), None)],
            "its own Lease not cached yet: the youngest"
        );
    }
}
