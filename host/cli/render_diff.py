"""Text reports of `coppelius diff`: a two-file comparison (`render`) and a fleet's classes
(`render_fleet`), from the dicts `coppelius.forensics.diff.compare` and `coppelius.forensics.fleet.classify` return."""
from __future__ import annotations

from rich import box
from rich.table import Table

from coppelius.cli.console import report_console as _console
from coppelius.cli.console import styled


def _cc(cc: int) -> str:
    return f"{cc // 10}.{cc % 10}" if cc else "—"


def _driver(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "—"


def _shown(field: str, value) -> str:
    """An identity value as a table shows it."""
    if value is None or value == "":
        return "—"
    if field == "compute_capability":
        return _cc(value)
    if field == "driver_version":
        return _driver(value)
    if field.endswith("sha256"):
        return "zeros (none)" if set(value) == {"0"} else value[:16] + "…"
    return str(value)


def _rules(rep: dict) -> str:
    tol = f"atol {rep['atol']:g}, rtol {rep['rtol']:g}"
    if rep["across_backends"]:
        return (f"across backends: numbers within {tol}; identity, time-dependent and environment "
                "fields never count")
    numbers = f"numbers within {tol}" if rep["atol"] or rep["rtol"] else "bits must match"
    return f"{numbers}; time-dependent and environment fields never count"


def ran_on(values, side: str | None = None) -> str:
    """ " on HOST, GPU-… (PCI 0000:65:00.0)": where a file was written (status block version 2),
    from a report's identity rows (`side` "a"/"b") or one file's identity dict; "" when unknown."""
    if side is not None:
        values = {r["field"]: r[side] for r in values}
    host, uuid, bus = values.get("host_name"), values.get("gpu_uuid"), values.get("pci_bus_id")
    parts = ([f"on {host}"] if host else []) + ([f"{uuid} (PCI {bus})"] if uuid else [])
    return (" " + ", ".join(parts)) if parts else ""


# ------------------------------------------------------------------------------------ two files
def render(rep: dict) -> None:
    """The files, the verdict, the first difference, a row per section, then what differs apart."""
    c = _console()
    for k in ("a", "b"):
        d = rep[k]
        c.print(f"{k.upper()}: {d['path']} ({d['profile']}, {d['outcome']}, {d['steps']:,} steps, "
                f"{d['size']:,} bytes){ran_on(rep['identity'], k)}")
    colour = "green" if rep["same"] else "red"
    tol = f" (atol {rep['atol']:g}, rtol {rep['rtol']:g})" if rep["atol"] or rep["rtol"] else ""
    c.print(styled((rep["verdict"], f"bold {colour}"), tol))
    for s in rep["structure"]:
        c.print(f"  {s}")
    if rep["first"] is not None:
        c.print(_first_line(rep["first"]))
    if rep["sections"]:
        c.print(_sections_table(rep))
    if rep["across_backends"]:
        c.print(_identity_table(rep))
    _print_apart(c, rep)
    if not rep["same"] and rep["a"]["profile"] == rep["b"]["profile"]:
        c.print(bisect_hint(rep))


def digest_step(rep: dict) -> int:
    """The update to digest next: the one before the first differing loss row (it made the
    parameters that row's forward read), step 0 for the forward logits, else the last step."""
    first = rep["first"] or {}
    if first.get("section") == "steps":
        return max(int(first["step"]) - 1, 0)
    if first.get("section") == "forward":
        return 0
    return max(min(rep["a"]["steps"], rep["b"]["steps"]) - 1, 0)


def _side_backends(rep: dict) -> tuple[str, str]:
    """The backend each file's status block names (the identity table), "cuda" where unknown."""
    row = next((r for r in rep.get("identity", []) if r["field"] == "backend"), None)
    if row is None:
        return "cuda", "cuda"
    known = ("cuda", "interpret")
    return tuple(b if b in known else "cuda" for b in (row["a"], row["b"]))


def bisect_hint(rep: dict) -> str:
    """The commands to run next, as they work when typed: digests of that update on each side,
    each side from its own copy of the state both runs started from (a run advances its
    checkpoint in place: two sides sharing one file would start from different updates, and
    bisect refuses the pair), then the bisect.  Files that start from different update counts
    trained different contexts: no launch of theirs compares, and the hint says so instead."""
    c0_a, c0_b = rep["a"]["c0"], rep["b"]["c0"]
    if c0_a != c0_b:
        return (f"these runs started from different update counts (c0 {c0_a} vs {c0_b}): they "
                "trained different contexts, so their losses differ by design and bisect "
                "compares no launch of theirs; compare two runs from the same starting "
                "checkpoint")
    n = digest_step(rep)
    tol = " --across-backends" if rep["across_backends"] else ""
    if c0_a == 0:
        start = "both started fresh: `: > A.ckpt; : > B.ckpt`"
    else:
        start = (f"both started at update {c0_a}: `cp START.ckpt A.ckpt; cp START.ckpt B.ckpt`, "
                 f"START.ckpt a copy of that checkpoint saved before they ran")
    runs = [f"`coppelius run --profile {rep['a']['profile']} --backend {backend} --checkpoint "
            f"{side}.ckpt --result {side}.bin --steps {n + 1} --digests {side}.json "
            f"--digest-step {n}`" for side, backend in zip("AB", _side_backends(rep))]
    return (f"next, to name the kernel: digest update step {n} on each side, each from its own "
            f"checkpoint ({start}), with the --tokens CACHE the runs trained on, if any: "
            f"{runs[0]} and {runs[1]}, then `coppelius bisect A.json B.json{tol}`")


def _first_line(f: dict) -> str:
    vals = ""
    if "a" in f:
        fmt = (lambda v: f"{v:.9g}") if "a_bits" in f else repr
        vals = f": A {fmt(f['a'])}, B {fmt(f['b'])}"
        if "a_bits" in f:
            vals += f" (bits {f['a_bits']} vs {f['b_bits']})"
    return f"first difference: section {f['section']}, {f['where']}{vals}"


def _sections_table(rep: dict) -> Table:
    tolerant = bool(rep["atol"] or rep["rtol"])
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ("section", "differing") + (("beyond tol.",) if tolerant else ()) + \
        ("max abs", "max rel", "first")
    for col in cols:
        t.add_column(col, justify="left" if col in ("section", "first") else "right")
    for s in rep["sections"]:
        first = "" if s["first"] is None else s["first"]["where"]
        row = [s["section"], f"{s['differing']:,}"]
        if tolerant:
            row.append(f"{s['beyond_tolerance']:,}")
        if "max_abs" in s:
            row += [f"{s['max_abs']:.3g}", f"{s['max_rel']:.3g}", first]
        else:
            row += ["", "", first if not s["fields"] else
                    first + "; fields " + ", ".join(f.split(".", 1)[1] for f in s["fields"])]
        t.add_row(*row)
    return t


def _identity_table(rep: dict) -> Table:
    t = Table(title="identity (listed apart, never counted)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("field", "A", "B", ""):
        t.add_column(col)
    for r in rep["identity"]:
        t.add_row(r["field"], _shown(r["field"], r["a"]), _shown(r["field"], r["b"]),
                  "differs" if r["differs"] else "")
    return t


def _print_apart(c, rep: dict) -> None:
    """The fields that differ but never count, and the device time per step of each file."""
    if rep["time_fields"]:
        c.print("time-dependent fields that differ (never count): " + ", ".join(rep["time_fields"]))
    if rep["environment_fields"]:
        c.print("environment fields that differ (never count): "
                + ", ".join(rep["environment_fields"]))
    if rep["identity_fields"]:
        c.print("identity fields that differ (never count across backends): "
                + ", ".join(rep["identity_fields"]))
    tm = rep.get("timing")
    if tm and tm["A_device_step_ms_p50"] is not None and tm["B_device_step_ms_p50"] is not None:
        c.print(f"device time per update step p50: A {tm['A_device_step_ms_p50']:.3f} ms, "
                f"B {tm['B_device_step_ms_p50']:.3f} ms")


# ---------------------------------------------------------------------------------------- fleet
def render_fleet(fleet: dict) -> None:
    """One row per class (members' identity, where it first differs from class 1), then the
    members of each class by name."""
    c = _console()
    n, k = len(fleet["files"]), len(fleet["classes"])
    colour = "green" if fleet["same"] else "red"
    verdict = f"all {n} in one class" if k == 1 else f"{k} classes"
    c.print(styled(f"{n} result files: ", (verdict, f"bold {colour}"), f" ({_rules(fleet)})"))
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("class", "files", "device", "cc", "driver", "PTX", "backend", "outcome", "c0",
                "first difference from class 1"):
        t.add_column(col, justify="right" if col in ("class", "files", "cc", "driver", "c0")
                     else "left")
    for cls in fleet["classes"]:
        files = cls["member_details"]
        t.add_row(str(cls["class"]), str(len(files)), _cell(files, "device_name"),
                  _cell(files, "compute_capability"), _cell(files, "driver_version"),
                  _cell(files, "ptx_target"), _cell(files, "backend"), _cell(files, "outcome"),
                  _cell(files, "c0"), _difference_text(cls["first_difference"]))
    c.print(t)
    for cls in fleet["classes"]:
        c.print(f"class {cls['class']}: " + ", ".join(
            m + ran_on(d) for m, d in zip(cls["members"], cls["member_details"])))


def _cell(files: list[dict], field: str) -> str:
    """The distinct values of one field among a class's members, one a line, with counts when
    they vary."""
    shown = [_shown(field, m[field]) for m in files]
    distinct = list(dict.fromkeys(shown))
    if len(distinct) == 1:
        return distinct[0]
    return "\n".join(f"{v} ×{shown.count(v)}" for v in distinct)


def _difference_text(d: dict | None) -> str:
    if d is None:
        return "(reference)"
    text = f"{d['section']}: {d['where']}"
    if "max_abs" in d:
        text += f" (max abs {d['max_abs']:.3g}, rel {d['max_rel']:.3g})"
    return text
