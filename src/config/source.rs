//! Which configuration file the settings came from, or that none did: what
//! the start logs and `check-config` prints first.

use std::path::{Path, PathBuf};

/// Where the settings came from: what the start logs and `check-config`
/// prints, since a service started from another folder than the one its
/// file is in runs on the defaults without an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// This file (its absolute path, when it resolves).
    File(PathBuf),
    /// No file: the default path was not there (relative to `cwd`), and the
    /// built-in defaults, under any flags and environment, are the settings.
    Defaults { looked_for: PathBuf, cwd: PathBuf },
}

impl ConfigSource {
    /// The file at `path`.
    pub fn file(path: &Path) -> Self {
        Self::File(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned()))
    }

    /// No file at the default `path`.
    pub fn defaults(path: &Path) -> Self {
        Self::Defaults {
            looked_for: path.to_owned(),
            cwd: std::env::current_dir().unwrap_or_default(),
        }
    }

    /// Says at start which file was read (info), or that none was (warn:
    /// a service on the defaults has no admin token, and a file meant for
    /// it may sit in another folder).
    pub fn log(&self) {
        match self {
            Self::File(_) => tracing::info!("{self}"),
            Self::Defaults { .. } => tracing::warn!("{self}"),
        }
    }
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "read the configuration file {}", path.display()),
            Self::Defaults { looked_for, cwd } => write!(
                f,
                "no configuration file at {} (looked in {}): running on the built-in defaults; \
                 give --config or SHARDSTOCK_CONFIG",
                looked_for.display(),
                cwd.display()
            ),
        }
    }
}
