//! The profiled process's container and cgroup, read from
//! `/proc/PID/cgroup`: the agent tags profiles with their container from
//! the `Datadog-Container-ID` and `Datadog-Entity-ID` headers. They are the
//! target's, not the profiler's (with `-p` the two can differ).
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What the headers say about where the target runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entity {
    pub container_id: Option<String>,
    /// `ci-<container id>`, else `in-<inode of the cgroup directory>`.
    pub entity_id: Option<String>,
}

impl Entity {
    /// Reads `pid`'s cgroup; missing pieces stay `None`.
    pub fn of_process(pid: u32) -> Self {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return Self::default();
        };
        let container_id = crate::container::container_id_in(&text);
        let entity_id = match &container_id {
            Some(id) => Some(format!("ci-{id}")),
            None => crate::container::cgroup_v2_path(&text)
                .and_then(|path| {
                    let directory = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
                    std::fs::metadata(directory).ok()
                })
                .map(|metadata| format!("in-{}", metadata.ino())),
        };
        Self {
            container_id,
            entity_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_outside_containers_has_a_cgroup_inode_entity() {
        let entity = Entity::of_process(std::process::id());
        if entity.container_id.is_none() {
            assert!(
                entity
                    .entity_id
                    .as_deref()
                    .is_none_or(|id| id.starts_with("in-")),
                "{entity:?}"
            );
        }
    }
}
