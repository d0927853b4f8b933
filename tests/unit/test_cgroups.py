"""cgroup discovery and file parsers, on recorded file contents."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasegate.worker import cgroups
from phasegate.worker.cgroups import (
    CgroupMount,
    discover,
    parse_flat_keyed,
    parse_limit,
    parse_mountinfo,
    parse_pressure,
    parse_proc_cgroup,
    read_cpu,
    read_memory,
)

# Recorded on this project's hybrid machine (Debian bookworm, kernel 6.x).
HYBRID_PROC_CGROUP = """\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/70c65d793aa51b07013dfb1e8ef1a54b
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""
HYBRID_MOUNTINFO = """\
23 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# A Kubernetes pod on a cgroup v2 node (EKS, containerd, cgroupns=private).
UNIFIED_PROC_CGROUP = "0::/\n"
UNIFIED_MOUNTINFO = (
    "1021 1012 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup "
    "rw,nsdelegate,memory_recursiveprot\n")
# Same node without a cgroup namespace: the mount shows the host's root.
HOST_VIEW_PROC_CGROUP = "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n"

PSI = """\
some avg10=4.87 avg60=1.72 avg300=0.83 total=9850949
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"""
MEMORY_EVENTS = "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"
CPU_STAT_V2 = ("usage_usec 176630454\nuser_usec 130097201\nsystem_usec 46533253\n"
               "nr_periods 1200\nnr_throttled 37\nthrottled_usec 812345\n")


def test_pressure_some_and_full():
    pressure = parse_pressure(PSI)
    assert pressure.some == cgroups.PressureLine(4.87, 1.72, 0.83, 9850949)
    assert pressure.full == cgroups.PressureLine(0.0, 0.0, 0.0, 0)


def test_pressure_cpu_file_without_full_line_on_older_kernels():
    pressure = parse_pressure("some avg10=0.10 avg60=0.00 avg300=0.00 total=55\n")
    assert pressure.some is not None and pressure.some.total_us == 55
    assert pressure.full is None


@pytest.mark.parametrize("text", [
    "", "garbage\n", "some avg10=x avg60=0 avg300=0 total=1\n", "some avg10=1.0 total=5\n",
    "some avg10=1 avg60=2 avg300=3 total=\n", "other avg10=1 avg60=2 avg300=3 total=4\n"])
def test_pressure_malformed_lines_are_skipped(text):
    assert parse_pressure(text).some is None


def test_pressure_malformed_line_does_not_hide_a_good_one():
    text = "some avg10=?? avg60=0 avg300=0 total=1\nfull avg10=1.5 avg60=0 avg300=0 total=9\n"
    pressure = parse_pressure(text)
    assert pressure.some is None and pressure.full is not None
    assert pressure.full.avg10 == 1.5


def test_flat_keyed_memory_events_and_cpu_stat():
    assert parse_flat_keyed(MEMORY_EVENTS)["oom_kill"] == 1
    assert parse_flat_keyed(MEMORY_EVENTS)["high"] == 12
    stat = parse_flat_keyed(CPU_STAT_V2)
    assert (stat["nr_throttled"], stat["throttled_usec"]) == (37, 812345)


def test_flat_keyed_skips_malformed_lines():
    assert parse_flat_keyed("a 1\nb\nc x\nd 2 3\n\ne 5\n") == {"a": 1, "e": 5}


@pytest.mark.parametrize(("text", "expected"), [
    ("max\n", None), ("67108864\n", 67108864), ("9223372036854771712\n", None), ("", None),
    ("lots\n", None), ("-1\n", None)])
def test_limits(text, expected):
    assert parse_limit(text) == expected


def test_proc_cgroup_hybrid():
    own = parse_proc_cgroup(HYBRID_PROC_CGROUP)
    assert own.v2_path == "/"
    assert own.v1_paths["memory"] == "/process_api/70c65d793aa51b07013dfb1e8ef1a54b"
    assert own.v1_paths["name=systemd"] == "/"


def test_proc_cgroup_unified_and_malformed():
    assert parse_proc_cgroup(UNIFIED_PROC_CGROUP) == cgroups.ProcCgroup("/", {})
    own = parse_proc_cgroup("junk\n4:memory\n0::relative\n0::/a/b\n")
    assert own.v2_path == "/a/b" and own.v1_paths == {}


def test_proc_cgroup_legacy_has_no_v2():
    own = parse_proc_cgroup("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert own.v2_path is None
    assert own.v1_paths == {"memory": "/docker/abc", "cpu": "/docker/abc",
                            "cpuacct": "/docker/abc"}


def test_mountinfo_hybrid():
    mounts = parse_mountinfo(HYBRID_MOUNTINFO)
    assert mounts.v2 == CgroupMount("/", "/sys/fs/cgroup/unified")
    assert mounts.v1["memory"] == CgroupMount("/", "/sys/fs/cgroup/memory")
    assert "name=systemd" not in mounts.v1 and "rw" not in mounts.v1
    assert "ext4" not in str(mounts)


def test_mountinfo_unified_and_escaped_and_malformed():
    mounts = parse_mountinfo(UNIFIED_MOUNTINFO + "bad line\n1 2 3 - \n")
    assert mounts.v2 == CgroupMount("/", "/sys/fs/cgroup") and mounts.v1 == {}
    escaped = parse_mountinfo("1 2 0:1 /a\\040b /mnt/c\\040g rw - cgroup2 none rw\n")
    assert escaped.v2 == CgroupMount("/a b", "/mnt/c g")


def test_mountinfo_without_cgroups():
    assert parse_mountinfo("23 1 254:0 / / rw - ext4 /dev/vda rw\n") == cgroups.Mounts(None, {})


# -- discovery on a recorded tree -----------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def test_discover_unified_reads_limit_from_the_tightest_ancestor(tmp_path):
    own = "/kubepods/pod1/ctr"
    _tree(tmp_path, {
        "cg/cgroup.procs": "", "cg/memory.max": "max\n",
        "cg/kubepods/cgroup.procs": "", "cg/kubepods/memory.max": "max\n",
        "cg/kubepods/pod1/cgroup.procs": "", "cg/kubepods/pod1/memory.max": "268435456\n",
        "cg/kubepods/pod1/memory.current": "200000000\n",
        "cg/kubepods/pod1/memory.stat": "anon 150000000\ninactive_file 10000000\n",
        "cg/kubepods/pod1/memory.events": MEMORY_EVENTS,
        "cg/kubepods/pod1/memory.high": "max\n",
        "cg/kubepods/pod1/ctr/cgroup.procs": "1\n", "cg/kubepods/pod1/ctr/memory.max": "max\n",
        "cg/kubepods/pod1/ctr/memory.pressure": PSI, "cg/kubepods/pod1/ctr/cpu.stat": CPU_STAT_V2,
        "cg/kubepods/pod1/ctr/cpu.pressure": "some avg10=1 avg60=1 avg300=1 total=1\n"})
    mountinfo = f"1 2 0:27 / {tmp_path}/cg rw - cgroup2 cgroup2 rw\n"
    paths = discover(f"0::{own}\n", mountinfo)
    assert paths.layout == "unified" and paths.available
    assert paths.v2_dir == tmp_path / "cg" / own.lstrip("/")
    assert paths.memory_limit_dir() == ("v2", tmp_path / "cg/kubepods/pod1")
    memory = read_memory(paths)
    assert memory is not None
    assert (memory.usage, memory.working_set, memory.limit) == (200000000, 190000000, 268435456)
    assert memory.events["high"] == 12
    assert memory.ratio == pytest.approx(190000000 / 268435456)
    assert read_cpu(paths) == cgroups.CpuSample(1200, 37, 812345)


def test_discover_mount_of_a_subtree_strips_its_root(tmp_path):
    _tree(tmp_path, {"cg/cgroup.procs": "", "cg/memory.pressure": PSI})
    mountinfo = f"1 2 0:27 /kubepods/pod1/ctr {tmp_path}/cg rw - cgroup2 cgroup2 rw\n"
    paths = discover("0::/kubepods/pod1/ctr\n", mountinfo)
    assert paths.v2_dir == tmp_path / "cg"
    assert paths.memory_pressure == tmp_path / "cg/memory.pressure"


def test_discover_hybrid_takes_limits_from_v1_memory(tmp_path):
    _tree(tmp_path, {
        "unified/cgroup.procs": "", "unified/memory.pressure": PSI,
        "unified/cpu.stat": "usage_usec 5\n",
        "memory/cgroup.procs": "", "memory/memory.limit_in_bytes": "9223372036854771712\n",
        "memory/app/cgroup.procs": "1\n", "memory/app/memory.limit_in_bytes": "67108864\n",
        "memory/app/memory.usage_in_bytes": "60000000\n", "memory/app/memory.failcnt": "4\n",
        "memory/app/memory.soft_limit_in_bytes": "9223372036854771712\n",
        "memory/app/memory.stat": "cache 9000000\ntotal_inactive_file 2000000\n",
        "memory/app/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        "cpu/cgroup.procs": "1\n", "cpu/cpu.stat": "nr_periods 10\nnr_throttled 3\n"
                                                  "throttled_time 5000000\n"})
    mountinfo = (f"32 31 0:29 / {tmp_path}/cpu rw - cgroup cgroup rw,cpu\n"
                 f"35 31 0:32 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
                 f"41 31 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n")
    paths = discover("4:memory:/app\n1:cpu:/\n0::/\n", mountinfo)
    assert paths.layout == "hybrid" and paths.available
    assert paths.memory_limit_dir() == ("v1", tmp_path / "memory/app")
    memory = read_memory(paths)
    assert memory is not None
    assert (memory.limit, memory.high, memory.working_set) == (67108864, None, 58000000)
    assert memory.events == {"max": 4, "oom_kill": 2}
    # The v2 root's cpu.stat has no throttling fields: v1 cpu is used, ns -> us.
    assert read_cpu(paths) == cgroups.CpuSample(10, 3, 5000)


def test_discover_legacy_only_is_not_available(tmp_path):
    _tree(tmp_path, {"memory/cgroup.procs": "1\n"})
    mountinfo = f"35 31 0:32 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n"
    paths = discover("4:memory:/\n", mountinfo)
    assert paths.layout == "legacy" and not paths.available
    assert paths.v2_dir is None


def test_discover_missing_controllers_and_files(tmp_path):
    _tree(tmp_path, {"cg/cgroup.procs": "1\n"})  # no pressure, no memory files
    paths = discover("0::/\n", f"1 2 0:27 / {tmp_path}/cg rw - cgroup2 cgroup2 rw\n")
    assert paths.layout == "unified" and not paths.available
    assert read_memory(paths) is None and read_cpu(paths) is None
    assert cgroups.read_pressure(paths.memory_pressure) is None


def test_discover_with_no_cgroups_at_all():
    paths = discover("", "23 1 254:0 / / rw - ext4 /dev/vda rw\n")
    assert paths.layout == "none" and not paths.available


def test_discover_this_machine_does_not_raise():
    paths = discover()
    assert paths.layout in ("unified", "hybrid", "legacy", "none")
