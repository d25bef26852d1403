//! A lexer-level reader of Rust source, enough to answer "which AWS SDK operations can
//! this function reach": it strips comments and string contents (so prose and labels
//! never count as calls), joins method chains split over lines, cuts the text into
//! `fn` bodies, and finds in each body the calls to other functions of the same code
//! and the SDK fluent calls (`.get_item()`).
//!
//! It over-approximates on purpose where it cannot be precise (functions are keyed by
//! name, so two helpers of one name merge): a check built on it may demand a
//! permission that is not needed, but never miss one that is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::CheckError;

/// The code of one `fn`, cleaned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnBody {
    pub name: String,
    pub file: PathBuf,
    pub body: String,
}

/// All `fn`s of some source files, by name.
#[derive(Debug, Clone, Default)]
pub struct Code {
    pub functions: BTreeMap<String, Vec<FnBody>>,
}

impl Code {
    /// Reads each `.rs` file of `paths`, and every `.rs` file under each directory.
    pub fn read(paths: &[PathBuf]) -> Result<Self, CheckError> {
        let mut code = Self::default();
        for path in paths {
            let files = if path.is_dir() {
                rust_files(path)?
            } else {
                vec![path.clone()]
            };
            for file in files {
                let text = std::fs::read_to_string(&file).map_err(|source| CheckError::Read {
                    path: file.clone(),
                    source,
                })?;
                for body in fn_bodies(&file, &without_test_modules(&clean(&text))) {
                    code.functions
                        .entry(body.name.clone())
                        .or_default()
                        .push(body);
                }
            }
        }
        Ok(code)
    }

