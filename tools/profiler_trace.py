"""The GPU activity of a torch.profiler run, read back from its Chrome
trace: (start µs, end µs, name) of each event of the given categories
("kernel"; "gpu_memset" and "gpu_memcpy" for copies), in start order."""

import json
import os
import tempfile


def gpu_events(prof, cats=("kernel",)):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("cat") in cats and e.get("ph") == "X"
    )
