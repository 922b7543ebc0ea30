//! `kube-svm plan`: what needs migrating and what kube-svm would do, written nowhere. The
//! decisions are in [`crate::removal::plan`]; this file gathers what they need and prints the plan.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use super::etcd::EtcdArgs;
use super::fleet::FleetArgs;
use super::kube::KubeArgs;
use super::table::{self, Output};
use crate::api::{GroupResource, GroupVersionResource, StorageState, StorageVersionMigration};
use crate::census::{self, EtcdReader, Scope};
use crate::engine::{ResolveError, Resource};
use crate::removal::plan::{self, Entry, Plan};
use crate::rules::crd::CrdState;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Resources to migrate whatever their state, as `resource[.group]` (`secrets` after an
    /// encryption key rotation, `widgets.example.com`).
    pub resources: Vec<String>,

    #[command(flatten)]
    pub kube: KubeArgs,

    /// With --drop: several clusters at once.
    #[command(flatten)]
    pub fleet: FleetArgs,

    /// With etcd's endpoints, objects are counted exactly and the stale ones named by census.
    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,

    /// Instead of what needs migrating: whether VERSION can be removed from the one CRD named
    /// (what blocks it, with numbers, and what clears each blocker). Exits 0 when it can, 3 when
    /// something blocks it, 1 on an error. With several clusters (--context more than once,
    /// --all-contexts), one row each: exits 0 when it can be removed in every one, 1 when one
    /// did not answer, else 3.
    #[arg(long, value_name = "VERSION")]
    pub drop: Option<String>,
}

/// What the plan needs to know of a listed resource beyond its entry.
#[derive(Default)]
struct Known {
    resolved: Option<Resource>,
    /// The CRD's storage version.
    storage_version: Option<String>,
    /// The CRD behind it, when it is a custom resource.
    crd: Option<CustomResourceDefinition>,
}

pub async fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let PlanArgs { resources, kube, fleet, etcd, output, drop } = args;
    let fleet = fleet.fleet(&kube)?;
    if let Some(version) = drop {
        let [resource] = <[String; 1]>::try_from(resources).map_err(|named| {
            anyhow::anyhow!(
                "--drop {version} takes the one CRD to drop it from (resource.group), {} named",
                named.len()
            )
        })?;
        let question = super::drop::Question { version, resource, etcd };
        return match fleet {
            Some(fleet) => super::drop::run_fleet(&fleet, question, output).await,
            None => {
                super::drop::run(Client::try_from(kube.config().await?)?, question, output).await
            }
        };
    }
    if fleet.is_some() {
        anyhow::bail!("plan asks several clusters only with --drop");
    }
    let client = Client::try_from(kube.config().await?)?;
    let mut plan = Plan::default();
    let mut known: BTreeMap<(String, String), Known> = BTreeMap::new();

    for crd in list_or_empty(Api::<CustomResourceDefinition>::all(client.clone())).await? {
        let Some(state) = CrdState::of(&crd) else { continue };
        let Some((reason, afterwards)) = plan::crd_reason(&state) else { continue };
        let (group, resource) = (crd.spec.group.clone(), crd.spec.names.plural.clone());
        let entry = plan.entry(&group, &resource);
        entry.reasons.push(reason);
        entry.add_afterwards(afterwards);
        let facts = known.entry((group, resource)).or_default();
        facts.storage_version = Some(state.storage_version);
        facts.crd = Some(crd);
    }

    for state in list_or_empty(Api::<StorageState>::all(client.clone())).await? {
        let GroupResource { group, resource } = state.spec.resource.clone();
        let persisted =
            state.status.map(|s| s.persisted_storage_version_hashes).unwrap_or_default();
        let resolved = match resolve(&client, &group, &resource).await {
            Ok(resolved) => resolved,
            Err(error) => {
                plan.unexamined.push(format!(
                    "{}: {}",
                    GroupResource::name_of(&group, &resource),
                    crate::error_chain(&error)
                ));
                continue;
            }
        };
        let current = resolved.storage_version_hash.as_deref();
        if let Some(reason) = plan::storage_state_reason(&persisted, current) {
            let entry = plan.entry(&group, &resource);
            entry.reasons.push(reason);
            entry.add_afterwards(format!(
                "its StorageState's persistedStorageVersionHashes becomes [{:?}] once a migration that targeted that hash succeeds",
                current.unwrap_or_default()
            ));
        }
        known.entry((group, resource)).or_default().resolved = Some(resolved);
    }

    for argument in &resources {
        let GroupResource { group, resource } = GroupResource::parse(argument);
        let (group, resource) = (group.as_str(), resource.as_str());
        let resolved = resolve(&client, group, resource)
            .await
            .with_context(|| format!("cannot plan {argument}"))?;
        plan.entry(group, resource).reasons.push("named on the command line".into());
        known.entry((group.to_owned(), resource.to_owned())).or_default().resolved = Some(resolved);
    }

    let migrations = list_or_empty(Api::<StorageVersionMigration>::all(client.clone())).await?;
    for entry in &mut plan.resources {
        let key = (entry.group.clone(), entry.resource.clone());
        let facts = known.entry(key).or_default();
        if facts.resolved.is_none() {
            facts.resolved = resolve(&client, &entry.group, &entry.resource).await.ok();
        }
        if let Some(resolved) = &facts.resolved {
            (entry.objects, entry.objects_exact) = count(&client, resolved).await;
            if facts.crd.is_none() && !resolved.group.is_empty() {
                let name = format!("{}.{}", resolved.plural, resolved.group);
                let crds = Api::<CustomResourceDefinition>::all(client.clone());
                facts.crd = crds.get_opt(&name).await.ok().flatten();
            }
        }
        if let Some(crd) = &facts.crd {
            let writes_through = facts.resolved.as_ref().map(|r| r.version.as_str());
            let timeout = crate::engine::Settings::default().request_timeout;
            if let Err(unavailable) =
                crate::evidence::conversion::preflight(&client, crd, writes_through, timeout).await
            {
                entry.problems.push(unavailable.to_string());
            }
        }
        entry.migration = plan::existing(&migrations, &entry.group, &entry.resource);
    }

    let (connection, etcd_prefix) = etcd.connection();
    if let Some(connection) = connection
        && !plan.resources.is_empty()
    {
        let reader =
            EtcdReader::connect(&connection).context("failed to set up the etcd client")?;
        let located = plan
            .resources
            .iter()
            .map(|e| {
                census::keys::locate(&etcd_prefix, &GroupResource::name_of(&e.group, &e.resource))
            })
            .collect();
        let report =
            census::take(&reader, &etcd_prefix, &Scope::Resources(located), |_, _, _| {}).await?;
        for (entry, census) in plan.resources.iter_mut().zip(report.resources) {
            let facts = known.get(&(entry.group.clone(), entry.resource.clone()));
            let resolved = facts.and_then(|f| f.resolved.as_ref());
            entry.stale_objects = plan::stale_objects(
                &census,
                &entry.group,
                resolved.map(|r| r.kind.as_str()).unwrap_or_default(),
                facts.and_then(|f| f.storage_version.as_deref()),
                resolved.and_then(|r| r.storage_version_hash.as_deref()),
            );
            (entry.objects, entry.objects_exact) = (Some(census.objects), true);
            entry.census = Some(census);
        }
    }

    let text = output.format(&plan, render)?;
    std::io::stdout().write_all(text.as_bytes()).context("failed to write the plan")?;
    Ok(ExitCode::from(plan.exit_code()))
}

