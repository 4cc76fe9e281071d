"""A container's mounts, as the node agent builds them (`mount_script`), in a real private
mount namespace: a volume over a directory that holds the agent's own files (an emptyDir on
/tmp while the pods' directory, or a clone of the project, is under /tmp) hides none of them.

The namespace is `unshare --mount`'s, as the agent's; nothing here changes the host's mounts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devservices.control_plane import unshare_available
from devservices.node_agent import Mount, mount_script

pytestmark = pytest.mark.skipif(
    not unshare_available(), reason="`unshare --mount` is not available here"
)


def test_a_volume_over_the_agents_own_directory_hides_no_source_nor_the_project(
    tmp_path: Path,
) -> None:
    cover = tmp_path.parent  # stands for /tmp: every source below is under it
    empty = tmp_path / "pod" / "volumes" / "tmp"
    data = tmp_path / "pod" / "volumes" / "data"
    project = tmp_path / "clone" / "project"
    for directory in (empty, data, project):
        directory.mkdir(parents=True)
    (data / "x").write_text("the data volume\n")
    tool = project / "tool.sh"
    tool.write_text("#!/bin/sh\necho the project still runs\n")
    tool.chmod(0o755)
    hosts = tmp_path / "pod" / "etc" / "main.hosts"
    hosts.parent.mkdir(parents=True)
    hosts.write_text("127.0.0.1\tlocalhost job-a-node-0-0.job-a\n")
    script = mount_script(
        [],
        # Given child first: the agent mounts parents before children whatever the order.
        [Mount(data, f"{cover}/data"), Mount(empty, str(cover))],
        keep=[project],
        hosts=hosts,
        working_dir=f"{cover}/work",
    )
    probe = (
        f"cat {cover}/data/x; grep job-a /etc/hosts; {tool}; pwd; "
        f"echo written > {cover}/note; ls {cover}"
    )

    namespace = ["unshare", "--mount", "--propagation", "private", "--"]
    done = subprocess.run(
        [*namespace, "bash", "-c", script, "bash", "sh", "-c", probe],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        "the data volume",
        "127.0.0.1\tlocalhost job-a-node-0-0.job-a",
        "the project still runs",
        f"{cover}/work",
    ]
    # Inside, the covered directory is the volume: what the container wrote is there, and
    # the host's own directory under it is not visible.
    assert tmp_path.name in sorted(lines[4:])  # re-created as the kept project's parent
    assert (empty / "note").read_text() == "written\n"
    assert not (cover / "note").exists()
    assert sorted(p.name for p in (empty / tmp_path.name).iterdir()) == ["clone"]
