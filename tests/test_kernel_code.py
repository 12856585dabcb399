"""What the built module's machine code must not hold, read from its SASS
(cuobjdump, which ships with the CUDA toolkit).

A wgmma kernel whose warpgroup MMAs ptxas serialized (C7514, C7520: each
HGMMA waited for before the next issues) is correct and runs at a fraction
of its speed, so no result test notices it. ptxas serializes a whole
kernel when anything outside the MMAs may read their accumulators while
they are in flight: an accumulator array the compiler put on the stack
(an index it could not resolve), a branch around a wgmma. In a pipelined
kernel only the last HGMMA of each k-step's group carries the group
barrier (gsb0); in a serialized one every HGMMA does."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import gemsops

pytestmark = pytest.mark.cuda


def sass_functions():
    """{mangled name: SASS text} of every function in the module's cubins."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump (CUDA toolkit) not on PATH")
    module = Path(gemsops._C.__file__)
    out = subprocess.run(
        [tool, "-sass", str(module)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    blocks = re.split(r"\n\s*Function : ", out)[1:]
    return {b.split("\n", 1)[0].strip(): b for b in blocks}


def test_no_wgmma_kernel_is_serialized():
    functions = sass_functions()
    wgmma = {
        name: body
        for name, body in functions.items()
        if re.search(r"\bHGMMA\.", body)
    }
    assert wgmma, "no HGMMA in the module's sm_90a code"
    serialized = []
    for name, body in wgmma.items():
        mmas = re.findall(r"\bHGMMA\.[^;]*;", body)
        grouped = [m for m in mmas if "gsb0" in m]
        if len(mmas) > 1 and len(grouped) == len(mmas):
            serialized.append(f"{name} ({len(mmas)} HGMMA, all gsb0)")
    assert not serialized, "\n".join(serialized)
