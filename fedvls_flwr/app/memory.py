"""Large buffers that come and go every message, without the kernel zeroing fresh pages each time.

A round moves a model's arrays several times: a client encodes its reply, a worker hands it
over, the server reads and averages it. glibc gives a block over its mmap threshold fresh pages
of the kernel and returns them when it is freed; the threshold starts at 128 KiB and rises to the
size of the largest block freed so far (at most 32 MiB), and a heap's free top beyond twice that
goes back to the kernel. So after each large reply the heap is trimmed, and the next reply faults
in and zeroes those pages again: for ResNet-18 (43 MB) most of the work (a reply encoded in 19
ms where one copy of its bytes takes 2.4, ``bench/bench_reply_path.py``). Serving blocks of up to
``MMAP_THRESHOLD`` from the heap and keeping up to ``TRIM_THRESHOLD`` free at a heap's top makes
the same work 4 ms.

The price: a process may hold more memory than it uses after a large round, up to
``TRIM_THRESHOLD`` per malloc arena (glibc keeps about one per thread that allocates) plus what
fragmentation leaves. ``FEDVLS_SYSTEM_MALLOC=1``, or glibc's own ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` / ``GLIBC_TUNABLES`` malloc settings in the environment, leave the
allocator as the user set it. Called by the app's entry modules (``client_app``,
``server_app``), so it holds for every process that runs the app: the in-process engine and
its workers, Ray's actors, a deployment's ClientApp and ServerApp processes.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: mallopt's parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (glibc's largest allowed on 64-bit: 32 MiB).
MMAP_THRESHOLD = 32 * 2**20
#: Free memory a heap keeps at its top before giving it back to the kernel.
TRIM_THRESHOLD = 256 * 2**20
OPT_OUT = "FEDVLS_SYSTEM_MALLOC"
_USERS_OWN = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_applied: bool | None = None


def users_own_setting(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The variable by which the user chose the allocator's behaviour themselves, if any."""
    if environ.get(OPT_OUT, "").strip() not in ("", "0"):
        return OPT_OUT
    for name in _USERS_OWN:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory() -> bool:
    """Set this process's malloc to keep freed memory (module docstring); once per process.
    True when set; False on another C library or platform, or when the user chose otherwise."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if not sys.platform.startswith("linux") or users_own_setting() is not None:
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already uses
        mallopt = libc.mallopt
        gnu = libc.gnu_get_libc_version  # glibc's: musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    del gnu
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
