//! A process's Datadog unified service tags from its environment
//! (`/proc/PID/environ`: the environment it was exec'd with), as Datadog's
//! libraries take them: `DD_SERVICE`, `DD_ENV`, `DD_VERSION`.
use std::io::Read;

use super::{tag_value, ServiceIdentity};

/// The environment is read up to this much (Linux allows far more; the
/// variables are near its start in practice, and a process chooses it).
pub const MAX_ENVIRON_BYTES: u64 = 256 << 10;

/// `pid`'s service from its environment (`None`: no `DD_SERVICE`, or it
/// cannot be read).
pub fn of_process(pid: u32) -> Option<ServiceIdentity> {
    // procfs: nothing that can hang, no link of someone else's.
    let file = std::fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_ENVIRON_BYTES).read_to_end(&mut bytes).ok()?;
    parse(&bytes)
}

/// The service in an environment block (`NAME=value` entries separated by
/// NULs).
pub fn parse(environ: &[u8]) -> Option<ServiceIdentity> {
    let variable = |name: &str| {
        let prefix = format!("{name}=");
        environ
            .split(|&byte| byte == 0)
            .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
            .and_then(|value| tag_value(&String::from_utf8_lossy(value)))
    };
    Some(ServiceIdentity {
        service: variable("DD_SERVICE")?,
        env: variable("DD_ENV"),
        version: variable("DD_VERSION"),
        instance_id: None,
        container_id: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_service_tags_are_taken_from_the_environment() {
        let environ = b"PATH=/bin\0DD_ENV=prod\0DD_SERVICE=checkout\0DD_VERSION=1.2\0";
        assert_eq!(
            parse(environ),
            Some(ServiceIdentity {
                service: "checkout".into(),
                env: Some("prod".into()),
                version: Some("1.2".into()),
                instance_id: None,
                container_id: None,
            })
        );
        // No service: no identity; an empty one or one of separators only
        // is none either.
        assert_eq!(parse(b"DD_ENV=prod\0"), None);
        assert_eq!(parse(b"DD_SERVICE=\0"), None);
        assert_eq!(parse(b"DD_SERVICE=,,\0"), None);
        // A value that would break the tag list is cleaned, and bounded.
        let long = format!("DD_SERVICE=a,b:{}\0", "x".repeat(1000));
        let service = parse(long.as_bytes()).unwrap().service;
        assert!(
            service.starts_with("a_b:x") && service.len() <= 200,
            "{service}"
        );
        // Not a prefix of another variable's name.
        assert_eq!(parse(b"MY_DD_SERVICE=x\0"), None);
    }
}
