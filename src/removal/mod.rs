//! Whether a version can be removed from a CRD now: the pure part of `kube-svm plan --drop`.
//! The command gathers the facts (the CRD, the objects' `managedFields`, the apiserver's request
//! counts, optionally the etcd census); [`judge`] lists what blocks the removal, with numbers,
//! and what clears each blocker.

pub mod plan;

use serde::Serialize;

use plan::ExistingMigration;

/// What is known of the CRD and of the version to drop.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The CRD's group.
    pub group: String,
    /// The CRD's plural resource name.
    pub resource: String,
    /// The version to drop.
    pub version: String,
    /// The CRD's storage version.
    pub storage_version: String,
    /// Whether the version is served.
    pub served: bool,
    /// The CRD's `status.storedVersions`.
    pub stored_versions: Vec<String>,
    /// Objects whose `managedFields` name the version, of the objects listed.
    pub managed_fields: Count,
    /// Requests for the version the apiserver counted, or why they could not be read.
    pub requests: Result<RequestCounts, String>,
    /// From the etcd census: objects stored in the version, and objects whose version the
    /// census could not read (encrypted, unrecognized); `None` without etcd.
    pub stored: Option<Count>,
    /// The resource's migration, the pending or running one, else the newest.
    pub migration: Option<ExistingMigration>,
    /// Objects of any resource whose `ownerReferences` name the CRD's kind in the version.
    pub dependents: Dependents,
}

/// Objects of the cluster whose `ownerReferences` name the version: the garbage collector cannot
/// map such a reference once the version is gone, and never deletes them (it retries forever).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dependents {
    /// Objects found naming it, of the objects looked at.
    pub count: Count,
    /// A few of them, as `resource namespace/name`.
    pub examples: Vec<String>,
    /// Resources that could not be listed, and why: their objects were not looked at.
    pub unread: Vec<String>,
}

/// How many objects, of how many looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Count {
    /// Objects found with what was looked for.
    pub objects: u64,
    /// Objects looked at (for the census: objects that could not be read).
    pub of: u64,
}

/// `apiserver_request_total` for one group, version and resource, as the apiserver that answered
/// counted it since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestCounts {
    /// Every request.
    pub total: u64,
    /// Answered with success (2xx): served.
    pub served: u64,
    /// Answered 404: asked for while the version was not served.
    pub not_found: u64,
}

/// What keeps the version in the CRD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Blocker {
    /// It is the storage version.
    StorageVersion,
    /// `status.storedVersions` lists it: the apiserver refuses the removal.
    StoredVersions,
    /// Clients may still use it.
    Served,
    /// Objects' `managedFields` name it: every server-side apply of them fails once it is gone.
    ManagedFields,
    /// etcd still holds objects in it.
    StoredObjects,
    /// Objects name it in their `ownerReferences`: the garbage collector never deletes them once
    /// it is gone.
    OwnerReferences,
    /// What could show a blocker could not be looked at: objects whose stored version the census
    /// could not read (encrypted, unrecognized), resources whose owner references could not be
    /// listed. Not known to be removable is not removable.
    Unverified,
}

/// One blocker, in numbers and words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    /// Which blocker.
    pub blocker: Blocker,
    /// What was found.
    pub message: String,
    /// How many objects or requests, where it is a number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// What clears it.
    pub clear: String,
}

/// The answer of `plan --drop`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// The CRD's group.
    pub group: String,
    /// The CRD's plural resource name.
    pub resource: String,
    /// The version asked about.
    pub version: String,
    /// Whether nothing blocks its removal.
    pub removable: bool,
    /// What blocks it, in the order to clear them.
    pub blockers: Vec<Found>,
    /// Requests for the version, as the apiserver that answered counted them since it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<RequestCounts>,
    /// What else was seen, or could not be looked at.
    pub notes: Vec<String>,
}

