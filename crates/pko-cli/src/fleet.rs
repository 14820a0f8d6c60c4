//! `kubectl pko fleet`: the replicas of a fleet and the shards they hold, from the fleet's Leases
//! (`coordination.k8s.io/v1` in the operator's namespace; `pko_fleet::lease`): a membership Lease per replica (renewed
//! while it lives; annotation `pulumi.com/shards`) and a shard Lease per shard (its holder, and its `leaseTransitions`
//! as the shard's epoch). Read with the caller's own rights (`list` Leases in that namespace): no new privileged path.
//! Each replica also announces its load on its membership Lease at every renewal (annotation `pulumi.com/load`, the
//! contract `pko_fleet::load`): operations queued per namespace, in flight, running per workspace class, pool agents
//! busy and idle per class and the pools' bounds — shown per replica and summed over the live ones.

use std::collections::BTreeMap;

use pko_fleet::lease::LeaseKind;
use serde::Serialize;
use serde_json::Value;

/// One replica of the fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replica {
    /// Its id (`--replica-id`, the pod's name).
    pub replica: String,
    /// Whether its membership Lease was renewed within its duration (`false`: gone, or released).
    pub live: bool,
    /// Seconds since its membership Lease was renewed.
    pub renewed_seconds_ago: Option<f64>,
    /// Its `--shards` (the membership Lease's annotation).
    pub shards_setting: String,
    /// Shards whose Lease names it holder.
    pub shards_held: usize,
    /// The lowest and highest epoch of those shards.
    pub epochs: Option<(i64, i64)>,
    /// Live, holding nothing, and announcing a shard count other than the one shards are held under: it waits for the
    /// prevailing count's replicas to go (a rolling change of `--shards`).
    pub standing_by: bool,
    /// Its load as announced (`pulumi.com/load`); `None` from a replica that announces none.
    pub load: Option<Load>,
}

pub use pko_fleet::load::{Agents, Load};

/// The fleet as its Leases tell it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fleet {
    /// Its replicas, by id.
    pub replicas: Vec<Replica>,
    /// Shards recorded in the fleet's shard tables.
    pub shards: usize,
    /// Shards the table gives no holder, or a holder that is not live.
    pub unheld: usize,
    /// The load of the live replicas, summed.
    pub total: Load,
}

fn seconds_ago(t: &Value, now: k8s_openapi::jiff::Timestamp) -> Option<f64> {
    let t: k8s_openapi::jiff::Timestamp = t.as_str()?.parse().ok()?;
    Some(now.duration_since(t).as_secs_f64())
}

fn kind(l: &Value) -> &str {
    l["metadata"]["labels"][pko_fleet::lease::KIND_LABEL].as_str().unwrap_or_default()
}

/// Every shard of the shard tables among `leases` (`pulumi.com/lease=table`, one per shard count: `<fleet>-shards-<S>`,
/// the fleet named by its `pulumi.com/fleet` label), as `(S, shard)` → its entry; a table whose name is not of that
/// form or whose annotation does not decode adds nothing. Pure.
pub fn table_entries(leases: &[Value]) -> BTreeMap<(u32, u32), pko_fleet::table::Entry> {
    let mut out = BTreeMap::new();
    for l in leases.iter().filter(|l| kind(l) == "table") {
        let (fleet, name) =
            (l["metadata"]["labels"][pko_fleet::lease::FLEET_LABEL].as_str(), l["metadata"]["name"].as_str());
        let Some(LeaseKind::Table(count)) = fleet.zip(name).and_then(|(f, n)| LeaseKind::of(f, n)) else { continue };
        let value = l["metadata"]["annotations"][pko_fleet::table::TABLE_ANNOTATION].as_str().unwrap_or("{}");
        if let Ok(table) = pko_fleet::table::ShardTable::decode(value) {
            out.extend(table.0.into_iter().map(|(k, e)| ((count, k), e)));
        }
    }
    out
}

