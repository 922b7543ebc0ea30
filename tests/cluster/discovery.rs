//! The discovery trigger on private control planes: StorageStates through real storage
//! switches of a CRD, failed migrations retried, stale heartbeats, StorageStates written by
//! kube-storage-version-migrator, the late-success race, flapping hashes and a missing
//! aggregated API.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kube_svm::api::{
    GroupResource, PERSISTED_SINCE_ANNOTATION, Phase, StorageState, StorageStateSpec,
    StorageVersionMigration, StorageVersionMigrationSpec,
};
use kube_svm::apiserver::requests::Requests;
use kube_svm::rules::storage_hash::storage_version_hash;
use kube_svm::trigger::discovery::{Error, HELD_ANNOTATION, TARGET_HASH_ANNOTATION, write_state};
use kube_svm::trigger::storage_state::next_status;
use serde_json::json;

use crate::support::Scenario;
use crate::support::fixtures::{WidgetCrd, missing_aggregated_api, unique};
use crate::support::invariant::Census;
use crate::support::process::KubeSvm;
use crate::support::upstream::{install_upstream_crds, take_over_as_the_readme_says};
use crate::support::{AuditEvent, CONTROLLER_NAMESPACE, ControlPlane};
use crate::support::{admission, migrations};

async fn start(control_plane: &ControlPlane, name: &str, settle: &str) -> KubeSvm {
    let settle = format!("--storage-version-settle={settle}");
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=false",
        "--discovery-trigger",
        "--discovery-interval=600",
        &settle,
    ];
    KubeSvm::start(control_plane, name, &args).await
}

/// The discovery trigger's migrations of `widgets`: (hash it targeted, phase), oldest first.
async fn triggered(client: &Client, widgets: &WidgetCrd) -> Vec<(String, Phase)> {
    let found = migrations::triggered(client, widgets, "discovery").await;
    found
        .iter()
        .map(|m| {
            let hash = m.metadata.annotations.as_ref().and_then(|a| a.get(TARGET_HASH_ANNOTATION));
            (hash.cloned().unwrap_or_default(), Phase::of(m))
        })
        .collect()
}

