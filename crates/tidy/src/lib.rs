//! strata-tidy: facts about the workspace's own non-test Rust, for the
//! ratchets in tests/tidy.rs and the `strata-tidy` report.
//!
//! Every `crates/*/src/**.rs` file is parsed with syn (with line numbers),
//! leaving out items under `#[cfg(test)]`, the files of `#[cfg(test)] mod
//! x;` declarations and `src/tests/` directories. For each function it
//! records what clippy's `too_many_lines` and `too_many_arguments` would
//! count, so the test can hold the same line as `make lint` without running
//! clippy:
//! - body lines: the lines between the body's braces that hold code, a
//!   comment-only or blank line not counted (clippy's rule, ported);
//! - arguments: the inputs, `self` included; methods of trait impls are
//!   exempt, as clippy exempts them (the trait decides their shape).
//!
//! It also records, per file, the physical line count, signatures returning
//! `Result<_, String>`, and the places that look behind the datastore
//! interface (a downcast, a branch on the datastore's kind, a probe of a
//! directory for its kind) when they sit above crates/datastore.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use std::path::{Path, PathBuf};

use proc_macro2::LineColumn;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// clippy's `too-many-lines-threshold` and `too-many-arguments-threshold`
/// in clippy.toml; a function is over when it has more than these.
pub const FN_LINES: usize = 70;
pub const FN_ARGS: usize = 5;
/// No source file longer than this many physical lines.
pub const FILE_LINES: usize = 1200;

/// Crates that may tell the datastore kinds apart: the interface itself and
/// what lies under it.
pub const BELOW_THE_INTERFACE: &[&str] = &["datastore", "engine", "objstore", "format"];

#[derive(Debug, Clone)]
pub struct Func {
    pub file: String,
    pub line: usize,
    pub name: String,
    /// clippy's count: lines with code strictly inside the body's braces.
    pub body_lines: usize,
    /// From the `fn` line to the closing brace, inclusive (the review's
    /// brace-scan measure).
    pub span_lines: usize,
    pub args: usize,
    /// A method of `impl Trait for Type`: clippy does not count its
    /// arguments.
    pub in_trait_impl: bool,
    /// `#[expect(clippy::too_many_lines)]` on the function itself.
    pub expects_lines: bool,
    pub expects_args: bool,
    /// The same lints silenced with `allow` (which never says when it is no
    /// longer needed, so the ratchet refuses it).
    pub allows_lines: bool,
    pub allows_args: bool,
}

impl Func {
    pub fn too_long(&self) -> bool {
        self.body_lines > FN_LINES
    }
    pub fn too_many_args(&self) -> bool {
        !self.in_trait_impl && self.args > FN_ARGS
    }
    pub fn place(&self) -> String {
        format!("{}:{} fn {}", self.file, self.line, self.name)
    }
}

/// Something above the interface that looks behind it.
#[derive(Debug, Clone)]
pub struct BackDoor {
    pub file: String,
    pub line: usize,
    /// "downcast", "kind branch" or "directory probe".
    pub what: &'static str,
}

