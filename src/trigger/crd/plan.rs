//! What the CRD trigger does about one CRD, decided from what it read of it ([`Observed`])
//! without a request: a [`Plan`] of steps, carried out in order by the trigger's apply, and
//! when to look at the CRD again. Pure: each case is a row of one table test.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::{
    CRD_UID_ANNOTATION, Needed, Retry, Settings, TRIGGER_LABEL, history, recreated_name, retry_of,
    rounds,
};
use crate::api::{
    BACKLOG_ANNOTATION, CLEAN_MANAGED_FIELDS_ANNOTATION, StorageVersionMigration,
    StorageVersionMigrationSpec, Trigger,
};

/// What the trigger read of a CRD before it decides.
pub struct Observed<'a> {
    /// The CRD, as the watch shows it.
    pub crd: &'a CustomResourceDefinition,
    /// The migration it needs now ([`super::needed_migration`]), if any.
    pub needed: Option<Needed>,
    /// Whether it is at the generation this process first saw it at: its migration is the
    /// catch-up ([`BACKLOG_ANNOTATION`]).
    pub caught_up: bool,
    /// How long before its unserved versions may be cleaned: `None` when they may be now, or
    /// when it serves every version.
    pub clean_wait: Option<Duration>,
    /// The migrations of every resource, as listed. Listed only when the CRD needs a migration
    /// and the trigger creates them; empty otherwise.
    pub migrations: &'a [StorageVersionMigration],
}

/// What the trigger does about a CRD: its steps in order, then when it looks again.
#[derive(Debug)]
pub struct Plan<'a> {
    /// The steps, in order; the first that fails ends the plan.
    pub steps: Vec<Step<'a>>,
    /// When to look at the CRD again once every step went through: `None` at its next change,
    /// or at the next change of a migration of its resource.
    pub look_again: Option<Duration>,
}

/// One step of a [`Plan`].
#[derive(Debug)]
pub enum Step<'a> {
    /// Delete the trigger's finished migrations beyond the newest kept of their resource
    /// ([`history::forgotten`]): (name, uid), oldest first.
    Forget(Vec<(String, String)>),
    /// Ask for a retry, in place, of the trigger's failed migration for the CRD's state.
    Retry(&'a StorageVersionMigration),
    /// Say that the trigger's failed migration is retried after `wait`.
    RetryLater { migration: String, wait: Duration },
    /// Say that the trigger's failed migration is left to an operator: it failed after every
    /// retry ([`super::MAX_RETRIES`]).
    GiveUp { migration: String },
    /// Create this migration (one that exists already is not an error).
    Create {
        migration: Box<StorageVersionMigration>,
        /// Whether it cleans `managedFields` of versions no longer served.
        clean_managed_fields: bool,
        /// Whether it is the catch-up ([`BACKLOG_ANNOTATION`]).
        backlog: bool,
    },
}

