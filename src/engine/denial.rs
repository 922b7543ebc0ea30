//! Telling a real denial from an apiserver that is still starting.
//!
//! A 403 usually means that an admission webhook or policy refused the object, or that
//! kube-svm's RBAC does not allow the verb. But a kube-apiserver that has just (re)started answers
//! `/readyz` before its authorizer has loaded the RBAC rules, and for a few seconds denies what it
//! will allow a moment later (seen on the test control plane at every restart). So on a 403 the
//! engine asks the apiserver whether it may do what it just did, with a SelfSubjectAccessReview
//! (which every authenticated user may create):
//! - the review is refused or unanswered: the authorizer is not ready; the request is tried
//!   again after a backoff without charging the object, a bounded number of times;
//! - the review says denied: kube-svm's RBAC forbids it; the object fails at once;
//! - the review says allowed: the denial came from admission (or was momentary); the object is
//!   retried like any other failure and fails once its attempts are spent.
//!
//! Reviews are cached per verb and namespace for a few seconds, so a resource denied wholesale
//! costs one review, not one per object.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;
use tracing::warn;

use super::request::{Access, Attempts, Next};
use super::retry::Retry;
use super::{Engine, RunState};

/// How long a review's answer is reused.
const REVIEW_TTL: Duration = Duration::from_secs(5);

/// Times a request denied by an authorizer that cannot say why is tried again: with the
/// engine's backoff (doubling from 0.2 s, at most 10 s), about a minute.
const STARTING_ATTEMPTS: u32 = 10;

/// Recent reviews of one run, by verb, subresource and namespace: when, and whether allowed.
#[derive(Default)]
pub(super) struct Reviews(Mutex<HashMap<String, (Instant, bool)>>);

/// What the apiserver says of a denied request.
enum Review {
    Allowed,
    Denied,
    /// It could not say: its authorizer is not ready.
    Unknown,
}

impl Engine {
    /// What to do after the request described by `access` was answered 403.
    pub(super) async fn after_denial(
        &self,
        run: &RunState,
        access: &Access<'_>,
        attempts: &mut Attempts,
        other_limit: u32,
    ) -> Next {
        let (count, limit) = match self.review(run, access).await {
            Review::Denied => return Next::GiveUp,
            Review::Allowed => {
                attempts.other += 1;
                (attempts.other, other_limit)
            }
            Review::Unknown => {
                attempts.excused += 1;
                (attempts.excused, STARTING_ATTEMPTS)
            }
        };
        if count >= limit {
            return Next::GiveUp;
        }
        if let Retry::After(wait) = self.settings.backoff.decide(None, None, count, fastrand::f64())
        {
            tokio::time::sleep(wait).await;
        }
        Next::Retry
    }

    async fn review(&self, run: &RunState, access: &Access<'_>) -> Review {
        let Access { resource, verb, namespace, subresource } = access;
        let key = format!("{verb}/{}/{namespace}", subresource.unwrap_or_default());
        let cached = run.reviews.lock().get(&key).copied();
        if let Some((at, allowed)) = cached
            && at.elapsed() < REVIEW_TTL
        {
            return if allowed { Review::Allowed } else { Review::Denied };
        }
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(resource.group.clone()),
                    version: Some(resource.version.clone()),
                    resource: Some(resource.plural.clone()),
                    subresource: subresource.map(str::to_owned),
                    namespace: Some(namespace.to_string()).filter(|n| !n.is_empty()),
                    verb: Some(verb.to_string()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let Some(limit) = run.fence.deadline(self.settings.request_timeout) else {
            return Review::Unknown;
        };
        let params = PostParams::default();
        match tokio::time::timeout(limit, reviews.create(&params, &review)).await {
            Ok(Ok(review)) => {
                let allowed = review.status.is_some_and(|s| s.allowed);
                run.reviews.lock().insert(key, (Instant::now(), allowed));
                if allowed { Review::Allowed } else { Review::Denied }
            }
            Ok(Err(error)) => {
                warn!(%resource, verb, error = %crate::error_chain(&error), "denied, and the apiserver cannot say why yet");
                Review::Unknown
            }
            Err(_) => Review::Unknown,
        }
    }
}

impl Reviews {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, bool)>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