#[derive(Debug, Default)]
pub struct Facts {
    pub files: Vec<(String, usize)>,
    pub funcs: Vec<Func>,
    /// (file, line, fn) of signatures returning `Result<_, String>`.
    pub string_errors: Vec<(String, usize, String)>,
    pub back_doors: Vec<BackDoor>,
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Scan every crate's src/ under `root`.
pub fn scan(root: &Path) -> std::io::Result<Facts> {
    let mut facts = Facts::default();
    let crates = root.join("crates");
    let mut names: Vec<_> = std::fs::read_dir(&crates)
        .map_err(|e| std::io::Error::other(format!("{}: {e}", crates.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("src").is_dir())
        .collect();
    names.sort();
    for krate in names {
        let name = krate.file_name().unwrap().to_string_lossy().into_owned();
        let mut files = Vec::new();
        rust_files(&krate.join("src"), &mut files);
        files.sort();
        // Every file is visited; those a `#[cfg(test)] mod x;` names (x.rs,
        // x/mod.rs or anything under x/) are dropped after.
        let mut skip: Vec<PathBuf> = Vec::new();
        let mut seen: Vec<(PathBuf, Facts)> = Vec::new();
        for path in files {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace("/./", "/");
            let src = std::fs::read_to_string(&path)
                .map_err(|e| std::io::Error::other(format!("{rel}: {e}")))?;
            let ast = syn::parse_file(&src).map_err(|e| {
                let at = e.span().start();
                std::io::Error::other(format!("{rel}:{}:{}: {e}", at.line, at.column))
            })?;
            let mut here = Facts::default();
            let mut v = Visitor {
                file: rel.clone(),
                src: src.lines().collect(),
                krate: &name,
                trait_impl: vec![],
                test_mods: vec![],
                facts: &mut here,
            };
            v.visit_file(&ast);
            let dir = module_dir(&path);
            for m in std::mem::take(&mut v.test_mods) {
                skip.push(dir.join(format!("{m}.rs")));
                skip.push(dir.join(m));
            }
            here.files.push((rel, src.lines().count()));
            seen.push((path, here));
        }
        for (path, here) in seen {
            if skip.iter().any(|s| path.starts_with(s)) {
                continue;
            }
            facts.files.extend(here.files);
            facts.funcs.extend(here.funcs);
            facts.string_errors.extend(here.string_errors);
            facts.back_doors.extend(here.back_doors);
        }
    }
    Ok(facts)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Where `mod x;` in this file looks for x.rs or x/.
fn module_dir(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap_or(Path::new("."));
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("lib" | "main" | "mod") => dir.to_path_buf(),
        Some(stem) => dir.join(stem),
        None => dir.to_path_buf(),
    }
}

struct Visitor<'a> {
    file: String,
    src: Vec<&'a str>,
    krate: &'a str,
    /// Whether each enclosing impl block implements a trait.
    trait_impl: Vec<bool>,
    /// `#[cfg(test)] mod x;` seen here: x.rs and x/ are left out.
    test_mods: Vec<String>,
    facts: &'a mut Facts,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let t = a.meta.to_token_stream_string();
            let t = t.trim_start_matches("cfg").trim();
            t.starts_with("(test") || t.starts_with("(all(test") || t.starts_with("(any(test")
        }
    })
}

trait MetaString {
    fn to_token_stream_string(&self) -> String;
}
impl MetaString for syn::Meta {
    fn to_token_stream_string(&self) -> String {
        quote::ToTokens::to_token_stream(self)
            .to_string()
            .replace(' ', "")
    }
}

/// Whether `attrs` hold `#[LEVEL(... clippy::LINT ...)]`.
fn lint_attr(attrs: &[syn::Attribute], level: &str, lint: &str) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident(level)
            && a.meta
                .to_token_stream_string()
                .contains(&format!("clippy::{lint}"))
    })
}

/// clippy's too_many_lines count over the text of a body `{ ... }`: the
/// lines between the braces that hold code outside comments.
pub fn body_code_lines(body: &str) -> usize {
    let inner = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or(body)
        .trim();
    let mut count = 0;
    let mut in_comment = false;
    for mut line in inner.lines() {
        let mut code = false;
        loop {
            line = line.trim_start();
            if line.is_empty() {
                break;
            }
            if in_comment {
                if let Some(i) = line.find("*/") {
                    line = &line[i + 2..];
                    in_comment = false;
                    continue;
                }
            } else {
                let multi = line.find("/*").unwrap_or(line.len());
                let single = line.find("//").unwrap_or(line.len());
                code |= multi > 0 && single > 0;
                if multi < single {
                    line = &line[multi + 2..];
                    in_comment = true;
                    continue;
                }
            }
            break;
        }
        count += usize::from(code);
    }
    count
}

