//! How hard a migration presses the apiserver: the `--pace` flag and the `kube-svm.io/pace`
//! annotation. The latency band each pace keeps its writes in is the engine's
//! (`crate::engine::Band`).

/// How hard a migration presses the apiserver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// The cluster's own traffic first: the window grows only while the apiserver answers within
    /// [`Band::GENTLE`], so other clients barely notice the migration.
    #[default]
    Gentle,
    /// The apiserver's whole throughput, for maintenance windows: [`Band::FAST`].
    Fast,
}

impl Pace {
    /// Every pace's name, as flags and annotations spell them.
    pub const NAMES: [&str; 2] = ["gentle", "fast"];

    /// As the `--pace` flag, the `kube-svm.io/pace` annotation and `kube-svm status` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Pace::Gentle => "gentle",
            Pace::Fast => "fast",
        }
    }

    /// The pace named `name` (`gentle` or `fast`).
    pub fn parse(name: &str) -> Option<Pace> {
        match name {
            "gentle" => Some(Pace::Gentle),
            "fast" => Some(Pace::Fast),
            _ => None,
        }
    }
}
