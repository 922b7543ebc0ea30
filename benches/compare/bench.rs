//! The run's shared state: one control plane, its widgets, the foreground client, the meter and
//! the rows measured so far; and the measure every contender goes through (storage switched,
//! migrated, timed, etcd read to prove every object moved).

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;

use crate::config::{Config, NAMESPACES};
use crate::foreground::{BURST_PERIOD, Foreground, Latencies};
use crate::meter::{Busy, Meter, peak_rss_mib, print_busiest};
use crate::probe::Probe;
use crate::support::chart;
use crate::support::fixtures::{WidgetCrd, create_namespace, install_kube_svm_crds, unique};
use crate::support::invariant::Census;
use crate::support::process::KubeSvm;
use crate::support::{CONTROLLER_NAMESPACE, ControlPlane, Etcd};

/// How long kube-svm's probe runs alone, nothing written, to show its own cost.
const PROBE_ALONE: Duration = Duration::from_secs(60);

pub struct Bench {
    pub config: Config,
    pub control_plane: ControlPlane,
    pub client: Client,
    pub widgets: WidgetCrd,
    /// The version the objects are stored in now.
    pub stored: &'static str,
    pub meter: Meter,
    pub rows: Vec<Row>,
    /// The kube-svm controller running now, if any: its pid is the contender's, and its log's
    /// lines on the gentle rate are printed after each measure.
    pub controller: Option<KubeSvm>,
    pub foreground: Foreground,
    /// The chart's ServiceAccount's client configuration: kube-svm runs as it.
    pub account: kube::Config,
    /// The round of `BENCH_REPEAT` being measured, when there are more than one: each row
    /// measured in it is named `<contender> #<round>`.
    pub round: Option<usize>,
}

/// What a contender needs.
pub struct Ctx {
    pub client: Client,
    pub widgets: WidgetCrd,
    pub target: &'static str,
    pub controller: Option<u32>,
    /// The chart's ServiceAccount's client configuration.
    pub account: kube::Config,
}

impl Ctx {
    pub fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        self.widgets.api(&self.client, self.target, namespace)
    }
}

impl Bench {
    /// A control plane (with `BENCH_APISERVER_FLAGS`), kube-svm's CRDs, the widgets seeded at
    /// v1 over [`NAMESPACES`] namespaces, and the foreground client started.
    pub async fn start(config: Config) -> Bench {
        let flags: Vec<&str> = config.apiserver_flags.iter().map(String::as_str).collect();
        let control_plane = ControlPlane::start(&flags).await.expect("control plane");
        let client = control_plane.client().await;
        install_kube_svm_crds(&client).await;
        let account = {
            let path = control_plane.controller_kubeconfig().await;
            let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("readable");
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .expect("the controller's kubeconfig is valid")
        };

        let widgets = WidgetCrd::new("bench", true);
        widgets.create(&client, "v1").await;
        let namespaces: Vec<String> = (0..NAMESPACES).map(|_| unique("bench")).collect();
        for namespace in &namespaces {
            create_namespace(&client, namespace).await;
        }
        let (objects, bytes) = (config.objects, config.object_bytes);
        let seeding = Instant::now();
        seed(&client, &widgets, &namespaces, objects, bytes).await;
        println!(
            "seeded {objects} widgets of about {bytes} bytes in {:.0} s",
            seeding.elapsed().as_secs_f64()
        );
        let foreground =
            Foreground::start(&control_plane, config.foreground, config.trace_ms).await;
        let meter = Meter::new(client.clone(), widgets.group.clone(), control_plane.pids());
        Bench {
            config,
            control_plane,
            client,
            widgets,
            stored: "v1",
            meter,
            rows: Vec::new(),
            controller: None,
            foreground,
            account,
            round: None,
        }
    }

    /// The name of `contender`'s row in the round being measured: `<contender> #<round>` when
    /// the contenders are repeated, `contender` otherwise.
    pub fn in_round(&self, contender: &str) -> String {
        match self.round {
            Some(round) => format!("{contender} #{round}"),
            None => contender.to_owned(),
        }
    }

