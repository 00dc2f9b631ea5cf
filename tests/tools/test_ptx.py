"""The committed PTX is exactly what tools/build_ptx.py produces, assembles with ptxas
for its target, has no atomics, uses wgmma on sm_90a, and its manifest covers the launch lists."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coppelius.plan import launches, profiles
from tests.support.paths import ROOT

PTX_DIR = ROOT / "kernels_ptx"
TARGETS = ("sm_90a", "sm_80")
DIRS = [(p, t) for p in profiles.names() for t in TARGETS]
ATOMIC = re.compile(r"^\s*(@!?%\w+\s+)?(atom|red)\.", re.M)
WGMMA_KERNELS = ("matmul", "matmul_swiglu", "matmul_rotary", "matmul_delta", "matmul_residual",
                 "weight_grad", "attention_fwd", "attention_bwd", "attention_bwd_dq")


def _ptxas() -> str | None:
    for cand in (shutil.which("ptxas"), "/usr/local/bin/ptxas", "/usr/local/cuda/bin/ptxas"):
        if cand and os.access(cand, os.X_OK):
            return cand
    try:
        import importlib.util
        spec = importlib.util.find_spec("triton")
        bundled = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
        return str(bundled) if bundled.exists() else None
    except Exception:
        return None


def _manifest(profile, target) -> dict:
    return json.loads((PTX_DIR / profile / target / "manifest.json").read_text())


def _ptx_files():
    return sorted(PTX_DIR.glob("*/*/*.ptx"))


def test_rebuild_matches_committed_bytes():
    """`python -m tools.build_ptx --check`: every profile and target rebuilt in a temporary
    directory, byte for byte the committed tree (and no file more or less)."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "tools.build_ptx", "--check",
                        "--jobs", str(os.cpu_count() or 2)], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, (f"the rebuild differs from the committed PTX (run python -m "
                               f"tools.build_ptx and commit kernels_ptx/):\n{r.stderr[-3000:]}")
    assert "byte for byte" in r.stdout
    committed = {p.relative_to(PTX_DIR).parts[:2] for p in PTX_DIR.glob("*/*/*") if p.is_file()}
    assert committed == {(p, t) for p, t in DIRS}         # --check covered every directory


def test_the_rebuild_check_names_every_difference(tmp_path):
    """differences(): a file only rebuilt, one only committed, and one whose last byte differs are
    each named; an identical tree gives nothing."""
    from tools.build_ptx import differences
    built, ref = tmp_path / "built", tmp_path / "ref"
    for root in (built, ref):
        (root / "tiny" / "sm_80").mkdir(parents=True)
        (root / "tiny" / "sm_80" / "same.ptx").write_bytes(b"same bytes\n")
        (root / "tiny" / "sm_80" / "last.ptx").write_bytes(b"x" * 4096 + b"\n")
    dirs = [("tiny", "sm_80")]
    assert differences(built, ref, dirs) == []
    (ref / "tiny" / "sm_80" / "last.ptx").write_bytes(b"x" * 4096 + b"\r")
    (built / "tiny" / "sm_80" / "new.ptx").write_bytes(b"")
    (ref / "tiny" / "sm_80" / "gone.ptx").write_bytes(b"")
    got = differences(built, ref, dirs)
    assert [line.split(":")[0] for line in got] == ["tiny/sm_80/gone.ptx", "tiny/sm_80/last.ptx",
                                                    "tiny/sm_80/new.ptx"], got
    assert "only in the rebuild" in got[2] and f"only in {ref}" in got[0] and "differs" in got[1]


def test_every_ptx_assembles_for_its_target():
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas on this machine")

    def assemble(path: Path):
        target = path.parent.name
        r = subprocess.run([ptxas, f"-arch={target}", str(path), "-o", os.devnull],
                           capture_output=True, text=True)
        return path, r.returncode, r.stderr

    with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(assemble, _ptx_files()))
    failed = [(str(p.relative_to(ROOT)), err.strip()[:300]) for p, rc, err in results
              if rc != 0 or "error" in err.lower()]
    assert not failed, f"ptxas failed: {failed[:3]}"
    assert len(results) == sum(len(_manifest(p, t)["kernels"]) for p, t in DIRS)


def test_no_atomics_anywhere():
    hits = [str(p.relative_to(ROOT)) for p in _ptx_files() if ATOMIC.search(p.read_text())]
    assert not hits, f"atom./red. instructions in {hits}"


@pytest.mark.parametrize("profile", profiles.names())
def test_wgmma_in_sm90a_matmul_and_attention(profile):
    m = _manifest(profile, "sm_90a")
    checked = 0
    for entry, rec in m["kernels"].items():
        if rec["function"] in WGMMA_KERNELS:
            text = (PTX_DIR / profile / "sm_90a" / rec["file"]).read_text()
            assert "wgmma.mma_async" in text, f"{entry} ({rec['function']}) has no wgmma"
            checked += 1
    assert checked >= len(WGMMA_KERNELS)


