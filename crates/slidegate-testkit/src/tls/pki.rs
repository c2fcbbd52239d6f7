//! Certificates made in the test ([`TestPki`]): a CA of its own, a server certificate for
//! `localhost` and 127.0.0.1, a client certificate, and on demand the certificates a client
//! must refuse (expired, for another host).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A test CA and the PEM files it issued, in a scratch directory removed when dropped.
pub struct TestPki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// How a certificate [`TestPki::issue`] makes is flawed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// None: valid now, for `localhost` and 127.0.0.1.
    None,
    /// Its validity ended yesterday.
    Expired,
    /// It names `redis.invalid` only.
    OtherHost,
}

impl TestPki {
    /// A new CA named `name`, writing `ca.pem`, `server.pem`/`server.key` and
    /// `client.pem`/`client.key` under a new scratch directory.
    ///
    /// # Panics
    /// When a certificate cannot be made or written.
    pub fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("slidegate-pki-{}-{name}-{}", std::process::id(), crate::free_port()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut params = CertificateParams::new(Vec::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, format!("slidegate test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA certificate");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca.pem");
        let pki = Self { dir, ca };
        pki.issue("server", Flaw::None);
        pki.issue("client", Flaw::None);
        pki
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The server certificate (for `localhost` and 127.0.0.1).
    pub fn server(&self) -> CertFiles {
        self.files("server")
    }

    /// The client certificate.
    pub fn client(&self) -> CertFiles {
        self.files("client")
    }

    /// The scratch directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Issues `<name>.pem` and `<name>.key` with `flaw`, for a server and a client alike (a
    /// Cluster node's bus connections present the server's certificate as a client).
    ///
    /// # Panics
    /// When the certificate cannot be made or written.
    pub fn issue(&self, name: &str, flaw: Flaw) -> CertFiles {
        let names: &[&str] = match flaw {
            Flaw::OtherHost => &["redis.invalid"],
            Flaw::None | Flaw::Expired => &["localhost", "127.0.0.1"],
        };
        self.issue_for(name, names, flaw)
    }

    /// Issues `<name>.pem` and `<name>.key` for the subject alternative names `names` (DNS
    /// names or IP addresses), with `flaw`'s validity.
    ///
    /// # Panics
    /// When the certificate cannot be made or written.
    pub fn issue_for(&self, name: &str, names: &[&str], flaw: Flaw) -> CertFiles {
        let names = names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).expect("certificate params");
        params.distinguished_name.push(DnType::CommonName, format!("slidegate test {name}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        if flaw == Flaw::Expired {
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::days(30);
            params.not_after = now - time::Duration::days(1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        let files = self.files(name);
        std::fs::write(&files.cert, cert.pem()).expect("write certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }

    fn files(&self, name: &str) -> CertFiles {
        CertFiles { cert: self.dir.join(format!("{name}.pem")), key: self.dir.join(format!("{name}.key")) }
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