/// Waits until the StorageState of `widgets` says its objects are stored under `hashes`.
async fn wait_persisted(
    client: &Client,
    widgets: &WidgetCrd,
    hashes: &[&str],
    controller: &KubeSvm,
) {
    let api: Api<StorageState> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let state = api.get_opt(&widgets.name()).await.expect("read");
        let persisted = state
            .and_then(|s| s.status)
            .map(|s| s.persisted_storage_version_hashes)
            .unwrap_or_default();
        if persisted == hashes {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "persisted {persisted:?}, expected {hashes:?}\n{}",
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the trigger's migrations of `widgets` satisfy `done`.
async fn wait_triggered(
    client: &Client,
    widgets: &WidgetCrd,
    controller: &KubeSvm,
    done: impl Fn(&[(String, Phase)]) -> bool,
) -> Vec<(String, Phase)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let found = triggered(client, widgets).await;
        if done(&found) {
            return found;
        }
        assert!(Instant::now() < deadline, "{found:?}\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn hash(widgets: &WidgetCrd, version: &str) -> String {
    storage_version_hash(&widgets.group, version, WidgetCrd::KIND)
}

/// A new resource starts Unknown and is migrated; a storage switch appends the new hash and is
/// migrated; a migration that fails is retried on the next poll until it succeeds; a trigger
/// that was down long enough starts over from Unknown. An aggregated API whose backend is
/// missing is named in the log and holds nothing up.
#[tokio::test]
async fn storage_states_follow_storage_switches() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("discovery", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 30).await;
    let missing = format!("{}.svm.example.com", unique("missing"));
    missing_aggregated_api(&client, &missing).await;
    let controller = start(&control_plane, "controller", "2").await;

    let (h1, h2, h3) = (hash(&widgets, "v1"), hash(&widgets, "v2"), hash(&widgets, "v3"));
    wait_persisted(&client, &widgets, &[&h1], &controller).await;
    assert_eq!(triggered(&client, &widgets).await, [(h1.clone(), Phase::Succeeded)]);
    let configmaps = Api::<StorageState>::all(client.clone()).get("configmaps").await;
    assert!(configmaps.is_ok_and(|s| s.spec.resource.resource == "configmaps"));
    let logs = controller.logs();
    assert!(logs.contains("were not examined") && logs.contains(&missing), "{logs}");

    widgets.set_storage_version(&client, "v2").await;
    wait_persisted(&client, &widgets, &[&h2], &controller).await;
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 30).await;
    let found = triggered(&client, &widgets).await;
    assert_eq!(found.last(), Some(&(h2.clone(), Phase::Succeeded)), "{found:?}");

    // Every update of a widget is refused: the migration fails, and is retried.
    let policy = unique("refuse-widgets");
    let expression = "false";
    admission::deny_updates(
        &client,
        &policy,
        &widgets.group,
        &["widgets"],
        expression,
        "frozen",
        None,
    )
    .await;
    widgets.set_storage_version(&client, "v3").await;
    wait_triggered(&client, &widgets, &controller, |found| {
        found.iter().filter(|(h, p)| *h == h3 && *p == Phase::Failed).count() >= 2
    })
    .await;
    admission::lift(&client, &policy).await;
    wait_persisted(&client, &widgets, &[&h3], &controller).await;
    widgets.assert_all_stored_as(&control_plane.etcd(), "v3", 30).await;

    // The trigger was down for longer than two polls: anything may have been written meanwhile.
    drop(controller);
    let long_ago = Timestamp::now() - SignedDuration::from_hours(2);
    let status = json!({ "status": { "lastHeartbeatTime": Time(long_ago) } });
    Api::<StorageState>::all(client.clone())
        .patch_status(&widgets.name(), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("heartbeat aged");
    let before = triggered(&client, &widgets).await.len();
    let controller = start(&control_plane, "restarted", "2").await;
    let found = wait_triggered(&client, &widgets, &controller, |found| {
        found.len() > before && found.last().is_some_and(|(_, p)| *p == Phase::Succeeded)
    })
    .await;
    assert_eq!(found.last(), Some(&(h3.clone(), Phase::Succeeded)));
    wait_persisted(&client, &widgets, &[&h3], &controller).await;
}

/// A StorageState as kube-storage-version-migrator writes it is continued; a migration that
/// succeeded for the previous hash proves nothing about the current one; and a storage version
/// switched and switched back before it could be trusted never becomes the target of a
/// migration (a poll that saw it lists it, and one more migration of the current hash follows).
#[tokio::test]
async fn upstream_states_are_continued_and_late_successes_prove_nothing() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::stale(&client, "upstream-state", 20).await;
    let (h1, h2) = (hash(&widgets, "v1"), hash(&widgets, "v2"));

    let states: Api<StorageState> = Api::all(client.clone());
    let spec = StorageStateSpec {
        resource: GroupResource { group: widgets.group.clone(), resource: "widgets".into() },
    };
    states
        .create(&PostParams::default(), &StorageState::new(&widgets.name(), spec))
        .await
        .expect("created");
    let status = json!({ "status": {
        "persistedStorageVersionHashes": [h1, h2],
        "currentStorageVersionHash": h2,
        "lastHeartbeatTime": Time(Timestamp::now()),
    }});
    states
        .patch_status(&widgets.name(), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status written");
    // The late success of a migration that targeted the previous hash.
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let late = StorageVersionMigration::new(
        "late",
        StorageVersionMigrationSpec {
            resource: kube_svm::api::GroupVersionResource {
                group: widgets.group.clone(),
                version: "v1".into(),
                resource: "widgets".into(),
            },
            continue_token: None,
        },
    );
    migrations.create(&PostParams::default(), &late).await.expect("created");
    let status = json!({ "status": {
        "conditions": [{ "type": "Succeeded", "status": "True", "reason": "Completed",
                         "lastUpdateTime": Time(Timestamp::now()) }],
        "listedFromStart": true,
        "startTime": Time(Timestamp::now()),
        "completionTime": Time(Timestamp::now()),
        "target": { "storageVersionHash": h1 },
    }});
    migrations
        .patch_status("late", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status written");

    let controller = start(&control_plane, "controller", "2").await;
    wait_persisted(&client, &widgets, &[&h2], &controller).await;
    assert_eq!(triggered(&client, &widgets).await, [(h2.clone(), Phase::Succeeded)]);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 20).await;
    drop(controller);

    // v1 for a moment, then v2 again: shorter than the settle period, so v1 is never trusted.
    let controller = start(&control_plane, "flapping", "6").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    widgets.set_storage_version(&client, "v1").await;
    widgets.set_storage_version(&client, "v2").await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    wait_persisted(&client, &widgets, &[&h2], &controller).await;
    let found = triggered(&client, &widgets).await;
    assert!(
        found.iter().all(|m| *m == (h2.clone(), Phase::Succeeded)),
        "{found:?}\n{}",
        controller.logs()
    );
    assert_eq!(
        Census::of(&control_plane.etcd(), &widgets).await.count(&widgets.api_version("v2")),
        20
    );
}

/// The migration the trigger creates right after it stamps a StorageState (persisted-since,
/// to the nanosecond) proves its objects are stored in the new hash although its startTime is
/// stored to the second: one migration per storage switch, not a second full one.
#[tokio::test]
async fn one_migration_per_storage_switch() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("one-per-switch", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 10).await;
    // No settle time: a migration starts within the second the trigger stamped the state.
    let controller = start(&control_plane, "controller", "0").await;
    let (h1, h2, h3) = (hash(&widgets, "v1"), hash(&widgets, "v2"), hash(&widgets, "v3"));
    wait_persisted(&client, &widgets, &[&h1], &controller).await;
    widgets.set_storage_version(&client, "v2").await;
    wait_persisted(&client, &widgets, &[&h2], &controller).await;
    widgets.set_storage_version(&client, "v3").await;
    wait_persisted(&client, &widgets, &[&h3], &controller).await;
    assert_eq!(
        triggered(&client, &widgets).await,
        [(h1, Phase::Succeeded), (h2, Phase::Succeeded), (h3, Phase::Succeeded)],
        "{}",
        controller.logs()
    );
    widgets.assert_all_stored_as(&control_plane.etcd(), "v3", 10).await;
}

