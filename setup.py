"""Builds gemsops._C: C sources with the C compiler, CUDA sources with nvcc.

Environment:
  GEMSOPS_CUDA=0          build the CPU-only extension even if nvcc exists
                          (switching it on or off relinks: each flavour
                          keeps its objects in its own build folder)
  GEMSOPS_CUDA_ARCHS      ';'-separated SASS targets (default "80;90a"); PTX
                          for the newest listed (compute_90) is added so newer
                          GPUs can JIT it
  GEMSOPS_CUDA_PTX=0      no PTX, SASS only (CI's compile check: the PTX pass
                          compiles the same sources again, a quarter of the
                          CUDA build's time)
  CUDA_HOME / CUDA_PATH   toolkit root when nvcc is not on PATH
  GEMSOPS_NVCC_THREADS    parallel nvcc jobs (default: CPU count)
  GEMSOPS_LINEINFO=1      compile the kernels with -lineinfo (off by
                          default: a release build carries no debug info)
  GEMSOPS_SANITIZE        ','-separated GCC sanitizers for the C sources
                          (e.g. "address,undefined"): built -O1 -g with
                          frame pointers and -fno-wrapv, every finding is
                          fatal (no recovery), and the module links the
                          runtimes; switching it on or off forces a
                          rebuild. The CUDA objects are left alone. Python
                          is not instrumented, so the ASan runtime must be
                          LD_PRELOADed at run time: tools/sanitize_cpu.sh
                          does all of it
No torch is needed to build: tensors cross the boundary through DLPack.
"""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def find_nvcc():
    if os.environ.get("GEMSOPS_CUDA", "1") == "0":
        return None
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_lib_dir(nvcc):
    """The toolkit's library folder: from CUDA_HOME, from nvcc's real
    location, or from what nvcc itself reports (it may be a wrapper)."""
    homes = [
        os.environ.get("CUDA_HOME"),
        os.environ.get("CUDA_PATH"),
        str(Path(nvcc).resolve().parent.parent),
        "/usr/local/cuda",
    ]
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
        ).stderr
        for line in out.splitlines():
            if "TOP=" in line:
                homes.insert(0, line.split("TOP=", 1)[1].strip())
    except OSError:
        pass
    for home in filter(None, homes):
        for cand in (
            "lib64",
            "lib",
            "targets/x86_64-linux/lib",
            "targets/sbsa-linux/lib",
        ):
            if (Path(home) / cand / "libcudart_static.a").exists():
                return str(Path(home) / cand)
    raise RuntimeError(f"libcudart_static.a not found under {homes}")


def gencode_flags():
    archs = [
        a.strip()
        for a in os.environ.get("GEMSOPS_CUDA_ARCHS", "80;90a").split(";")
    ]
    archs = [a for a in archs if a]
    flags = []
    for arch in archs:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    newest = max(int("".join(c for c in a if c.isdigit())) for a in archs)
    if os.environ.get("GEMSOPS_CUDA_PTX", "1") != "0":
        flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    if "90a" in archs:  # the host may pick the wgmma kernels on sm_90
        flags.append("-DGEMSOPS_HAVE_SM90A=1")
    if newest >= 90:  # what runs on sm_90 and later has griddepcontrol
        flags.append("-DGEMSOPS_HAVE_PDL=1")
    return flags


C_FLAGS = [
    "-O3",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-fopenmp",
    "-fvisibility=hidden",
]


def sanitizers():
    """The sanitizers GEMSOPS_SANITIZE names."""
    return [
        n.strip()
        for n in os.environ.get("GEMSOPS_SANITIZE", "").split(",")
        if n.strip()
    ]


def sanitize_flags():
    """Compile and link flags for GEMSOPS_SANITIZE; both empty when unset."""
    names = sanitizers()
    if not names:
        return [], []
    san = "-fsanitize=" + ",".join(names)
    # -O1 after the -O3 above wins: inlining and vectorizing at -O3 leave
    # stacks that point at the wrong line; -O1 still removes enough dead
    # stores that ASan runs at a usable speed
    compile_flags = [san, "-fno-omit-frame-pointer", "-g", "-O1"]
    # Python's own CFLAGS carry -fwrapv, which defines signed overflow and
    # so silently turns UBSan's signed-integer-overflow check off; an
    # overflowing size or offset computation is exactly what we want caught
    compile_flags.append("-fno-wrapv")
    # otherwise UBSan prints and carries on, and the test passes; "all"
    # rather than "undefined" so checks outside that group
    # (float-cast-overflow) are fatal too
    compile_flags.append("-fno-sanitize-recover=all")
    return compile_flags, [san]


SAN_COMPILE, SAN_LINK = sanitize_flags()
# Release build: no -g/-G. GEMSOPS_LINEINFO=1 adds -lineinfo (source lines
# for compute-sanitizer and ncu; the generated code is the same)
NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "-Xcompiler",
    "-fPIC,-Wall,-Wextra",
    "-Xptxas",
    "-warn-spills,-warn-lmem-usage",
]
if os.environ.get("GEMSOPS_LINEINFO", "0") == "1":
    NVCC_FLAGS.append("-lineinfo")


