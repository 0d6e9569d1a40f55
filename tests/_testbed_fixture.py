"""The pytest side of the test bed: a module-scoped bed, a job runner that parses the ranks' results,
and the leftover check every bed test module ends with.

    bed = make_bed_fixture(lambda: BedSpec.of([2, 2], rate="400 Mb/s", chips=[...]))   # in a test module
    pair = make_bed_fixture(lambda: BedSpec.of([2, 2]), name="pair")          # a second bed

The fixture skips the module with the reason when this machine cannot build a bed (not root, no
network namespaces, a missing tool); it sweeps beds left by dead test processes first; its finalizer
takes the bed down and asserts that nothing is left: no namespace, host process or state file of the
bed, no device of it in the root namespace, no new /dev/shm entry, and (checked before teardown)
each host's private /dev/shm empty.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any, Callable

import pytest

from hal.testbed import BedSpec, Testbed, TestbedUnavailable, check_available, sweep_stale
from hal.testbed.launch import JobResult, launch


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def make_bed_fixture(spec_factory: Callable[[], BedSpec], name: str = "bed"):
    """A module-scoped fixture `name` (several beds in one module take several names)."""
    @pytest.fixture(scope="module", name=name)
    def bed(tmp_path_factory):
        try:
            check_available()
        except TestbedUnavailable as exc:
            pytest.skip(f"test bed unavailable: {exc}")
        sweep_stale()
        shm_before = set(os.listdir("/dev/shm"))
        links_before = _root_links()
        b = Testbed(spec_factory())
        b.phase_dir = str(tmp_path_factory.mktemp(f"phases-{name}"))
        try:
            b.up()
        except TestbedUnavailable as exc:
            pytest.skip(f"test bed unavailable: {exc}")
        problems = []
        try:
            yield b
            for h in range(b.spec.hosts):
                if b.init_pids[h]:
                    left = b.run(h, ["ls", "-A", "/dev/shm"]).stdout.split()
                    if left:
                        problems.append(f"host {h} /dev/shm not empty after the jobs: {left}")
        finally:
            b.down()
        problems += b.leftovers()
        new_links = {l for l in _root_links() - links_before if re.fullmatch(r"rail\d+|h\d+r\d+|br0", l)}
        problems += [f"device {l} in the root namespace" for l in sorted(new_links)]
        new_shm = {s for s in set(os.listdir("/dev/shm")) - shm_before if "hal" in s.lower()}
        problems += [f"/dev/shm/{s} left in the root namespace" for s in sorted(new_shm)]
        assert not problems, f"test bed {b.name} left things behind: {problems}"
    return bed


def run_cases(bed: Testbed, cases: list, timeout_s: float, wall_s: float, env: dict | None = None,
              during: Callable[[Any], None] | None = None) -> tuple[JobResult, dict[int, list[dict]]]:
    """Run `cases` (see tests/_testbed_job.py) in one torchrun job across the bed; returns the job and
    {rank: [result per case]}. `during(job)` runs while the job is up (e.g. pull a link)."""
    for f in os.listdir(bed.phase_dir):
        os.unlink(os.path.join(bed.phase_dir, f))
    env = {"HAL_TESTBED_PHASE_DIR": bed.phase_dir, "HAL_CPU_CCL": "auto", **(env or {})}
    job = launch(bed, ["-m", "tests._testbed_job", json.dumps(cases), str(timeout_s)], env=env)
    try:
        if during is not None:
            during(job)
    finally:
        result = job.wait(wall_s)
    per_rank: dict[int, list[dict]] = {}
    for line in result.lines:
        if line.startswith("TBRESULT "):
            rec = json.loads(line[len("TBRESULT "):])
            per_rank.setdefault(rec["rank"], []).append(rec)
    for recs in per_rank.values():
        recs.sort(key=lambda r: r["i"])
    return result, per_rank


def wait_phase(bed: Testbed, name: str, ranks: list[int], timeout: float) -> bool:
    """True once every rank in `ranks` wrote phase `name` (see tests/_testbed_job._phase)."""
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(os.path.exists(os.path.join(bed.phase_dir, f"{name}.{r}")) for r in ranks):
            return True
        time.sleep(0.05)
    return False
