//! Exploration.

use crate::support::{ControlPlane, Topology};

#[tokio::test]
async fn explore() {
    let old = vec!["--emulated-version=1.36".to_owned()];
    let topology = Topology { apiservers: vec![old.clone(), old, vec![]], common: vec![] };
    let plane = ControlPlane::start_ha(&topology).await.expect("starts");
    for i in 0..plane.apiserver_count() {
        let client = plane.direct_client(i).await;
        let groups = client.list_api_group_resources("admissionregistration.k8s.io/v1").await;
        let groups2 = client.list_api_group_resources("admissionregistration.k8s.io/v1beta1").await;
        for (v, g) in [("v1", groups), ("v1beta1", groups2)] {
            match g {
                Ok(list) => {
                    for r in list.resources.iter().filter(|r| r.name.starts_with("mutatingadmission")) {
                        println!("apiserver {i} {v}: {} hash {:?}", r.name, r.storage_version_hash);
                    }
                }
                Err(e) => println!("apiserver {i} {v}: {e}"),
            }
        }
    }
    let client = plane.client().await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "kube-system");
    for l in leases.list(&Default::default()).await.unwrap().items {
        println!("lease {:?} labels {:?}", l.metadata.name, l.metadata.labels);
    }
    plane.keep();
}
