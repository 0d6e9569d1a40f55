"""Build of the C++ shared-memory fabric (hal.emulation.shm._shm); all other metadata lives in pyproject.toml.

Plain pybind11 + C++17 operating on raw pointers, so the build needs no torch headers (pip builds in
an isolated environment; depending on torch there would pull a multi-GB wheel). -O3 lets GCC
vectorize the reduce loops; no -march=native, because the wheel must run on any x86-64 (the kernels
are cloned for AVX2 at load time instead, see csrc/shm_reduce.cpp).

HAL_BUILD_SHM=0 builds without it: a pure-Python install that needs no compiler (a vendor who only
writes a plugin). Then `hal.emulation.shm.available()` says why and how to get the fabric, `HAL_CPU_CCL=auto`
uses gloo, and `HAL_CPU_CCL=shm` raises `hal.emulation.shm.ShmSetupError` (docs/writing-a-plugin.md;
tests/test_install_without_shm.py). Any other value, or unset, builds it (the default install).
"""
import os
from glob import glob

from setuptools import setup

BUILD_SHM = os.environ.get("HAL_BUILD_SHM", "1").strip().lower() not in ("0", "no", "false", "off")

if BUILD_SHM:
    from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext

    # Compile the C++ files concurrently (about 30 s of g++ on one core; the reduce kernels dominate).
    ParallelCompile("NPY_NUM_BUILD_JOBS", default=0).install()
    ext = Pybind11Extension(
        "hal.emulation.shm._shm",
        sources=sorted(glob("csrc/*.cpp")),
        include_dirs=["csrc"],
        depends=sorted(glob("csrc/*.h")),  # rebuild on header changes; ship them in an sdist
        cxx_std=17,
        extra_compile_args=["-O3", "-fno-math-errno"],
        libraries=["rt"],  # shm_open on glibc < 2.34
    )
    setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})
else:
    print("hetero-hal: HAL_BUILD_SHM=0, building without the C++ shared-memory fabric (hal.emulation.shm): "
          "CPU and emulated ranks will use gloo")
    setup()
