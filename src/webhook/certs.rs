//! Development certificates: a fresh CA and a server certificate it signs, written as
//! `ca.crt`, `tls.crt` and `tls.key` (the names a `kubernetes.io/tls` Secret mounts).
//! For local runs and tests; clusters use cert-manager (see `config/webhook/`).

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use thiserror::Error;

/// Validity of generated certificates.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(Debug, Error)]
pub enum CertError {
    #[error("at least one host name or IP address is needed for the certificate")]
    NoHosts,
    #[error("generating the certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The names the in-cluster Service answers to, plus loopback for local runs.
pub fn default_hosts() -> Vec<String> {
    [
        "harness-engine-webhook.harness-engine-system.svc",
        "harness-engine-webhook.harness-engine-system.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    ]
    .map(String::from)
    .to_vec()
}

/// Where [`self_signed`] wrote its files, and the CA in PEM (a webhook configuration's
/// `caBundle` is its base64).
#[derive(Clone, Debug)]
pub struct SelfSigned {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_pem: String,
}

/// Writes a new CA (`ca.crt`) and a server certificate (`tls.crt`, key `tls.key`, mode
/// 0600) valid for `hosts` (DNS names or IP addresses) into `dir`, creating it. Each file
/// is replaced atomically (written aside, then renamed), so a server watching them never
/// reads half a file. Existing files are overwritten: calling this again rotates them.
pub fn self_signed(dir: &Path, hosts: &[String]) -> Result<SelfSigned, CertError> {
    if hosts.is_empty() {
        return Err(CertError::NoHosts);
    }
    let now = SystemTime::now();
    let not_before = time::OffsetDateTime::from(now - Duration::from_secs(3600));
    let not_after = time::OffsetDateTime::from(now + VALIDITY);

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "harness-engine webhook development CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    ca.serial_number = Some(random_serial());
    let ca_cert = ca.self_signed(&ca_key)?;

    let leaf_key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name
        .push(DnType::CommonName, hosts[0].clone());
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    leaf.serial_number = Some(random_serial());
    let issuer = Issuer::new(ca, &ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let ca_pem = ca_cert.pem();
    let out = SelfSigned {
        ca_file: dir.join("ca.crt"),
        cert_file: dir.join("tls.crt"),
        key_file: dir.join("tls.key"),
        ca_pem: ca_pem.clone(),
    };
    write_atomically(&out.ca_file, ca_pem.as_bytes(), false)?;
    write_atomically(&out.key_file, leaf_key.serialize_pem().as_bytes(), true)?;
    write_atomically(&out.cert_file, leaf_cert.pem().as_bytes(), false)?;
    Ok(out)
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive and non-zero as DER integers must be for a serial number.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> Result<(), CertError> {
    let err = |source| CertError::Write {
        path: path.display().to_string(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = path.with_file_name(format!(".{file_name}.tmp"));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(&aside).map_err(err)?;
    file.write_all(bytes).map_err(err)?;
    file.sync_all().map_err(err)?;
    drop(file);
    std::fs::rename(&aside, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_ca_and_a_server_pair_and_rotates_on_a_second_call() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let hosts = vec![
            "harness-engine-webhook.harness-engine-system.svc".to_owned(),
            "127.0.0.1".to_owned(),
        ];
        let first = self_signed(dir.path(), &hosts).unwrap_or_else(|e| panic!("{e}"));
        for file in [&first.ca_file, &first.cert_file, &first.key_file] {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{e}"));
            assert!(text.starts_with("-----BEGIN "), "{}", file.display());
        }
        assert_eq!(
            std::fs::read_to_string(&first.ca_file).unwrap_or_default(),
            first.ca_pem
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&first.key_file)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0);
            assert_eq!(mode, 0o600);
        }
        let second = self_signed(dir.path(), &hosts).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(first.ca_pem, second.ca_pem);
        assert!(matches!(
            self_signed(dir.path(), &[]),
            Err(CertError::NoHosts)
        ));
    }
}
