//! Certificates made at test time with openssl: a CA, a server certificate for 127.0.0.1 and
//! localhost, a client certificate, and a second CA that signed none of them (the "wrong CA").

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::path_str;

/// What a server needs to speak TLS: its certificate and key, and the CA its clients'
/// certificates must chain to.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The files of one test's certificates (PEM), all in one directory.
#[derive(Debug, Clone)]
pub struct TestCerts {
    pub dir: PathBuf,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate (CN `herald`) and its key, for servers that ask for one.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here: trusting only it must fail.
    pub other_ca: PathBuf,
}

impl TestCerts {
    /// Makes every file in `dir` (created).
    pub fn generate(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = |name: &str| dir.join(name);
        let certs = Self {
            dir: dir.to_path_buf(),
            ca: path("ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server.key"),
            client_cert: path("client.pem"),
            client_key: path("client.key"),
            other_ca: path("other-ca.pem"),
        };
        for (name, subject) in [("ca", "/CN=Herald test CA"), ("other-ca", "/CN=Another CA")] {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                subject,
                "-keyout",
                path_str(&path(&format!("{name}.key")))?,
                "-out",
                path_str(&path(&format!("{name}.pem")))?,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ])?;
        }
        for (name, subject, extensions) in [
            (
                "server",
                "/CN=localhost",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
            ),
            (
                "client",
                "/CN=herald",
                "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
            ),
        ] {
            let csr = path(&format!("{name}.csr"));
            let ext = path(&format!("{name}.ext"));
            std::fs::write(&ext, extensions)?;
            openssl(&[
                "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                "-keyout", path_str(&path(&format!("{name}.key")))?,
                "-out", path_str(&csr)?,
            ])?;
            openssl(&[
                "x509", "-req", "-days", "2", "-in", path_str(&csr)?,
                "-CA", path_str(&certs.ca)?, "-CAkey", path_str(&path("ca.key"))?, "-CAcreateserial",
                "-extfile", path_str(&ext)?,
                "-out", path_str(&path(&format!("{name}.pem")))?,
            ])?;
        }
        Ok(certs)
    }

    /// The server side, for PostgreSQL, Redis and etcd.
    pub fn server(&self) -> ServerTls {
        ServerTls {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
            ca: self.ca.clone(),
        }
    }
}

fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl (Debian package openssl)")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
