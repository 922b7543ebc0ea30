//! `make bench`: kube-svm next to the apiserver's own limit and its peers, on one local control
//! plane, in one run. Custom resources spread over 20 namespaces are moved one storage version
//! further by each contender in turn ([`contenders`]), and etcd is read after each to prove every
//! object moved. Beside every contender, and on the idle apiserver before and after them, a
//! foreground client ([`foreground`]) measures what the cluster's own traffic feels of it.
//!
//! Per contender: objects/s, the foreground's latency (and its p99 each minute, printed to stderr
//! as the minute ends: [`minutes`]), requests per object, apiserver and etcd CPU seconds per
//! 1,000 objects, peak RSS of the migrating process, and the kinds of request the apiserver
//! spent its time on meanwhile ([`meter`]). Then a sweep of kube-svm's engine ([`sweep`]). The
//! report goes to `docs/bench.md` and `docs/bench.json` ([`report`]). Throughput drifts as
//! etcd's history grows: the limit is measured at the start and again at the end, and ratios are
//! quoted against their mean.
//!
//! Every `BENCH_*` variable is read once, into [`config::Config`]; `docs/performance.md` lists
//! them with their defaults.

// The integration tests' harness; the bench needs only part of it.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/cluster/support/mod.rs"]
mod support;

mod bench;
mod config;
mod contenders;
mod foreground;
mod meter;
mod minutes;
mod probe;
mod report;
mod sweep;
mod trace;

use bench::Bench;
use config::Config;

#[tokio::main]
async fn main() {
    let config = Config::from_env();
    // A control plane, the widgets seeded, the foreground client sending.
    let mut bench = Bench::start(config).await;
    bench.idle_before().await;
    // What kube-svm's probe and the burst of other load cost by themselves.
    bench.probe_alone().await;
    bench.burst_alone().await;

    // The contenders, one after another, each after a storage switch.
    let limit = "bare client, minimal patch, 64 in flight";
    contenders::limit(&mut bench, "limit-64", 64, limit).await;
    // The contenders that pace themselves beside the client, in rounds (`BENCH_REPEAT`).
    let rounds = bench.config.repeat;
    for round in 1..=rounds {
        bench.round = (rounds > 1).then_some(round);
        contenders::before_build(&mut bench).await;
        contenders::controller_defaults(&mut bench).await;
        contenders::in_tree_and_budgets(&mut bench).await;
    }
    bench.round = None;
    contenders::controller_fast(&mut bench).await;
    contenders::already_current(&mut bench).await;
    contenders::flow_control(&mut bench).await;
    let limit = "bare client, minimal patch, 16 in flight";
    contenders::limit(&mut bench, "limit-16", 16, limit).await;
    contenders::engine(&mut bench).await;
    contenders::upstream_model(&mut bench).await;
    let limit = "bare client, 64 in flight, at the end";
    contenders::limit(&mut bench, "limit-64-again", 64, limit).await;
    if bench.config.selected("idle-after") {
        bench.idle("idle-after", "nothing runs but the foreground client").await;
    }

    // The write window, the gentle band and fixed rates, swept: objects/s against the
    // foreground's p99.
    let sweep = sweep::run(&mut bench).await;
    if !sweep.is_empty() {
        bench.idle("idle-after-sweep", "nothing runs but the foreground client").await;
    }
    report::write(&bench, &sweep);
}
