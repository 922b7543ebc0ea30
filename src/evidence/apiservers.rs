//! How many kube-apiservers serve the cluster, and whether discovery samples taken through fresh
//! connections can be answers of different ones.
//!
//! Sampling discovery through new connections shows every apiserver's answer only when the
//! connections spread over them. Three things defeat it, and kube-svm looks for each before it
//! trusts agreeing samples:
//! - an aggregated API (an APIService with a backend Service): kube-apiserver proxies its
//!   discovery over kept-alive connections of its own, so any number of samples may all be one
//!   replica's answer, and that server's replicas are not counted anywhere;
//! - `sessionAffinity: ClientIP` on the `default/kubernetes` Service: every connection of a client
//!   in the cluster goes to the apiserver its first one reached;
//! - too few apiservers counted (an apiserver without its identity Lease, or one whose clock is
//!   off): fewer samples are taken than its number needs. The endpoints of the `kubernetes`
//!   Service (the endpoint reconciler lists one address per apiserver) are counted too, and the
//!   larger count is used.
//!
//! What no request can show: a load balancer outside the cluster that keeps a client on one
//! apiserver. The evidence says it rests on connections being spread.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{ListParams, ObjectList};
use kube::{Api, Client};

/// Tries of a list whose answer may differ if asked again, [`LIST_AGAIN_AFTER`] apart.
const LIST_TRIES: u32 = 3;
const LIST_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

/// The label kube-apiserver puts on its identity Lease in `kube-system` (APIServerIdentity, on
/// by default since Kubernetes 1.26).
const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity=kube-apiserver";

/// How many apiservers to sample for when their identity Leases cannot be read: more than most
/// control planes run, so the samples err on the safe side.
pub const ASSUMED_APISERVERS: usize = 5;

/// The namespace and name of the Service through which clients in the cluster reach the
/// apiservers; kube-apiserver creates it and keeps its endpoints.
const KUBERNETES_SERVICE: (&str, &str) = ("default", "kubernetes");

/// The label EndpointSlices carry naming their Service (`discovery.k8s.io/v1`).
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The `sessionAffinity` that pins a client's connections to one backend.
const CLIENT_IP: &str = "ClientIP";

/// What was read about the control plane: each fact, or why it could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Survey {
    /// The group version whose discovery is sampled (`v1` for the core group).
    pub group_version: String,
    /// How many kube-apiserver identity Leases are current.
    pub leases: Result<usize, String>,
    /// How many distinct addresses the `kubernetes` Service's EndpointSlices list.
    pub endpoints: Result<usize, String>,
    /// The `kubernetes` Service's `sessionAffinity` (`None` when it has none).
    pub affinity: Result<Option<String>, String>,
    /// The Service an aggregated group version is proxied to (`namespace/name`); `None` when
    /// kube-apiserver serves it itself.
    pub aggregated: Result<Option<String>, String>,
}

/// How many apiservers discovery is sampled for, and how they were counted, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Count {
    /// The number sampled for.
    pub apiservers: usize,
    /// How it was reached: `3 apiservers counted (identity Leases: 3; ...)`.
    pub counted: String,
}

/// Why agreeing discovery samples cannot show how every apiserver encodes a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unsampleable {
    /// The group version is served by an aggregated API server behind this Service.
    Aggregated {
        /// The group version.
        group_version: String,
        /// The backend Service, `namespace/name`.
        service: String,
    },
    /// Whether the group version is aggregated could not be read.
    AggregationUnknown {
        /// The group version.
        group_version: String,
        /// Why it could not be read.
        why: String,
    },
    /// The `kubernetes` Service has client-IP affinity: a client's connections reach one
    /// apiserver.
    ClientIpAffinity(Count),
    /// The `kubernetes` Service could not be read, so client-IP affinity cannot be ruled out.
    AffinityUnknown {
        /// The apiservers counted.
        count: Count,
        /// Why it could not be read.
        why: String,
    },
}

