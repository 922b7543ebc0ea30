//! Plain-text tables for the terminal, aligned as kubectl aligns its own.

use std::fmt::Write as _;

use clap::ValueEnum;
use serde::Serialize;

/// How a command prints what it found (`-o`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

impl Output {
    /// `value` as JSON or YAML, or as the table `table` draws.
    pub fn format<T: Serialize>(
        self,
        value: &T,
        table: fn(&T) -> String,
    ) -> anyhow::Result<String> {
        Ok(match self {
            Output::Table => table(value),
            Output::Json => serde_json::to_string_pretty(value)? + "\n",
            Output::Yaml => serde_yaml_ng::to_string(value)?,
        })
    }
}

/// Renders `rows` (the first is the header) with two spaces between columns; the columns in
/// `right` (counts) are right-aligned. Trailing blanks are trimmed.
pub fn render<Row: AsRef<[String]>>(rows: &[Row], right: &[usize]) -> String {
    let mut widths = Vec::new();
    for row in rows {
        let row = row.as_ref();
        widths.resize(widths.len().max(row.len()), 0);
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, (cell, &width)) in row.as_ref().iter().zip(&widths).enumerate() {
            let _ = match right.contains(&i) {
                true => write!(line, "{cell:>width$}  "),
                false => write!(line, "{cell:<width$}  "),
            };
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligns_columns() {
        let rows = [
            ["NAME".to_owned(), "COUNT".to_owned(), "NOTE".to_owned()],
            ["a".to_owned(), "7".to_owned(), String::new()],
            ["longer".to_owned(), "1200".to_owned(), "x".to_owned()],
        ];
        assert_eq!(
            super::render(&rows, &[1]),
            "NAME    COUNT  NOTE\na           7\nlonger   1200  x\n"
        );
    }
}
