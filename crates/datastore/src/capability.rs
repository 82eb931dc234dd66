//! What each kind of datastore cannot do, and why: one table, so a
//! command is refused in one place with one reason (docs/MULTIHOST.md
//! shows the same table).

use crate::{Error, ErrorKind, Kind, Result};

/// Something a command needs of a datastore beyond disks, snapshots,
/// linked clones and I/O (which every kind has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capability {
    /// Space reserved at create (zeroedthick, eagerzeroedthick).
    Thick,
    /// A change of provisioning (`convert`).
    Convert,
    /// Laying a disk out in logical order, consolidating free space.
    Defrag,
    /// A disk's writer taken or handed over (`claim`, `release`).
    Claims,
    /// Garbage collection of what no live root reaches (`gc`).
    Gc,
    /// Rewriting the live grains of partly live objects (`compact`).
    Compact,
    /// Consistency groups (`strata group`).
    Groups,
    /// Finding and re-sharing equal grains (`strata dedup`).
    Dedup,
    /// Packing cold grains into compressed streams (`strata compress`).
    Compress,
}

impl Capability {
    /// The command that needs it, for messages.
    pub fn command(self) -> &'static str {
        match self {
            Capability::Thick => "thick provisioning",
            Capability::Convert => "convert",
            Capability::Defrag => "defrag",
            Capability::Claims => "claim and release",
            Capability::Gc => "gc",
            Capability::Compact => "compact",
            Capability::Groups => "consistency groups",
            Capability::Dedup => "dedup",
            Capability::Compress => "compress",
        }
    }
}

/// A reason that is a fact of the kind, not a gap in strata.
const LOCAL: &[(Capability, &str)] = &[
    (
        Capability::Claims,
        "a local datastore has one writer, the process that holds its lock (its server)",
    ),
    (
        Capability::Gc,
        "a local datastore frees space as it goes (reference counts): there is nothing to collect",
    ),
    (
        Capability::Compact,
        "a local datastore frees each grain as its last reference goes and reuses it in place: \
         nothing is left partly live ('strata defrag' lays a disk out)",
    ),
];

/// What an object-store datastore does not do, with the reason (a fact
/// of the kind, or what this version builds for local datastores only,
/// saying so).
const OBJECT_STORE: &[(Capability, &str)] = &[
    (
        Capability::Thick,
        "an object store has no space to reserve in advance: its disks are thin",
    ),
    (
        Capability::Convert,
        "an object store's disks are thin, and thin is all there is to convert to",
    ),
    (
        Capability::Defrag,
        "a disk's grains are objects in the store, which lays them out itself; what its \
         segments hold that no root reaches is freed by 'strata gc'",
    ),
    (
        Capability::Compress,
        "packing grains into compressed streams is for local datastores in this version",
    ),
];

/// Why `kind` cannot do `what`, or None if it can.
pub fn refusal(kind: Kind, what: Capability) -> Option<&'static str> {
    refusals(kind)
        .iter()
        .find(|(c, _)| *c == what)
        .map(|(_, why)| *why)
}

/// Ok, or an `Unsupported` error naming the command, the kind and the
/// reason (docs/ERRORS.md: valid, but this kind does not do it; never
/// `Refused`, which says "not now" to a caller that may then retry).
pub fn check(kind: Kind, what: Capability) -> Result<()> {
    match refusal(kind, what) {
        None => Ok(()),
        Some(why) => Err(Error::new(
            ErrorKind::Unsupported,
            format!("{} on this {}: {why}", what.command(), kind.noun()),
        )),
    }
}

/// The error of a maintenance call `kind` does not answer: its refusal
/// from the table with the reason, or (a kind the table says can, that
/// does not implement it) one that says so; `Unsupported` either way.
pub fn refused(kind: Kind, what: Capability) -> Error {
    match check(kind, what) {
        Err(e) => e,
        Ok(()) => Error::new(
            ErrorKind::Unsupported,
            format!(
                "{} on this {} is not implemented",
                what.command(),
                kind.noun()
            ),
        ),
    }
}

/// Every refusal of `kind`, for documentation and `status`.
pub fn refusals(kind: Kind) -> &'static [(Capability, &'static str)] {
    match kind {
        Kind::Local => LOCAL,
        Kind::ObjectStore => OBJECT_STORE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_names_the_command_and_the_kind() {
        let e = check(Kind::ObjectStore, Capability::Thick).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(
            e.message
                .starts_with("thick provisioning on this object-store datastore: "),
            "{}",
            e.message
        );
        assert!(check(Kind::Local, Capability::Thick).is_ok());
        assert!(check(Kind::ObjectStore, Capability::Claims).is_ok());
        assert!(check(Kind::Local, Capability::Claims).is_err());
    }

    #[test]
    fn each_capability_appears_at_most_once_per_kind() {
        for kind in [Kind::Local, Kind::ObjectStore] {
            let t = refusals(kind);
            for (i, (c, _)) in t.iter().enumerate() {
                assert!(
                    !t[i + 1..].iter().any(|(d, _)| d == c),
                    "{c:?} twice for {kind:?}"
                );
            }
        }
    }
}
