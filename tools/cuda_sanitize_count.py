"""Counts compute-sanitizer reports per tool and splits them into errors in
gemsops' kernels and errors elsewhere (torch's kernels, cuBLAS, host API
calls torch made), which are listed but not counted.

usage: python -m tools.cuda_sanitize_count LOG_DIR [TOOL ...]
  LOG_DIR holds TOOL.cs.<pid>.log files (compute-sanitizer --log-file
  TOOL.cs.%p.log), TOOL.rc (the exit status of that run) and
  TOOL.pytest.log. Exit status 1 when any tool has an error in a gemsops
  kernel or a run that did not finish (killed, crashed); 0 otherwise. Tests
  that fail under a tool are named but are the test suite's business.

A report is ours when it names one of the kernels defined in csrc/cuda
(read from the sources, so a new kernel needs no edit here), points at one
of those source files (-lineinfo), or was launched or made its API call
from gemsops' C code (the host backtrace compute-sanitizer saves names
gemsops:: / gemsops_ functions or csrc files; it names modules by file
name only, and torch's is _C.cpython-*.so too, so the module does not
tell). A report with none of these and no kernel at all is counted as ours
too: an unknown format must not pass silently.
"""

import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
ERROR_EXIT = 86  # the --error-exitcode tools/cuda_sanitize.sh passes

# sanitizer lines are "========= text"; continuation lines are indented
# (pytest's "==== FAILURES ====" must not pass for one)
PREFIX = re.compile(r"^=========(?: |$)")
# headers that are bookkeeping, not findings
NOT_FINDINGS = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|"
    r"Target application returned|This can be caused|"
    r"\d+ errors? (were|was) not printed|INFO\b|Info\b)",
    re.I,
)
WARNING = re.compile(r"^warning\b", re.I)
HOST_PART = re.compile(r"Saved host backtrace|Host Frame", re.I)
API_CALL = re.compile(r"on CUDA API call to (\w+)|by (cuda\w+|cu\w+)")


def kernel_names():
    """Every __global__ function's name in csrc/cuda."""
    names = set()
    for src in sorted((ROOT / "csrc" / "cuda").glob("*.cu*")):
        text = src.read_text()
        for m in re.finditer(r"__global__\b", text):
            i = m.end()
            rest = text[i : i + 2000]
            rest = re.sub(r"^\s*(static\s+)?void\s+", "", rest)
            if rest.startswith("__launch_bounds__"):
                depth, j = 0, len("__launch_bounds__")
                while j < len(rest):
                    depth += {"(": 1, ")": -1}.get(rest[j], 0)
                    j += 1
                    if depth == 0:
                        break
                rest = rest[j:]
            name = re.match(r"\s*(\w+)", rest)
            if name:
                names.add(name.group(1))
    return names


def source_files():
    return {p.name for p in (ROOT / "csrc" / "cuda").glob("*.cu*")}


def host_marker():
    """Host frames of gemsops' C: its symbols, or its source files."""
    files = sorted(
        p.name
        for p in list((ROOT / "csrc").glob("*.c"))
        + list((ROOT / "csrc" / "cpu").glob("*.c"))
        + list((ROOT / "csrc" / "cuda").glob("*.cu*"))
    )
    return re.compile(
        r"Host Frame:.*(\bgemsops(::|_)|\bin ("
        + "|".join(map(re.escape, files))
        + r"):\d+)"
    )


def records(lines):
    """(header, device lines, host lines) per report."""
    rec = None
    for raw in lines:
        if not PREFIX.match(raw):
            continue  # the application's own output, when not in a log file
        line = PREFIX.sub("", raw.rstrip("\n"), count=1)
        if not line.strip():
            if rec:
                yield rec
            rec = None
            continue
        if not line.startswith(" "):
            if rec:
                yield rec
            rec = [line.strip(), [], [], False]
            continue
        if rec is None:
            continue
        if HOST_PART.search(line):
            rec[3] = True
        (rec[2] if rec[3] else rec[1]).append(line.strip())
    if rec:
        yield rec


def kernel_label(header, device):
    """A short name for where a report points: the kernel (or device
    function) named on its 'at ...' line, else the API call."""
    m = API_CALL.search(header)
    if m:
        return "host API " + (m.group(1) or m.group(2))
    for text in [header] + device:
        if text is header:  # racecheck: "Race reported between Write access
            m = re.search(r"access at (?:0x[0-9a-f]+ in )?(.+)", text)
        else:  # memcheck, synccheck, initcheck: "at f(args)+0x70 in f.cu:6"
            m = re.match(
                r"(?:at|and \w+ access at|\w+ Thread \S+ at|"
                r"Device Frame:) ?(?:0x[0-9a-f]+ in )?(.+)",
                text,
            )
        if not m:
            continue
        loc = m.group(1)
        loc = re.sub(r"\s+\[\d+ hazards?\]$", "", loc)
        if "+0x" in loc:  # new format: kernel(args)+0x70 in f.cu:6
            loc = loc.split("+0x")[0]
        else:  # old format: f.cu:6:kernel(args)
            loc = re.sub(r"^.*?\.cuh?:\d+:", "", loc)
        loc = re.sub(r"^void ", "", loc.strip())
        # up to the argument list, template arguments kept short
        depth, out = 0, ""
        for ch in loc:
            if ch == "(" and depth == 0:
                break
            if ch == "<":
                depth += 1
                if depth == 1:
                    out += "<...>"
            elif ch == ">":
                depth -= 1
            elif depth == 0:
                out += ch
        return out.strip() or loc[:80]
    return None