    /// The names of this code's functions that `root` calls, directly or through each
    /// other, `root` included.
    pub fn reachable(&self, root: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![root.to_owned()];
        while let Some(name) = stack.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            for body in self.functions.get(&name).into_iter().flatten() {
                for callee in callees(&body.body) {
                    if self.functions.contains_key(&callee) && !seen.contains(&callee) {
                        stack.push(callee);
                    }
                }
            }
        }
        seen
    }

    /// Every fluent call `.op()` to one of `operations` in the bodies of `functions`.
    pub fn operations_in(
        &self,
        functions: &BTreeSet<String>,
        operations: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        functions
            .iter()
            .flat_map(|name| self.functions.get(name).into_iter().flatten())
            .flat_map(|body| fluent_calls(&body.body, operations))
            .collect()
    }

    /// Every fluent call `.op()` to one of `operations` anywhere in this code.
    pub fn all_operations(&self, operations: &BTreeSet<String>) -> BTreeSet<String> {
        let all: BTreeSet<String> = self.functions.keys().cloned().collect();
        self.operations_in(&all, operations)
    }

    /// Whether any body of `functions` contains `needle` (in cleaned code).
    pub fn mentions(&self, functions: &BTreeSet<String>, needle: &str) -> bool {
        functions
            .iter()
            .flat_map(|name| self.functions.get(name).into_iter().flatten())
            .any(|body| body.body.contains(needle))
    }

    /// The files of the bodies of `functions` that contain `needle` (in cleaned code).
    pub fn files_mentioning(
        &self,
        functions: &BTreeSet<String>,
        needle: &str,
    ) -> BTreeSet<PathBuf> {
        functions
            .iter()
            .flat_map(|name| self.functions.get(name).into_iter().flatten())
            .filter(|body| body.body.contains(needle))
            .map(|body| body.file.clone())
            .collect()
    }

    /// Whether any function of this code contains `needle`.
    pub fn mentions_anywhere(&self, needle: &str) -> bool {
        self.functions
            .values()
            .flatten()
            .any(|body| body.body.contains(needle))
    }
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, CheckError> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| CheckError::Read {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| CheckError::Read {
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The source without comments, with every string and char literal emptied, and with
/// whitespace before `.` and around `::` removed so `self\n    .get_item()` reads
/// `self.get_item()`.
pub fn clean(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || (next == Some('#') && raw_string_start(&chars, i + 1)))
        {
            // Raw string r"..." / r#"..."#: skip to the matching quote and hashes.
            let mut hashes = 0;
            i += 1;
            while chars.get(i) == Some(&'#') {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    join_chains(&out)
}

/// Cleaned source without its `#[cfg(test)] mod .. { .. }` blocks: test code may call
/// anything (create tables, purge queues) without the deployed function ever doing so.
pub fn without_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_module = trimmed.starts_with("mod ")
            || trimmed.starts_with("pub mod ")
            || trimmed.starts_with("pub(crate) mod ");
        let open = after.find('{');
        let semicolon = after.find(';');
        match (is_module, open) {
            (true, Some(open)) if semicolon.is_none_or(|semi| semi > open) => {
                let mut depth = 0_i32;
                let mut end = after.len();
                for (index, c) in after[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + index + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

fn raw_string_start(chars: &[char], mut i: usize) -> bool {
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    chars.get(i) == Some(&'"')
}

/// `'x'`, `'\n'`, `'\''` are char literals; `'a` in `&'a str` is a lifetime.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    matches!(
        (chars.get(i + 1), chars.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

fn join_chains(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_whitespace() {
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let before_dot = chars.get(j) == Some(&'.') && chars.get(j + 1) != Some(&'.');
            let before_path = chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':');
            let after_path = out.ends_with("::");
            if !(before_dot || before_path || after_path) {
                out.push(' ');
            }
            i = j;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Cuts cleaned source into `fn` bodies. Declarations without a body (trait items)
/// are skipped.
pub fn fn_bodies(file: &Path, text: &str) -> Vec<FnBody> {
    let chars: Vec<char> = text.chars().collect();
    let mut bodies = Vec::new();
    let mut i = 0;
    while i + 3 < chars.len() {
        let at_word = i == 0 || !is_ident(chars[i - 1]);
        if at_word && chars[i] == 'f' && chars[i + 1] == 'n' && chars[i + 2] == ' ' {
            let mut j = i + 3;
            let start = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            let name: String = chars[start..j].iter().collect();
            // The body opens at the first `{` at bracket depth 0 of the signature,
            // unless a `;` ends the declaration first.
            let mut depth = 0_i32;
            let mut open = None;
            while j < chars.len() {
                match chars[j] {
                    '(' | '[' | '<' => depth += 1,
                    ')' | ']' => depth -= 1,
                    '>' if chars[j - 1] != '-' && chars[j - 1] != '=' => depth -= 1,
                    '{' if depth <= 0 => {
                        open = Some(j);
                        break;
                    }
                    ';' if depth <= 0 => break,
                    _ => {}
                }
                j += 1;
            }
            if let (false, Some(open)) = (name.is_empty(), open) {
                let mut depth = 0_i32;
                let mut k = open;
                while k < chars.len() {
                    match chars[k] {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                let end = k.min(chars.len());
                bodies.push(FnBody {
                    name,
                    file: file.to_path_buf(),
                    body: chars[open..end].iter().collect(),
                });
                // Nested fns (closures are not fns) are found by continuing inside.
                i = open + 1;
                continue;
            }
            i = j;
            continue;
        }
        i += 1;
    }
    bodies
}

/// Names this body calls as functions or methods of its own code: `name(`, `self.name(`,
/// `Self::name(`, `module::name(`. A method call on any other receiver (`map.get(`) is
/// not a call into this code.
pub fn callees(body: &str) -> BTreeSet<String> {
    let chars: Vec<char> = body.chars().collect();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) && (i == 0 || !is_ident(chars[i - 1])) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            let turbofish = chars.get(i) == Some(&':') && chars.get(i + 2) == Some(&'<');
            if chars.get(i) != Some(&'(') && !turbofish {
                continue;
            }
            let on_self = start >= 5
                && chars[start - 5..start].iter().collect::<String>() == "self."
                && (start == 5 || !is_ident(chars[start - 6]));
            let is_method = start > 0 && chars[start - 1] == '.';
            if (!is_method || on_self) && !name.starts_with(|c: char| c.is_ascii_digit()) {
                found.insert(name);
            }
        } else {
            i += 1;
        }
    }
    found
}

/// The methods called on `self.<field>` in `body`, on the field of a binding of the
/// service (`service.ledger.release(` in a settlement holding `let service =
/// self.service`), or on a local binding named after the field (`let Some(payments) =
/// &self.payments;` then `payments.settle(`): `self.ledger.reserve(` gives `reserve` for
/// field `ledger`. This is how the use cases reach their ports.
pub fn field_calls(body: &str, field: &str) -> BTreeSet<String> {
    let needle = format!("{field}.");
    let mut found = BTreeSet::new();
    for (at, _) in body.match_indices(&needle) {
        let before = &body[..at];
        if before.chars().next_back().is_some_and(is_ident) {
            continue; // `x_field.`
        }
        if let Some(receiver_end) = before.strip_suffix('.') {
            let receiver: String = receiver_end
                .chars()
                .rev()
                .take_while(|c| is_ident(*c))
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !["self", "service", field].contains(&receiver.as_str()) {
                continue; // `other.field.`
            }
        }
        let after = &body[at + needle.len()..];
        let name: String = after.chars().take_while(|c| is_ident(*c)).collect();
        if !name.is_empty() && after[name.len()..].starts_with('(') {
            found.insert(name);
        }
    }
    found
}

/// The `operations` called fluently in `body`: `.op()` with no arguments, which is how
/// every AWS SDK for Rust operation starts its request builder.
pub fn fluent_calls(body: &str, operations: &BTreeSet<String>) -> BTreeSet<String> {
    operations
        .iter()
        .filter(|op| body.contains(&format!(".{op}()")))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reconciler reached its ports as `let Some(payments) = &self.payments;` then
    /// `payments.payments.follow_money(`: unseen, so its role missed the actions.
    #[test]
    fn calls_on_a_local_binding_named_after_the_field_are_field_calls() {
        let body = "let Some(payments) = &self.payments else { return; }; \
                    payments.payments.follow_money(x); self.ledger.release(y); \
                    service.ledger.give_back(z); self.service.payments.pay_with(w); \
                    other.payments.nope(); my_payments.nope_either(); payments.len;";
        assert_eq!(
            field_calls(body, "payments"),
            BTreeSet::from(["follow_money".to_owned(), "pay_with".to_owned()])
        );
        assert_eq!(
            field_calls(body, "ledger"),
            BTreeSet::from(["release".to_owned(), "give_back".to_owned()])
        );
    }

    #[test]
    fn comments_and_strings_never_count_as_calls() {
        let text = "fn a() { // self.client.get_item()\n let s = \"x.put_item()\"; /* .scan() */ }";
        let cleaned = clean(text);
        let ops: BTreeSet<String> = ["get_item", "put_item", "scan"].map(str::to_owned).into();
        assert!(fluent_calls(&cleaned, &ops).is_empty(), "{cleaned}");
    }

    #[test]
    fn chains_split_over_lines_are_joined() {
        let cleaned = clean(
            "fn g(&self) {\n    self\n        .client\n        .get_item()\n        .send()\n}",
        );
        let ops: BTreeSet<String> = ["get_item".to_owned()].into();
        assert_eq!(fluent_calls(&cleaned, &ops), ops);
    }

    #[test]
    fn calls_through_helpers_are_followed_but_methods_of_other_receivers_are_not() {
        let source = clean(
            "impl S {\n\
               async fn release(&self) { self.read(1).await; map.get(&k); }\n\
               async fn read(&self, x: u8) -> Option<u8> { self.get(x) }\n\
               fn get(&self, x: u8) -> u8 { self.client.get_item().send() }\n\
               fn unrelated(&self) { self.client.scan().send() }\n\
             }\n\
             trait T { fn declared(&self); }",
        );
        let code = Code {
            functions: fn_bodies(Path::new("x.rs"), &source)
                .into_iter()
                .map(|body| (body.name.clone(), vec![body]))
                .collect(),
        };
        let reached = code.reachable("release");
        assert_eq!(
            reached,
            ["get", "read", "release"].map(str::to_owned).into()
        );
        let ops: BTreeSet<String> = ["get_item", "scan"].map(str::to_owned).into();
        assert_eq!(
            code.operations_in(&reached, &ops),
            ["get_item".to_owned()].into()
        );
        assert!(!code.functions.contains_key("declared"));
    }

    #[test]
    fn test_modules_are_not_deployed_code() {
        let cleaned = without_test_modules(&clean(
            "fn a() { x.get_item() }\n#[cfg(test)]\nmod tests { fn t() { c.create_table() } }\nfn b() {}",
        ));
        assert!(cleaned.contains("get_item") && cleaned.contains("fn b"));
        assert!(!cleaned.contains("create_table"), "{cleaned}");
    }

    #[test]
    fn lifetimes_are_not_char_literals() {
        let cleaned = clean("fn f<'a>(x: &'a str) -> char { let c = '\\''; x.get_item() }");
        let ops: BTreeSet<String> = ["get_item".to_owned()].into();
        assert_eq!(fluent_calls(&cleaned, &ops), ops);
    }
}