    /// The idle apiserver, before any contender: the CPU the apiserver and etcd burn with only
    /// the foreground client (subtracted from every contender's), and the foreground's latencies.
    pub async fn idle_before(&mut self) {
        let idle_from = self.meter.sample().await;
        tokio::time::sleep(self.config.idle).await;
        let idle_to = self.meter.sample().await;
        let idle_seconds = idle_to.at.duration_since(idle_from.at).as_secs_f64();
        self.meter.idle = (
            (idle_to.apiserver_cpu - idle_from.apiserver_cpu) / idle_seconds,
            (idle_to.etcd_cpu - idle_from.etcd_cpu) / idle_seconds,
        );
        println!(
            "idle CPU: apiserver {:.3} s/s, etcd {:.3} s/s",
            self.meter.idle.0, self.meter.idle.1
        );
        let idle_busiest = idle_to.served.busiest_since(&idle_from.served, idle_seconds);
        print_busiest(&idle_busiest);
        let idle_before = self.foreground.between(idle_from.at, idle_to.at);
        let note = "nothing runs but the foreground client";
        self.rows.push(Row::phase(
            "idle-before",
            note,
            idle_seconds,
            idle_before.clone(),
            idle_busiest,
        ));
        println!(
            "{:<38} foreground {}",
            "idle-before",
            idle_before.map(|f| f.cells()).unwrap_or_default()
        );
    }

    fn etcd(&self) -> Etcd {
        self.control_plane.etcd()
    }

