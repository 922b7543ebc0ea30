//! Where kube-apiserver keeps each resource in etcd, and which resource a key belongs to.
//!
//! kube-apiserver stores an object at `<etcd prefix>/<resource prefix>/[<namespace>/]<name>`.
//! For built-in resources the resource prefix is the resource name alone, whatever its group
//! (`/registry/deployments/...`), except for a few names kept from early releases
//! (`SpecialDefaultResourcePrefixes` in `pkg/kubeapiserver/default_storage_factory_builder.go`).
//! Custom resources, CRDs themselves (`apiextensions.k8s.io`) and APIServices
//! (`apiregistration.k8s.io`) are kept under `<group>/<resource>`. A cluster that overrides
//! prefixes (`--etcd-prefix`, `--etcd-servers-overrides`) needs the key prefix given directly.

use crate::api::GroupResource;

/// The API groups whose resources kube-apiserver 1.37 stores under the resource name alone
/// (`kubectl api-resources` on a plain kube-apiserver, minus the groups nothing is stored for).
const BUILT_IN_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apps",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "extensions",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Built-in resources kept under another name: (group, resource, resource prefix).
const SPECIAL_PREFIXES: &[(&str, &str, &str)] = &[
    ("", "replicationcontrollers", "controllers"),
    ("", "endpoints", "services/endpoints"),
    ("", "nodes", "minions"),
    ("", "services", "services/specs"),
    ("extensions", "ingresses", "ingress"),
    ("networking.k8s.io", "ingresses", "ingress"),
    ("extensions", "podsecuritypolicies", "podsecuritypolicy"),
    ("policy", "podsecuritypolicies", "podsecuritypolicy"),
];

/// A resource and the keys that hold its objects.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Located {
    /// `None` when only the key prefix was given, or the group could not be told from the key.
    pub group: Option<String>,
    /// The resource's plural name, such as `secrets`; empty when only the key prefix was given.
    pub resource: String,
    /// Ends with `/`.
    pub key_prefix: String,
}

impl Located {
    /// `resource.group` as kubectl writes it (`secrets` for core), or the key prefix when the
    /// resource is not known.
    pub fn name(&self) -> String {
        match self.group.as_deref() {
            Some("") => self.resource.clone(),
            Some(group) => format!("{}.{group}", self.resource),
            None if self.resource.is_empty() => self.key_prefix.clone(),
            None => self.resource.clone(),
        }
    }
}

/// Where `argument` is kept under `etcd_prefix`: `resource[.group]` as kubectl takes it
/// (`secrets`, `deployments.apps`, `widgets.example.com`), or a key prefix starting with `/`
/// taken as it is.
pub fn locate(etcd_prefix: &str, argument: &str) -> Located {
    if argument.starts_with('/') {
        let key_prefix = format!("{}/", argument.trim_end_matches('/'));
        return Located { group: None, resource: String::new(), key_prefix };
    }
    let GroupResource { group, resource } = GroupResource::parse(argument);
    let (group, resource) = (group.as_str(), resource.as_str());
    let etcd_prefix = etcd_prefix.trim_end_matches('/');
    let special = SPECIAL_PREFIXES.iter().find(|(g, r, _)| *g == group && *r == resource);
    let key_prefix = match special {
        Some((_, _, prefix)) => format!("{etcd_prefix}/{prefix}/"),
        None if BUILT_IN_GROUPS.contains(&group) => format!("{etcd_prefix}/{resource}/"),
        None => format!("{etcd_prefix}/{group}/{resource}/"),
    };
    Located { group: Some(group.to_owned()), resource: resource.to_owned(), key_prefix }
}

