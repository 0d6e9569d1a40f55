"""The test bed's spec (rates, layout from a cluster spec, validation with field and value), its
per-rank NIC entry point, the layering (hal never imports testbed), and `hal testbed` up/status/exec/
down round trip without a torch job (root only; skipped with the reason elsewhere). Fast: no ranks.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal.core.cluster import load_cluster_spec
from hal.testbed import BedSpec, LinkShape, Testbed, TestbedSpecError, TestbedUnavailable, check_available, parse_rate
from hal.testbed.rank_nic import nic_for_local_rank

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("text,bps", [("200 Mb/s", 200e6), ("200mbit", 200e6), ("1 Gb/s", 1e9), ("25 MB/s", 200e6),
                                      ("500kbit", 500e3), (3e6, 3e6)])
def test_parse_rate(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text", ["fast", "-5 Mb/s", "0mbit", 0])
def test_parse_rate_refuses(text):
    with pytest.raises(TestbedSpecError, match="rate="):
        parse_rate(text)


def test_spec_validation_names_field_and_value():
    with pytest.raises(TestbedSpecError, match=r"ranks\[1\]=0"):
        BedSpec.of([2, 0])
    with pytest.raises(TestbedSpecError, match="subnet='8.8.0.0/16'"):
        BedSpec.of([2, 2], subnet="8.8.0.0/16")
    with pytest.raises(TestbedSpecError, match="loss=1.5"):
        LinkShape(loss=1.5)
    with pytest.raises(TestbedSpecError, match="chips: 3 entries for a world of 4"):
        BedSpec.of([2, 2], chips=["cuda"] * 3)
    with pytest.raises(TestbedSpecError, match="name='no-dash'"):
        Testbed(BedSpec.of([1]), name="no-dash")


def test_addresses_are_private_and_distinct():
    spec = BedSpec.of([2, 1, 3])
    addrs = [spec.address(h, i) for h in range(3) for i in range(spec.ranks[h])]
    assert addrs[:3] == ["10.213.1.1", "10.213.1.2", "10.213.2.1"] and len(set(addrs)) == 6
    assert spec.world_size == 6 and spec.first_rank(2) == 3


def test_from_cluster_scales_nic_bandwidth():
    cluster = load_cluster_spec(ROOT / "examples/clusters/h800-910b-32.toml")
    spec = BedSpec.from_cluster(cluster, scale=1000)
    assert spec.ranks == (8, 8, 8, 8)
    assert spec.links[0][0].rate_bps == pytest.approx(400e6) and spec.links[3][7].rate_bps == pytest.approx(200e6)
    assert spec.chips == ("cuda",) * 16 + ("ascend",) * 16
    capped = BedSpec.from_cluster(cluster, scale=1000, max_rate="300 Mb/s")
    assert capped.links[0][0].rate_bps == pytest.approx(300e6) and capped.links[2][0].rate_bps == pytest.approx(200e6)
    laptop = BedSpec.from_cluster(load_cluster_spec(ROOT / "examples/clusters/laptop-2x2.toml"))
    assert laptop.ranks == (4,)   # colocated sub-clusters share one host


def test_sub_clusters_spanning_hosts():
    """A host list per sub-cluster: cuda on hosts 0 and 1, ascend on host 2; each rank its own NIC."""
    spec = BedSpec.of_sub_clusters([("cuda", [1, 1]), ("ascend", [2])], rate="200 Mb/s")
    assert spec.ranks == (1, 1, 2) and spec.chips == ("cuda", "cuda", "ascend", "ascend")
    assert spec.sub_cluster_hosts() == {"cuda": [0, 1], "ascend": [2]}
    assert [spec.host_of(r) for r in range(4)] == [0, 1, 2, 2]
    assert all(s.rate_bps == pytest.approx(200e6) for links in spec.links for s in links)
    assert BedSpec.of_sub_clusters({"cuda": [2, 1], "ascend": 1}).ranks == (2, 1, 1)
    # the rails are [0, 2] and [1, 3]: host 2 reaches rank 1 (host 1's only NIC) from rank 3's NIC,
    # not from NIC 0 as index matching would; index-matched layouts keep the index routes
    assert [spec.route_nic(2, r) for r in (0, 1)] == [0, 1] and spec.route_nic(1, 3) == 0
    even = BedSpec.of([2, 2], chips=["cuda"] * 2 + ["ascend"] * 2)
    assert [[even.route_nic(h, r) for r in range(4) if even.host_of(r) != h] for h in (0, 1)] == [[0, 1], [0, 1]]
    topo = spec.topology()
    assert [s.nodes for s in topo.sub_clusters] == [[[0], [1]], [[2, 3]]]
    assert topo.link(0, 1).bytes_per_s == pytest.approx(25e6)   # one sub-cluster, two hosts: the NIC
    assert topo.link(2, 3).bytes_per_s == float("inf")          # one host: shared memory, unshaped
    for bad, match in ((["cuda", [2]], "entry"), ([("cuda", [])], "hosts=\\[\\]"), ([], "no sub-clusters")):
        with pytest.raises(TestbedSpecError, match=match):
            BedSpec.of_sub_clusters(bad)
    with pytest.raises(TestbedSpecError, match="rank=4"):
        spec.host_of(4)
    with pytest.raises(TestbedSpecError, match="no chips"):
        BedSpec.of([2]).topology()


def test_rank_nic_picks_the_local_ranks_nic():
    assert nic_for_local_rank("rail0,rail1", 1) == "rail1"
    with pytest.raises(SystemExit, match="LOCAL_RANK=2 but HAL_RANK_NICS='rail0,rail1' names 2"):
        nic_for_local_rank("rail0,rail1", 2)


def test_not_root_is_a_clear_skip_reason(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedUnavailable, match="needs root"):
        check_available()


def test_hal_does_not_import_testbed():
    code = "import sys, hal, hal.cli; print('testbed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def _hal(capfd, *argv):
    """`hal ARGV` in this process (torch is already imported here; a subprocess per call costs ~3 s)."""
    from hal.cli import main
    capfd.readouterr()
    rc = main(list(argv))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, rc, out, err)


def test_cli_up_status_exec_down_leaves_nothing(capfd):
    try:
        check_available()
    except TestbedUnavailable as exc:
        pytest.skip(f"test bed unavailable: {exc}")
    name = f"t{os.getpid() % 100000}"
    up = _hal(capfd, "testbed", "up", "--ranks", "2,1", "--rate", "100Mb/s", "--chips", "cuda:2,ascend:1", "--name", name)
    try:
        assert up.returncode == 0, up.stderr
        assert f"test bed {name} is up: 2 host(s), 3 rank(s)" in up.stdout
        assert "rail1 10.213.1.2 100 Mb/s" in up.stdout
        st = _hal(capfd, "testbed", "status", "--name", name)
        assert "hosts ['up', 'up']" in st.stdout, st.stdout + st.stderr
        ex = _hal(capfd, "testbed", "exec", "--name", name, "--host", "1", "--", "sh", "-c", "hostname; ls -A /dev/shm")
        assert ex.returncode == 0 and ex.stdout.split() == [f"hal-tb-{name}-h1"], ex.stdout + ex.stderr
    finally:
        down = _hal(capfd, "testbed", "down", "--name", name)
    assert down.returncode == 0 and "nothing left behind" in down.stdout, down.stdout + down.stderr
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    bad = _hal(capfd, "testbed", "run", "--name", name, "--", "-m", "x")
    assert bad.returncode == 2 and f"no test bed '{name}'" in bad.stderr


_OWNER = ("import sys, time\n"
          "from hal.testbed import BedSpec, Testbed\n"
          "Testbed(BedSpec.of([1, 1], rate='100Mb/s'), name=sys.argv[1]).up()\n"
          "print('up', flush=True)\n"
          "time.sleep(600)\n")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_bed_whose_owner_is_killed_is_removed(sig):
    """SIGTERM: the owner's handler takes its bed down. SIGKILL: nothing can run in the owner, the
    hosts (own session) survive it, and `sweep_stale` (called by every bed fixture) removes them."""
    import select
    import signal
    from hal.testbed import list_beds, sweep_stale
    try:
        check_available()
    except TestbedUnavailable as exc:
        pytest.skip(f"test bed unavailable: {exc}")
    name = f"{sig[3].lower()}{os.getpid() % 100000}"
    p = subprocess.Popen([sys.executable, "-c", _OWNER, name], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 120)
        assert ready and p.stdout.readline().strip() == "up", "the owner did not bring its bed up"
        assert name in list_beds() and f"hal-tb-{name}-h1" in _netns()
        p.send_signal(getattr(signal, sig))
        p.wait(timeout=60)
        if sig == "SIGKILL":
            assert name in list_beds(), "nothing could have removed it yet"
            assert name in sweep_stale()
    finally:
        if p.poll() is None:
            p.kill()
    assert name not in list_beds() and f"hal-tb-{name}" not in _netns()


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_delay_without_netem_is_refused_with_the_reason():
    """This machine's kernel has no netem qdisc: a bed asking for delay says so (and leaves nothing);
    where netem exists the bed comes up with it."""
    try:
        check_available()
    except TestbedUnavailable as exc:
        pytest.skip(f"test bed unavailable: {exc}")
    bed = Testbed(BedSpec.of([1, 1], delay_ms=1.0))
    try:
        bed.up()
    except TestbedUnavailable as exc:
        assert "netem" in str(exc) and "delay" in str(exc)
    finally:
        bed.down()
    assert bed.leftovers() == []