/// The fleet of `leases` (the JSON of every Lease labelled with the fleet's name) at `now`. Pure.
pub fn fleet(leases: &[Value], now: k8s_openapi::jiff::Timestamp) -> Fleet {
    let mut replicas: BTreeMap<String, Replica> = BTreeMap::new();
    for m in leases.iter().filter(|l| kind(l) == "member") {
        let Some(id) = m["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()) else { continue };
        let ago = seconds_ago(&m["spec"]["renewTime"], now);
        let duration = m["spec"]["leaseDurationSeconds"].as_f64().unwrap_or(15.0);
        let shards_setting = m["metadata"]["annotations"]["pulumi.com/shards"].as_str().unwrap_or_default().to_string();
        let live = ago.is_some_and(|a| a <= duration);
        let load = m["metadata"]["annotations"][pko_fleet::load::LOAD_ANNOTATION].as_str().and_then(Load::parse);
        replicas.insert(
            id.to_string(),
            Replica {
                replica: id.to_string(),
                live,
                renewed_seconds_ago: ago,
                shards_setting,
                shards_held: 0,
                epochs: None,
                standing_by: false,
                load,
            },
        );
    }
    let shards = table_entries(leases);
    let mut unheld = 0;
    for e in shards.values() {
        let epoch = e.epoch;
        match replicas.get_mut(e.holder.as_deref().unwrap_or_default()) {
            Some(r) => {
                r.shards_held += 1;
                r.epochs = Some(r.epochs.map_or((epoch, epoch), |(lo, hi)| (lo.min(epoch), hi.max(epoch))));
                if !r.live {
                    unheld += 1;
                }
            }
            None => unheld += 1,
        }
    }
    // the count shards are held under: that of the replicas holding some
    let prevailing: std::collections::BTreeSet<String> =
        replicas.values().filter(|r| r.shards_held > 0).map(|r| r.shards_setting.clone()).collect();
    let mut total = Load::default();
    for r in replicas.values_mut() {
        r.standing_by =
            r.live && r.shards_held == 0 && !prevailing.is_empty() && !prevailing.contains(&r.shards_setting);
        if let Some(l) = r.load.as_ref().filter(|_| r.live) {
            total.add(l);
        }
    }
    Fleet { replicas: replicas.into_values().collect(), shards: shards.len(), unheld, total }
}

fn pairs(m: &BTreeMap<String, u32>) -> String {
    if m.is_empty() { "none".into() } else { m.iter().map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(", ") }
}

/// `n` bytes in MiB, one decimal. Pure.
fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
}

/// The summary lines under the table: shards, then the live replicas' queue, running operations and pool agents. Pure.
fn summary(f: &Fleet) -> String {
    let t = &f.total;
    let mut out =
        format!("shards: {} held of {} ({} not held by a live replica)\n", f.shards - f.unheld, f.shards, f.unheld);
    out.push_str(&format!("queued by namespace: {}\n", pairs(&t.queued)));
    out.push_str(&format!("running by class: {} ({} in flight)\n", pairs(&t.running), t.in_flight));
    if !t.agents.is_empty() || t.pool_bounds.is_some() {
        let agents: Vec<String> = t
            .agents
            .iter()
            .map(|(k, a)| {
                let disk = if a.disk_bytes > 0 {
                    format!(", disk {} (largest agent {})", mib(a.disk_bytes), mib(a.max_agent_disk_bytes))
                } else {
                    String::new()
                };
                format!("{k}: {} busy, {} idle{disk}", a.busy, a.idle)
            })
            .collect();
        let bounds =
            t.pool_bounds.map(|(lo, hi)| format!(" (per replica and class: min {lo}, max {hi})")).unwrap_or_default();
        out.push_str(&format!(
            "pool agents by class: {}{bounds}\n",
            if agents.is_empty() { "none running".into() } else { agents.join("; ") }
        ));
    }
    out
}

