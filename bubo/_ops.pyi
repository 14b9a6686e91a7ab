"""Float ops, the thread pool, and the matmul driver (bubo/_ops.pyx); the kernel
table's variants are in bubo._kernels.

`isa` names a level: "scalar", "avx2", "avx512" or "neon"; None means this CPU's best. Arrays go
in as anything numpy converts to float32 and come out as new float32 arrays."""
from typing import Literal

import numpy as np
import numpy.typing as npt

_F32 = npt.NDArray[np.float32]
_ArrayLike = npt.ArrayLike
_Isa = str | None

def ops_isa(isa: _Isa = None) -> str: ...

def rms_norm(x: _ArrayLike, w: _ArrayLike | None, eps: float, isa: _Isa = None) -> _F32: ...
def rope(
    x: _ArrayLike,
    pos: _ArrayLike,
    n_rot: int,
    freq_base: float,
    freq_scale: float = 1.0,
    mode: Literal["normal", "neox"] = "normal",
    freq_factors: _ArrayLike | None = None,
    isa: _Isa = None,
) -> _F32: ...
def softmax(x: _ArrayLike, scale: float = 1.0, mask: _ArrayLike | None = None, isa: _Isa = None) -> _F32: ...
def silu(x: _ArrayLike, isa: _Isa = None) -> _F32: ...
def gelu(x: _ArrayLike, isa: _Isa = None) -> _F32: ...
def gelu_erf(x: _ArrayLike, isa: _Isa = None) -> _F32: ...
def swiglu(gate: _ArrayLike, up: _ArrayLike, isa: _Isa = None) -> _F32: ...
def geglu(gate: _ArrayLike, up: _ArrayLike, isa: _Isa = None) -> _F32: ...
def add(x: _ArrayLike, y: _ArrayLike, isa: _Isa = None) -> _F32: ...
def mul(x: _ArrayLike, y: _ArrayLike, isa: _Isa = None) -> _F32: ...
def scale(x: _ArrayLike, s: float, isa: _Isa = None) -> _F32: ...

class ThreadPool:
    def __init__(self, n_threads: int) -> None: ...
    @property
    def n_threads(self) -> int: ...

def pool_probe(pool: ThreadPool, n_runs: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def matmul(pool: ThreadPool | None, type_id: int, w: _ArrayLike | bytes, rows: int, cols: int, x: _ArrayLike,
           prepacked: bool = False) -> _F32: ...
def prepack(type_id: int, w: _ArrayLike | bytes, rows: int, cols: int) -> npt.NDArray[np.uint8] | None: ...
def prepacked_row(type_id: int, packed: _ArrayLike | bytes, rows: int, cols: int, r: int) -> npt.NDArray[np.uint8]: ...

ATTEND_GROUP: int
ATTEND_CHUNK: int
def attend_paged(
    type_id: int,
    k: npt.NDArray[np.uint8],
    v: npt.NDArray[np.uint8],
    table: _ArrayLike,
    kv_head: int,
    head_dim_k: int,
    head_dim_v: int,
    kv_begin: _ArrayLike,
    kv_end: _ArrayLike,
    q: npt.NDArray[np.uint8],
    kq_scale: float,
    isa: _Isa = None,
    type_v: int | None = None,
) -> _F32: ...
