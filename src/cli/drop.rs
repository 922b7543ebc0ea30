//! `kube-svm plan --drop VERSION RESOURCE`: can this version be removed from the CRD now? The
//! decisions are in [`crate::removal`]; this file gathers the facts (the CRD, every object's
//! `managedFields` page by page, the objects whose `ownerReferences` name the version, the
//! apiserver's `/metrics`, the etcd census) and prints them.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use super::etcd::EtcdArgs;
use super::fleet::{Answers, Fleet};
use super::table::Output;
use crate::api::{GroupResource, StorageVersionMigration};
use crate::census::{self, EtcdReader, Scope};
use crate::removal::plan::EXIT_NEEDS_MIGRATION;
use crate::removal::{self, Count, Dependents, Facts, RequestCounts, Verdict};

/// Objects per list request while counting `managedFields`.
const PAGE_SIZE: u32 = 500;

/// What `plan --drop` is asked.
#[derive(Clone)]
pub struct Question {
    pub version: String,
    pub resource: String,
    pub etcd: EtcdArgs,
}

/// Asks one cluster, prints its verdict, and exits 0 when the version can be removed.
pub async fn run(client: Client, question: Question, output: Output) -> anyhow::Result<ExitCode> {
    let verdict = verdict(client, question).await?;
    let text = output.format(&verdict, render)?;
    std::io::stdout().write_all(text.as_bytes()).context("failed to write the plan")?;
    Ok(ExitCode::from(exit_code(&verdict)))
}

/// Asks every cluster of `fleet` at once and prints one row each; exits 0 when the version can
/// be removed in every one.
pub async fn run_fleet(
    fleet: &Fleet,
    question: Question,
    output: Output,
) -> anyhow::Result<ExitCode> {
    if !question.etcd.etcd_endpoints.is_empty() {
        anyhow::bail!("--etcd-endpoints names one cluster's etcd: ask one cluster with it");
    }
    let answers = fleet.ask(|client| verdict(client, question.clone())).await;
    let text = output.format(&answers, render_fleet)?;
    std::io::stdout().write_all(text.as_bytes()).context("failed to write the plan")?;
    Ok(ExitCode::from(answers.exit_code(exit_code)))
}

/// 0 when the version can be removed, [`EXIT_NEEDS_MIGRATION`] when something blocks it.
pub fn exit_code(verdict: &Verdict) -> u8 {
    if verdict.removable { 0 } else { EXIT_NEEDS_MIGRATION }
}

/// Whether the version can be removed from the CRD in the cluster `client` talks to.
pub async fn verdict(client: Client, question: Question) -> anyhow::Result<Verdict> {
    let Question { version, resource, etcd } = question;
    let GroupResource { group, resource } = GroupResource::parse(&resource);
    let name = GroupResource::name_of(&group, &resource);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get_opt(&name)
        .await
        .with_context(|| format!("failed to read the CRD {name}"))?
        .with_context(|| {
            format!("{name} is not served by a CRD: only a CRD's versions can be dropped")
        })?;
    let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
    let Some(dropped) = crd.spec.versions.iter().find(|v| v.name == version) else {
        anyhow::bail!(
            "{version} is not a version of {name} (its versions: {})",
            versions.join(", ")
        );
    };
    let storage =
        crd.spec.versions.iter().find(|v| v.storage).context("the CRD has no storage version")?;
    let read_at = crd.spec.versions.iter().find(|v| v.served).unwrap_or(storage);
    let kind = &crd.spec.names.kind;

    let gvk = GroupVersionKind::gvk(&group, &read_at.name, kind);
    let objects: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, &resource));
    let api_version = format!("{group}/{version}");
    let managed_fields =
        naming(&objects, &api_version).await.with_context(|| format!("failed to list {name}"))?;
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let migrations = match migrations.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) if crate::apiserver::answers::is_not_found(&error) => Vec::new(),
        Err(error) => return Err(error).context("failed to list StorageVersionMigrations"),
    };
    let facts = Facts {
        group: group.clone(),
        resource: resource.clone(),
        version: version.clone(),
        storage_version: storage.name.clone(),
        served: dropped.served,
        stored_versions: crd
            .status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default(),
        managed_fields,
        requests: requests(&client, &group, &version, &resource).await,
        stored: stored(etcd, &name, &api_version).await?,
        migration: crate::removal::plan::existing(&migrations, &group, &resource),
        dependents: dependents(&client, &api_version, kind).await?,
    };
    Ok(removal::judge(&facts))
}

