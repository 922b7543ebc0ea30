//! `kube-svm inspect`: how each resource's objects are really stored, read from etcd (read-only).

use std::io::Write;

use anyhow::Context;
use clap::Args;

use super::etcd::EtcdArgs;
use super::table::{self, Output};
use crate::census::{self, EtcdReader, ResourceCensus, Scope};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Resources as `resource[.group]` (`secrets`, `deployments.apps`, `widgets.example.com`),
    /// or key prefixes starting with `/`. None: every key under --etcd-prefix, by resource.
    pub resources: Vec<String>,

    #[command(flatten)]
    pub etcd: EtcdArgs,

    /// Print the keys stored in this apiVersion (`example.com/v1`) or encryption key
    /// (`aescbc:key1`, or `key1`), or `unencrypted` or `unrecognized`, one per line, instead of
    /// the census.
    #[arg(long, value_name = "SELECTOR")]
    pub list: Option<String>,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(args: InspectArgs) -> anyhow::Result<()> {
    let InspectArgs { resources, etcd, list, output } = args;
    let (connection, etcd_prefix) = etcd.connection();
    let connection =
        connection.context("inspect reads etcd: give its URLs with --etcd-endpoints")?;
    let reader = EtcdReader::connect(&connection).context("failed to set up the etcd client")?;
    let scope = match resources.is_empty() {
        true => Scope::Everything,
        false => Scope::Resources(
            resources.iter().map(|r| census::keys::locate(&etcd_prefix, r)).collect(),
        ),
    };

    // Listed keys are printed once the census is whole: a census started over (etcd compacted
    // the revision it read) lists its keys again, at the new revision.
    let mut listed: Vec<Vec<u8>> = Vec::new();
    let mut listed_in = 0;
    let report = census::take(&reader, &etcd_prefix, &scope, |attempt, key, stored| {
        if let Some(selector) = &list
            && census::matches(selector, stored)
        {
            if attempt != listed_in {
                listed.clear();
                listed_in = attempt;
            }
            listed.push(key.to_vec());
        }
    })
    .await?;
    // A named resource with no key at all may be a typo, or kept elsewhere: say so, aside.
    if !resources.is_empty() {
        for empty in report.resources.iter().filter(|r| r.objects == 0) {
            eprintln!(
                "note: etcd holds no key under {} (a misspelt resource, or one kept under another prefix or etcd?)",
                empty.key_prefix
            );
        }
    }
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    if list.is_some() {
        for key in &listed {
            stdout
                .write_all(key)
                .and_then(|()| stdout.write_all(b"\n"))
                .context("failed to write the keys")?;
        }
        return stdout.flush().context("failed to write the keys");
    }
    let text = output.format(&report, table)?;
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("failed to write the census")
}

/// One block of lines per resource: its stored versions and encryption keys side by side.
fn table(report: &census::Report) -> String {
    let mut rows = vec![[
        "RESOURCE".to_owned(),
        "OBJECTS".to_owned(),
        "STORED AS".to_owned(),
        "ENCRYPTION".to_owned(),
        "OLDEST WRITE".to_owned(),
    ]];
    for resource in &report.resources {
        let versions = stored_as(resource);
        let encryption = encryption(resource);
        for line in 0..versions.len().max(encryption.len()).max(1) {
            let first = line == 0;
            rows.push([
                if first { resource.name() } else { String::new() },
                if first { resource.objects.to_string() } else { String::new() },
                versions.get(line).cloned().unwrap_or_default(),
                encryption.get(line).cloned().unwrap_or_default(),
                match (first, resource.oldest_mod_revision) {
                    (true, Some(revision)) => format!("revision {revision}"),
                    _ => String::new(),
                },
            ]);
        }
    }
    let header = format!(
        "etcd revision {} under {}/\n\n",
        report.etcd_revision,
        report.etcd_prefix.trim_end_matches('/')
    );
    header + &table::render(&rows, &[1])
}

fn stored_as(resource: &ResourceCensus) -> Vec<String> {
    let mut lines: Vec<String> =
        resource.api_versions.iter().map(|(version, n)| format!("{version} {n}")).collect();
    let hidden: u64 = resource.encryption.iter().map(|k| k.objects).sum();
    if hidden > 0 {
        lines.push(format!("(encrypted) {hidden}"));
    }
    if resource.unrecognized > 0 {
        lines.push(format!("(unrecognized) {}", resource.unrecognized));
    }
    lines
}

fn encryption(resource: &ResourceCensus) -> Vec<String> {
    let mut lines: Vec<String> = resource
        .encryption
        .iter()
        .map(|k| format!("{}:{} {}", k.provider, k.key, k.objects))
        .collect();
    if !lines.is_empty() && resource.unencrypted > 0 {
        lines.push(format!("none {}", resource.unencrypted));
    }
    if lines.is_empty() && resource.objects > 0 {
        lines.push("none".into());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::census::EncryptionKey;

    #[test]
    fn the_table_lists_versions_and_keys_side_by_side() {
        let widgets = ResourceCensus {
            group: Some("example.com".into()),
            resource: "widgets".into(),
            key_prefix: "/registry/example.com/widgets/".into(),
            objects: 30,
            api_versions: [("example.com/v1".into(), 18), ("example.com/v2".into(), 12)].into(),
            unencrypted: 30,
            oldest_mod_revision: Some(41),
            ..ResourceCensus::default()
        };
        let secrets = ResourceCensus {
            group: Some(String::new()),
            resource: "secrets".into(),
            key_prefix: "/registry/secrets/".into(),
            objects: 10,
            encryption: vec![
                EncryptionKey { provider: "aescbc".into(), key: "key1".into(), objects: 6 },
                EncryptionKey { provider: "aescbc".into(), key: "key2".into(), objects: 3 },
            ],
            unencrypted: 1,
            api_versions: [("v1".into(), 1)].into(),
            oldest_mod_revision: Some(7),
            ..ResourceCensus::default()
        };
        let empty = ResourceCensus {
            group: Some("example.com".into()),
            resource: "gadgets".into(),
            key_prefix: "/registry/example.com/gadgets/".into(),
            ..ResourceCensus::default()
        };
        let report = census::Report {
            etcd_revision: 99,
            etcd_prefix: "/registry".into(),
            resources: vec![widgets, secrets, empty],
        };
        let expected = "\
etcd revision 99 under /registry/

RESOURCE             OBJECTS  STORED AS          ENCRYPTION     OLDEST WRITE
widgets.example.com       30  example.com/v1 18  none           revision 41
                              example.com/v2 12
secrets                   10  v1 1               aescbc:key1 6  revision 7
                              (encrypted) 9      aescbc:key2 3
                                                 none 1
gadgets.example.com        0
";
        assert_eq!(table(&report), expected);
    }
}
