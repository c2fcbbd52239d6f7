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
    pem_certificates(pem).map_err(|reason| problem(file, reason))
}

/// The private key in `pem` (`file`'s bytes).
pub(super) fn private_key(file: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
    pem_private_key(pem).map_err(|reason| problem(file, reason))
}

/// The certificates of a PEM file's bytes — at least one — or why there are none, for a message
/// that names the file: TLS files of the service's listeners are read as those of Redis.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) in it".to_owned());
    }
    Ok(certs)
}

/// The private key of a PEM file's bytes, or why there is none.
pub fn pem_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no PEM private key in it: {e}"))
}
