//! Webhook certificates: a CA and serving certificates it signs, in memory ([`new_ca`],
//! [`issue_serving`]: what the operator keeps in its Secret when it manages the
//! webhook's certificates itself, `src/operator/webhook_certs.rs`) or written as
//! `ca.crt`, `tls.crt` and `tls.key` for local runs and tests ([`self_signed`]).

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

/// A CA or a serving certificate in PEM, with its key and the end of its validity
/// (seconds since the Unix epoch).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pem {
    pub cert: String,
    pub key: String,
    pub not_after: i64,
}

fn validity(lifetime: Duration) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = SystemTime::now();
    (
        time::OffsetDateTime::from(now - Duration::from_secs(3600)),
        time::OffsetDateTime::from(now + lifetime),
    )
}

fn ca_params(common_name: &str) -> Result<CertificateParams, CertError> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, common_name.to_owned());
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca)
}

/// A new self-signed CA named `common_name`, valid for `lifetime` (from an hour ago, so
/// a clock slightly behind still accepts it).
pub fn new_ca(common_name: &str, lifetime: Duration) -> Result<Pem, CertError> {
    let key = KeyPair::generate()?;
    let mut params = ca_params(common_name)?;
    let (not_before, not_after) = validity(lifetime);
    params.not_before = not_before;
    params.not_after = not_after;
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after: not_after.unix_timestamp(),
    })
}

/// A serving certificate for `hosts` (DNS names or IP addresses), signed by the CA named
/// `ca_name` whose key is `ca_key` (PEM), valid for `lifetime`.
pub fn issue_serving(
    ca_name: &str,
    ca_key: &str,
    hosts: &[String],
    lifetime: Duration,
) -> Result<Pem, CertError> {
    if hosts.is_empty() {
        return Err(CertError::NoHosts);
    }
    let ca_key = KeyPair::from_pem(ca_key)?;
    let issuer = Issuer::new(ca_params(ca_name)?, &ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name
        .push(DnType::CommonName, hosts[0].clone());
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let (not_before, not_after) = validity(lifetime);
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    leaf.serial_number = Some(random_serial());
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
        not_after: not_after.unix_timestamp(),
    })
}

/// Writes a new CA (`ca.crt`) and a server certificate (`tls.crt`, key `tls.key`, mode
/// 0600) valid for `hosts` (DNS names or IP addresses) into `dir`, creating it. Each file
/// is replaced atomically (written aside, then renamed), so a server watching them never
/// reads half a file. Existing files are overwritten: calling this again rotates them.
pub fn self_signed(dir: &Path, hosts: &[String]) -> Result<SelfSigned, CertError> {
    if hosts.is_empty() {
        return Err(CertError::NoHosts);
    }
    const CA_NAME: &str = "harness-engine webhook development CA";
    let ca = new_ca(CA_NAME, VALIDITY)?;
    let leaf = issue_serving(CA_NAME, &ca.key, hosts, VALIDITY)?;
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let out = SelfSigned {
        ca_file: dir.join("ca.crt"),
        cert_file: dir.join("tls.crt"),
        key_file: dir.join("tls.key"),
        ca_pem: ca.cert.clone(),
    };
    write_atomically(&out.ca_file, ca.cert.as_bytes(), false)?;
    write_atomically(&out.key_file, leaf.key.as_bytes(), true)?;
    write_atomically(&out.cert_file, leaf.cert.as_bytes(), false)?;
    Ok(out)
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive and non-zero as DER integers must be for a serial number.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

/// Replaces `path` with `bytes` (written aside, synced, renamed), mode 0600 when `private`.
pub fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> Result<(), CertError> {
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
