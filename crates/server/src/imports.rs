//! What every importer shares (`vmdk_ops` for VMDK, raw and qcow2,
//! `luks_ops` for LUKS1): the request, the new disk made plain or
//! encrypted, and the report of an image that became one disk.

use std::path::Path;

use strata_api::{ImageFormat, ImportReport, KeyGrant};
use strata_datastore::{Datastore, EncryptedDisk};
use strata_engine::{Error, Provisioning};

/// What to import: the image at `path` (its format, or None to tell it
/// by its bytes) as disk `name`, provisioned `prov`, encrypted with a
/// first keyslot for `encrypt` when given (a LUKS1 image's passphrase).
pub struct Import<'a> {
    pub path: &'a Path,
    pub name: &'a str,
    pub prov: Provisioning,
    pub format: Option<ImageFormat>,
    pub encrypt: Option<&'a KeyGrant>,
}

impl Import<'_> {
    /// Create the new disk of `size` bytes, encrypted when a key was given.
    pub fn create(&self, ds: &dyn Datastore, size: u64) -> Result<(), Error> {
        match self.encrypt {
            Some(key) => {
                let spec = EncryptedDisk {
                    disk: self.name,
                    size_bytes: size,
                    provisioning: self.prov,
                    key,
                };
                ds.create_encrypted(&spec, &mut |_, _| {})?;
            }
            None => {
                ds.create(self.name, size, self.prov, &mut |_, _| {})?;
            }
        }
        Ok(())
    }

    /// The report of an image of `format` that became the one disk asked
    /// for (no links, no snapshots).
    pub fn one_disk(&self, ds: &dyn Datastore, format: ImageFormat) -> Result<ImportReport, Error> {
        Ok(ImportReport {
            disk: ds.disk_view(self.name, false)?,
            format,
            links: None,
            snapshots: Vec::new(),
        })
    }
}
