//! `serve` mode's local files: the data directory, the HMAC identity key and the token
//! file. With nothing configured, first start creates all three, so `harness-engine
//! serve` alone gives a working server; later starts reuse them. Keys and tokens are
//! created owner-only (0600) and never overwritten.

use std::{
    fs,
    path::{Path, PathBuf},
};

use rand::TryRngCore;

use super::auth::static_tokens::{StaticTokens, TokenFileError, write_new_private_file};
use crate::domain::ids::{KeyError, Keyring, MIN_KEY_LEN};

/// The principal and subject of a generated token file.
pub const LOCAL_PRINCIPAL: &str = "local";
pub const LOCAL_SUBJECT: &str = "user:local";

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("no data directory: set --data-dir, XDG_DATA_HOME or HOME")]
    NoDataDir,
    #[error("creating data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading identity key {path}: {source}")]
    ReadKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing identity key {path}: {source}")]
    WriteKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("identity key {path}: {source}")]
    BadKey { path: PathBuf, source: KeyError },
    #[error("the system random number generator failed: {0}")]
    Random(String),
    #[error(transparent)]
    Tokens(#[from] TokenFileError),
}

/// The resolved local setup.
pub struct LocalSetup {
    pub data_dir: PathBuf,
    pub database: PathBuf,
    pub tokens_file: PathBuf,
    pub identity_key_file: PathBuf,
    pub keyring: Keyring,
    pub tokens: StaticTokens,
    /// The raw token, when this start created the token file: shown once, stored nowhere.
    pub created_token: Option<String>,
    pub created_key: bool,
}

/// `$XDG_DATA_HOME/harness-engine`, else `~/.local/share/harness-engine`.
pub fn default_data_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    xdg.or_else(|| {
        std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .map(|h| PathBuf::from(h).join(".local/share"))
    })
    .map(|base| base.join("harness-engine"))
}

/// Resolves (creating what is missing) the data directory, identity key and token file.
pub fn prepare(
    data_dir: Option<PathBuf>,
    tokens_file: Option<PathBuf>,
    identity_key_file: Option<PathBuf>,
    environment: &str,
) -> Result<LocalSetup, LocalError> {
    let data_dir = data_dir
        .or_else(default_data_dir)
        .ok_or(LocalError::NoDataDir)?;
    create_private_dir(&data_dir).map_err(|source| LocalError::DataDir {
        path: data_dir.clone(),
        source,
    })?;

    let (keyring, identity_key_file, created_key) =
        identity_key(&data_dir, identity_key_file, environment)?;

    let (tokens_file, created_token) = match tokens_file {
        Some(path) => (path, None),
        None => {
            let path = data_dir.join("tokens.yaml");
            if path.exists() {
                (path, None)
            } else {
                let token =
                    StaticTokens::create_file(&path, LOCAL_PRINCIPAL, &[LOCAL_SUBJECT.to_owned()])?;
                (path, Some(token))
            }
        }
    };
    let tokens = StaticTokens::load(&tokens_file)?;

    Ok(LocalSetup {
        database: data_dir.join("state.db"),
        data_dir,
        tokens_file,
        identity_key_file,
        keyring,
        tokens,
        created_token,
        created_key,
    })
}

/// Loads the identity key (creating a random one in `data_dir` when no file is named),
/// and the keyring made from it. Shared by `serve` and `operator`.
pub fn identity_key(
    data_dir: &Path,
    identity_key_file: Option<PathBuf>,
    environment: &str,
) -> Result<(Keyring, PathBuf, bool), LocalError> {
    let (identity_key_file, created_key) = match identity_key_file {
        Some(path) => (path, false),
        None => {
            let path = data_dir.join("identity.key");
            let created = !path.exists();
            if created {
                let mut key = [0u8; 32];
                rand::rngs::OsRng
                    .try_fill_bytes(&mut key)
                    .map_err(|e| LocalError::Random(e.to_string()))?;
                write_new_private_file(&path, &key).map_err(|source| LocalError::WriteKey {
                    path: path.clone(),
                    source,
                })?;
            }
            (path, created)
        }
    };
    let key = fs::read(&identity_key_file).map_err(|source| LocalError::ReadKey {
        path: identity_key_file.clone(),
        source,
    })?;
    if key.len() < MIN_KEY_LEN {
        return Err(LocalError::BadKey {
            path: identity_key_file,
            source: KeyError::TooShort(key.len()),
        });
    }
    warn_if_shared(&identity_key_file);
    let keyring = Keyring::new(key, environment).map_err(|source| LocalError::BadKey {
        path: identity_key_file.clone(),
        source,
    })?;
    Ok((keyring, identity_key_file, created_key))
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)
}