/// Every object of `api`, or none when the apiserver does not serve the type (kube-svm's CRDs
/// not installed).
async fn list_or_empty<K>(api: Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(error) if crate::apiserver::answers::is_not_found(&error) => Ok(Vec::new()),
        Err(error) => Err(error).context("failed to list what the plan is made of"),
    }
}

async fn resolve(client: &Client, group: &str, resource: &str) -> Result<Resource, ResolveError> {
    let target = GroupVersionResource {
        group: group.to_owned(),
        version: String::new(),
        resource: resource.to_owned(),
    };
    Resource::resolve(client, &target, false).await
}

/// How many objects `resource` holds, from a one-item metadata list: exact when that was the
/// whole list, else the apiserver's `remainingItemCount` estimate.
async fn count(client: &Client, resource: &Resource) -> (Option<u64>, bool) {
    let gvk = GroupVersionKind::gvk(&resource.group, &resource.version, &resource.kind);
    let api_resource = ApiResource::from_gvk_with_plural(&gvk, &resource.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource);
    let Ok(page) = api.list_metadata(&ListParams::default().limit(1)).await else {
        return (None, false);
    };
    let listed = page.items.len() as u64;
    let more = page.metadata.continue_.as_deref().is_some_and(|c| !c.is_empty());
    match (more, page.metadata.remaining_item_count) {
        (false, _) => (Some(listed), true),
        (true, Some(remaining)) => (Some(listed + u64::try_from(remaining).unwrap_or(0)), false),
        (true, None) => (None, false),
    }
}

fn render(plan: &Plan) -> String {
    if plan.resources.is_empty() {
        let mut out = "Nothing needs migrating.\n".to_owned();
        for unexamined in &plan.unexamined {
            out.push_str(&format!("Not examined: {unexamined}\n"));
        }
        return out;
    }
    let mut rows = vec![["RESOURCE", "OBJECTS", "STALE", "MIGRATION", "WHY"].map(str::to_owned)];
    for entry in &plan.resources {
        let Entry {
            group,
            resource,
            reasons,
            objects,
            objects_exact,
            stale_objects,
            migration,
            ..
        } = entry;
        let objects = match (objects, objects_exact) {
            (Some(n), true) => n.to_string(),
            (Some(n), false) => format!("~{n}"),
            (None, _) => "?".into(),
        };
        let stale = stale_objects.map_or("-".into(), |n| n.to_string());
        let migration =
            migration.as_ref().map_or("-".into(), |m| format!("{} ({})", m.name, m.phase));
        for (i, reason) in reasons.iter().enumerate() {
            let first = i == 0;
            rows.push([
                if first { GroupResource::name_of(group, resource) } else { String::new() },
                if first { objects.clone() } else { String::new() },
                if first { stale.clone() } else { String::new() },
                if first { migration.clone() } else { String::new() },
                reason.clone(),
            ]);
        }
    }
    let mut out = table::render(&rows, &[1, 2]);
    out.push_str("\nAfterwards:\n");
    for entry in &plan.resources {
        out.push_str(&format!(
            "  {}: {}\n",
            GroupResource::name_of(&entry.group, &entry.resource),
            entry.afterwards
        ));
    }
    let problems: Vec<_> = plan.resources.iter().filter(|e| !e.problems.is_empty()).collect();
    if !problems.is_empty() {
        out.push_str("\nProblems (a migration would fail before writing):\n");
        for entry in problems {
            for problem in &entry.problems {
                let name = GroupResource::name_of(&entry.group, &entry.resource);
                out.push_str(&format!("  {name}: {problem}\n"));
            }
        }
    }
    for unexamined in &plan.unexamined {
        out.push_str(&format!("Not examined: {unexamined}\n"));
    }
    out
}
