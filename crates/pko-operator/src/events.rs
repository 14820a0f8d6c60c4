//! Kubernetes events (`events.k8s.io/v1`) with client-go's series aggregation: the first occurrence of an event creates
//! it, the second turns it into a series at once, and later occurrences of the same event (same object, type, reason
//! and note, same reporter) are counted in memory and written — the series' `count` and `lastObservedTime` — at
//! most once per [`SERIES_WRITE_INTERVAL`] (client-go's `tools/events` refreshes its series every 30 minutes). A busy
//! Stack therefore costs two event writes per kind of event, not one per change. kube's `Recorder` patches every
//! occurrence, so this module replaces it; the Event objects it writes are the same (name `<object>.<hex nanoseconds>`,
//! `reportingController`, `reportingInstance`, `action` = reason).
//!
//! Unlike client-go, the note is part of the series' identity: an event whose message changed (a new error) is a new
//! Event, so the latest message is always readable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// How often at most a series' count is written while it keeps occurring: 5 minutes.
pub const SERIES_WRITE_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// How long a series is remembered after its last occurrence (kube's and client-go's 6 minutes): an occurrence after
/// that starts a new Event.
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// Whether an event reports normal operation or a problem (Kubernetes `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Normal => "Normal",
            Severity::Warning => "Warning",
        }
    }
}

/// What makes two occurrences the same event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The object's uid (its kind, namespace and name when it has none).
    object: String,
    severity: Severity,
    reason: String,
    note: String,
}

/// A series as this recorder knows it.
#[derive(Debug, Clone)]
struct Series {
    /// The Event object's name.
    name: String,
    namespace: String,
    /// Occurrences so far.
    count: i32,
    /// Occurrences the API server has (the last written count).
    written: i32,
    /// When it last occurred.
    last_observed: Timestamp,
    /// When it occurred last, on this process's clock.
    seen: Instant,
    /// When the count was last written.
    written_at: Instant,
}

/// What an occurrence costs: an Event created, a series patched, or nothing (counted in memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A new Event object.
    Create,
    /// The series' count and last-observed time written.
    Patch,
    /// Counted; written later.
    Count,
}

/// The write an occurrence at `now` of a known series (`None`: not known, or forgotten) makes: client-go's rule —
/// create; the second occurrence at once; later ones once [`SERIES_WRITE_INTERVAL`] has passed since the series was
/// last written. Pure.
pub fn write_for(known: Option<(i32, Instant)>, now: Instant) -> Write {
    match known {
        None => Write::Create,
        Some((written, _)) if written < 2 => Write::Patch,
        Some((_, written_at)) if now.saturating_duration_since(written_at) >= SERIES_WRITE_INTERVAL => Write::Patch,
        Some(_) => Write::Count,
    }
}

/// One controller's event recorder (PKO's controller names: `stack-controller`, `update-controller`,
/// `workspace-controller`), kept for the process's life so that its series aggregate.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    controller: String,
    instance: String,
    series: Arc<Mutex<HashMap<Key, Series>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("controller", &self.controller).field("instance", &self.instance).finish()
    }
}

impl Recorder {
    /// A recorder reporting as `controller`, instance `instance` (the pod's name; the controller's when `None`, as kube
    /// does).
    pub fn new(client: kube::Client, controller: &str, instance: Option<String>) -> Self {
        Self {
            client,
            controller: controller.into(),
            instance: instance.unwrap_or_else(|| controller.into()),
            series: Arc::default(),
        }
    }

