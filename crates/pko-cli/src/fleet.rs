//! `kubectl pko fleet`: the replicas of a fleet and the shards they hold, from the fleet's Leases
//! (`coordination.k8s.io/v1` in the operator's namespace; `pko_fleet::lease`): a membership Lease per
//! replica (renewed while it lives; annotation `pulumi.com/shards`) and a shard Lease per shard (its
//! holder, and its `leaseTransitions` as the shard's epoch). Read with the caller's own rights
//! (`list` Leases in that namespace): no new privileged path.

use std::collections::BTreeMap;

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
}

/// The fleet as its Leases tell it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fleet {
    /// Its replicas, by id.
    pub replicas: Vec<Replica>,
    /// Shard Leases found.
    pub shards: usize,
    /// Shards whose Lease names no holder, or a holder that is not live.
    pub unheld: usize,
}

fn seconds_ago(t: &Value, now: k8s_openapi::jiff::Timestamp) -> Option<f64> {
    let t: k8s_openapi::jiff::Timestamp = t.as_str()?.parse().ok()?;
    Some(now.duration_since(t).as_secs_f64())
}

/// The fleet of `leases` (the JSON of every Lease labelled with the fleet's name) at `now`. Pure.
pub fn fleet(leases: &[Value], now: k8s_openapi::jiff::Timestamp) -> Fleet {
    let kind = |l: &Value| l["metadata"]["labels"]["pulumi.com/lease"].as_str().unwrap_or_default().to_string();
    let mut replicas: BTreeMap<String, Replica> = BTreeMap::new();
    for m in leases.iter().filter(|l| kind(l) == "member") {
        let Some(id) = m["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()) else { continue };
        let ago = seconds_ago(&m["spec"]["renewTime"], now);
        let duration = m["spec"]["leaseDurationSeconds"].as_f64().unwrap_or(15.0);
        let shards_setting = m["metadata"]["annotations"]["pulumi.com/shards"].as_str().unwrap_or_default().to_string();
        let live = ago.is_some_and(|a| a <= duration);
        replicas.insert(id.to_string(), Replica { replica: id.to_string(), live, renewed_seconds_ago: ago, shards_setting, shards_held: 0, epochs: None });
    }
    let shards: Vec<&Value> = leases.iter().filter(|l| kind(l) == "shard").collect();
    let mut unheld = 0;
    for s in &shards {
        let holder = s["spec"]["holderIdentity"].as_str().unwrap_or_default();
        let epoch = s["spec"]["leaseTransitions"].as_i64().unwrap_or(0);
        match replicas.get_mut(holder) {
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
    Fleet { replicas: replicas.into_values().collect(), shards: shards.len(), unheld }
}

/// The fleet as kubectl prints a table, then a summary line. Pure.
pub fn table(f: &Fleet) -> String {
    let mut rows = vec![["REPLICA", "LIVE", "RENEWED", "SHARDS", "EPOCHS", "--SHARDS"].map(String::from).to_vec()];
    for r in &f.replicas {
        let renewed = r.renewed_seconds_ago.map(|a| format!("{a:.0}s ago")).unwrap_or_else(|| "<none>".into());
        let epochs = r.epochs.map(|(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }).unwrap_or_else(|| "<none>".into());
        let setting = if r.shards_setting.is_empty() { "<none>".into() } else { r.shards_setting.clone() };
        rows.push(vec![r.replica.clone(), r.live.to_string(), renewed, r.shards_held.to_string(), epochs, setting]);
    }
    let widths: Vec<usize> = (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        let cols: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        out.push_str(cols.join("   ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!("shards: {} held of {} ({} not held by a live replica)\n", f.shards - f.unheld, f.shards, f.unheld));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn member(id: &str, renewed: &str) -> Value {
        json!({"metadata": {"labels": {"pulumi.com/lease": "member"}, "annotations": {"pulumi.com/shards": "64"}},
               "spec": {"holderIdentity": id, "renewTime": renewed, "leaseDurationSeconds": 15}})
    }

    fn shard(k: u32, holder: &str, epoch: i64) -> Value {
        json!({"metadata": {"labels": {"pulumi.com/lease": "shard", "pulumi.com/shard": k.to_string()}}, "spec": {"holderIdentity": holder, "leaseTransitions": epoch}})
    }

    #[test]
    fn replicas_hold_shards_at_epochs_and_a_dead_ones_count_as_unheld() {
        let now: k8s_openapi::jiff::Timestamp = "2026-11-26T10:00:30Z".parse().unwrap();
        let leases = [member("a", "2026-11-26T10:00:28Z"), member("b", "2026-11-26T09:59:00Z"), shard(0, "a", 3), shard(1, "a", 7), shard(2, "b", 2), shard(3, "", 1)];
        let f = fleet(&leases, now);
        assert_eq!((f.shards, f.unheld), (4, 2), "b is not live; shard 3 has no holder");
        let a = &f.replicas[0];
        assert_eq!((a.replica.as_str(), a.live, a.shards_held, a.epochs, a.shards_setting.as_str()), ("a", true, 2, Some((3, 7)), "64"));
        assert!(!f.replicas[1].live);
        let t = table(&f);
        assert!(
            t.starts_with("REPLICA   LIVE    RENEWED")
                && t.contains("a         true    2s ago    2        3-7")
                && t.ends_with("shards: 2 held of 4 (2 not held by a live replica)\n"),
            "{t}"
        );
    }
}
