"""LightGBM models scored through LightGBM's C library alone.

The `lightgbm` Python package imports scipy (and looks for pandas and scikit-learn); a decoder
only needs a model file's predictions. `NativeBooster` loads the library that package ships
(found without importing it) and calls its C API with arguments prepared once, single-threaded:
the outputs of `Booster.predict` without its per-call checks, which dominate a 16-row
prediction, and a single row through LightGBM's single-row fast path.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

import numpy as np

from mcsd_runtime.errors import MCSDError

_LIB_NAMES = {"win32": "lib_lightgbm.dll", "darwin": "lib_lightgbm.dylib"}
_DTYPE_FLOAT64, _ROW_MAJOR, _NORMAL, _ALL_ITERATIONS = 1, 1, 0, -1
_NAME_BUFFER = 256


class LightGBMError(Exception):
    """An error reported by LightGBM's C library."""


def _find_library() -> ctypes.CDLL:
    """LightGBM's C library from the installed `lightgbm` package, without importing it."""
    spec = importlib.util.find_spec("lightgbm")
    if spec is None or not spec.submodule_search_locations:
        raise MCSDError("LightGBM stoppers need the lightgbm package: pip install lightgbm")
    name = _LIB_NAMES.get(sys.platform, "lib_lightgbm.so")
    for folder in map(Path, spec.submodule_search_locations):
        for path in (folder / "lib" / name, folder / "bin" / name, folder.parent / name):
            if path.is_file():
                lib = ctypes.cdll.LoadLibrary(str(path))
                lib.LGBM_GetLastError.restype = ctypes.c_char_p
                return lib
    from lightgbm.basic import _LIB  # an unusual layout: let the package find it

    return _LIB


_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        _lib = _find_library()
    return _lib


class NativeBooster:
    """A LightGBM model file's predictions (probabilities for binary and cross-entropy
    objectives), as `lightgbm.Booster(model_file=path).predict(x)` gives them."""

    def __init__(self, path: str | Path) -> None:
        self._lib, ct = _library(), ctypes
        self._handle = ct.c_void_p()
        self._row_config = ct.c_void_p()
        iterations = ct.c_int(0)
        self._call(self._lib.LGBM_BoosterCreateFromModelfile(
            ct.c_char_p(str(path).encode()), ct.byref(iterations), ct.byref(self._handle)))
        n = ct.c_int(0)
        self._call(self._lib.LGBM_BoosterGetNumFeature(self._handle, ct.byref(n)))
        self.num_feature = n.value
        self.feature_names = self._feature_names()
        self._params = ct.c_char_p(b"num_threads=1")
        self._call(self._lib.LGBM_BoosterPredictForMatSingleRowFastInit(
            self._handle, ct.c_int(_NORMAL), ct.c_int(0), ct.c_int(_ALL_ITERATIONS),
            ct.c_int(_DTYPE_FLOAT64), ct.c_int32(self.num_feature), self._params,
            ct.byref(self._row_config)))

    def _call(self, ret: int) -> None:
        if ret != 0:
            raise LightGBMError(self._lib.LGBM_GetLastError().decode())

    def _feature_names(self) -> list[str]:
        ct, n = ctypes, self.num_feature
        buffers = [ct.create_string_buffer(_NAME_BUFFER) for _ in range(n)]
        pointers = (ct.c_char_p * n)(*(ct.c_char_p(ct.addressof(b)) for b in buffers))
        out_len, needed = ct.c_int(0), ct.c_size_t(0)
        self._call(self._lib.LGBM_BoosterGetFeatureNames(
            self._handle, ct.c_int(n), ct.byref(out_len), ct.c_size_t(_NAME_BUFFER),
            ct.byref(needed), pointers))
        if needed.value > _NAME_BUFFER:
            raise LightGBMError(f"a feature name is longer than {_NAME_BUFFER - 1} bytes")
        return [b.value.decode() for b in buffers[: out_len.value]]

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if self._row_config.value:
            lib.LGBM_FastConfigFree(self._row_config)
        if self._handle.value:
            lib.LGBM_BoosterFree(self._handle)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """One score per row of `x` ([rows, num_feature])."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.num_feature:
            raise MCSDError(f"LightGBM stopper expects {self.num_feature} features per row, "
                            f"got shape {tuple(x.shape)}")
        ct = ctypes
        out = np.empty(x.shape[0], dtype=np.float64)
        n_out = ct.c_int64(0)
        data, result = x.ctypes.data_as(ct.c_void_p), out.ctypes.data_as(ct.POINTER(ct.c_double))
        if x.shape[0] == 1:
            self._call(self._lib.LGBM_BoosterPredictForMatSingleRowFast(
                self._row_config, data, ct.byref(n_out), result))
            return out
        self._call(self._lib.LGBM_BoosterPredictForMat(
            self._handle, data, ct.c_int(_DTYPE_FLOAT64), ct.c_int32(x.shape[0]),
            ct.c_int32(x.shape[1]), ct.c_int(_ROW_MAJOR), ct.c_int(_NORMAL), ct.c_int(0),
            ct.c_int(_ALL_ITERATIONS), self._params, ct.byref(n_out), result))
        return out
