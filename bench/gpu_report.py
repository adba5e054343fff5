"""The device check's summary (bench/gpu_check.sh), read from what its steps left in its work folder: each
step's exit status and seconds (steps.tsv), pytest's JUnit XML, the speed figures' JSON and the smoke
matrix's JSON lines. A verdict never comes from a log's last line. Exit status 0 where every step passed.

    python bench/gpu_report.py WORK SECONDS
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FIGURES = (  # (file name, what it measures, the goal it is held to)
    ("dfedavg", "DFedAvg, 300 peers, MLP", "<= 0.15 s"),
    ("ntk-dfl", "NTK-DFL, 300 peers (paper preset)", "<= 1.5 s"),
    ("tct-stage1", "TCT stage 1, paper scale", "<= 3 s"),
    ("dfedavg-cnn", "DFedAvg, 300 peers, cnn-fmnist", "<= 1 s"),
)
CUT = {124: "stopped at its time limit", 137: "killed at its time limit", 125: "skipped: no time left"}


def read_steps(work: Path) -> dict[str, dict]:
    steps = {}
    for line in (work / "steps.tsv").read_text().splitlines() if (work / "steps.tsv").exists() else []:
        name, code, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        steps[name] = {"code": int(code), "seconds": int(seconds or 0), "note": note}
    return steps


def status(step: dict | None) -> str:
    if step is None:
        return "not run"
    code = step["code"]
    if code == 0:
        return f"passed in {step['seconds']} s"
    return CUT.get(code, f"FAILED (exit {code}) after {step['seconds']} s")


def junit(path: Path) -> tuple[str, list[str]]:
    """('N passed, N failed, ...', the failed tests' names and first message lines)."""
    if not path.exists():
        return "no result file", []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return "a damaged result file", []
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
    failed = []
    for case in root.iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failed.append(f"{case.get('name')}: {message[0][:160] if message else ''}")
    counts = f"{passed} passed, {count['failures']} failed, {count['errors']} errors, {count['skipped']} skipped"
    return counts, failed


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def figure_line(work: Path, name: str, what: str, goal: str) -> str:
    gpu, cpu = read_json(work / f"figure-{name}-gpu.json"), read_json(work / f"figure-{name}-cpu.json")
    line = f"  {what:34s} "
    if gpu is None:
        return line + f"no result (see logs/figure-{name}-gpu.log)   [goal {goal}]"
    peak = f", peak GPU {gpu['peak_gpu_gb']:.2f} GB" if gpu.get("peak_gpu_gb") is not None else ""
    line += f"{gpu['device']} {gpu['best']:7.3f} s{peak}"
    if cpu is not None:
        scale = gpu["epochs"] / cpu["epochs"] if cpu.get("epochs") else 1  # a baseline of fewer epochs, scaled
        cpu_s = cpu["best"] * scale
        line += f", cpu {cpu_s:7.2f} s" + (f" (1 epoch x {scale:g})" if scale != 1 else "")
        line += f", {cpu_s / gpu['best']:.1f}x"
        if cpu.get("taus") and gpu.get("taus"):
            same = sum(a == b for a, b in zip(cpu["taus"], gpu["taus"]))
            line += f"; the CPU's t chosen at {same} of {len(gpu['taus'])} peers"
    else:
        line += ", cpu not measured"
    if not gpu.get("finite", True):
        line += "; NON-FINITE weights"
    return line + f"   [goal {goal}]"


def summary(work: Path, seconds: int) -> tuple[list[str], bool]:
    steps = read_steps(work)
    machine = (work / "machine.txt").read_text().strip().replace("\n", ", ") if (work / "machine.txt").exists() else "?"
    lines = [f"p2pfl device check: {machine}"]
    if "gate" in steps:
        return lines + [f"not started: {steps['gate']['note']}"], False
    for name, what in (
        ("keyed", "keyed hashes, CPU = GPU bit for bit"),
        ("cuda-tests", "cuda tests (against the CPU)"),
    ):
        counts, failed = junit(work / f"{name}.xml")
        lines.append(f"{what}: {status(steps.get(name))}; {counts}")
        lines += [f"  FAILED {f}" for f in failed]
    data = (work / "data.txt").read_text().strip() if (work / "data.txt").exists() else "?"
    lines.append(f"speed on {data} (seconds per round, the GPU synchronized; best of the rounds timed):")
    lines += [figure_line(work, *f) for f in FIGURES]
    pairs = (
        [json.loads(x) for x in (work / "smoke.jsonl").read_text().splitlines()]
        if (work / "smoke.jsonl").exists()
        else []
    )
    ok = sum(p["ok"] for p in pairs)
    lines.append(f"smoke matrix: {status(steps.get('smoke'))}; {ok} OK, {len(pairs) - ok} FAIL")
    lines += [f"  FAIL {p['pair']} {p['seconds']} s: {p['last']}" for p in pairs if not p["ok"]]
    counts, failed = junit(work / "conformance.xml")
    lines.append(f"conformance cuda tests: {status(steps.get('conformance'))}; {counts}")
    lines += [f"  FAILED {f}" for f in failed]
    figures_failed = [n for n, s in steps.items() if n.startswith("figure-") and s["code"] != 0]
    if figures_failed:
        lines.append("figure steps not passed: " + ", ".join(f"{n} ({status(steps[n])})" for n in figures_failed))
    optional = {n for n, s in steps.items() if n.endswith("-cpu") and s["code"] == 125}  # baselines: where time is left
    passed = bool(steps) and all(s["code"] == 0 for n, s in steps.items() if n not in optional)
    lines.append(
        f"{'all steps passed' if passed else 'NOT ALL STEPS PASSED'}; {seconds} s in all; logs: gpu_check_logs.tar.gz"
    )
    return lines, passed


def main() -> int:
    lines, passed = summary(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print("\n".join(lines))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