@pytest.mark.parametrize("profile,target", DIRS)
def test_manifest_covers_launch_lists_and_pins_isa(profile, target):
    m = _manifest(profile, target)
    assert m["ptx_isa"] == "8.0" and m["target"] == target and m["triton"] == "3.9.0"
    for sub in launches.submissions(profiles.get(profile)):
        for launch in sub.launches:
            rec = m["kernels"].get(launch.kernel)
            assert rec is not None, f"{launch.kernel} ({launch.label}) missing from the manifest"
            visible = [p["name"] for p in rec["params"] if not p["hidden"]]
            assert visible == [n for n, _ in launch.args], launch.kernel
            want = 1 if launch.function == launches.RELEASE else launch.num_warps * 32
            assert rec["threads"] == want, launch.kernel
    for rec in m["kernels"].values():
        text = (PTX_DIR / profile / target / rec["file"]).read_text(encoding="ascii")
        assert re.search(r"^\.version 8\.0$", text, re.M), rec["file"]
        assert re.search(rf"^\.target {target}$", text, re.M), rec["file"]
        assert f".entry {rec['entry']}(" in text
        assert "/work/" not in text and "/tmp/" not in text and ".file" not in text
        assert [p["name"] for p in rec["params"] if p["hidden"]] in ([], ["global_scratch",
                                                                       "profile_scratch"])


def test_committed_ptx_is_small():
    total = sum(p.stat().st_size for p in PTX_DIR.rglob("*") if p.is_file())
    assert total < 20e6, f"kernels_ptx is {total / 1e6:.1f} MB"


# a memory access a kernel may not make before griddepcontrol.wait: global or generic loads and
# stores, async copies, atomics and reductions, prefetches, a cluster's distributed shared memory.
# Parameter loads are the launch's own, and its CTA's own shared memory no other grid reaches
# (setting it up may overlap the predecessor, as the dK/dV backward's zero tile does)
_MEMORY_OP = re.compile(r"^\s*(@!?%\w+\s+)?(ld|st|cp\.async|atom|red|prefetch|cp\.reduce)"
                        r"(?!\.param|\.shared(?!::cluster))(\.|\s)")
_WAIT, _LAUNCH_NEXT = "griddepcontrol.wait", "griddepcontrol.launch_dependents"


def _grid_dependency_problems(ptx: str) -> list[str]:
    """Why a kernel may not be launched programmatically: a memory access before its first
    griddepcontrol.wait, no wait, or a launch_dependents before the wait (the next grid could
    then start before this one's predecessor is done, and grids pile up on the SMs)."""
    lines = ptx.splitlines()
    wait = next((i for i, ln in enumerate(lines) if _WAIT in ln), None)
    if wait is None:
        return ["no griddepcontrol.wait"]
    early = [ln.strip() for ln in lines[:wait] if _MEMORY_OP.match(ln)]
    problems = [f"memory access before the wait: {ln!r}" for ln in early[:3]]
    nxt = next((i for i, ln in enumerate(lines) if _LAUNCH_NEXT in ln), None)
    if nxt is not None and nxt < wait:
        problems.append("launch_dependents before the wait")
    return problems


@pytest.mark.parametrize("profile,target", DIRS)
def test_programmatic_kernels_wait_before_touching_memory(profile, target):
    """Programmatic dependent launch: a kernel the manifest marks `pdl` — every Triton
    kernel on sm_90a, none on sm_80, which has no griddepcontrol — reads and writes no memory
    but its CTA's own shared memory before griddepcontrol.wait, so overlapping its launch with
    its predecessor changes no bit;
    the hand-written kernels are never marked (their edges stay full)."""
    m = _manifest(profile, target)
    for key, k in m["kernels"].items():
        ptx = (PTX_DIR / profile / target / k["file"]).read_text()
        hand = k["function"] in launches.HAND_WRITTEN
        assert k["pdl"] is (target == "sm_90a" and not hand), (key, k["pdl"])
        if k["pdl"]:
            assert not _grid_dependency_problems(ptx), (key, _grid_dependency_problems(ptx))
        else:
            assert "griddepcontrol" not in ptx, key


def test_the_grid_dependency_check_can_fail():
    """The order check above refuses what it must: a load before the wait, a kernel with no wait,
    an early launch_dependents."""
    ok = "\tld.param.b64 \t%rd1, [k_param_0];\n\tgriddepcontrol.wait ;\n" \
         "\tgriddepcontrol.launch_dependents ;\n\tld.global.b32 \t%r1, [%rd1];\n"
    assert _grid_dependency_problems(ok) == []
    assert _grid_dependency_problems("\t@%p1 ld.global.b32 { %r1 }, [ %rd1 + 0 ];\n"
                                     "\tgriddepcontrol.wait ;\n")
    assert _grid_dependency_problems("\tst.global.b32 [%rd2], %r1;\n\tgriddepcontrol.wait ;\n")
    assert _grid_dependency_problems("\tcp.async.cg.shared.global [%r2], [%rd1], 16;\n"
                                     "\tgriddepcontrol.wait ;\n")
    assert _grid_dependency_problems("\tst.shared::cluster.b32 [%r2], %r1;\n"
                                     "\tgriddepcontrol.wait ;\n")
    assert _grid_dependency_problems("\tst.shared.v2.b32 [%r2+57344], {0, 0};\n"
                                     "\tgriddepcontrol.wait ;\n") == []
    assert _grid_dependency_problems("\tld.global.b32 \t%r1, [%rd1];\n") == ["no griddepcontrol.wait"]
    assert _grid_dependency_problems("\tgriddepcontrol.launch_dependents ;\n"
                                     "\tgriddepcontrol.wait ;\n")