    /// Records an occurrence of an event about `object` (its reference): creates, patches or only counts it
    /// ([`write_for`]); series whose counts are due are written on the way (best effort: one that fails is written with
    /// its next due count).
    ///
    /// Errors: the API refused this occurrence's write (an Event not created is forgotten, so the next occurrence
    /// creates it again).
    pub async fn publish(
        &self,
        object: &ObjectReference,
        severity: Severity,
        reason: &str,
        note: String,
    ) -> Result<(), kube::Error> {
        let now = Instant::now();
        let key = Key { object: object_key(object), severity, reason: reason.into(), note };
        let (write, this, due) = self.occur(&key, object, now);
        for s in due {
            if let Err(e) = self.patch(&s).await {
                tracing::debug!(error = %e, event = %s.name, "event series not brought up to date");
            }
        }
        match write {
            Write::Create => {
                let created = self.create(object, &key, &this).await;
                if created.is_err() {
                    self.lock().remove(&key);
                }
                created
            }
            Write::Patch => self.patch(&this).await,
            Write::Count => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Series>> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts the occurrence of `key`; returns its write, its series as counted, and the other series whose unwritten
    /// counts are due (marked written), forgetting those not seen for [`SERIES_TTL`].
    fn occur(&self, key: &Key, object: &ObjectReference, now: Instant) -> (Write, Series, Vec<Series>) {
        let mut series = self.lock();
        series.retain(|_, s| now.saturating_duration_since(s.seen) < SERIES_TTL);
        let write = write_for(series.get(key).map(|s| (s.written, s.written_at)), now);
        let stamp = Timestamp::now();
        let this = match series.get_mut(key) {
            Some(s) => {
                s.count += 1;
                s.last_observed = stamp;
                s.seen = now;
                if write == Write::Patch {
                    s.written = s.count;
                    s.written_at = now;
                }
                s.clone()
            }
            None => {
                let name =
                    format!("{}.{:x}", object.name.as_deref().unwrap_or(&self.controller), stamp.as_nanosecond());
                let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
                let s =
                    Series { name, namespace, count: 1, written: 1, last_observed: stamp, seen: now, written_at: now };
                series.insert(key.clone(), s.clone());
                s
            }
        };
        let mut due = Vec::new();
        for (k, s) in series.iter_mut() {
            if k != key && s.count > s.written && now.saturating_duration_since(s.written_at) >= SERIES_WRITE_INTERVAL {
                s.written = s.count;
                s.written_at = now;
                due.push(s.clone());
            }
        }
        (write, this, due)
    }

    async fn create(&self, object: &ObjectReference, key: &Key, s: &Series) -> Result<(), kube::Error> {
        let event = Event {
            action: Some(key.reason.clone()),
            reason: Some(key.reason.clone()),
            event_time: Some(MicroTime(s.last_observed)),
            regarding: Some(object.clone()),
            note: Some(key.note.clone()),
            metadata: ObjectMeta {
                namespace: Some(s.namespace.clone()),
                name: Some(s.name.clone()),
                ..Default::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(key.severity.as_str().into()),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &s.namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }

    async fn patch(&self, s: &Series) -> Result<(), kube::Error> {
        let series = EventSeries { count: s.written, last_observed_time: MicroTime(s.last_observed) };
        let patch = serde_json::json!({ "series": series });
        Api::<Event>::namespaced(self.client.clone(), &s.namespace)
            .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

/// The object an event is about, as a key: its uid, else its kind, namespace and name. Pure.
fn object_key(o: &ObjectReference) -> String {
    match &o.uid {
        Some(uid) => uid.clone(),
        None => format!(
            "{}/{}/{}",
            o.kind.as_deref().unwrap_or_default(),
            o.namespace.as_deref().unwrap_or_default(),
            o.name.as_deref().unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_written_at_its_first_and_second_occurrence_then_at_most_once_per_interval() {
        let t0 = Instant::now();
        assert_eq!(write_for(None, t0), Write::Create);
        assert_eq!(write_for(Some((1, t0)), t0), Write::Patch, "the second occurrence makes it a series at once");
        assert_eq!(
            write_for(Some((2, t0)), t0 + Duration::from_secs(10)),
            Write::Count,
            "the third within the interval is counted"
        );
        assert_eq!(
            write_for(Some((2, t0)), t0 + SERIES_WRITE_INTERVAL),
            Write::Patch,
            "once the interval passed, written again"
        );
    }

    #[tokio::test]
    async fn occurrences_are_counted_and_due_series_flushed_on_the_way() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let recorder = Recorder::new(kube::Client::try_from(config).expect("a client"), "stack-controller", None);
        let stack = ObjectReference {
            kind: Some("Stack".into()),
            namespace: Some("a".into()),
            name: Some("s".into()),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        let key = |note: &str| Key {
            object: "u-1".into(),
            severity: Severity::Normal,
            reason: "StackCreated".into(),
            note: note.into(),
        };
        let t0 = Instant::now();
        assert_eq!(recorder.occur(&key("ok"), &stack, t0).0, Write::Create);
        assert_eq!(recorder.occur(&key("ok"), &stack, t0).0, Write::Patch);
        assert_eq!(recorder.occur(&key("ok"), &stack, t0 + Duration::from_secs(1)).0, Write::Count);
        assert_eq!(
            recorder.occur(&key("other note"), &stack, t0 + Duration::from_secs(2)).0,
            Write::Create,
            "a new note is a new Event"
        );
        let (write, _, due) =
            recorder.occur(&key("other note"), &stack, t0 + SERIES_WRITE_INTERVAL + Duration::from_secs(1));
        assert_eq!(write, Write::Patch);
        assert_eq!(
            due.iter().map(|s| s.written).collect::<Vec<_>>(),
            [3],
            "the first series' third occurrence is written on the way"
        );
        let (write, _, _) =
            recorder.occur(&key("ok"), &stack, t0 + SERIES_WRITE_INTERVAL + SERIES_TTL + Duration::from_secs(2));
        assert_eq!(write, Write::Create, "forgotten after the TTL: a new Event");
    }

    #[tokio::test]
    async fn an_event_not_created_is_created_again_by_its_next_occurrence() {
        // nothing listens on port 9: the create fails
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let recorder = Recorder::new(kube::Client::try_from(config).expect("a client"), "stack-controller", None);
        let stack = ObjectReference {
            kind: Some("Stack".into()),
            namespace: Some("a".into()),
            name: Some("s".into()),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        assert!(recorder.publish(&stack, Severity::Warning, "StackUpdateFailure", "boom".into()).await.is_err());
        let key = Key {
            object: "u-1".into(),
            severity: Severity::Warning,
            reason: "StackUpdateFailure".into(),
            note: "boom".into(),
        };
        assert_eq!(
            recorder.occur(&key, &stack, Instant::now()).0,
            Write::Create,
            "not a patch of an Event that does not exist"
        );
    }

    #[test]
    fn an_object_is_keyed_by_uid_else_by_kind_namespace_and_name() {
        let r = ObjectReference {
            kind: Some("Stack".into()),
            namespace: Some("a".into()),
            name: Some("s".into()),
            ..Default::default()
        };
        assert_eq!(object_key(&r), "Stack/a/s");
        assert_eq!(object_key(&ObjectReference { uid: Some("u-1".into()), ..r }), "u-1");
    }
}