/// The resource a key under `etcd_prefix` belongs to, read from the key alone: a first segment
/// with a dot is a group, the special prefixes map back to their resources, and anything else
/// is a built-in resource whose group the stored value tells (`group: None` here).
pub fn resource_of(etcd_prefix: &str, key: &[u8]) -> Option<Located> {
    let etcd_prefix = etcd_prefix.trim_end_matches('/');
    let rest = key.strip_prefix(etcd_prefix.as_bytes())?.strip_prefix(b"/")?;
    let rest = std::str::from_utf8(rest).ok()?;
    let mut segments = rest.split('/');
    let first = segments.next().filter(|s| !s.is_empty())?;
    let second = segments.next();
    let special = SPECIAL_PREFIXES.iter().find(|(_, _, prefix)| match prefix.split_once('/') {
        Some((a, b)) => a == first && second == Some(b),
        None => *prefix == first,
    });
    let located = |group: Option<&str>, resource: &str, prefix: &str| Located {
        group: group.map(str::to_owned),
        resource: resource.to_owned(),
        key_prefix: format!("{etcd_prefix}/{prefix}/"),
    };
    if let Some((group, resource, prefix)) = special {
        // Ingresses are served by two groups from one prefix; the value tells which wrote it.
        let group =
            (*resource != "ingresses" && *resource != "podsecuritypolicies").then_some(*group);
        return Some(located(group, resource, prefix));
    }
    if first.contains('.') {
        let resource = second.filter(|s| !s.is_empty())?;
        return Some(located(Some(first), resource, &format!("{first}/{resource}")));
    }
    Some(located(None, first, first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(argument: &str) -> String {
        locate("/registry", argument).key_prefix
    }

    #[test]
    fn locates_resources_the_way_kube_apiserver_stores_them() {
        assert_eq!(prefix("secrets"), "/registry/secrets/");
        assert_eq!(prefix("deployments.apps"), "/registry/deployments/");
        assert_eq!(prefix("Leases.coordination.k8s.io"), "/registry/leases/");
        assert_eq!(prefix("services"), "/registry/services/specs/");
        assert_eq!(prefix("nodes"), "/registry/minions/");
        assert_eq!(prefix("ingresses.networking.k8s.io"), "/registry/ingress/");
        assert_eq!(prefix("widgets.example.com"), "/registry/example.com/widgets/");
        // A CRD in a k8s.io group that kube-apiserver does not serve itself.
        assert_eq!(
            prefix("gateways.gateway.networking.k8s.io"),
            "/registry/gateway.networking.k8s.io/gateways/"
        );
        assert_eq!(
            prefix("customresourcedefinitions.apiextensions.k8s.io"),
            "/registry/apiextensions.k8s.io/customresourcedefinitions/"
        );
        assert_eq!(locate("/custom/", "secrets").key_prefix, "/custom/secrets/");
        let raw = locate("/registry", "/registry/secrets/team-a");
        assert_eq!(
            (raw.key_prefix.as_str(), raw.name()),
            ("/registry/secrets/team-a/", "/registry/secrets/team-a/".into())
        );
    }

    #[test]
    fn names_follow_kubectl() {
        assert_eq!(locate("/registry", "secrets").name(), "secrets");
        assert_eq!(locate("/registry", "widgets.example.com").name(), "widgets.example.com");
    }

    #[test]
    fn tells_the_resource_from_a_key() {
        let of = |key: &str| resource_of("/registry", key.as_bytes());
        let cr = of("/registry/example.com/widgets/team-a/w-1").unwrap();
        assert_eq!(
            (cr.name(), cr.key_prefix.as_str()),
            ("widgets.example.com".into(), "/registry/example.com/widgets/")
        );
        let service = of("/registry/services/specs/default/kubernetes").unwrap();
        assert_eq!(
            (service.name(), service.key_prefix.as_str()),
            ("services".into(), "/registry/services/specs/")
        );
        assert_eq!(
            of("/registry/services/endpoints/default/kubernetes").unwrap().name(),
            "endpoints"
        );
        assert_eq!(of("/registry/minions/node-1").unwrap().name(), "nodes");
        let deployment = of("/registry/deployments/default/web").unwrap();
        assert_eq!((deployment.group, deployment.resource.as_str()), (None, "deployments"));
        assert_eq!(of("/registry/ingress/default/web").unwrap().group, None);
        assert_eq!(of("/other/secrets/a"), None);
        assert_eq!(of("/registry/"), None);
        assert_eq!(of("/registry/example.com"), None);
    }
}