impl Visitor<'_> {
    /// The source text between two positions (lines 1-based, columns in
    /// characters).
    fn text(&self, a: LineColumn, b: LineColumn) -> String {
        let mut out = String::new();
        for l in a.line..=b.line {
            let Some(line) = self.src.get(l - 1) else {
                break;
            };
            let from = if l == a.line { a.column } else { 0 };
            let to = if l == b.line {
                b.column
            } else {
                line.chars().count()
            };
            out.extend(line.chars().skip(from).take(to.saturating_sub(from)));
            if l != b.line {
                out.push('\n');
            }
        }
        out
    }

    fn func(
        &mut self,
        attrs: &[syn::Attribute],
        sig: &syn::Signature,
        body: Option<&syn::Block>,
        in_trait_impl: bool,
    ) {
        let start = sig.fn_token.span.start().line;
        let (body_lines, span_lines) = match body {
            Some(b) => {
                let (s, e) = (b.span().start(), b.span().end());
                (body_code_lines(&self.text(s, e)), e.line - start + 1)
            }
            None => (0, 1),
        };
        self.facts.funcs.push(Func {
            file: self.file.clone(),
            line: start,
            name: sig.ident.to_string(),
            body_lines,
            span_lines,
            args: sig.inputs.len(),
            in_trait_impl,
            expects_lines: lint_attr(attrs, "expect", "too_many_lines"),
            expects_args: lint_attr(attrs, "expect", "too_many_arguments"),
            allows_lines: lint_attr(attrs, "allow", "too_many_lines"),
            allows_args: lint_attr(attrs, "allow", "too_many_arguments"),
        });
        if returns_string_error(&sig.output) {
            self.facts
                .string_errors
                .push((self.file.clone(), start, sig.ident.to_string()));
        }
    }

    fn above_interface(&self) -> bool {
        !BELOW_THE_INTERFACE.contains(&self.krate)
    }

    fn back_door(&mut self, line: usize, what: &'static str) {
        if self.above_interface()
            && !self
                .facts
                .back_doors
                .iter()
                .any(|b| b.file == self.file && b.line == line && b.what == what)
        {
            self.facts.back_doors.push(BackDoor {
                file: self.file.clone(),
                line,
                what,
            });
        }
    }

    /// Back doors inside macro arguments (`matches!`, `format!`), which
    /// syn leaves as tokens.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let toks: Vec<_> = tokens.into_iter().collect();
        for (i, t) in toks.iter().enumerate() {
            match t {
                proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                proc_macro2::TokenTree::Ident(id) => {
                    let s = id.to_string();
                    let line = id.span().start().line;
                    if let Some(what) = ident_back_door(&s) {
                        self.back_door(line, what);
                    }
                    if s == "Kind" {
                        let next: String = toks[i + 1..]
                            .iter()
                            .take(3)
                            .map(ToString::to_string)
                            .collect();
                        if next == "::Local" || next == "::ObjectStore" {
                            self.back_door(line, "kind branch");
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Names that are a back door wherever they appear above the interface.
fn ident_back_door(ident: &str) -> Option<&'static str> {
    match ident {
        "as_local" | "as_object_store" => Some("downcast"),
        "is_shared" | "FILE_SUPER" => Some("directory probe"),
        _ => None,
    }
}

fn returns_string_error(out: &syn::ReturnType) -> bool {
    let syn::ReturnType::Type(_, ty) = out else {
        return false;
    };
    let syn::Type::Path(p) = &**ty else {
        return false;
    };
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    if last.ident != "Result" {
        return false;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return false;
    };
    matches!(
        args.args.iter().nth(1),
        Some(syn::GenericArgument::Type(syn::Type::Path(e))) if e.path.is_ident("String")
    )
}

impl<'ast> Visit<'ast> for Visitor<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_cfg_test(&m.attrs) {
            if m.content.is_none() {
                self.test_mods.push(m.ident.to_string());
            }
            return;
        }
        visit::visit_item_mod(self, m);
    }

    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Fn(x) => &x.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Mod(x) => &x.attrs,
            syn::Item::Const(x) => &x.attrs,
            syn::Item::Static(x) => &x.attrs,
            syn::Item::Struct(x) => &x.attrs,
            syn::Item::Enum(x) => &x.attrs,
            syn::Item::Trait(x) => &x.attrs,
            syn::Item::Use(x) => &x.attrs,
            syn::Item::Macro(x) => &x.attrs,
            _ => return visit::visit_item(self, i),
        };
        if is_cfg_test(attrs) && !matches!(i, syn::Item::Mod(_)) {
            return;
        }
        visit::visit_item(self, i);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.func(&f.attrs, &f.sig, Some(&f.block), false);
        visit::visit_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.trait_impl.push(i.trait_.is_some());
        visit::visit_item_impl(self, i);
        self.trait_impl.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_cfg_test(&f.attrs) {
            return;
        }
        let in_trait = self.trait_impl.last().copied().unwrap_or(false);
        self.func(&f.attrs, &f.sig, Some(&f.block), in_trait);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if is_cfg_test(&f.attrs) {
            return;
        }
        self.func(&f.attrs, &f.sig, f.default.as_ref(), false);
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_ident(&mut self, id: &'ast proc_macro2::Ident) {
        if let Some(what) = ident_back_door(&id.to_string()) {
            self.back_door(id.span().start().line, what);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let [.., kind, variant] = segs.as_slice() {
            if kind == "Kind" && (variant == "Local" || variant == "ObjectStore") {
                self.back_door(p.span().start().line, "kind branch");
            }
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        visit::visit_macro(self, m);
    }
}
