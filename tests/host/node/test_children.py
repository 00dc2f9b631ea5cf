"""How `coppelius node` starts its children: the installed package, or the checkout's path shim
(`python3 -m tools.checkout`, where nothing is installed) from the checkout's root; absolute paths
and a fresh, empty checkpoint per GPU."""
from __future__ import annotations

import sys

from coppelius.node.children import Invocation, child_command, prepare
from coppelius.node.targets import Target
from tests.support.paths import ROOT


class CheckoutFinder:                       # what tools/shim.py mounts, by its class name
    def find_spec(self, *args):
        return None


def test_the_child_runs_what_this_process_runs(monkeypatch):
    assert child_command() == ([sys.executable, "-m", "coppelius.cli"], None)
    monkeypatch.setattr(sys, "meta_path", [CheckoutFinder(), *sys.meta_path])
    assert child_command() == ([sys.executable, "-m", "tools.checkout"], ROOT)


def test_prepare_starts_fresh_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gpu = Target(3, "NVIDIA H200", "GPU-00000000-0000-0000-0000-000000000003", "0000:9a:00.0")
    (tmp_path / "w" / "gpu3").mkdir(parents=True)
    (tmp_path / "w" / "gpu3" / "tiny.ckpt").write_bytes(b"old checkpoint")
    c = prepare(Invocation(profile="tiny", steps=1, work=tmp_path.relative_to(tmp_path) / "w",
                           soak=4), gpu)
    assert c.directory == tmp_path / "w" / "gpu3" and (c.directory / "tiny.ckpt").stat().st_size == 0
    argv = c.argv
    assert argv[argv.index("--device") + 1] == "3" and argv[argv.index("--steps") + 1] == "1"
    assert argv[argv.index("--soak") + 1] == "4"
    assert argv[argv.index("--digests") + 1] == str(tmp_path / "w" / "gpu3" / "digests.json")
    assert argv[argv.index("--directory") + 1] == str(tmp_path / "w")
    slot = prepare(Invocation(profile="tiny", backend="interpret", work=tmp_path / "w"),
                   Target(1, "cpu", "", ""))
    assert "--device" not in slot.argv and slot.directory.name == "slot1"


def test_bad_options_are_refused_before_anything_runs(tmp_path, capsys):
    from coppelius.cli import main
    for args in (["--steps", "0"], ["--steps", "9"], ["--soak", "0"], ["--count", "0",
                                                                        "--backend", "interpret"]):
        assert main(["node", "--profile", "tiny", "--work", str(tmp_path / "n"), *args]) == 2
        assert not (tmp_path / "n").exists()
    err = capsys.readouterr().err
    assert "--steps 9 is outside 1..8" in err and "--soak 0" in err and "--count 0" in err