/// Objects whose `managedFields` name `api_version`, of every object, listed page by page
/// (metadata only, which carries `managedFields`).
async fn naming(objects: &Api<DynamicObject>, api_version: &str) -> kube::Result<Count> {
    let mut count = Count::default();
    let mut params = ListParams::default().limit(PAGE_SIZE);
    loop {
        let page = objects.list_metadata(&params).await?;
        for object in &page.items {
            count.of += 1;
            let entries = object.metadata.managed_fields.as_deref().unwrap_or_default();
            if entries.iter().any(|e| e.api_version.as_deref() == Some(api_version)) {
                count.objects += 1;
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(count),
        }
    }
}

/// Examples of dependents named in the answer.
const DEPENDENT_EXAMPLES: usize = 3;

/// Objects of every resource that can be listed whose `ownerReferences` name `kind` in
/// `api_version`, listed page by page (metadata only); resources that cannot be listed are said.
async fn dependents(client: &Client, api_version: &str, kind: &str) -> anyhow::Result<Dependents> {
    use kube::discovery::{Discovery, verbs};
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("failed to read discovery, to look for ownerReferences")?;
    let mut found = Dependents::default();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if !capabilities.supports_operation(verbs::LIST) {
                continue;
            }
            let objects: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let named =
                |reference: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
                    reference.api_version == api_version && reference.kind == kind
                };
            let mut params = ListParams::default().limit(PAGE_SIZE);
            loop {
                let page = match objects.list_metadata(&params).await {
                    Ok(page) => page,
                    Err(error) => {
                        let name = GroupResource::name_of(&resource.group, &resource.plural);
                        found.unread.push(format!("{name}: {}", crate::error_chain(&error)));
                        break;
                    }
                };
                for object in &page.items {
                    found.count.of += 1;
                    let references =
                        object.metadata.owner_references.as_deref().unwrap_or_default();
                    if references.iter().any(named) {
                        found.count.objects += 1;
                        if found.examples.len() < DEPENDENT_EXAMPLES {
                            let namespace =
                                object.metadata.namespace.as_deref().unwrap_or_default();
                            let name = object.metadata.name.as_deref().unwrap_or_default();
                            let at = if namespace.is_empty() {
                                name.to_owned()
                            } else {
                                format!("{namespace}/{name}")
                            };
                            found.examples.push(format!("{} {at}", resource.plural));
                        }
                    }
                }
                match page.metadata.continue_.filter(|token| !token.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
        }
    }
    Ok(found)
}

/// Requests for the version, from the answering apiserver's `/metrics`.
async fn requests(
    client: &Client,
    group: &str,
    version: &str,
    resource: &str,
) -> Result<RequestCounts, String> {
    let request = http::Request::get("/metrics").body(Vec::new()).map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(metrics) => Ok(removal::requests_in(&metrics, group, version, resource)),
        Err(error) => {
            Err(format!("reading the apiserver's /metrics failed: {}", crate::error_chain(&error)))
        }
    }
}

/// Objects stored in `api_version`, and objects the census could not read, when etcd was given.
async fn stored(etcd: EtcdArgs, name: &str, api_version: &str) -> anyhow::Result<Option<Count>> {
    let (connection, etcd_prefix) = etcd.connection();
    let Some(connection) = connection else { return Ok(None) };
    let reader = EtcdReader::connect(&connection).context("failed to set up the etcd client")?;
    let located = vec![census::keys::locate(&etcd_prefix, name)];
    let report =
        census::take(&reader, &etcd_prefix, &Scope::Resources(located), |_, _, _| {}).await?;
    let Some(census) = report.resources.into_iter().next() else { return Ok(None) };
    let objects = census.api_versions.get(api_version).copied().unwrap_or(0);
    let unreadable = census.objects.saturating_sub(census.api_versions.values().sum::<u64>());
    Ok(Some(Count { objects, of: unreadable }))
}

/// One row per cluster: whether the version can be removed, and what blocks it.
fn render_fleet(answers: &Answers<Verdict>) -> String {
    answers.render(
        ["REMOVABLE", "BLOCKERS"],
        |verdict| {
            let mut blockers: Vec<String> =
                verdict.blockers.iter().map(|found| format!("{:?}", found.blocker)).collect();
            blockers.dedup();
            let removable = if verdict.removable { "yes" } else { "no" };
            let blockers = if blockers.is_empty() { "-".into() } else { blockers.join(", ") };
            [removable.to_owned(), blockers]
        },
        &[],
    )
}

fn render(verdict: &Verdict) -> String {
    let Verdict { group, resource, version, removable, blockers, notes, .. } = verdict;
    let name = GroupResource::name_of(group, resource);
    let mut out = match removable {
        true => format!("{version} can be removed from {name}: nothing blocks it.\n"),
        false => format!(
            "{version} cannot be removed from {name} yet: {} blocker{}.\n",
            blockers.len(),
            if blockers.len() == 1 { "" } else { "s" }
        ),
    };
    for (i, found) in blockers.iter().enumerate() {
        out.push_str(&format!(
            "\n{}. {:?}: {}\n   To clear it: {}\n",
            i + 1,
            found.blocker,
            found.message,
            found.clear
        ));
    }
    if !notes.is_empty() {
        out.push('\n');
    }
    for note in notes {
        out.push_str(&format!("Note: {note}\n"));
    }
    out
}
