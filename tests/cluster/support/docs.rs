//! The commands the README and the pages under `docs/` show, so that tests run them as written.

use std::path::{Path, PathBuf};

/// The README, then every page of `docs/`, in name order.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("the docs directory")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    std::iter::once(root.join("README.md")).chain(docs).collect()
}

/// Pages whose `sh` blocks are one procedure, run as a whole by their own test (a heredoc, steps
/// that build on each other), and not line by line.
const PROCEDURES: [&str; 1] = ["removing-a-version.md"];

/// The lines of the `sh` blocks of the README and the docs that start with `prefix`, in the
/// order a reader meets them; the pages of [`PROCEDURES`] are left out.
pub fn sh_lines(prefix: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let procedure =
        |page: &Path| page.file_name().is_some_and(|name| PROCEDURES.iter().any(|p| name == *p));
    for page in pages().into_iter().filter(|page| !procedure(page)) {
        let text = std::fs::read_to_string(&page).expect("a readable page");
        let mut in_sh = false;
        for line in text.lines() {
            match line.trim() {
                "```sh" => in_sh = true,
                "```" => in_sh = false,
                line if in_sh && line.starts_with(prefix) => lines.push(line.to_owned()),
                _ => {}
            }
        }
    }
    lines
}

/// Every `sh` block of `docs/<page>`, in order, as one script.
pub fn sh_script(page: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(page);
    let text = std::fs::read_to_string(&path).expect("a readable page");
    let mut script = String::new();
    let mut in_sh = false;
    for line in text.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            _ if in_sh => {
                script.push_str(line);
                script.push('\n');
            }
            _ => {}
        }
    }
    script
}