/// A StorageState write decided on an older read (a deposed leader's, delayed until the new
/// leader has written) is refused by the apiserver and changes nothing.
#[tokio::test]
async fn a_storage_state_write_from_an_older_read_changes_nothing() {
    let Scenario { client, control_plane } = Scenario::shared().await;
    let resource = GroupResource {
        group: format!("{}.svm.example.com", unique("stale-write")),
        resource: "widgets".into(),
    };
    let states: Api<StorageState> = Api::all(client.clone());
    let config = control_plane.config().await;
    let requests = &Requests::new(config, Duration::from_secs(30)).expect("a client");
    let stale_after = Duration::from_secs(1200);
    let now = Timestamp::now;

    let first = next_status(None, "A", "A", false, now(), stale_after);
    write_state(requests, &states, &resource, None, &first, Some(now())).await.expect("created");
    // What the old leader read; then the new leader reads and writes a switch to B.
    let read = states.get(&resource.name()).await.expect("read");
    let newer = next_status(read.status.as_ref(), "B", "B", false, now(), stale_after);
    write_state(requests, &states, &resource, Some(&read), &newer, Some(now()))
        .await
        .expect("written");
    let written = states.get(&resource.name()).await.expect("read");

    // The old leader's delayed writes, from its older read: a proof of A would collapse the
    // hashes to ["A"] although objects may now be stored in B.
    let late = next_status(read.status.as_ref(), "A", "A", true, now(), stale_after);
    for stamp in [None, Some(now())] {
        let result = write_state(requests, &states, &resource, Some(&read), &late, stamp).await;
        assert!(matches!(result, Err(Error::Changed(_))), "{result:?}");
    }
    // A state created meanwhile by someone else is not written over either.
    let result = write_state(requests, &states, &resource, None, &late, Some(now())).await;
    assert!(matches!(result, Err(Error::Changed(_))), "{result:?}");

    let after = states.get(&resource.name()).await.expect("read");
    assert_eq!(after.metadata.resource_version, written.metadata.resource_version);
    let persisted = after.status.map(|s| s.persisted_storage_version_hashes).unwrap_or_default();
    assert_eq!(persisted, ["Unknown", "A", "B"]);
}

