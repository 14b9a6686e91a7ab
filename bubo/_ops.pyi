"""The kernel table's variants (bubo/_ops.pyx).

`isa` names a level: "scalar", "avx2", "avx512" or "neon"; None means this CPU's best. Arrays go
in as anything numpy converts to float32 and come out as new float32 arrays."""
from typing import TypedDict

import numpy as np
import numpy.typing as npt

_F32 = npt.NDArray[np.float32]
_ArrayLike = npt.ArrayLike
_Isa = str | None

def supported_isas() -> list[str]: ...
def best_isa() -> str: ...

class TypeInfo(TypedDict):
    name: str
    blck_size: int
    type_size: int
    supported: bool
    vec_dot_type: int
    to_float: list[str]
    from_float: list[str]
    vec_dot: list[str]

def type_info(type_id: int) -> TypeInfo | None: ...
def to_float(type_id: int, data: _ArrayLike | bytes, n: int, isa: _Isa = None) -> _F32: ...
def from_float(type_id: int, x: _F32, isa: _Isa = None) -> npt.NDArray[np.uint8]: ...
def vec_dot(type_id: int, x: _ArrayLike | bytes, y: _ArrayLike | bytes, n: int, isa: _Isa = None) -> float: ...
def f16_to_f32(bits: npt.NDArray[np.uint16]) -> _F32: ...
def f32_to_f16(x: _F32) -> npt.NDArray[np.uint16]: ...
def bf16_to_f32(bits: npt.NDArray[np.uint16]) -> _F32: ...
def f32_to_bf16(x: _F32) -> npt.NDArray[np.uint16]: ...