def classify(rec, ours_names, ours_files, ours_host):
    header, device, host, _ = rec
    text = "\n".join([header] + device)
    for name in ours_names:
        if re.search(r"\b" + name + r"\b", text):
            return "ours", name
    for f in ours_files:
        if re.search(r"\b" + re.escape(f) + r":\d+", text):
            return "ours", kernel_label(header, device) or f
    label = kernel_label(header, device)
    if any(ours_host.search(h) for h in host):
        return "ours", label or "called from gemsops' C"
    if label is None:
        if WARNING.match(header):
            return "tool", header[:90]
        return "ours", "unattributed: " + header[:70]
    return "theirs", label


def summarize(log_dir, tool, ours_names, ours_files, ours_host):
    logs = sorted(log_dir.glob(f"{tool}.cs.*.log"))
    rc_file = log_dir / f"{tool}.rc"
    if not logs and not rc_file.exists():
        return None
    ours, theirs, warnings = Counter(), Counter(), Counter()
    summary_total, race_errors, not_printed, finished = 0, 0, 0, False
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        for raw in lines:
            line = PREFIX.sub("", raw, count=1)
            m = re.match(r"ERROR SUMMARY: (\d+) error", line)
            if m:
                finished = True
                summary_total += int(m.group(1))
            m = re.match(r"RACECHECK SUMMARY: .*?\((\d+) errors?", line)
            if m:
                finished = True
                race_errors += int(m.group(1))
            m = re.search(r"(\d+) errors? (?:were|was) not printed", line)
            if m:
                not_printed += int(m.group(1))
        for rec in records(lines):
            header = rec[0]
            if NOT_FINDINGS.match(header):
                continue
            where, label = classify(rec, ours_names, ours_files, ours_host)
            if WARNING.match(header):
                warnings[(where, label)] += 1
            elif where == "ours":
                ours[label] += 1
            else:
                theirs[label] += 1
    if not_printed:
        # past --print-limit nothing says where they were: ours, to be safe
        ours["not printed (past --print-limit)"] += not_printed
    # the tool's own count against what was parsed: a report in a format
    # this script does not know must not pass as clean
    said = (
        race_errors if tool == "racecheck" and race_errors else summary_total
    )
    unparsed = said - sum(ours.values()) - sum(theirs.values())
    if unparsed > 0:
        ours["in the tool's summary but not parsed: read the log"] += unparsed
    rc = rc_file.read_text().strip() if rc_file.exists() else "missing"
    failed_tests = []
    pytest_log = log_dir / f"{tool}.pytest.log"
    if pytest_log.exists():
        failed_tests = re.findall(
            r"^(?:FAILED|ERROR) (\S+)",
            pytest_log.read_text(errors="replace"),
            re.M,
        )
    return dict(
        ours=ours,
        theirs=theirs,
        warnings=warnings,
        rc=rc,
        finished=finished,
        logs=logs,
        summary_total=summary_total,
        failed_tests=failed_tests,
    )


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    log_dir = Path(argv[1])
    tools = argv[2:] or list(TOOLS)
    ours_names, ours_files = kernel_names(), source_files()
    ours_host = host_marker()
    failed = False
    lines = []
    for tool in tools:
        s = summarize(log_dir, tool, ours_names, ours_files, ours_host)
        if s is None:
            continue
        n, m = sum(s["ours"].values()), sum(s["theirs"].values())
        line = (
            f"{tool}: {n} errors in gemsops kernels "
            f"({m} in torch kernels filtered)"
        )
        nw = sum(s["warnings"].values())
        if nw:
            line += f"; {nw} warnings (not counted)"
        # a run that died (a crash under the tool, a test failing) did not
        # check everything it was given
        incomplete = []
        if not s["logs"]:
            incomplete.append("no log")
        elif not s["finished"]:
            incomplete.append("log has no summary: the run died")
        # 1: pytest's "tests failed", with the tool's summary written: the
        # run went through; anything else (timeout 124/137, a signal, a
        # usage error) means it did not
        if s["rc"] not in ("0", "1", str(ERROR_EXIT)):
            incomplete.append(f"exit status {s['rc']}")
        if s["rc"] == "1" and not s["failed_tests"]:
            incomplete.append("exit status 1 and no failed test named")
        if incomplete:
            line += "; INCOMPLETE (" + ", ".join(incomplete) + ")"
            failed = True
        if n:
            failed = True
        lines.append(line)
        for label, c in s["ours"].most_common():
            lines.append(f"    gemsops  {c:5d}  {label}")
        for label, c in s["theirs"].most_common():
            lines.append(f"    filtered {c:5d}  {label}")
        for (where, label), c in s["warnings"].most_common():
            lines.append(f"    warning  {c:5d}  {label} ({where})")
        for t in s["failed_tests"]:
            lines.append(
                f"    test failed under {tool} (not a sanitizer "
                f"report; see {tool}.pytest.log): {t}"
            )
    print("\n".join(lines))
    print(
        f"gemsops kernels: {', '.join(sorted(ours_names))}; errors in "
        "any other kernel (torch's, cuBLAS's) or in API calls not made "
        "from gemsops/_C are filtered out: listed above, not counted."
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