/// The fleet as kubectl prints a table, then a summary line. Pure.
pub fn table(f: &Fleet) -> String {
    let mut rows = vec![
        ["REPLICA", "LIVE", "RENEWED", "SHARDS", "EPOCHS", "--SHARDS", "QUEUED", "IN-FLIGHT", "AGENTS"]
            .map(String::from)
            .to_vec(),
    ];
    for r in &f.replicas {
        let renewed = r.renewed_seconds_ago.map(|a| format!("{a:.0}s ago")).unwrap_or_else(|| "<none>".into());
        let epochs = r
            .epochs
            .map(|(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") })
            .unwrap_or_else(|| "<none>".into());
        let setting = if r.shards_setting.is_empty() { "<none>".into() } else { r.shards_setting.clone() };
        let live = if r.standing_by { "standing-by".to_string() } else { r.live.to_string() };
        let (queued, in_flight, agents) = match &r.load {
            Some(l) => {
                let (busy, idle) = l.agents.values().fold((0, 0), |(b, i), a| (b + a.busy, i + a.idle));
                (
                    l.queued.values().sum::<u32>().to_string(),
                    l.in_flight.to_string(),
                    if l.pool_bounds.is_some() { format!("{busy}/{}", busy + idle) } else { "<none>".into() },
                )
            }
            None => ("<none>".into(), "<none>".into(), "<none>".into()),
        };
        rows.push(vec![
            r.replica.clone(),
            live,
            renewed,
            r.shards_held.to_string(),
            epochs,
            setting,
            queued,
            in_flight,
            agents,
        ]);
    }
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        let cols: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        out.push_str(cols.join("   ").trim_end());
        out.push('\n');
    }
    out.push_str(&summary(f));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn member(id: &str, renewed: &str) -> Value {
        let load = concat!(
            r#"{"queued":{"team-a":3},"inFlight":2,"running":{"c1":2},"#,
            r#""agents":{"c1":{"busy":2,"idle":1,"diskBytes":3145728,"maxAgentDiskBytes":2097152}},"#,
            r#""poolBounds":[0,4]}"#
        );
        json!({"metadata": {"labels": {"pulumi.com/lease": "member"}, "annotations": {"pulumi.com/shards": "64",
            "pulumi.com/load": load}},
               "spec": {"holderIdentity": id, "renewTime": renewed, "leaseDurationSeconds": 15}})
    }

    /// The shard table Lease of 64 shards recording `entries` (shard, holder, epoch; holder "": free).
    fn table_of(entries: &[(u32, &str, i64)]) -> Value {
        let table = pko_fleet::table::ShardTable(
            entries
                .iter()
                .map(|(k, h, e)| {
                    (*k, pko_fleet::table::Entry { holder: (!h.is_empty()).then(|| h.to_string()), epoch: *e })
                })
                .collect(),
        );
        json!({"metadata": {"name": "pko-shards-64", "labels": {"pulumi.com/lease": "table", "pulumi.com/fleet": "pko"},
            "annotations": {pko_fleet::table::TABLE_ANNOTATION: table.encode()}}})
    }

    #[test]
    fn replicas_hold_shards_at_epochs_and_a_dead_ones_count_as_unheld() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-26T10:00:30Z".parse().unwrap();
        let leases = [
            member("a", "2026-11-26T10:00:28Z"),
            member("b", "2026-11-26T09:59:00Z"),
            table_of(&[(0, "a", 3), (1, "a", 7), (2, "b", 2), (3, "", 1)]),
        ];
        let f = fleet(&leases, now);
        assert_eq!((f.shards, f.unheld), (4, 2), "b is not live; shard 3 has no holder");
        let a = &f.replicas[0];
        assert_eq!(
            (a.replica.as_str(), a.live, a.shards_held, a.epochs, a.shards_setting.as_str()),
            ("a", true, 2, Some((3, 7)), "64")
        );
        assert!(!f.replicas[1].live);
        assert_eq!(table_entries(&leases).keys().next(), Some(&(64, 0)), "keyed by the table's count");
        let mut misnamed = leases[2].clone();
        misnamed["metadata"]["name"] = json!("pko-shards-064");
        assert!(table_entries(&[misnamed]).is_empty(), "a table Lease's name is read as the fleet writes it");
        let t = table(&f);
        assert!(
            t.starts_with("REPLICA   LIVE    RENEWED")
                && t.contains("a         true    2s ago    2        3-7")
                && t.contains("shards: 2 held of 4 (2 not held by a live replica)\n"),
            "{t}"
        );
        // the live replica's load only (b is gone)
        assert!(
            t.contains("queued by namespace: team-a=3\n") && t.contains("running by class: c1=2 (2 in flight)\n"),
            "{t}"
        );
        let agents = "pool agents by class: c1: 2 busy, 1 idle, disk 3.0 MiB (largest agent 2.0 MiB) (per replica";
        assert!(t.contains(agents), "{t}");
        assert!(t.lines().nth(1).is_some_and(|l| l.ends_with("3        2           2/3")), "{t}");
    }

    #[test]
    fn a_live_replica_of_another_count_holding_nothing_stands_by() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-26T10:00:30Z".parse().unwrap();
        let mut c = member("c", "2026-11-26T10:00:29Z");
        c["metadata"]["annotations"]["pulumi.com/shards"] = json!("128");
        c["metadata"]["annotations"]["pulumi.com/load"] = json!("not json");
        let f = fleet(&[member("a", "2026-11-26T10:00:28Z"), c, table_of(&[(0, "a", 1)])], now);
        assert!(!f.replicas[0].standing_by && f.replicas[1].standing_by);
        assert_eq!(f.replicas[1].load, None, "a load that does not parse is not shown");
        assert!(table(&f).contains("standing-by"));
    }
}
