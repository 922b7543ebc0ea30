//! Conversion webhooks.

use std::time::Instant;

use crate::support::Scenario;
use crate::support::conversion::{closed_port, missing_service};
use crate::support::fixtures::WidgetCrd;

#[tokio::test]
async fn probe_answers() {
    let Scenario { control_plane: _cp, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::stale(&client, "probe", 3).await;
    for config in [closed_port(), missing_service("nothing-here")] {
        widgets.convert_with(&client, config).await;
        for (version, accept) in [
            ("v1", "application/json"),
            ("v2", "application/json"),
            ("v2", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            ("v3", "application/json"),
        ] {
            let started = Instant::now();
            let request = http::Request::get(format!(
                "/apis/{}/{version}/widgets?limit=1",
                widgets.group
            ))
            .header("accept", accept)
            .body(Vec::new())
            .unwrap();
            let response = client.send(request.map(kube::client::Body::from)).await.unwrap();
            let code = response.status();
            let body = response.into_body().collect_bytes().await.unwrap();
            println!(
                "{version} {accept}: {code} in {:?}: {}",
                started.elapsed(),
                String::from_utf8_lossy(&body).chars().take(600).collect::<String>()
            );
        }
    }
}
