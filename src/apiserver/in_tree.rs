//! The in-tree migrator (kube-controller-manager; `storagemigration.k8s.io/v1`, GA and on by
//! default from Kubernetes 1.37): reading its migrations, to show them beside kube-svm's and to
//! leave alone a resource it is migrating (at most one migration per resource at a time,
//! whoever runs it).

use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use crate::api::conditions::{FAILED, RUNNING, STATUS_TRUE, SUCCEEDED};
use crate::api::{GroupResource, Phase};

const GROUP: &str = "storagemigration.k8s.io";
const VERSION: &str = "v1";

/// The in-tree migrator's StorageVersionMigration resource.
pub fn api_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, "StorageVersionMigration");
    ApiResource::from_gvk_with_plural(&gvk, "storageversionmigrations")
}

/// Where an in-tree migration stands: `Succeeded`, `Failed`, `Running`, or `New` before the
/// in-tree migrator has picked it up.
pub fn phase(migration: &DynamicObject) -> Phase {
    let conditions = migration.data["status"]["conditions"].as_array();
    let holds = |type_: &str| {
        conditions.into_iter().flatten().any(|c| c["type"] == type_ && c["status"] == STATUS_TRUE)
    };
    let phases =
        [(SUCCEEDED, Phase::Succeeded), (FAILED, Phase::Failed), (RUNNING, Phase::Running)];
    phases.into_iter().find(|(type_, _)| holds(type_)).map_or(Phase::New, |(_, phase)| phase)
}

/// The resource an in-tree migration migrates.
pub fn resource(migration: &DynamicObject) -> GroupResource {
    let spec = &migration.data["spec"]["resource"];
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
    GroupResource { group: text(&spec["group"]), resource: text(&spec["resource"]) }
}

/// Every in-tree migration; none where the cluster does not serve the API (before 1.37, or
/// turned off).
pub async fn list(client: &Client) -> Result<Vec<DynamicObject>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(error) if crate::apiserver::answers::is_not_found(&error) => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// The name of the in-tree migration running for `resource`, if any.
pub async fn running_for(
    client: &Client,
    resource: &GroupResource,
) -> Result<Option<String>, kube::Error> {
    let migrations = list(client).await?;
    Ok(migrations
        .iter()
        .find(|m| phase(m) == Phase::Running && self::resource(m) == *resource)
        .map(|m| m.metadata.name.clone().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(conditions: serde_json::Value) -> DynamicObject {
        let mut object = DynamicObject::new("m", &api_resource());
        object.data = serde_json::json!({
            "spec": { "resource": { "group": "example.com", "resource": "widgets" } },
            "status": { "conditions": conditions },
        });
        object
    }

    #[test]
    fn the_phase_is_the_condition_that_holds() {
        assert_eq!(phase(&migration(serde_json::json!([]))), Phase::New);
        let running = serde_json::json!([{ "type": "Running", "status": "True" }]);
        assert_eq!(phase(&migration(running)), Phase::Running);
        let done = serde_json::json!([
            { "type": "Running", "status": "False" },
            { "type": "Succeeded", "status": "True" },
        ]);
        assert_eq!(phase(&migration(done)), Phase::Succeeded);
        let widgets = GroupResource { group: "example.com".into(), resource: "widgets".into() };
        assert_eq!(resource(&migration(serde_json::json!([]))), widgets);
    }
}