/// What blocks removing `facts.version`, and what clears each blocker.
pub fn judge(facts: &Facts) -> Verdict {
    let Facts { group, resource, version, storage_version, .. } = facts;
    let name = format!("{resource}.{group}");
    let mut blockers = Vec::new();
    let mut found = |blocker, message: String, count, clear: String| {
        blockers.push(Found { blocker, message, count, clear });
    };
    if storage_version == version {
        found(
            Blocker::StorageVersion,
            format!("{version} is the storage version"),
            None,
            format!(
                "make another served version the storage version (spec.versions[].storage), then migrate: kube-svm migrate {name}"
            ),
        );
    }
    if facts.stored_versions.contains(version) {
        let migration = match &facts.migration {
            Some(m) => format!(" (its latest migration, {}, is {})", m.name, m.phase),
            None => String::new(),
        };
        found(
            Blocker::StoredVersions,
            format!(
                "status.storedVersions lists {version} ({:?}), so the apiserver refuses the removal{migration}",
                facts.stored_versions
            ),
            None,
            format!(
                "kube-svm migrate {name} (or a StorageVersionMigration): every object is rewritten in {storage_version}, and storedVersions is pruned once that is proven"
            ),
        );
    }
    let requests = facts.requests.as_ref().ok();
    if facts.served {
        let served = requests.map_or(String::new(), |r| {
            format!(
                "; the apiserver that answered served {} requests for it since it started",
                r.served
            )
        });
        found(
            Blocker::Served,
            format!("{version} is still served{served}"),
            requests.map(|r| r.served),
            format!(
                "set served: false for {version} in the CRD: clients asking for it get 404 (which can be undone), counted in apiserver_request_total with code 404"
            ),
        );
    }
    let Count { objects, of } = facts.managed_fields;
    if objects > 0 {
        let first = match facts.served {
            true => format!("once {version} is no longer served, "),
            false => String::new(),
        };
        found(
            Blocker::ManagedFields,
            format!(
                "{objects} of {of} objects have managedFields entries naming {version}: once it is removed, every server-side apply of them fails"
            ),
            Some(objects),
            format!(
                "{first}kube-svm migrate --clean-managed-fields {name} (or a migration annotated kube-svm.io/clean-managed-fields: \"true\")"
            ),
        );
    }
    let mut notes = Vec::new();
    match &facts.stored {
        Some(Count { objects, of }) => {
            if *objects > 0 {
                found(
                    Blocker::StoredObjects,
                    format!("etcd holds {objects} objects stored in {version}"),
                    Some(*objects),
                    format!("kube-svm migrate {name}"),
                );
            }
            if *of > 0 {
                found(
                    Blocker::Unverified,
                    format!(
                        "{of} objects in etcd are encrypted or unrecognized: the census could not tell their version, so whether some are still stored in {version} is unknown"
                    ),
                    Some(*of),
                    format!(
                        "kube-svm migrate {name} rewrites them all in {storage_version} (it reads through the apiserver, which decrypts): then only a write since could have stored {version}, and {version} is no longer the storage version"
                    ),
                );
            }
        }
        None => notes.push(
            "etcd was not read (--etcd-endpoints): objects stored in each version were not counted"
                .to_owned(),
        ),
    }
    let Dependents { count, examples, unread } = &facts.dependents;
    if count.objects > 0 {
        let kind = format!("{group}/{version}");
        found(
            Blocker::OwnerReferences,
            format!(
                "{} of {} objects name an owner in {kind} in their ownerReferences (for example {}): once {version} is gone the garbage collector cannot resolve them, and never deletes them",
                count.objects,
                count.of,
                examples.join(", ")
            ),
            Some(count.objects),
            format!(
                "change their ownerReferences[].apiVersion to {group}/{storage_version} (the owner's uid stays the same)"
            ),
        );
    }
    if !unread.is_empty() {
        found(
            Blocker::Unverified,
            format!(
                "the ownerReferences of {} resources could not be read: {}",
                unread.len(),
                unread.join("; ")
            ),
            Some(unread.len() as u64),
            "let kube-svm list them (metadata only), or check their ownerReferences yourself"
                .to_owned(),
        );
    }
    match &facts.requests {
        Ok(r) if !facts.served && r.not_found > 0 => notes.push(format!(
            "clients asked for {version} {} times while it was not served (answered 404): they fail already, and will go on failing once it is removed",
            r.not_found
        )),
        Ok(_) => {}
        Err(why) => notes.push(format!("requests for {version} were not counted: {why}")),
    }
    if requests.is_some() {
        notes.push(
            "request counts are the answering apiserver's own, since it started: with several apiservers, ask each"
                .to_owned(),
        );
    }
    Verdict {
        group: group.clone(),
        resource: resource.clone(),
        version: version.clone(),
        removable: blockers.is_empty(),
        blockers,
        requests: requests.cloned(),
        notes,
    }
}

/// `apiserver_request_total` for `group`, `version` and `resource` in the Prometheus text an
/// apiserver serves on `/metrics`.
pub fn requests_in(metrics: &str, group: &str, version: &str, resource: &str) -> RequestCounts {
    let mut requests = RequestCounts::default();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else { continue };
        let Some((labels, value)) = rest.rsplit_once('}') else { continue };
        let value = value.trim().parse::<f64>().unwrap_or(0.0);
        let label = |name: &str| label_value(labels, name);
        if label("group").as_deref() != Some(group)
            || label("version").as_deref() != Some(version)
            || label("resource").as_deref() != Some(resource)
        {
            continue;
        }
        // Counters are integers written as floats.
        let count = value.max(0.0) as u64;
        requests.total += count;
        match label("code").as_deref() {
            Some(code) if code.starts_with('2') => requests.served += count,
            Some("404") => requests.not_found += count,
            _ => {}
        }
    }
    requests
}

