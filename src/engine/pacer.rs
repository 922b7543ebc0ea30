//! What a run asks before each request, whatever its pace: a [`Pacer`].
//!
//! Every run keeps its writes in a window (`window`) whose band its pace chooses. A run at the
//! fast pace, or at the gentle pace with the foreground budget off, is paced by that window
//! alone ([`ByWindow`]); a gentle run with a budget also waits for the rate the probe steers
//! ([`ByProbe`]), which every such run of the process shares.

use std::sync::Arc;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use super::foreground::{Flight, Foreground, Steered};
use crate::api::Budget;

/// What a run asks before each request.
pub trait Pacer: Send + Sync {
    /// Waits until a write may go. A write the probe's rate admitted is in flight until its
    /// [`Flight`] is dropped.
    fn admit(&self) -> BoxFuture<'_, Option<Flight>>;

    /// Waits until a list may go.
    fn before_list(&self) -> BoxFuture<'_, ()>;

    /// What steers the rate, where a probe does.
    fn seen(&self) -> Option<Steered>;
}

/// Paced by the write window alone.
pub struct ByWindow;

impl Pacer for ByWindow {
    fn admit(&self) -> BoxFuture<'_, Option<Flight>> {
        futures::future::ready(None).boxed()
    }

    fn before_list(&self) -> BoxFuture<'_, ()> {
        futures::future::ready(()).boxed()
    }

    fn seen(&self) -> Option<Steered> {
        None
    }
}

/// At the rate the probe steers, with the budget the migration asks for, if any.
pub struct ByProbe {
    pub gate: Arc<Foreground>,
    pub budget: Option<Budget>,
}

impl Pacer for ByProbe {
    fn admit(&self) -> BoxFuture<'_, Option<Flight>> {
        async move { Some(self.gate.admit(self.budget).await) }.boxed()
    }

    /// After any quiet window under way: a run's lists keep quiet in it too, or they would be
    /// measured as the cluster's own load.
    fn before_list(&self) -> BoxFuture<'_, ()> {
        self.gate.quiet().boxed()
    }

    fn seen(&self) -> Option<Steered> {
        Some(self.gate.seen())
    }
}