def flavour(nvcc):
    """What the module is built as: "cpu" or "cuda", plus the sanitizers.
    Objects of one flavour never meet another's (one build folder each),
    and a module left by another flavour is rebuilt."""
    name = "cpu" if nvcc is None else "cuda"
    names = sanitizers()
    return "-".join([name] + (["san"] + names if names else []))


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        self.nvcc = find_nvcc()
        self.flavour = flavour(self.nvcc)
        # the stamp sits beside the flavours' folders, so it outlives none
        # of them: no stamp means the module's flavour is unknown
        temp = Path(self.build_temp)
        if temp.name == self.flavour:  # finalized twice
            temp = temp.parent
        self.stamp = temp / "gemsops_flavour.json"
        self.build_temp = str(temp / self.flavour)

    def build_extensions(self):
        nvcc = self.nvcc
        ext = self.extensions[0]
        # headers are invisible to distutils' staleness check otherwise
        ext.depends += [
            str(p)
            for p in list((ROOT / "include").rglob("*.h"))
            + list((ROOT / "csrc").rglob("*.h"))
        ]
        if nvcc is None:
            why = (
                "GEMSOPS_CUDA=0"
                if os.environ.get("GEMSOPS_CUDA") == "0"
                else "nvcc not found"
            )
            print(
                f"gemsops: {why}: building the CPU-only extension",
                file=sys.stderr,
            )
            ext.sources.append("csrc/cuda_absent.c")
        else:
            print(
                f"gemsops: building CUDA kernels with {nvcc} "
                f"({' '.join(gencode_flags())})",
                file=sys.stderr,
            )
            objects = self.compile_cuda(nvcc)
            ext.extra_objects += objects
            # distutils relinks only when a listed source or dependency is
            # newer than the module: a kernel rebuilt alone must count too
            ext.depends += objects
            ext.library_dirs.append(cuda_lib_dir(nvcc))
            ext.libraries += ["cudart_static", "rt", "pthread", "dl"]
            ext.extra_link_args.append("-lstdc++")
        self.force_if_flavour_changed(ext)
        super().build_extensions()
        self.record_flavour(ext)

    def built_flavours(self):
        try:
            return json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return {}

    @staticmethod
    def identity(out):
        """The module file as the stamp knows it: a module replaced by
        any other means (another setup.py, a copy) no longer matches."""
        st = out.stat()
        return [st.st_size, st.st_mtime_ns]

    def record_flavour(self, ext):
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        if out.exists():
            stamps = self.built_flavours()
            stamps[str(out)] = [self.flavour] + self.identity(out)
            self.stamp.parent.mkdir(parents=True, exist_ok=True)
            self.stamp.write_text(json.dumps(stamps) + "\n")

    def force_if_flavour_changed(self, ext):
        """distutils rebuilds by timestamps alone, so a module built as
        another flavour (CUDA or CPU-only, sanitized or not) whose sources
        have not changed since would be kept, and the build would announce
        one flavour and ship the other: a sanitized module left in place
        cannot even be imported without the preloaded runtime."""
        if SAN_COMPILE:
            self.force = True
            return
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        if not out.exists():
            return
        data = out.read_bytes()
        if b"__asan_init" in data or b"__ubsan_handle" in data:
            self.force = True
        stamp = self.built_flavours().get(str(out))
        built = None
        if isinstance(stamp, list) and stamp[1:] == self.identity(out):
            built = stamp[0]
        if built != self.flavour:
            print(
                f"gemsops: the module in {out.parent} was built as "
                f"{built or 'an unknown flavour'}: rebuilding it as "
                f"{self.flavour}",
                file=sys.stderr,
            )
            self.force = True

    def compile_cuda(self, nvcc):
        sources = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
        out_dir = Path(self.build_temp) / "cuda"
        out_dir.mkdir(parents=True, exist_ok=True)
        include = ["-I" + str(ROOT / "include"), "-I" + str(ROOT / "csrc")]

        def compile_one(src):
            obj = out_dir / (src.stem + ".o")
            deps = (
                [src]
                + list((ROOT / "csrc" / "cuda").glob("*.cuh"))
                + list((ROOT / "include" / "gemsops").glob("*.h"))
            )
            if obj.exists() and obj.stat().st_mtime > max(
                d.stat().st_mtime for d in deps
            ):
                return str(obj)
            cmd = [
                nvcc,
                "-c",
                str(src),
                "-o",
                str(obj),
                *NVCC_FLAGS,
                *gencode_flags(),
                *include,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(
                    f"nvcc failed on {src.name}:\n"
                    f"{' '.join(cmd)}\n{res.stdout}{res.stderr}"
                )
            noise = [
                line
                for line in (res.stdout + res.stderr).splitlines()
                if line.strip()
            ]
            if noise:
                print(
                    f"nvcc {src.name}:\n" + "\n".join(noise), file=sys.stderr
                )
            return str(obj)

        jobs = int(os.environ.get("GEMSOPS_NVCC_THREADS", os.cpu_count() or 1))
        # the largest source (the longest nvcc job) starts first, so that it
        # does not run alone at the end; the objects link in name order
        first = sorted(
            sources, key=lambda src: src.stat().st_size, reverse=True
        )
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            built = dict(zip(first, pool.map(compile_one, first)))
        return [built[src] for src in sources]


C_SOURCES = sorted(
    str(p.relative_to(ROOT))
    for p in list((ROOT / "csrc").glob("*.c"))
    + list((ROOT / "csrc" / "cpu").glob("*.c"))
    if p.name != "cuda_absent.c"
)

setup(
    ext_modules=[
        Extension(
            "gemsops._C",
            sources=C_SOURCES,
            include_dirs=["include", "csrc"],
            extra_compile_args=C_FLAGS + SAN_COMPILE,
            extra_link_args=["-fopenmp"] + SAN_LINK,
            # the stable ABI of Python 3.10: one module (gemsops/_C.abi3.so)
            # and one wheel (cp310-abi3) for every later Python too
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            py_limited_api=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    cmdclass={"build_ext": BuildExt},
)