    /// Starts `kube-svm <args>` (a controller named `name`) as the chart's ServiceAccount; it is
    /// the contender of the measures that follow, until [`Bench::stop_controller`].
    pub async fn start_controller(&mut self, name: &str, args: &[String]) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // One controller at a time: two would both carry out a migration.
        self.stop_controller();
        self.controller = Some(KubeSvm::start(&self.control_plane, name, &args).await);
    }

    /// Stops the controller running, if any.
    pub fn stop_controller(&mut self) {
        self.controller = None;
    }

    /// Switches storage to the other version, and asks for a widget through the new storage;
    /// returns the version.
    ///
    /// The apiserver builds a custom resource's storage for a new storage version on the first
    /// request to it, its watch cache included, which reads every object from etcd. In a cluster
    /// that request comes at once (the resource's controllers watch it); here it would be the
    /// first migrator's, and the rebuild would count as the migrator's cost.
    pub async fn switch(&mut self) -> &'static str {
        let next = if self.stored == "v1" { "v2" } else { "v1" };
        self.widgets.set_storage_version(&self.client, next).await;
        self.widgets
            .api(&self.client, next, None)
            .list_metadata(&ListParams::default().limit(1))
            .await
            .expect("widgets list after the switch");
        next
    }

    /// Runs `migrate` (which moves every object to `target`), measures it, checks etcd. With
    /// `switch`, the storage version is switched first, and `pause` waited before measuring.
    /// Nothing runs unless `contender` is selected.
    pub async fn measure<F, Fut>(
        &mut self,
        contender: &str,
        note: &str,
        switch: bool,
        pause: Duration,
        migrate: F,
    ) where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = Option<u32>>,
    {
        if !self.config.selected(contender) {
            return;
        }
        let objects = self.config.objects;
        let target = if switch { self.switch().await } else { self.stored };
        tokio::time::sleep(pause).await;
        // Where this measure's lines of the controller's log begin, read before the measure.
        let logged = self.controller.as_ref().map_or(0, |c| c.logs().len());
        let before = self.meter.sample().await;
        let ctx = Ctx {
            client: self.client.clone(),
            widgets: WidgetCrd { group: self.widgets.group.clone(), namespaced: true },
            target,
            controller: self.controller.as_ref().map(|c| c.pid()),
            account: self.account.clone(),
        };
        let pid = migrate(ctx).await;
        let after = self.meter.sample().await;
        let foreground = self.foreground.between(before.at, after.at);
        let census = Census::of(&self.etcd(), &self.widgets).await;
        let expected = self.widgets.api_version(target);
        assert_eq!(census.count(&expected), objects, "{contender}: etcd holds {:?}", census.0);
        self.stored = target;
        let seconds = after.at.duration_since(before.at).as_secs_f64();
        let per_1000 =
            |used: f64, idle: f64| (used - idle * seconds).max(0.0) * 1000.0 / objects as f64;
        let row = Row {
            contender: self.in_round(contender),
            note: note.to_owned(),
            objects,
            seconds,
            objects_per_second: objects as f64 / seconds,
            requests_per_object: (after.served.requests_of(&self.meter.group)
                - before.served.requests_of(&self.meter.group))
                / objects as f64,
            apiserver_cpu_per_1000: per_1000(
                after.apiserver_cpu - before.apiserver_cpu,
                self.meter.idle.0,
            ),
            etcd_cpu_per_1000: per_1000(after.etcd_cpu - before.etcd_cpu, self.meter.idle.1),
            peak_rss_mib: pid.map(peak_rss_mib),
            foreground,
            busiest: after.served.busiest_since(&before.served, seconds),
        };
        println!(
            "{:<38} {:>8.1} objects/s  foreground {}  {:>6.3} requests/object  apiserver {:>5.2} s, etcd {:>5.2} s CPU per 1,000{}",
            row.contender,
            row.objects_per_second,
            row.foreground.as_ref().map(|f| f.cells()).unwrap_or_default(),
            row.requests_per_object,
            row.apiserver_cpu_per_1000,
            row.etcd_cpu_per_1000,
            row.peak_rss_mib.map(|m| format!("  peak RSS {m:.1} MiB")).unwrap_or_default()
        );
        print_busiest(&row.busiest);
        // How the gentle rate moved, for whoever tunes the law.
        if let Some(controller) = &self.controller {
            let logs = controller.logs();
            let since = logs.get(logged..).unwrap_or_default();
            let steering = |l: &&str| l.contains("gentle rate") || l.contains("gentle writes");
            for line in since.lines().filter(steering) {
                println!("  {line}");
            }
        }
        self.rows.push(row);
    }

    /// Measures the foreground client alone for `BENCH_IDLE_SECONDS`, nothing migrated.
    pub async fn idle(&mut self, contender: &str, note: &str) {
        let from = Instant::now();
        tokio::time::sleep(self.config.idle).await;
        self.phase(contender, note, from);
    }

    /// kube-svm's probe alone for [`PROBE_ALONE`], nothing written: what it costs the
    /// foreground and the apiserver's CPU, and what it reads on this apiserver (its p99 against
    /// its quiet baseline).
    pub async fn probe_alone(&mut self) {
        if !self.config.selected("probe-alone") {
            return;
        }
        let from = Instant::now();
        let cpu_from = self.meter.cpu_seconds(self.meter.apiserver);
        let probe = Probe::start(
            &self.account,
            self.config.pace.probe_budget(),
            self.config.pace.probe_params(),
        );
        tokio::time::sleep(PROBE_ALONE).await;
        let seen = probe.stop();
        // The apiserver's CPU the probe costs, the idle rate (the foreground's) subtracted.
        let cpu = self.meter.cpu_seconds(self.meter.apiserver) - cpu_from;
        let cpu = cpu / from.elapsed().as_secs_f64() - self.meter.idle.0;
        let note = format!(
            "kube-svm's probe alone, nothing written: {seen}; apiserver CPU {cpu:+.3} s/s over idle"
        );
        self.phase("probe-alone", &note, from);
    }

    /// The burst alone ([`Foreground::burst`]): what it costs the foreground by itself.
    pub async fn burst_alone(&mut self) {
        if !self.config.selected("burst-alone") {
            return;
        }
        let from = Instant::now();
        let config = self.foreground.config.clone();
        Foreground::burst(config, Duration::ZERO).await.expect("the burst ran");
        let note = format!(
            "a second client of the foreground's identity, a GET and a PATCH every {} ms",
            BURST_PERIOD.as_millis()
        );
        self.phase("burst-alone", &note, from);
    }

    /// Records what the foreground felt from `from` to now, nothing migrated.
    fn phase(&mut self, contender: &str, note: &str, from: Instant) {
        let seconds = from.elapsed().as_secs_f64();
        let foreground = self.foreground.between(from, Instant::now());
        println!(
            "{contender:<38} foreground {}  {note}",
            foreground.as_ref().map(|f| f.cells()).unwrap_or_default()
        );
        self.rows.push(Row::phase(contender, note, seconds, foreground, Vec::new()));
    }

    /// Installs (or removes) the chart's API Priority and Fairness objects for the controller's
    /// ServiceAccount, and waits until the apiserver classifies its requests accordingly.
    pub async fn flow_control(&self, on: bool) {
        let args =
            ["--set", "flowControl.enabled=true", "--show-only", "templates/flowcontrol.yaml"];
        let objects = chart::objects(&chart::render("kube-svm", CONTROLLER_NAMESPACE, &args));
        let level = objects
            .iter()
            .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "PriorityLevelConfiguration"))
            .and_then(|o| o.metadata.name.clone())
            .expect("the chart renders a priority level");
        if on {
            chart::apply(&self.client, &objects, false).await.expect("the flow control applies");
        } else {
            for object in &objects {
                let types = object.types.as_ref().expect("typed");
                let gvk = GroupVersionKind::try_from(types).expect("a kind");
                let (resource, _) =
                    kube::discovery::pinned_kind(&self.client, &gvk).await.expect("served");
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
                let name = object.metadata.name.clone().expect("named");
                api.delete(&name, &DeleteParams::default()).await.expect("deleted");
            }
        }
        // The UID of the level the account's requests go to, from the apiserver's answer.
        let account = Client::try_from(self.account.clone()).expect("a client");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let levels: Api<DynamicObject> = Api::all_with(
                self.client.clone(),
                &ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(
                        "flowcontrol.apiserver.k8s.io",
                        "v1",
                        "PriorityLevelConfiguration",
                    ),
                    "prioritylevelconfigurations",
                ),
            );
            let own = levels.get_opt(&level).await.expect("levels are readable");
            let own = own.and_then(|l| l.metadata.uid);
            let request =
                http::Request::get("/apis/migration.k8s.io/v1alpha1/storageversionmigrations")
                    .body(kube::client::Body::empty())
                    .expect("a request");
            let response = account.send(request).await.expect("an answer");
            let classified = response
                .headers()
                .get("X-Kubernetes-PF-PriorityLevel-UID")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if (classified.is_some() && classified == own) == on {
                return;
            }
            assert!(Instant::now() < deadline, "the flow control never took effect");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Creates `count` widgets of about `bytes` each, spread over `namespaces`, stored at v1.
