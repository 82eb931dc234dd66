//! The text descriptor: `key=value` lines, extent lines and the disk
//! database. Parsing is lenient where VMware and QEMU are (comments, quotes,
//! spaces around `=`), strict where a mistake would lose data (extent sizes,
//! unknown extent types), and bounded (a descriptor is at most
//! [`MAX_DESCRIPTOR_BYTES`], at most [`MAX_EXTENTS`] extents). Rendering
//! follows every qemu-img 7.2 quirk in docs/FORMAT.md §VMDK.

use std::fmt::Write as _;

use crate::error::{Result, VmdkError};

/// Descriptor text that does not follow the format (the caller names the file).
fn corrupt(message: impl Into<String>) -> VmdkError {
    crate::error::malformed("", message)
}

/// Larger descriptors are refused (QEMU reads at most 1 MiB).
pub const MAX_DESCRIPTOR_BYTES: usize = 1 << 20;
/// More extents than this are refused.
pub const MAX_EXTENTS: usize = 4096;
/// "No parent" in `parentCID`.
pub const NO_PARENT_CID: u32 = 0xffff_ffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Rw,
    RdOnly,
    NoAccess,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Rw => "RW",
            Access::RdOnly => "RDONLY",
            Access::NoAccess => "NOACCESS",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentType {
    Flat,
    Sparse,
    Zero,
    Vmfs,
    VmfsSparse,
    SeSparse,
    VmfsRdm,
    VmfsRaw,
}

impl ExtentType {
    pub fn name(self) -> &'static str {
        match self {
            ExtentType::Flat => "FLAT",
            ExtentType::Sparse => "SPARSE",
            ExtentType::Zero => "ZERO",
            ExtentType::Vmfs => "VMFS",
            ExtentType::VmfsSparse => "VMFSSPARSE",
            ExtentType::SeSparse => "SESPARSE",
            ExtentType::VmfsRdm => "VMFSRDM",
            ExtentType::VmfsRaw => "VMFSRAW",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "FLAT" => ExtentType::Flat,
            "SPARSE" => ExtentType::Sparse,
            "ZERO" => ExtentType::Zero,
            "VMFS" => ExtentType::Vmfs,
            "VMFSSPARSE" => ExtentType::VmfsSparse,
            "SESPARSE" => ExtentType::SeSparse,
            "VMFSRDM" => ExtentType::VmfsRdm,
            "VMFSRAW" => ExtentType::VmfsRaw,
            _ => return None,
        })
    }
}

/// One extent line: `ACCESS SECTORS TYPE "FILE" [OFFSET]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentLine {
    pub access: Access,
    pub sectors: u64,
    pub kind: ExtentType,
    /// Relative to the descriptor's folder; empty for ZERO extents.
    pub file: String,
    /// Start of the extent in its file, in sectors (FLAT only).
    pub offset: u64,
}

/// A parsed descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub version: u32,
    pub cid: u32,
    pub parent_cid: u32,
    pub create_type: String,
    pub parent_hint: Option<String>,
    pub extents: Vec<ExtentLine>,
    /// `ddb.*` entries in file order, keys without quotes, values unquoted.
    pub ddb: Vec<(String, String)>,
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(s)
}

fn parse_hex_u32(v: &str) -> Option<u32> {
    u32::from_str_radix(v.trim(), 16).ok()
}

fn parse_extent(line: &str) -> Result<Option<ExtentLine>> {
    let mut rest = line.trim();
    let (word, tail) = split_word(rest);
    let access = match word {
        "RW" => Access::Rw,
        "RDONLY" => Access::RdOnly,
        "NOACCESS" => Access::NoAccess,
        _ => return Ok(None),
    };
    rest = tail;
    let (sectors, tail) = split_word(rest);
    let sectors: u64 = sectors.parse().map_err(|_| {
        corrupt(format!(
            "extent line {line:?}: size {sectors:?} is not a number"
        ))
    })?;
    rest = tail;
    let (kind_s, tail) = split_word(rest);
    let kind = ExtentType::parse(kind_s).ok_or_else(|| {
        corrupt(format!(
            "extent line {line:?}: unknown extent type {kind_s:?}"
        ))
    })?;
    rest = tail.trim();
    let mut file = String::new();
    if kind != ExtentType::Zero || rest.starts_with('"') {
        let body = rest
            .strip_prefix('"')
            .ok_or_else(|| corrupt(format!("extent line {line:?}: file name must be quoted")))?;
        let end = body
            .find('"')
            .ok_or_else(|| corrupt(format!("extent line {line:?}: unterminated file name")))?;
        file = body[..end].to_string();
        rest = body[end + 1..].trim();
        if file.is_empty() {
            return Err(corrupt(format!("extent line {line:?}: empty file name")));
        }
    }
    let mut offset = 0;
    if !rest.is_empty() {
        let (o, tail) = split_word(rest);
        offset = o.parse().map_err(|_| {
            corrupt(format!(
                "extent line {line:?}: offset {o:?} is not a number"
            ))
        })?;
        if !tail.trim().is_empty() {
            return Err(corrupt(format!(
                "extent line {line:?}: unexpected {:?}",
                tail.trim()
            )));
        }
    }
    Ok(Some(ExtentLine {
        access,
        sectors,
        kind,
        file,
        offset,
    }))
}

fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

/// The text of a descriptor: at most [`MAX_DESCRIPTOR_BYTES`], up to the
/// first NUL, UTF-8.
fn descriptor_text(bytes: &[u8]) -> Result<&str> {
    if bytes.len() > MAX_DESCRIPTOR_BYTES {
        return Err(corrupt(format!(
            "descriptor of {} bytes is larger than the {} bytes allowed",
            bytes.len(),
            MAX_DESCRIPTOR_BYTES
        )));
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::str::from_utf8(&bytes[..end])
        .map_err(|e| corrupt(format!("descriptor is not UTF-8 text ({e})")))
}

impl Descriptor {
    /// Parse descriptor text. Text after a NUL byte (the padding of an
    /// embedded descriptor) is ignored.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let text = descriptor_text(bytes)?;
        let mut d = Descriptor {
            version: 0,
            cid: 0,
            parent_cid: NO_PARENT_CID,
            create_type: String::new(),
            parent_hint: None,
            extents: Vec::new(),
            ddb: Vec::new(),
        };
        let mut saw_version = false;
        let mut saw_cid = false;
        for raw in text.split('\n') {
            let line = raw.trim_end_matches('\r').trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(ext) = parse_extent(line)? {
                if d.extents.len() >= MAX_EXTENTS {
                    return Err(corrupt(format!("more than {MAX_EXTENTS} extents")));
                }
                d.extents.push(ext);
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(corrupt(format!(
                    "line {line:?} is neither key=value nor an extent"
                )));
            };
            let key = k.trim();
            d.set(key, unquote(v))?;
            saw_version |= key == "version";
            saw_cid |= key == "CID";
        }
        d.check_complete(saw_version, saw_cid)?;
        Ok(d)
    }

    /// One `key=value` line; keys strata does not use (encoding,
    /// changeTrackPath, isNativeSnapshot, ...) are skipped.
    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "version" => {
                self.version = value
                    .parse()
                    .map_err(|_| corrupt(format!("version {value:?} is not a number")))?;
            }
            "CID" => {
                self.cid = parse_hex_u32(value)
                    .ok_or_else(|| corrupt(format!("CID {value:?} is not hex")))?;
            }
            "parentCID" => {
                self.parent_cid = parse_hex_u32(value)
                    .ok_or_else(|| corrupt(format!("parentCID {value:?} is not hex")))?
            }
            "createType" => self.create_type = value.to_string(),
            "parentFileNameHint" => self.parent_hint = Some(value.to_string()),
            k if k.starts_with("ddb.") => self.ddb.push((k.to_string(), value.to_string())),
            _ => {}
        }
        Ok(())
    }

    /// The lines every descriptor must have were there, and its version is
    /// one strata reads.
    fn check_complete(&self, saw_version: bool, saw_cid: bool) -> Result<()> {
        if !saw_version {
            return Err(corrupt("no version= line"));
        }
        if !(1..=3).contains(&self.version) {
            return Err(corrupt(format!(
                "descriptor version {} (1, 2 or 3 expected)",
                self.version
            )));
        }
        if !saw_cid {
            return Err(corrupt("no CID= line"));
        }
        if self.create_type.is_empty() {
            return Err(corrupt("no createType= line"));
        }
        if self.extents.is_empty() {
            return Err(corrupt("no extent lines"));
        }
        Ok(())
    }

    /// Total size of the extents, in sectors.
    pub fn sectors(&self) -> u64 {
        self.extents
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.sectors))
    }

    pub fn ddb_get(&self, key: &str) -> Option<&str> {
        self.ddb
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Render as text that VMware and qemu-img 7.2 both read: `CID=` right
    /// before `parentCID=`, no spaces around `=` in the header lines, the
    /// `# Extent description` comment directly above the extent lines.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str("# Disk DescriptorFile\n");
        let _ = writeln!(s, "version={}", self.version);
        let _ = writeln!(s, "CID={:08x}", self.cid);
        let _ = writeln!(s, "parentCID={:08x}", self.parent_cid);
        let _ = writeln!(s, "createType=\"{}\"", self.create_type);
        if let Some(p) = &self.parent_hint {
            let _ = writeln!(s, "parentFileNameHint=\"{p}\"");
        }
        s.push_str("\n# Extent description\n");
        for e in &self.extents {
            let _ = write!(s, "{} {} {}", e.access.name(), e.sectors, e.kind.name());
            if e.kind != ExtentType::Zero {
                let _ = write!(s, " \"{}\"", e.file);
            }
            if e.kind == ExtentType::Flat {
                let _ = write!(s, " {}", e.offset);
            }
            s.push('\n');
        }
        s.push_str("\n# The Disk Data Base\n#DDB\n\n");
        for (k, v) in &self.ddb {
            let _ = writeln!(s, "{k} = \"{v}\"");
        }
        s
    }

    /// The disk database QEMU writes for a disk of `sectors` (adapter ide
    /// gets 16 heads, others 255; 63 sectors per track).
    pub fn default_ddb(sectors: u64, adapter: &str, hw_version: u32) -> Vec<(String, String)> {
        let heads: u64 = if adapter == "ide" { 16 } else { 255 };
        let cylinders = (sectors / (63 * heads)).clamp(1, 16383);
        vec![
            ("ddb.virtualHWVersion".into(), hw_version.to_string()),
            ("ddb.geometry.cylinders".into(), cylinders.to_string()),
            ("ddb.geometry.heads".into(), heads.to_string()),
            ("ddb.geometry.sectors".into(), "63".into()),
            ("ddb.adapterType".into(), adapter.into()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QEMU_FLAT: &str = "# Disk DescriptorFile\nversion=1\nCID=52c5b5a1\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\n# Extent description\nRW 2048 FLAT \"a-flat.vmdk\" 0\n\n# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"4\"\nddb.geometry.cylinders = \"2\"\nddb.adapterType = \"ide\"\n";

    #[test]
    fn parses_what_qemu_writes_and_renders_it_back() {
        let d = Descriptor::parse(QEMU_FLAT.as_bytes()).unwrap();
        assert_eq!(d.cid, 0x52c5b5a1);
        assert_eq!(d.parent_cid, NO_PARENT_CID);
        assert_eq!(d.create_type, "monolithicFlat");
        assert_eq!(d.extents.len(), 1);
        assert_eq!(d.extents[0].kind, ExtentType::Flat);
        assert_eq!(d.extents[0].file, "a-flat.vmdk");
        assert_eq!(d.ddb_get("ddb.adapterType"), Some("ide"));
        let again = Descriptor::parse(d.render().as_bytes()).unwrap();
        assert_eq!(again, d);
        // The quirks: CID line right before parentCID; the comment right
        // above the extents; no blank line directly before an extent.
        let r = d.render();
        assert!(r.contains("CID=52c5b5a1\nparentCID=ffffffff\n"));
        assert!(r.contains("# Extent description\nRW 2048 FLAT"));
        assert_eq!(r.find("CID"), r.find("CID=52c5b5a1"));
    }

    #[test]
    fn extents_with_spaces_zero_and_nul_padding() {
        let text = "version=1\nCID=1\nparentCID=ffffffff\ncreateType = \"twoGbMaxExtentFlat\"\nRW 10 FLAT \"my disk-f001.vmdk\" 0\nRW 5 ZERO\nRDONLY 7 SPARSE \"x.vmdk\"\n\0\0\0garbage";
        let d = Descriptor::parse(text.as_bytes()).unwrap();
        assert_eq!(d.extents.len(), 3);
        assert_eq!(d.extents[0].file, "my disk-f001.vmdk");
        assert_eq!(d.extents[1].kind, ExtentType::Zero);
        assert_eq!(d.extents[2].access, Access::RdOnly);
        assert_eq!(d.sectors(), 22);
    }

    #[test]
    fn bad_descriptors_say_what_is_wrong() {
        for (text, want) in [
            ("CID=1\ncreateType=\"x\"\nRW 1 FLAT \"a\" 0\n", "version"),
            (
                "version=9\nCID=1\ncreateType=\"x\"\nRW 1 FLAT \"a\" 0\n",
                "version 9",
            ),
            ("version=1\nCID=zz\n", "CID"),
            ("version=1\nCID=1\ncreateType=\"x\"\n", "no extent"),
            (
                "version=1\nCID=1\ncreateType=\"x\"\nRW x FLAT \"a\" 0\n",
                "not a number",
            ),
            (
                "version=1\nCID=1\ncreateType=\"x\"\nRW 1 WEIRD \"a\"\n",
                "unknown extent type",
            ),
            (
                "version=1\nCID=1\ncreateType=\"x\"\nRW 1 FLAT a 0\n",
                "quoted",
            ),
            (
                "version=1\nCID=1\ncreateType=\"x\"\nRW 1 FLAT \"a\n",
                "unterminated",
            ),
            ("version=1\nhello\n", "neither"),
            ("\u{ff}", "neither"),
        ] {
            let e = Descriptor::parse(text.as_bytes()).unwrap_err();
            assert!(e.message.contains(want), "{text:?}: {e}");
        }
        assert!(Descriptor::parse(&[0xff, 0xfe])
            .unwrap_err()
            .message
            .contains("UTF-8"));
    }
}