/// What the trigger does about `observed` at `now`, with `settings`. Pure.
pub fn plan<'a>(observed: &Observed<'a>, settings: &Settings, now: Timestamp) -> Plan<'a> {
    let Observed { crd, needed, caught_up, clean_wait, migrations } = observed;
    let (crd, migrations, caught_up) = (*crd, *migrations, *caught_up);
    // Versions unserved within their grace: looked at again once it ends.
    let after_grace = clean_wait.map(|left| left + Duration::from_secs(1));
    let Some(Needed { name, target, clean_managed_fields }) = needed else {
        return Plan { steps: Vec::new(), look_again: after_grace };
    };
    if !settings.create {
        return Plan { steps: Vec::new(), look_again: None };
    }
    // The discovery trigger's sweep does not hold back a switch seen since the start: the
    // migration created here waits for the sweep's of the same resource, which writes in this
    // one's lane meanwhile. The catch-up leaves a resource to the sweep's, which proves the
    // same, rather than rewrite it twice.
    let busy = migrations.iter().any(|m| {
        let swept = m.made_by() == Some(Trigger::Discovery);
        m.is_of(&target.group, &target.resource) && m.is_unfinished() && (caught_up || !swept)
    });
    if busy {
        return Plan { steps: Vec::new(), look_again: after_grace };
    }
    let mut steps = Vec::new();
    let old = history::forgotten(migrations, Trigger::Crd, history::KEPT_PER_RESOURCE);
    if !old.is_empty() {
        steps.push(Step::Forget(old));
    }
    // The state's own migration, whatever generation it was made at: retried in place when it
    // failed, left alone when it succeeded without pruning ([`rounds`]).
    let latest = rounds::latest_for(migrations, crd, &target.version, *clean_managed_fields);
    if let Some(own) = latest.filter(|own| !rounds::round_over(own, *clean_managed_fields)) {
        let migration = own.name_any();
        let look_again = match retry_of(own, now, settings.retry_delay) {
            Retry::No | Retry::Pending => None,
            Retry::After(wait) => {
                steps.push(Step::RetryLater { migration, wait });
                Some(wait)
            }
            Retry::GaveUp => {
                steps.push(Step::GiveUp { migration });
                None
            }
            Retry::Now => {
                steps.push(Step::Retry(own));
                None
            }
        };
        return Plan { steps, look_again };
    }
    let taken = migrations.iter().any(|m| m.metadata.name.as_deref() == Some(name.as_str()));
    let uid = crd.metadata.uid.clone().unwrap_or_default();
    let name = match taken {
        // Taken by a migration of a CRD of the same name deleted since, or of the last round.
        true => {
            let generation = crd.metadata.generation.unwrap_or_default();
            let recreated =
                recreated_name(&target.resource, &target.group, &target.version, generation, &uid);
            match clean_managed_fields {
                true => format!("{recreated}-clean"),
                false => recreated,
            }
        }
        false => name.clone(),
    };
    let mut annotations = BTreeMap::from([(CRD_UID_ANNOTATION.to_owned(), uid)]);
    if *clean_managed_fields {
        annotations.insert(CLEAN_MANAGED_FIELDS_ANNOTATION.to_owned(), "true".to_owned());
        annotations.insert(rounds::UNSERVED_ANNOTATION.to_owned(), rounds::unserved_of(crd));
    }
    // Found so when this process started: the switches seen since write first.
    if caught_up {
        annotations.insert(BACKLOG_ANNOTATION.to_owned(), "true".to_owned());
    }
    let migration = StorageVersionMigration {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(BTreeMap::from([(
                TRIGGER_LABEL.to_owned(),
                Trigger::Crd.label().to_owned(),
            )])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: StorageVersionMigrationSpec { resource: target.clone(), continue_token: None },
        status: None,
    };
    steps.push(Step::Create {
        migration: Box::new(migration),
        clean_managed_fields: *clean_managed_fields,
        backlog: caught_up,
    });
    Plan { steps, look_again: after_grace }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::super::tests::{crd, failed, settings};
    use super::super::{MAX_RETRIES, needed_migration};
    use super::*;
    use crate::api::conditions::{FAILED, RUNNING, STATUS_TRUE, STORED_VERSIONS_PRUNED, SUCCEEDED};
    use crate::api::{GroupVersionResource, MigrationCondition};

    /// The CRD `u1` at `generation`, stored as `stored`.
    fn at(generation: i64, storage: &str, stored: &[&str]) -> CustomResourceDefinition {
        let mut crd = crd(storage, stored, None);
        crd.metadata.uid = Some("u1".into());
        crd.metadata.generation = Some(generation);
        crd
    }

    /// A migration `name` of widgets at `version` the trigger created for the CRD `u1` at
    /// `second`, with the conditions `states` (none: not started), failed (if so) at 1,000.
    fn own(name: &str, version: &str, second: i64, states: &[&str]) -> StorageVersionMigration {
        let mut migration = failed(0, Some("crd"));
        migration.metadata.name = Some(name.into());
        migration.metadata.uid = Some(format!("uid-{name}"));
        migration.metadata.annotations =
            Some([(CRD_UID_ANNOTATION.to_owned(), "u1".to_owned())].into());
        migration.metadata.creation_timestamp = Some(Time(Timestamp::from_second(second).unwrap()));
        migration.spec.resource = GroupVersionResource {
            group: "example.com".into(),
            version: version.into(),
            resource: "widgets".into(),
        };
        let condition = |type_: &&str| MigrationCondition {
            type_: (*type_).into(),
            status: STATUS_TRUE.into(),
            ..MigrationCondition::default()
        };
        match (states.is_empty(), migration.status.as_mut()) {
            (true, _) => migration.status = None,
            (false, Some(status)) => status.conditions = states.iter().map(condition).collect(),
            (false, None) => {}
        }
        migration
    }

    /// `plan` as lines: a step a line, then when it looks again.
    fn told(plan: &Plan) -> Vec<String> {
        let mut lines: Vec<String> = plan
            .steps
            .iter()
            .map(|step| match step {
                Step::Forget(old) => {
                    let names: Vec<&str> = old.iter().map(|(name, _)| name.as_str()).collect();
                    format!("forget {}", names.join(" "))
                }
                Step::Retry(own) => format!("retry {}", own.name_any()),
                Step::RetryLater { migration, wait } => {
                    format!("retry {migration} in {}s", wait.as_secs())
                }
                Step::GiveUp { migration } => format!("give up {migration}"),
                Step::Create { migration, clean_managed_fields, backlog } => {
                    let backlog = if *backlog { " backlog" } else { "" };
                    let cleaning = if *clean_managed_fields { " clean" } else { "" };
                    format!("create {}{backlog}{cleaning}", migration.name_any())
                }
            })
            .collect();
        lines.push(match plan.look_again {
            Some(after) => format!("look again in {}s", after.as_secs()),
            None => "look again at a change".to_owned(),
        });
        lines
    }

    /// What a row is about, the CRD, whether it is the catch-up, the cleaning grace left, the
    /// migrations, the second it is now, whether the trigger creates, and the plan [`told`].
    type Row = (
        &'static str,
        CustomResourceDefinition,
        bool,
        Option<Duration>,
        Vec<StorageVersionMigration>,
        i64,
        bool,
        &'static [&'static str],
    );

    #[test]
    fn each_state_of_a_crd_and_its_migrations_gets_its_plan() {
        const V2_4: &str = "widgets.example.com-v2-4";
        let pruned = [SUCCEEDED, STORED_VERSIONS_PRUNED];
        let stale = at(4, "v2", &["v1", "v2"]);
        let mut gave_up = own(V2_4, "v2", 100, &[FAILED]);
        gave_up.status.as_mut().unwrap().retries = Some(MAX_RETRIES);
        let mut swept = own("widgets.example.com-abc", "v1", 100, &[RUNNING]);
        swept.metadata.labels = Some([(TRIGGER_LABEL.to_owned(), "discovery".to_owned())].into());
        let mut of_a_crd_deleted_since = own(V2_4, "v2", 100, &pruned);
        of_a_crd_deleted_since.metadata.annotations =
            Some([(CRD_UID_ANNOTATION.to_owned(), "u0".to_owned())].into());
        // Twelve finished rounds of v1: the newest ten are kept.
        let rounds: Vec<StorageVersionMigration> = (0..12)
            .map(|i| own(&format!("widgets.example.com-v1-{i}"), "v1", 100 + i, &pruned))
            .collect();
        let minute = Duration::from_secs(60);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("no migration yet: the catch-up", stale.clone(), true, None, vec![], 1_000, true,
                &["create widgets.example.com-v2-4 backlog", "look again at a change"]),
            ("no migration yet: a switch seen since", stale.clone(), false, None, vec![], 1_000, true,
                &["create widgets.example.com-v2-4", "look again at a change"]),
            ("a running one holds it back", stale.clone(), false, None, vec![own(V2_4, "v2", 100, &[RUNNING])], 1_000, true,
                &["look again at a change"]),
            ("a pending one holds it back", stale.clone(), false, None, vec![own(V2_4, "v2", 100, &[])], 1_000, true,
                &["look again at a change"]),
            ("the sweep holds back the catch-up", stale.clone(), true, None, vec![swept.clone()], 1_000, true,
                &["look again at a change"]),
            ("the sweep does not hold back a switch seen since", stale.clone(), false, None, vec![swept], 1_000, true,
                &["create widgets.example.com-v2-4", "look again at a change"]),
            ("a failed one waits out its first wait", stale.clone(), false, None, vec![own(V2_4, "v2", 100, &[FAILED])], 1_010, true,
                &["retry widgets.example.com-v2-4 in 50s", "look again in 50s"]),
            ("a failed one is retried in place, whatever the generation", at(9, "v2", &["v1", "v2"]), false, None, vec![own(V2_4, "v2", 100, &[FAILED])], 1_060, true,
                &["retry widgets.example.com-v2-4", "look again at a change"]),
            ("a failed one is left to an operator after every retry", stale.clone(), false, None, vec![gave_up], 99_999, true,
                &["give up widgets.example.com-v2-4", "look again at a change"]),
            ("succeeded without pruning: left as it is", stale.clone(), false, None, vec![own(V2_4, "v2", 100, &[SUCCEEDED])], 1_000, true,
                &["look again at a change"]),
            ("succeeded and pruned, then switched away and back: another round",
                at(6, "v2", &["v1", "v2"]), false, None,
                vec![own(V2_4, "v2", 100, &pruned), own("widgets.example.com-v1-5", "v1", 200, &pruned)], 1_000, true,
                &["create widgets.example.com-v2-6", "look again at a change"]),
            ("its name taken by a CRD deleted since", stale.clone(), false, None, vec![of_a_crd_deleted_since], 1_000, true,
                &["create widgets.example.com-v2-4-u1", "look again at a change"]),
            ("history bounded: the oldest finished ones are forgotten", stale.clone(), false, None, rounds, 1_000, true,
                &["forget widgets.example.com-v1-0 widgets.example.com-v1-1", "create widgets.example.com-v2-4", "look again at a change"]),
            ("nothing stale, versions unserved within their grace", at(4, "v2", &["v2"]), false, Some(minute), vec![], 1_000, true,
                &["look again in 61s"]),
            ("a migration in flight still looks again once the grace ends", stale.clone(), false, Some(minute), vec![own(V2_4, "v2", 100, &[RUNNING])], 1_000, true,
                &["look again in 61s"]),
            ("without --crd-trigger, nothing", stale.clone(), true, Some(minute), vec![], 1_000, false,
                &["look again at a change"]),
        ];
        for (what, crd, caught_up, clean_wait, migrations, now, create, expected) in rows {
            let observed = Observed {
                crd: &crd,
                needed: needed_migration(&crd, false),
                caught_up,
                clean_wait,
                migrations: &migrations,
            };
            let now = Timestamp::from_second(now).unwrap();
            let plan = plan(&observed, &settings(create), now);
            assert_eq!(told(&plan), expected, "{what}");
        }
    }
}