/// A migration that succeeds without proving anything (here the StorageState was stamped by a
/// replica whose clock ran an hour ahead, so every migration seems to start before the hashes
/// changed) is not followed by the same migration again and again: the next one waits twice as
/// long as the one before, as after failures, the log says why once per migration, and after
/// three in a row the trigger creates none and says why on the StorageState.
#[tokio::test]
async fn successes_that_prove_nothing_back_off() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("unproven", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 5).await;
    let h1 = hash(&widgets, "v1");
    let states: Api<StorageState> = Api::all(client.clone());
    let ahead = Timestamp::now() + SignedDuration::from_hours(1);
    let mut state = StorageState::new(
        &widgets.name(),
        StorageStateSpec {
            resource: GroupResource { group: widgets.group.clone(), resource: "widgets".into() },
        },
    );
    state.metadata.annotations =
        Some([(PERSISTED_SINCE_ANNOTATION.to_owned(), ahead.to_string())].into());
    states.create(&PostParams::default(), &state).await.expect("created");
    let status = json!({ "status": {
        "persistedStorageVersionHashes": ["Unknown", h1],
        "currentStorageVersionHash": h1,
        "lastHeartbeatTime": Time(Timestamp::now()),
    }});
    states
        .patch_status(&widgets.name(), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status written");

    let controller = start(&control_plane, "controller", "0").await;
    // Retries wait 2, then 4 s (the follow-up poll, doubling): the third comes at least 4 s
    // after the second ended. Without the backoff it came at the next poll, 2 s later. The first
    // waits its turn behind every built-in resource's first migration. Then none comes.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let state = states.get(&widgets.name()).await.expect("the StorageState");
        if state.annotations().contains_key(HELD_ANNOTATION) {
            break;
        }
        let found = migrations::triggered(&client, &widgets, "discovery").await.len();
        assert!(Instant::now() < deadline, "{found} migrations\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The poll that held it back is the one that would have created the fourth.
    let found = migrations::triggered(&client, &widgets, "discovery").await;
    assert_eq!(found.len(), 3, "{}", controller.logs());
    let ended = |m: &StorageVersionMigration| {
        m.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0)
    };
    let created = |m: &StorageVersionMigration| m.metadata.creation_timestamp.as_ref().map(|t| t.0);
    for m in &found {
        assert_eq!(Phase::of(m), Phase::Succeeded, "{}", controller.logs());
    }
    let second_ended = ended(&found[1]).expect("the second ended");
    let third_created = created(&found[2]).expect("created");
    let gap = third_created.duration_since(second_ended).as_secs();
    assert!(gap >= 3, "the third came {gap} s after the second ended\n{}", controller.logs());
    // Said, with why, once for each success that held the next one back.
    let logs = controller.logs();
    let said: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("does not prove the objects are stored"))
        .filter_map(|line| line.split("migration=").nth(1)?.split_whitespace().next())
        .collect();
    let once: std::collections::BTreeSet<&&str> = said.iter().collect();
    assert!(said.len() >= 2 && once.len() == said.len(), "said {said:?}: {logs}");
    assert!(
        logs.contains("began before the StorageState's persisted hashes last changed"),
        "{logs}"
    );
}