async fn seed(
    client: &Client,
    widgets: &WidgetCrd,
    namespaces: &[String],
    count: usize,
    bytes: usize,
) {
    let padding = "x".repeat(bytes.saturating_sub(300));
    let per_namespace = count / namespaces.len();
    let creates = namespaces.iter().flat_map(|namespace| {
        let padding = &padding;
        (0..per_namespace).map(move |i| async move {
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": widgets.api_version("v1"),
                "kind": WidgetCrd::KIND,
                "metadata": { "name": format!("w-{i}"), "namespace": namespace },
                "spec": { "index": i, "padding": padding },
            }))
            .expect("a valid widget");
            widgets
                .api(client, "v1", Some(namespace))
                .create(&PostParams::default(), &object)
                .await
                .map(|_| ())
        })
    });
    futures::stream::iter(creates)
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("seeded");
}

/// One contender's result, or one phase's with nothing migrated.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub contender: String,
    pub note: String,
    pub objects: usize,
    pub seconds: f64,
    pub objects_per_second: f64,
    pub requests_per_object: f64,
    pub apiserver_cpu_per_1000: f64,
    pub etcd_cpu_per_1000: f64,
    pub peak_rss_mib: Option<f64>,
    /// The foreground client's requests while the contender ran.
    pub foreground: Option<Latencies>,
    /// What the apiserver spent its time on meanwhile, every client's requests together.
    pub busiest: Vec<Busy>,
}

impl Row {
    /// A phase of `seconds` in which nothing migrated: only the foreground's latencies, and what
    /// the apiserver was busy with if measured.
    pub fn phase(
        contender: &str,
        note: &str,
        seconds: f64,
        foreground: Option<Latencies>,
        busiest: Vec<Busy>,
    ) -> Row {
        Row {
            contender: contender.to_owned(),
            note: note.to_owned(),
            objects: 0,
            seconds,
            objects_per_second: 0.0,
            requests_per_object: 0.0,
            apiserver_cpu_per_1000: 0.0,
            etcd_cpu_per_1000: 0.0,
            peak_rss_mib: None,
            foreground,
            busiest,
        }
    }
}