/// The value of label `name` in `a="1",b="2"` (the labels of one line of the Prometheus text
/// format), unescaped.
pub fn label_value(labels: &str, name: &str) -> Option<String> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, escaped)) => value.push(escaped),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        if key.trim_start_matches(',').trim() == name {
            return Some(value);
        }
        rest = after[end..].trim_start_matches(',');
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            group: "example.com".into(),
            resource: "widgets".into(),
            version: "v1".into(),
            storage_version: "v2".into(),
            served: false,
            stored_versions: vec!["v2".into()],
            managed_fields: Count { objects: 0, of: 12 },
            requests: Ok(RequestCounts::default()),
            stored: Some(Count::default()),
            migration: None,
            dependents: Dependents { count: Count { objects: 0, of: 40 }, ..Default::default() },
        }
    }

    fn blockers(facts: &Facts) -> Vec<Blocker> {
        judge(facts).blockers.iter().map(|found| found.blocker).collect()
    }

    #[test]
    fn nothing_left_means_removable() {
        let verdict = judge(&facts());
        assert!(verdict.removable && verdict.blockers.is_empty(), "{verdict:?}");
    }

    #[test]
    fn each_blocker_is_listed_in_the_order_to_clear_them() {
        let all = Facts {
            storage_version: "v1".into(),
            served: true,
            stored_versions: vec!["v1".into(), "v2".into()],
            managed_fields: Count { objects: 3, of: 12 },
            stored: Some(Count { objects: 5, of: 0 }),
            ..facts()
        };
        use Blocker::*;
        let expected = [StorageVersion, StoredVersions, Served, ManagedFields, StoredObjects];
        assert_eq!(blockers(&all), expected);
        let verdict = judge(&all);
        assert!(!verdict.removable);
        let managed = &verdict.blockers[3];
        assert_eq!(managed.count, Some(3));
        assert!(managed.clear.starts_with("once v1 is no longer served, kube-svm migrate --clean-managed-fields widgets.example.com"), "{}", managed.clear);
    }

    #[test]
    fn owner_references_to_the_version_block_it() {
        let owned = Facts {
            dependents: Dependents {
                count: Count { objects: 2, of: 40 },
                examples: vec!["configmaps default/a".into(), "configmaps default/b".into()],
                unread: Vec::new(),
            },
            ..facts()
        };
        let verdict = judge(&owned);
        assert!(!verdict.removable);
        assert_eq!(blockers(&owned), [Blocker::OwnerReferences]);
        let found = &verdict.blockers[0];
        assert!(found.message.contains("for example configmaps default/a"), "{}", found.message);
        assert!(found.clear.contains("example.com/v2"), "{}", found.clear);
    }

    #[test]
    fn what_the_census_or_the_owner_scan_could_not_read_is_no_silent_yes() {
        let blind = Facts { stored: Some(Count { objects: 0, of: 12 }), ..facts() };
        assert_eq!(blockers(&blind), [Blocker::Unverified]);
        assert!(!judge(&blind).removable);
        let unread =
            Dependents { unread: vec!["leases.example.io: 403".into()], ..Default::default() };
        let unlisted = Facts { dependents: unread, ..facts() };
        assert_eq!(blockers(&unlisted), [Blocker::Unverified]);
    }

    #[test]
    fn what_could_not_be_looked_at_is_said_not_hidden() {
        let unknown = Facts { requests: Err("HTTP 403".into()), stored: None, ..facts() };
        let verdict = judge(&unknown);
        assert!(verdict.removable);
        assert!(verdict.notes.iter().any(|n| n.contains("not counted: HTTP 403")), "{verdict:?}");
        assert!(verdict.notes.iter().any(|n| n.contains("etcd was not read")), "{verdict:?}");
    }

    #[test]
    fn requests_are_summed_over_verbs_and_codes_of_one_version_only() {
        let metrics = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="example.com",resource="widgets",scope="resource",subresource="",verb="GET",version="v1"} 7
apiserver_request_total{code="201",component="apiserver",dry_run="",group="example.com",resource="widgets",scope="resource",subresource="",verb="APPLY",version="v1"} 3
apiserver_request_total{code="404",component="apiserver",dry_run="",group="example.com",resource="widgets",scope="resource",subresource="",verb="GET",version="v1"} 2
apiserver_request_total{code="409",component="apiserver",dry_run="",group="example.com",resource="widgets",scope="resource",subresource="",verb="PATCH",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="example.com",resource="widgets",scope="resource",subresource="",verb="GET",version="v2"} 50
apiserver_request_total{code="200",component="apiserver",dry_run="",group="other.com",resource="widgets",scope="resource",subresource="",verb="GET",version="v1"} 50
apiserver_request_total_other{group="example.com",resource="widgets",version="v1"} 9
"#;
        let counted = requests_in(metrics, "example.com", "v1", "widgets");
        assert_eq!(counted, RequestCounts { total: 13, served: 10, not_found: 2 });
    }

    #[test]
    fn label_values_are_unescaped_and_found_wherever_they_are() {
        let labels = r#"a="x\"y",group="g\\h",version="v1""#;
        assert_eq!(label_value(labels, "a").as_deref(), Some("x\"y"));
        assert_eq!(label_value(labels, "group").as_deref(), Some("g\\h"));
        assert_eq!(label_value(labels, "version").as_deref(), Some("v1"));
        assert_eq!(label_value(labels, "code"), None);
    }
}