/// kube-storage-version-migrator's CRDs drop the status fields that prove a migration: with
/// them and the discovery trigger, kube-svm once created migration after migration of every
/// resource (1,595 in 170 s). It now refuses to run on them, creating nothing; once they are
/// taken over in place, each resource is migrated once and the count stays put.
#[tokio::test]
async fn upstream_crds_never_make_the_trigger_loop() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let client = control_plane.client().await;
    install_upstream_crds(&control_plane).await;
    let widgets = WidgetCrd::stale(&client, "no-loop", 20).await;
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=false",
        "--discovery-trigger",
        "--discovery-interval=5",
        "--storage-version-settle=0",
    ];
    let controller = KubeSvm::start(&control_plane, "controller", &args).await;
    controller.wait_for_log("schema would drop", Duration::from_secs(60)).await;
    let all: Api<StorageVersionMigration> = Api::all(client.clone());
    let created = all.list(&Default::default()).await.expect("listed").items;
    assert!(created.is_empty(), "created while refusing: {}", created.len());

    take_over_as_the_readme_says(&control_plane);
    let h2 = hash(&widgets, "v2");
    wait_persisted(&client, &widgets, &[&h2], &controller).await;
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 20).await;
    // Two more polls (each writes the heartbeat: the interval is 5 s, heartbeats are written
    // when 2.5 s old), then no resource has a second success.
    migrations::wait_for_polls(&client, &widgets.name(), 2, &controller).await;
    let states: Api<StorageState> = Api::all(client.clone());
    let mut succeeded = std::collections::BTreeMap::<String, Vec<_>>::new();
    for m in all.list(&Default::default()).await.expect("listed").items {
        if Phase::of(&m) == Phase::Succeeded {
            let resource = &m.spec.resource;
            let key = format!("{}.{}", resource.resource, resource.group);
            succeeded.entry(key).or_default().push((m.metadata.annotations, m.status));
        }
    }
    let twice: Vec<_> = succeeded.iter().filter(|(_, all)| all.len() > 1).collect();
    let states = states.list(&Default::default()).await.expect("listed").items;
    let state_of = |name: &str| states.iter().find(|s| s.metadata.name.as_deref() == Some(name));
    assert!(
        twice.is_empty(),
        "migrated again: {twice:#?}\n{:#?}\n{}",
        twice.first().and_then(|(name, _)| state_of(name.trim_end_matches('.'))),
        controller.logs()
    );
    assert_eq!(succeeded.get(&format!("widgets.{}", widgets.group)).map(Vec::len), Some(1));
}

/// A resource whose migrations cannot succeed (an admission policy refuses one of its objects)
/// gets a new one from the discovery trigger after each failure, at most every
/// `--discovery-interval`, for as long as it fails: the trigger keeps only its newest finished
/// ones of each resource and deletes the older, so their number stays bounded while the
/// failures go on.
#[tokio::test]
async fn a_resource_that_keeps_failing_leaves_a_bounded_number_of_migrations() {
    const KEPT: usize = 3;
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("keeps-failing", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 5).await;
    let frozen = json!({ "metadata": { "labels": { "frozen": "true" } } });
    let api = widgets.api(&client, "v1", None);
    api.patch("w-3", &PatchParams::default(), &Patch::Merge(&frozen)).await.expect("labelled");
    crate::engine::reject_updates_of_frozen(&client, &widgets.group).await;
    widgets.set_storage_version(&client, "v2").await;
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=false",
        "--discovery-trigger",
        "--discovery-interval=1",
        "--storage-version-settle=0",
        "--discovery-keep-finished=3",
    ];
    let controller = KubeSvm::start(&control_plane, "keeps-failing", &args).await;

    // Failures go on past what is kept (every name ever seen is remembered); the number kept
    // stays bounded all along.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut ever = std::collections::BTreeSet::new();
    loop {
        let found: Vec<(String, Phase)> = migrations::triggered(&client, &widgets, "discovery")
            .await
            .iter()
            .map(|m| (m.metadata.name.clone().unwrap_or_default(), Phase::of(m)))
            .collect();
        let failed = found.iter().filter(|(_, phase)| *phase == Phase::Failed).count();
        ever.extend(found.iter().map(|(name, _)| name.clone()));
        assert!(found.len() <= KEPT + 1, "{} migrations kept: {found:?}", found.len());
        if failed >= KEPT && ever.len() > found.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{failed} failed of {} so far\n{}",
            ever.len(),
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(controller.logs().contains("oldest finished migrations"), "{}", controller.logs());
}

