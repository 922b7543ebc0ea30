//! What the bench reads around each contender: the apiserver's and etcd's CPU (from /proc, the
//! idle rate subtracted), what the apiserver served and spent its time on (its `/metrics`), a
//! process's peak memory, and what the apiserver says of its heap and its cache checks.

use std::time::Instant;

use kube::Client;

use crate::support::fixtures::WidgetCrd;

/// The kinds of request a row names.
const BUSIEST: usize = 8;

/// What the bench measures around one contender.
pub struct Meter {
    client: Client,
    /// The widgets' group: the requests per object are those of this group.
    pub group: String,
    pub apiserver: u32,
    etcd: u32,
    ticks_per_second: f64,
    /// CPU seconds per second the apiserver and etcd burn while nothing migrates.
    pub idle: (f64, f64),
}

#[derive(Clone)]
pub struct Sample {
    pub at: Instant,
    pub apiserver_cpu: f64,
    pub etcd_cpu: f64,
    pub served: Served,
}

impl Meter {
    /// A meter of the apiserver and etcd (their `pids`), the idle rate not yet measured.
    pub fn new(client: Client, group: String, (apiserver, etcd): (u32, u32)) -> Meter {
        let ticks = std::process::Command::new("getconf").arg("CLK_TCK").output().ok();
        let ticks_per_second = ticks
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0);
        Meter { client, group, apiserver, etcd, ticks_per_second, idle: (0.0, 0.0) }
    }

    pub fn cpu_seconds(&self, pid: u32) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc is readable");
        // Fields after the command name: state is the first, utime the 12th, stime the 13th.
        let after = stat.rsplit_once(") ").expect("a stat line").1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 =
            fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
        ticks / self.ticks_per_second
    }

    /// What the apiserver has served so far.
    async fn served(&self) -> Served {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("a request");
        let text = self.client.request_text(request).await.expect("the apiserver's metrics");
        Served::parse(&text)
    }

    pub async fn sample(&self) -> Sample {
        Sample {
            served: self.served().await,
            at: Instant::now(),
            apiserver_cpu: self.cpu_seconds(self.apiserver),
            etcd_cpu: self.cpu_seconds(self.etcd),
        }
    }
}

/// What the apiserver has served so far, by group, resource (with its subresource) and verb:
/// requests (`apiserver_request_total`) and the seconds they took
/// (`apiserver_request_duration_seconds_sum`).
#[derive(Clone, Default)]
pub struct Served(std::collections::BTreeMap<(String, String, String), (f64, f64)>);

impl Served {
    /// From the apiserver's metrics text.
    fn parse(text: &str) -> Served {
        let mut served = Served::default();
        for line in text.lines() {
            let (total, rest) = match line.strip_prefix("apiserver_request_total{") {
                Some(rest) => (true, rest),
                None => match line.strip_prefix("apiserver_request_duration_seconds_sum{") {
                    Some(rest) => (false, rest),
                    None => continue,
                },
            };
            let Some((labels, value)) = rest.rsplit_once('}') else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let label = |name| kube_svm::removal::label_value(labels, name).unwrap_or_default();
            let resource = match label("subresource") {
                sub if sub.is_empty() => label("resource"),
                sub => format!("{}/{sub}", label("resource")),
            };
            let key = (label("group"), resource, label("verb"));
            let entry = served.0.entry(key).or_default();
            if total { entry.0 += value } else { entry.1 += value }
        }
        served
    }

    /// Requests served for `group`.
    pub fn requests_of(&self, group: &str) -> f64 {
        self.0.iter().filter(|((g, _, _), _)| g == group).map(|(_, (n, _))| n).sum()
    }

    /// The kinds of request the apiserver spent the most time on since `before`, busiest first,
    /// over `seconds` (watches aside: their time is how long they stayed open).
    pub fn busiest_since(&self, before: &Served, seconds: f64) -> Vec<Busy> {
        let mut busy: Vec<Busy> = self
            .0
            .iter()
            .filter(|((_, _, verb), _)| verb != "WATCH" && verb != "CONNECT")
            .map(|(key @ (group, resource, verb), (n, took))| {
                let (n0, took0) = before.0.get(key).copied().unwrap_or_default();
                let group = if group.is_empty() { "core" } else { group };
                Busy {
                    request: format!("{verb} {group}/{resource}"),
                    per_second: (n - n0) / seconds,
                    busy_per_second: (took - took0) / seconds,
                }
            })
            .filter(|b| b.per_second > 0.0)
            .collect();
        busy.sort_by(|a, b| b.busy_per_second.total_cmp(&a.busy_per_second));
        busy.truncate(BUSIEST);
        busy
    }
}

/// One kind of request while a contender ran: how many a second, and the seconds of the
/// apiserver's time they took each second (summed latencies: a request in flight for a second
/// counts a second, whether it worked or waited).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Busy {
    pub request: String,
    pub per_second: f64,
    pub busy_per_second: f64,
}

/// Prints what the apiserver was busiest with, one kind of request a line.
pub fn print_busiest(busiest: &[Busy]) {
    for busy in busiest {
        println!(
            "    {:<52} {:>7.1} /s  {:>6.3} s/s",
            busy.request, busy.per_second, busy.busy_per_second
        );
    }
}

/// A process's peak resident memory (`VmHWM`), in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc is readable");
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM is reported");
    kib / 1024.0
}

/// What the apiserver says of itself at the end of a minute, by its own `/metrics`.
#[derive(Clone, Copy)]
pub struct ApiserverAccount {
    /// Its garbage collections so far.
    pub collections: f64,
    /// The bytes of its heap in use.
    pub inuse: f64,
    /// Its watch cache's consistency checks of widgets so far: each lists every widget from
    /// etcd (every 5 to 7.5 minutes, `DetectCacheInconsistency`, on by default).
    pub checks: f64,
}

/// The apiserver's account of its heap and its checks of the widgets (filtered by name, a few
/// KiB); `None` when it does not say.
pub async fn apiserver_account(admin: &Client) -> Option<ApiserverAccount> {
    let path = "/metrics?name[]=go_gc_duration_seconds&name[]=go_memstats_heap_inuse_bytes\
                &name[]=apiserver_storage_consistency_checks_total";
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = admin.request_text(request).await.ok()?;
    let value = |name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
    };
    let widgets = format!("resource=\"{}\"", WidgetCrd::PLURAL);
    let checks = text
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_storage_consistency_checks_total{")
                && line.contains(&widgets)
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    Some(ApiserverAccount {
        collections: value("go_gc_duration_seconds_count ")?,
        inuse: value("go_memstats_heap_inuse_bytes ")?,
        checks,
    })
}