impl Unsampleable {
    /// Whether the refusal rests on what was read (an aggregated API, client-IP affinity), not
    /// on a read that failed and may succeed when asked again.
    pub fn is_definite(&self) -> bool {
        matches!(self, Unsampleable::Aggregated { .. } | Unsampleable::ClientIpAffinity(_))
    }
}

impl fmt::Display for Unsampleable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (namespace, name) = KUBERNETES_SERVICE;
        match self {
            Unsampleable::Aggregated { group_version, service } => write!(
                f,
                "{group_version} is an aggregated API served through the Service {service}: kube-apiserver proxies its discovery over kept-alive connections, so samples of it may all come from one replica and cannot show that every replica encodes alike"
            ),
            Unsampleable::AggregationUnknown { group_version, why } => write!(
                f,
                "whether {group_version} is an aggregated API (proxied to replicas samples cannot tell apart) could not be read: {why}"
            ),
            Unsampleable::ClientIpAffinity(count) => write!(
                f,
                "the Service {namespace}/{name} has sessionAffinity: {CLIENT_IP}, so every new connection of a client in the cluster reaches the same apiserver: samples cannot show how the others of the {} encode",
                count.counted
            ),
            Unsampleable::AffinityUnknown { count, why } => write!(
                f,
                "the Service {namespace}/{name} could not be read ({why}), so sessionAffinity: {CLIENT_IP} (every connection to one apiserver) cannot be ruled out among the {}",
                count.counted
            ),
        }
    }
}

/// How many apiservers to sample for: the larger of the current identity Leases and the
/// `kubernetes` Service's endpoint addresses (each can undercount: an apiserver without its
/// Lease, a reconciler that lists none), or [`ASSUMED_APISERVERS`] when the Leases cannot be
/// read and the endpoints do not show more.
pub fn count(leases: &Result<usize, String>, endpoints: &Result<usize, String>) -> Count {
    let listed = endpoints.as_ref().map_or(0, |n| *n);
    let endpoint_words = match endpoints {
        Ok(n) => format!("endpoint addresses of the kubernetes Service: {n}"),
        Err(why) => format!("endpoints of the kubernetes Service not read: {why}"),
    };
    let (apiservers, lease_words) = match leases {
        Ok(n) => ((*n).max(listed), format!("identity Leases: {n}")),
        Err(why) => (
            ASSUMED_APISERVERS.max(listed),
            format!("identity Leases not read ({why}), so {ASSUMED_APISERVERS} assumed"),
        ),
    };
    let noun = if apiservers == 1 { "apiserver" } else { "apiservers" };
    Count {
        apiservers,
        counted: format!("{apiservers} {noun} counted ({lease_words}; {endpoint_words})"),
    }
}

/// Whether agreeing discovery samples of `survey`'s group version can stand for every
/// apiserver, and for how many to sample if so. Refuses an aggregated API (and one not known
/// not to be), and, among more than one apiserver, client-IP affinity (and affinity not known
/// to be absent).
pub fn sampling(survey: &Survey) -> Result<Count, Unsampleable> {
    let group_version = survey.group_version.clone();
    match &survey.aggregated {
        Ok(None) => {}
        Ok(Some(service)) => {
            return Err(Unsampleable::Aggregated { group_version, service: service.clone() });
        }
        Err(why) => {
            return Err(Unsampleable::AggregationUnknown { group_version, why: why.clone() });
        }
    }
    let count = count(&survey.leases, &survey.endpoints);
    if count.apiservers <= 1 {
        return Ok(count);
    }
    match &survey.affinity {
        Ok(Some(affinity)) if affinity == CLIENT_IP => Err(Unsampleable::ClientIpAffinity(count)),
        Ok(_) => Ok(count),
        Err(why) => Err(Unsampleable::AffinityUnknown { count, why: why.clone() }),
    }
}