/// The key is the root of every identity: say so when others can read it. Group read
/// access is expected when the file's group is one of this process's own groups: a
/// Kubernetes Secret volume under `fsGroup` is mounted that way (owner root, group the
/// pod's), and the non-root operator reads the key through that group alone.
fn warn_if_shared(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let Ok(meta) = fs::metadata(path) else { return };
        let mode = meta.permissions().mode();
        let own_group = fs::read_to_string("/proc/self/status")
            .map(|status| process_groups(&status).contains(&meta.gid()))
            .unwrap_or(false);
        if key_is_shared(mode, own_group) {
            tracing::warn!(
                key = %path.display(),
                "identity key is readable by group or others; chmod 600 it"
            );
        }
    }
}

/// Whether a key file with `mode` is readable beyond this process: any bit for others,
/// or group bits when the file's group is not one of the process's (`own_group`).
fn key_is_shared(mode: u32, own_group: bool) -> bool {
    mode & 0o007 != 0 || (mode & 0o070 != 0 && !own_group)
}

/// The real, effective and supplementary group ids in a `/proc/<pid>/status` text.
fn process_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .filter_map(|l| l.strip_prefix("Gid:").or_else(|| l.strip_prefix("Groups:")))
        .flat_map(|rest| rest.split_whitespace().filter_map(|g| g.parse().ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_read_is_shared_only_through_a_foreign_group() {
        let status = "Name:\tx\nGid:\t0\t0\t0\t0\nGroups:\t65532 7 \n";
        assert_eq!(process_groups(status), vec![0, 0, 0, 0, 65532, 7]);
        // A Secret volume under fsGroup: 0440, group the pod's own.
        assert!(!key_is_shared(0o100440, true));
        assert!(key_is_shared(0o100440, false));
        assert!(key_is_shared(0o100604, true));
        assert!(!key_is_shared(0o100600, false));
    }

    #[test]
    fn first_start_creates_everything_and_second_reuses_it() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let data = dir.path().join("nested/data");
        let first = match prepare(Some(data.clone()), None, None, "local") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert!(first.created_key && first.created_token.is_some());
        assert_eq!(
            fs::read(&first.identity_key_file)
                .map(|k| k.len())
                .unwrap_or(0),
            32
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| {
                fs::metadata(p)
                    .map(|m| m.permissions().mode() & 0o777)
                    .unwrap_or(0)
            };
            assert_eq!(mode(&first.identity_key_file), 0o600);
            assert_eq!(mode(&first.tokens_file), 0o600);
            assert_eq!(mode(&data), 0o700);
        }
        let second = match prepare(Some(data), None, None, "local") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert!(
            !second.created_key && second.created_token.is_none(),
            "nothing is regenerated"
        );
        assert_eq!(
            first.keyring.binding_id("s", "a", "c"),
            second.keyring.binding_id("s", "a", "c"),
            "the same key, the same ids"
        );
    }

    #[test]
    fn a_short_key_is_refused() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let key = dir.path().join("short.key");
        let _ = fs::write(&key, [1u8; 16]);
        assert!(matches!(
            prepare(Some(dir.path().to_owned()), None, Some(key), "local"),
            Err(LocalError::BadKey { .. })
        ));
    }
}
