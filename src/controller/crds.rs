//! The controller's start-up gate: it waits until kube-svm's CRDs are installed, keep every
//! field kube-svm writes, and are established. Until then it migrates nothing and starts no
//! watch, `/readyz` says why, the log says it once with what the operator must do, and a CRD
//! that is someone else's gets a Warning Event. The decisions are [`crate::api::installed`]'s.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Resource};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::conditions::events;
use crate::api::installed::{self, TAKE_OVER_COMMAND, Unusable};
use crate::apiserver::requests::Requests;
use crate::ops::server::Health;

/// How often the CRDs are read again while they cannot be used: kube-svm's start-up poll has
/// always been 2 s; two GETs that often cost the apiserver nothing, and a controller started
/// next to `helm install` begins within seconds of the CRDs being established.
const RECHECK: Duration = Duration::from_secs(2);

/// One of kube-svm's CRDs that cannot be used.
struct Problem {
    name: String,
    /// The CRD as installed; `None` when it is not.
    installed: Option<CustomResourceDefinition>,
    unusable: Unusable,
}

/// What one look found.
enum Found {
    Usable,
    Unusable(Vec<Problem>),
    /// A CRD could not be read (no answer, no permission): why.
    Unreadable(String),
}

/// Waits until kube-svm's CRDs can be used; `false` when `shutdown` fired first. Every request
/// is bounded by the request timeout, and the whole wait by `shutdown`.
pub async fn wait_until_usable(
    requests: &Requests,
    health: &Health,
    identity: &str,
    shutdown: &CancellationToken,
) -> bool {
    let reporter = Reporter { controller: "kube-svm".into(), instance: Some(identity.to_owned()) };
    let recorder = Recorder::new(requests.client().clone(), reporter);
    let mut said: Option<String> = None;
    loop {
        // Waiting is this loop's job: the process is alive (a liveness probe must not restart
        // it into the same wait).
        health.beat();
        let found = tokio::select! {
            () = shutdown.cancelled() => return false,
            found = look(requests) => found,
        };
        let why = match &found {
            Found::Usable => {
                health.set_crds_unusable(None);
                if said.is_some() {
                    info!("kube-svm's CRDs can be used now: starting");
                }
                return true;
            }
            Found::Unusable(problems) => summary(problems),
            Found::Unreadable(why) => why.clone(),
        };
        health.set_crds_unusable(Some(why.clone()));
        // Said once, and again only when it changes.
        if said.as_deref() != Some(why.as_str()) {
            said = Some(why.clone());
            match &found {
                Found::Unusable(problems) => {
                    tell(problems, &why);
                    let published = publish(&recorder, problems, &why);
                    tokio::select! {
                        () = shutdown.cancelled() => return false,
                        _ = requests.read(published) => {}
                    }
                }
                _ => warn!(reason = why, "cannot read kube-svm's CRDs; trying again"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(RECHECK) => {}
        }
    }
}

/// Reads both CRDs and checks them.
async fn look(requests: &Requests) -> Found {
    let api: Api<CustomResourceDefinition> = Api::all(requests.client().clone());
    let mut problems = Vec::new();
    for ours in crate::api::crds() {
        let name = ours.metadata.name.clone().unwrap_or_default();
        let installed = match requests.send(api.get_opt(&name)).await {
            Ok(installed) => installed,
            Err(error) => {
                let error = crate::error_chain(&error);
                return Found::Unreadable(format!("failed to read CRD {name}: {error}"));
            }
        };
        if let Err(unusable) = installed::check(&ours, installed.as_ref()) {
            problems.push(Problem { name, installed, unusable });
        }
    }
    match problems.is_empty() {
        true => Found::Usable,
        false => Found::Unusable(problems),
    }
}

/// One line saying what is wrong and what to do, for `/readyz`, the log and Events.
fn summary(problems: &[Problem]) -> String {
    let missing: Vec<&str> = problems
        .iter()
        .filter(|p| p.unusable == Unusable::Missing)
        .map(|p| p.name.as_str())
        .collect();
    let mut what: Vec<String> = problems
        .iter()
        .filter(|p| p.unusable != Unusable::Missing)
        .map(|p| p.unusable.describe(&p.name))
        .collect();
    if !missing.is_empty() {
        what.insert(0, format!("kube-svm's CRDs are not installed ({})", missing.join(", ")));
    }
    let remedy = if problems.iter().any(|p| p.unusable.foreign()) {
        format!(
            "kube-svm migrates nothing until they are replaced in place, which keeps every \
             existing object: `{TAKE_OVER_COMMAND}`"
        )
    } else if !missing.is_empty() {
        format!(
            "install them with the Helm chart (crds.install=true, the default) or with \
             `{TAKE_OVER_COMMAND}`"
        )
    } else {
        "waiting for the apiserver to establish them".to_owned()
    };
    format!("{}: {remedy}", what.join("; "))
}

/// Logs what was found: an error when the operator must act, else that it waits.
fn tell(problems: &[Problem], why: &str) {
    if problems.iter().all(|p| p.unusable.transient()) {
        info!(reason = why, "waiting for kube-svm's CRDs");
    } else {
        error!(reason = why, "kube-svm's CRDs cannot be used; migrating nothing");
    }
}

/// A Warning Event on each installed CRD that is someone else's.
async fn publish(recorder: &Recorder, problems: &[Problem], why: &str) {
    for problem in problems.iter().filter(|p| p.unusable.foreign()) {
        let Some(crd) = &problem.installed else { continue };
        // Event notes are limited to 1 kB.
        let note: String = why.chars().take(1000).collect();
        let event = Event {
            type_: EventType::Warning,
            reason: events::INCOMPATIBLE_SCHEMA.into(),
            note: Some(note),
            action: "CheckCRD".into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &crd.object_ref(&())).await {
            warn!(%error, crd = problem.name, "failed to publish an event on a CRD");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(name: &str, unusable: Unusable) -> Problem {
        Problem { name: name.into(), installed: None, unusable }
    }

    #[test]
    fn summaries_say_what_is_wrong_and_the_command_that_fixes_it() {
        let missing =
            [problem("a.example", Unusable::Missing), problem("b.example", Unusable::Missing)];
        assert_eq!(
            summary(&missing),
            "kube-svm's CRDs are not installed (a.example, b.example): install them with the \
             Helm chart (crds.install=true, the default) or with `kube-svm crds | kubectl apply \
             --server-side --force-conflicts -f -`"
        );
        let pruned =
            Unusable::PrunesFields { version: "v1".into(), fields: vec![".status.x".into()] };
        let foreign =
            [problem("a.example", pruned), problem("b.example", Unusable::NotEstablished)];
        let text = summary(&foreign);
        let expected = "CRD a.example is not kube-svm's: its v1 schema would drop .status.x; \
                        CRD b.example is not established yet: kube-svm migrates nothing until";
        assert!(text.starts_with(expected), "{text}");
        assert!(text.ends_with(&format!("`{TAKE_OVER_COMMAND}`")), "{text}");
        let waiting = [problem("a.example", Unusable::NotEstablished)];
        assert_eq!(
            summary(&waiting),
            "CRD a.example is not established yet: waiting for the apiserver to establish them"
        );
    }
}
