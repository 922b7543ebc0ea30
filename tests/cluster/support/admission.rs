//! Admission that refuses updates, from a ValidatingAdmissionPolicy: the real thing, no webhook
//! server needed.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Installs policy `name` denying UPDATEs of `resources` in API group `group` whose new object
/// fails the CEL `expression`, with `message` and `reason` (`Forbidden` answers 403; `Invalid`,
/// also when none is given, 422).
pub async fn deny_updates(
    client: &Client,
    name: &str,
    group: &str,
    resources: &[&str],
    expression: &str,
    message: &str,
    reason: Option<&str>,
) {
    let mut validation = json!({ "expression": expression, "message": message });
    if let Some(reason) = reason {
        validation["reason"] = json!(reason);
    }
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": [group], "apiVersions": ["*"], "operations": ["UPDATE"],
                "resources": resources,
            }]},
            "validations": [validation],
        },
    }))
    .expect("a valid policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "policyName": name, "validationActions": ["Deny"] },
    }))
    .expect("a valid binding");
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("the policy is created");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the binding is created");
}

/// Lifts policy `name`: its binding goes, so it no longer applies once the apiserver sees it.
pub async fn lift(client: &Client, name: &str) {
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .expect("the binding is deleted");
}
