//! `--switch-user USER`: the command runs as USER (name or numeric UID).
//!
//! The launcher opens its events first (as the caller), then sets the
//! supplementary groups, the GID and the UID (real, effective and saved) of
//! USER just before the exec. The environment (HOME, USER, ...) is left as
//! the caller set it, as `setpriv` does.
use std::ffi::CString;

use nix::unistd::{Gid, Uid, User};

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("no user `{0}` on this machine")]
    Unknown(String),
    #[error("cannot look up the user `{name}`: {source}")]
    Lookup { name: String, source: nix::Error },
    #[error("--switch-user: cannot become `{name}` ({step}: {source}); this needs root or CAP_SETUID and CAP_SETGID")]
    Switch {
        name: String,
        step: &'static str,
        source: nix::Error,
    },
}

/// A user resolved before anything else happens, so that a typo fails at once.
#[derive(Debug, Clone)]
pub struct TargetUser {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
}

/// Resolves a user name, or a numeric UID.
pub fn resolve(name: &str) -> Result<TargetUser, UserError> {
    let lookup = |result: nix::Result<Option<User>>| {
        result.map_err(|source| UserError::Lookup {
            name: name.to_string(),
            source,
        })
    };
    let user = match name.parse::<u32>() {
        Ok(uid) => lookup(User::from_uid(Uid::from_raw(uid)))?,
        Err(_) => lookup(User::from_name(name))?,
    }
    .ok_or_else(|| UserError::Unknown(name.to_string()))?;
    Ok(TargetUser {
        name: user.name,
        uid: user.uid,
        gid: user.gid,
    })
}

/// Becomes `user`: groups, then GID, then UID (after which nothing else can
/// be changed). The kernel clears the capabilities of a process whose UIDs
/// all leave 0, so a command run as another user gets none.
pub fn switch_to(user: &TargetUser) -> Result<(), UserError> {
    let error = |step: &'static str| {
        move |source| UserError::Switch {
            name: user.name.clone(),
            step,
            source,
        }
    };
    let name =
        CString::new(user.name.as_str()).map_err(|_| error("initgroups")(nix::Error::EINVAL))?;
    nix::unistd::initgroups(&name, user.gid).map_err(error("initgroups"))?;
    nix::unistd::setresgid(user.gid, user.gid, user.gid).map_err(error("setresgid"))?;
    nix::unistd::setresuid(user.uid, user.uid, user.uid).map_err(error("setresuid"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_and_uids() {
        let root = resolve("root").unwrap();
        assert_eq!(root.uid, Uid::from_raw(0));
        assert_eq!(resolve("0").unwrap().name, "root");
        assert!(matches!(
            resolve("no-such-user-ddprof"),
            Err(UserError::Unknown(_))
        ));
    }
}
