"""The app's processes keep freed large buffers for the next message (fedvls_flwr/app/memory.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from fedvls_flwr.app.memory import OPT_OUT, users_own_setting

ROOT = Path(__file__).resolve().parents[1]

#: In a fresh process: optionally import an app entry module, free a 31 MiB buffer, print how much
#: more freed memory glibc's heap holds after it (mallinfo2: glibc >= 2.33). 31 MiB: above any
#: threshold glibc's own rises to while imports free blocks (it stops at 32 MiB), so only the
#: app's setting keeps it.
PROBE = """
import ctypes, sys
sys.path.insert(0, {root!r})
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if {entry!r}:
    __import__({entry!r})
buffer = b"x" * (31 * 2**20)
before = libc.mallinfo2().fordblks
del buffer
print(libc.mallinfo2().fordblks - before)
"""


def _glibc_with_mallinfo2() -> bool:
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        major, minor = (int(p) for p in libc.gnu_get_libc_version().decode().split(".")[:2])
        return (major, minor) >= (2, 33)
    except (OSError, AttributeError, ValueError):
        return False


def _freed_bytes_kept(entry: str, **env: str) -> int:
    import os

    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k not in (OPT_OUT, "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), entry=entry)], capture_output=True,
                          text=True, env={**environ, **env}, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only")
@pytest.mark.parametrize("entry", ["client_app", "server_app"])
def test_a_process_running_the_app_keeps_a_freed_large_buffer_for_the_next(entry):
    assert _freed_bytes_kept("") < 2**20  # glibc's default: 31 MiB freed goes back to the kernel at once
    assert _freed_bytes_kept(entry) >= 31 * 2**20  # the app's processes: kept for the next reply
    assert _freed_bytes_kept(entry, **{OPT_OUT: "1"}) < 2**20  # the user's opt-out holds
    assert _freed_bytes_kept(entry, MALLOC_TRIM_THRESHOLD_="131072") < 2**20  # and glibc's own setting


@pytest.mark.parametrize(("environ", "named"), [
    ({}, None),
    ({OPT_OUT: "0"}, None),
    ({OPT_OUT: "1"}, OPT_OUT),
    ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "MALLOC_MMAP_THRESHOLD_"),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES"),
    ({"GLIBC_TUNABLES": "glibc.rtld.nns=4"}, None),
])
def test_the_users_own_allocator_setting_is_recognised(environ, named):
    assert users_own_setting(environ) == named
