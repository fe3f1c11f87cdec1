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
        let container_id = text.lines().find_map(container_id_of_line);
        let entity_id = match &container_id {
            Some(id) => Some(format!("ci-{id}")),
            None => cgroup_v2_path(&text)
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

/// The unified hierarchy's path (`0::/PATH`).
fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::"))
}

/// A container ID in a `/proc/PID/cgroup` line: the last path component
/// that is (or wraps, as `docker-<id>.scope` or `cri-containerd-<id>.scope`
/// do) 64 hex digits, a UUID, or an ECS task's `<32 hex>-<digits>`.
fn container_id_of_line(line: &str) -> Option<String> {
    let path = line.splitn(3, ':').nth(2)?;
    path.rsplit('/').find_map(|component| {
        let component = component.strip_suffix(".scope").unwrap_or(component);
        // The whole component, or what follows one of its dashes
        // (`docker-<id>`, `cri-containerd-<id>`; a UUID has dashes itself).
        let suffixes = component
            .match_indices('-')
            .map(|(at, _)| &component[at + 1..]);
        std::iter::once(component)
            .chain(suffixes)
            .find(|candidate| is_container_id(candidate))
            .map(str::to_string)
    })
}

fn is_container_id(text: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
    let is_uuid = {
        let parts: Vec<&str> = text.split('-').collect();
        parts.len() == 5
            && parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
            && parts.iter().all(|p| hex(p))
    };
    let is_ecs_task = text.split_once('-').is_some_and(|(task, number)| {
        task.len() == 32 && hex(task) && number.chars().all(|c| c.is_ascii_digit())
    });
    (text.len() == 64 && hex(text)) || is_uuid || is_ecs_task
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_found_in_cgroup_lines() {
        let docker = "0::/system.slice/docker-3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860.scope";
        assert_eq!(
            container_id_of_line(docker).as_deref(),
            Some("3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860")
        );
        let kubernetes = "11:memory:/kubepods/burstable/podc9a2c5f0/34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376";
        assert_eq!(
            container_id_of_line(kubernetes).map(|id| id.len()),
            Some(64)
        );
        let uuid = "0::/kubepods/pod1/cri-containerd-6f6d0b4a-2b7e-4a8d-9e0f-0123456789ab.scope";
        assert_eq!(
            container_id_of_line(uuid).as_deref(),
            Some("6f6d0b4a-2b7e-4a8d-9e0f-0123456789ab")
        );
        assert_eq!(container_id_of_line("0::/user.slice/session-3.scope"), None);
        assert_eq!(container_id_of_line("0::/"), None);
    }

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
