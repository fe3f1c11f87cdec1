//! Signal dispositions the launcher changes for itself and puts back before
//! the exec: the command must start with the caller's (an ignored signal
//! stays ignored across exec, a handled one is reset to the default).
use std::io;

/// A disposition saved by [`SavedDisposition::replace`].
pub struct SavedDisposition {
    signal: libc::c_int,
    previous: libc::sigaction,
}

impl SavedDisposition {
    /// Sets `signal` to `handler` (`SIG_IGN` or `SIG_DFL`), remembering the
    /// caller's disposition.
    pub fn replace(
        signal: libc::c_int,
        handler: libc::sighandler_t,
    ) -> io::Result<SavedDisposition> {
        // SAFETY: both sigaction structs are fully initialised (zeroed, then
        // filled) before the kernel reads them; `previous` is written by it.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, &action, &mut previous) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(SavedDisposition { signal, previous })
        }
    }

    /// Puts the caller's disposition back.
    pub fn restore(self) {
        // SAFETY: `previous` is what the kernel returned for this signal.
        unsafe { libc::sigaction(self.signal, &self.previous, std::ptr::null_mut()) };
    }
}

/// Whether `signal` is currently ignored.
pub fn is_ignored(signal: libc::c_int) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one
    // into a zeroed struct.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_the_previous_disposition() {
        // SIGURG is ignored by default (SIG_DFL) and nothing else uses it.
        let before = is_ignored(libc::SIGURG);
        let saved = SavedDisposition::replace(libc::SIGURG, libc::SIG_IGN).unwrap();
        assert!(is_ignored(libc::SIGURG));
        saved.restore();
        assert_eq!(is_ignored(libc::SIGURG), before);
    }
}
