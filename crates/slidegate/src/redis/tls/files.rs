//! The PEM files of [`super::TlsFiles`], read with their type and size checked first, and
//! parsed; every problem names the file and the reason.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// The largest certificate or key file read: a CA bundle of a few hundred certificates is
/// well under it, and a path pointing at something else (a log, a device) is refused before it
/// is read.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// An [`Error::Tls`] about `file`.
pub(super) fn problem(file: &Path, reason: impl Into<String>) -> Error {
    Error::Tls { what: file.display().to_string(), reason: reason.into() }
}

/// The bytes of `file`: a regular file of at most [`MAX_PEM_BYTES`].
pub(super) fn read(file: &Path) -> Result<Vec<u8>, Error> {
    let meta = std::fs::metadata(file).map_err(|e| problem(file, format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(problem(file, "not a regular file"));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(problem(file, format!("{} bytes, more than the {MAX_PEM_BYTES} a PEM file may have", meta.len())));
    }
    std::fs::read(file).map_err(|e| problem(file, format!("cannot read it: {e}")))
}

/// The certificates in `pem` (`file`'s bytes): at least one.
pub(super) fn certificates(file: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(file, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(problem(file, "no PEM certificate (-----BEGIN CERTIFICATE-----) in it"));
    }
    Ok(certs)
}

/// The private key in `pem` (`file`'s bytes).
pub(super) fn private_key(file: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| problem(file, format!("no PEM private key in it: {e}")))
}
