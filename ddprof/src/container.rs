//! Which container a process runs in, from its cgroup (`/proc/PID/cgroup`):
//! the export's `Datadog-Container-ID` header for the profiled command and
//! each sample's `container_id` label, as Datadog's C++ ddprof puts it on
//! every sample. The cgroup's path is chosen by whoever created the cgroup
//! (root, a container runtime, a user it was delegated to): an id found
//! there only labels that process's own samples.
use std::sync::Arc;

/// The container id in `/proc/PID/cgroup`'s text, if any.
pub fn container_id_in(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(container_id_of_line)
}

/// The container process `pid` runs in (`None`: none, or it is gone).
pub fn container_of(pid: u32) -> Option<Arc<str>> {
    // procfs: nothing that can hang or be a link planted by someone.
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    container_id_in(&text).map(Arc::from)
}

/// The unified hierarchy's path (`0::/PATH`).
pub fn cgroup_v2_path(text: &str) -> Option<&str> {
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
    fn a_process_is_in_the_container_its_cgroup_says() {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(
            container_of(std::process::id()).as_deref(),
            container_id_in(&own).as_deref()
        );
        assert_eq!(container_of(u32::MAX), None);
    }
}
