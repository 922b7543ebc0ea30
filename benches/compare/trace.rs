//! `BENCH_TRACE_MS`: each slow foreground request, and each check of the widgets' watch caches
//! against etcd as the apiserver counts them, printed to stderr with the time of day to the
//! millisecond, to line up with the minute lines and the controller's log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::Client;

use crate::meter::apiserver_account;
use crate::minutes::{Request, clock};

/// Prints each of `requests` (named by their verb) that took `slow` ms or more.
pub fn slow_requests(slow: f64, requests: &[(&str, Request)]) {
    for (verb, request) in requests {
        let millis = request.took.as_secs_f64() * 1000.0;
        if millis >= slow {
            eprintln!("foreground {verb} sent {} took {millis:.1} ms", clock(request.sent));
        }
    }
}

/// Prints when the apiserver's count of its checks of the widgets' watch caches grows, read
/// once a second, until `stop`.
pub async fn checks(admin: Client, stop: Arc<AtomicBool>) {
    let mut seen: Option<f64> = None;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(account) = apiserver_account(&admin).await else { continue };
        if let Some(before) = seen
            && account.checks > before
        {
            eprintln!(
                "the apiserver ended {} check(s) of the widgets' watch caches by {}",
                account.checks - before,
                clock(Instant::now()),
            );
        }
        seen = Some(account.checks);
    }
}