/// While a new hash waits to be trusted, the polls between the full ones read only the
/// discovery of the group version serving it. After a storage switch the controller's log shows
/// fast polls reading the widgets' group version alone, and the audit log shows the trigger
/// reading a group with nothing to migrate (authorization.k8s.io/v1) only in full polls: each
/// such read is followed by the poll's list of StorageStates before the next one, which a fast
/// poll between them would break.
#[tokio::test]
async fn a_fast_poll_reads_only_the_group_version_of_the_pending_hash() {
    let Scenario { control_plane, client } = Scenario::audited(&[]).await;
    let widgets = WidgetCrd::new("fast-poll", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 5).await;
    // A settle long enough that the polls the CRD's changes bring (at once, then ever further
    // apart) cannot prove the new hash alone: the polls between them must come.
    let controller = start(&control_plane, "controller", "20").await;
    let (h1, h2) = (hash(&widgets, "v1"), hash(&widgets, "v2"));
    wait_persisted(&client, &widgets, &[&h1], &controller).await;

    let switched = Timestamp::now();
    let logged_before = controller.logs().len();
    widgets.set_storage_version(&client, "v2").await;
    wait_persisted(&client, &widgets, &[&h2], &controller).await;

    let logs = controller.logs();
    let fast: Vec<&str> =
        logs[logged_before..].lines().filter(|l| l.contains("fast discovery poll")).collect();
    assert!(!fast.is_empty(), "no fast poll after the switch\n{logs}");
    for line in &fast {
        assert!(line.contains(&widgets.group) && line.contains("waiting=1"), "{line}");
        assert_eq!(line.matches("\"v").count(), 1, "one group version read: {line}");
    }
    let account = format!("system:serviceaccount:{CONTROLLER_NAMESPACE}:kube-svm");
    let mut events: Vec<AuditEvent> = control_plane
        .audit_events()
        .into_iter()
        .filter(|e| e.sender() == account && e.received() > switched)
        .collect();
    events.sort_by_key(AuditEvent::received);
    let path = |e: &AuditEvent| e.request_uri.split('?').next().unwrap_or_default().to_owned();
    let lists_states = |e: &AuditEvent| {
        e.verb == "list" && e.object_ref.as_ref().is_some_and(|o| o.resource == "storagestates")
    };
    // In time order: `u` for a read of the unrelated group, `l` for a list of StorageStates.
    let order: String = events
        .iter()
        .filter_map(|e| match path(e).as_str() {
            "/apis/authorization.k8s.io/v1" => Some('u'),
            _ if lists_states(e) => Some('l'),
            _ => None,
        })
        .collect();
    let full_polls = order.matches('u').count();
    assert!(full_polls >= 1, "no full poll after the switch");
    assert!(!order.contains("uu"), "another group was read in a fast poll: {order}");
    let widgets_path = format!("/apis/{}/", widgets.group);
    let pending = events.iter().filter(|e| path(e).starts_with(&widgets_path)).count();
    assert!(pending >= full_polls + fast.len(), "{pending} reads of the widgets' group: {order}");
}