/// The chance, at least, that `samples` connections each handed to one of `apiservers` at
/// random asked every one of them: `1 - n (1 - 1/n)^k` (the chance that any one is missed,
/// summed over all).
pub fn asked_every_apiserver(apiservers: usize, samples: u32) -> f64 {
    if apiservers <= 1 {
        return 1.0;
    }
    let n = apiservers as f64;
    let missed_by_one = (1.0 - 1.0 / n).powi(i32::try_from(samples).unwrap_or(i32::MAX));
    (1.0 - n * missed_by_one).max(0.0)
}

/// Reads what [`sampling`] decides on, for discovery of `group`/`version`.
pub async fn survey(client: &Client, group: &str, version: &str) -> Survey {
    let group_version = match group {
        "" => version.to_owned(),
        _ => format!("{group}/{version}"),
    };
    Survey {
        group_version,
        leases: identity_leases(client).await,
        endpoints: endpoint_addresses(client).await,
        affinity: affinity(client).await,
        aggregated: aggregated(client, group, version).await,
    }
}

/// How many apiservers to sample for ([`count`]): the larger of the identity Leases and the
/// `kubernetes` Service's endpoint addresses.
pub async fn apiservers_or_assumed(client: &Client) -> usize {
    count(&identity_leases(client).await, &endpoint_addresses(client).await).apiservers
}

/// How many kube-apiserver identity Leases in `kube-system` were renewed within their duration.
/// Says why when they cannot be counted.
pub async fn identity_leases(client: &Client) -> Result<usize, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let params = ListParams::default().labels(IDENTITY_LABEL);
    let list = list_patiently(&leases, &params).await.map_err(|e| crate::error_chain(&e))?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let live = list
        .items
        .iter()
        .filter(|lease| {
            let Some(spec) = &lease.spec else { return false };
            let (Some(renewed), Some(seconds)) = (&spec.renew_time, spec.lease_duration_seconds)
            else {
                return false;
            };
            let age = now.duration_since(renewed.0).as_secs_f64();
            age <= f64::from(seconds)
        })
        .count();
    match live {
        0 => Err("no kube-apiserver identity Lease in kube-system is current".to_owned()),
        n => Ok(n),
    }
}

/// Lists `api`, asking again a few times (a moment apart) when the answer may differ if asked
/// again: an apiserver going down behind the balancer fails a request or two, and what counts the
/// apiservers should not fall back to an assumption for that.
async fn list_patiently<K>(api: &Api<K>, params: &ListParams) -> Result<ObjectList<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut tries = 1;
    loop {
        match api.list(params).await {
            Err(error) if tries < LIST_TRIES && crate::apiserver::answers::is_transient(&error) => {
                tries += 1;
                tokio::time::sleep(LIST_AGAIN_AFTER).await;
            }
            listed => return listed,
        }
    }
}

/// How many distinct addresses the `kubernetes` Service's EndpointSlices list (0 when the
/// endpoint reconciler is off).
async fn endpoint_addresses(client: &Client) -> Result<usize, String> {
    let (namespace, name) = KUBERNETES_SERVICE;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}"));
    let list = list_patiently(&slices, &params).await.map_err(|e| crate::error_chain(&e))?;
    let addresses: BTreeSet<&String> = list
        .items
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|endpoint| endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|endpoint| &endpoint.addresses)
        .collect();
    Ok(addresses.len())
}

/// The `kubernetes` Service's `sessionAffinity`.
async fn affinity(client: &Client) -> Result<Option<String>, String> {
    let (namespace, name) = KUBERNETES_SERVICE;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let service = services.get(name).await.map_err(|e| crate::error_chain(&e))?;
    Ok(service.spec.and_then(|spec| spec.session_affinity).filter(|a| a != "None"))
}

