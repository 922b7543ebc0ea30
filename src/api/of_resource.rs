//! One view of the migrations of a resource: which resource a migration migrates, which
//! trigger created it, and whether it still holds its resource. "Still holds" has two meanings
//! among the callers, each a method of its own: [`StorageVersionMigration::is_unfinished`]
//! (pending or running), and [`StorageVersionMigration::is_unfinished_and_not_deleted`] (what
//! the controller's turns wait for: a migration being deleted never runs again).

use super::{GroupResource, Phase, StorageVersionMigration};

/// Label on the migrations a trigger creates: its [`Trigger::label`].
pub const TRIGGER_LABEL: &str = "kube-svm.io/trigger";

/// What created a migration on its own, as its [`TRIGGER_LABEL`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The CRD trigger: a CRD's `storedVersions` held more than its storage version.
    Crd,
    /// The discovery trigger: a resource's storage version hash changed.
    Discovery,
}

impl Trigger {
    /// The value of [`TRIGGER_LABEL`] on the trigger's migrations.
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Crd => "crd",
            Trigger::Discovery => "discovery",
        }
    }
}

impl StorageVersionMigration {
    /// The resource it migrates.
    pub fn group_resource(&self) -> GroupResource {
        let target = &self.spec.resource;
        GroupResource { group: target.group.clone(), resource: target.resource.clone() }
    }

    /// Whether it migrates `group`/`resource`, at whatever version.
    pub fn is_of(&self, group: &str, resource: &str) -> bool {
        self.spec.resource.group == group && self.spec.resource.resource == resource
    }

    /// The trigger that created it; `None` for one created by a person or another tool.
    pub fn made_by(&self) -> Option<Trigger> {
        let labels = self.metadata.labels.as_ref();
        match labels.and_then(|l| l.get(TRIGGER_LABEL)).map(String::as_str) {
            Some("crd") => Some(Trigger::Crd),
            Some("discovery") => Some(Trigger::Discovery),
            _ => None,
        }
    }

    /// Whether it is pending or running: neither succeeded nor failed.
    pub fn is_unfinished(&self) -> bool {
        !Phase::of(self).is_terminal()
    }

    /// Whether it is pending or running and not being deleted.
    pub fn is_unfinished_and_not_deleted(&self) -> bool {
        self.is_unfinished() && self.metadata.deletion_timestamp.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{FAILED, RUNNING, SUCCEEDED};
    use crate::api::in_state;

    #[test]
    fn the_label_names_the_trigger_and_nothing_else_does() {
        let mut migration = in_state(RUNNING);
        assert_eq!(migration.made_by(), None);
        for (value, trigger) in
            [("crd", Some(Trigger::Crd)), ("discovery", Some(Trigger::Discovery)), ("x", None)]
        {
            migration.metadata.labels = Some([(TRIGGER_LABEL.to_owned(), value.to_owned())].into());
            assert_eq!(migration.made_by(), trigger, "{value}");
            assert!(trigger.is_none_or(|t| t.label() == value));
        }
    }

    #[test]
    fn a_migration_being_deleted_is_unfinished_but_no_longer_waited_for() {
        assert!(!in_state(SUCCEEDED).is_unfinished() && !in_state(FAILED).is_unfinished());
        let mut running = in_state(RUNNING);
        assert!(running.is_unfinished() && running.is_unfinished_and_not_deleted());
        let now = k8s_openapi::jiff::Timestamp::from_second(0).unwrap();
        running.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        assert!(running.is_unfinished() && !running.is_unfinished_and_not_deleted());
    }
}