/// The backend Service of `group`/`version`'s APIService, `None` when kube-apiserver serves it
/// itself (the core group, built-in groups, CRDs) or no APIService names it (then the
/// aggregator proxies nothing for it).
async fn aggregated(client: &Client, group: &str, version: &str) -> Result<Option<String>, String> {
    if group.is_empty() {
        return Ok(None);
    }
    let services: Api<APIService> = Api::all(client.clone());
    let found = services.get_opt(&format!("{version}.{group}")).await;
    let found = found.map_err(|e| crate::error_chain(&e))?;
    Ok(found
        .and_then(|s| s.spec?.service)
        .map(|s| format!("{}/{}", s.namespace.unwrap_or_default(), s.name.unwrap_or_default())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survey(apiservers: usize, affinity: Option<&str>) -> Survey {
        Survey {
            group_version: "example.com/v2".into(),
            leases: Ok(apiservers),
            endpoints: Ok(0),
            affinity: Ok(affinity.map(Into::into)),
            aggregated: Ok(None),
        }
    }

    #[test]
    fn spread_connections_are_sampled_for_every_apiserver_counted() {
        let count = sampling(&survey(3, None)).expect("sampled");
        assert_eq!(count.apiservers, 3);
        assert!(count.counted.starts_with("3 apiservers counted (identity Leases: 3"), "{count:?}");
    }

    #[test]
    fn an_aggregated_api_is_never_sampled() {
        let aggregated =
            Survey { aggregated: Ok(Some("openshift-apiserver/api".into())), ..survey(1, None) };
        let refusal = sampling(&aggregated).expect_err("proxied discovery proves nothing");
        assert!(matches!(refusal, Unsampleable::Aggregated { .. }));
        assert!(refusal.to_string().contains("openshift-apiserver/api"), "{refusal}");
        let unknown = Survey { aggregated: Err("forbidden".into()), ..survey(3, None) };
        assert!(matches!(sampling(&unknown), Err(Unsampleable::AggregationUnknown { .. })));
    }

    #[test]
    fn client_ip_affinity_among_several_apiservers_refuses_sampling() {
        let refusal = sampling(&survey(3, Some("ClientIP"))).expect_err("pinned");
        assert!(matches!(refusal, Unsampleable::ClientIpAffinity(ref c) if c.apiservers == 3));
        assert!(refusal.to_string().contains("sessionAffinity: ClientIP"), "{refusal}");
        // Affinity that cannot be ruled out is no better.
        let unread = Survey { affinity: Err("forbidden".into()), ..survey(3, None) };
        let unknown = sampling(&unread).expect_err("affinity not ruled out");
        assert!(matches!(unknown, Unsampleable::AffinityUnknown { .. }));
        assert!(refusal.is_definite() && !unknown.is_definite());
        // One apiserver is asked whatever the affinity.
        assert_eq!(sampling(&survey(1, Some("ClientIP"))).map(|c| c.apiservers), Ok(1));
        // An affinity counts whatever says there is more than one apiserver: here the endpoints.
        let endpoints = Survey { endpoints: Ok(2), ..survey(1, Some("ClientIP")) };
        assert!(matches!(sampling(&endpoints), Err(Unsampleable::ClientIpAffinity(_))));
    }

    #[test]
    fn undercounted_leases_give_way_to_the_endpoints() {
        assert_eq!(count(&Ok(1), &Ok(3)).apiservers, 3);
        assert_eq!(count(&Ok(3), &Ok(1)).apiservers, 3);
        assert_eq!(count(&Ok(2), &Err("forbidden".into())).apiservers, 2);
        assert_eq!(count(&Err("none".into()), &Ok(2)).apiservers, ASSUMED_APISERVERS);
        assert_eq!(count(&Err("none".into()), &Ok(7)).apiservers, 7);
        let words = count(&Ok(1), &Ok(3)).counted;
        assert!(words.contains("Leases: 1") && words.contains("Service: 3"), "{words}");
    }

    #[test]
    fn the_chance_that_every_apiserver_was_asked() {
        assert_eq!(asked_every_apiserver(1, 2), 1.0);
        let three = asked_every_apiserver(3, 12);
        assert!((0.97..0.98).contains(&three), "{three}");
        assert_eq!(asked_every_apiserver(5, 1), 0.0);
    }
}
