# Type stub of the compiled TriAttention engine module (csrc/python/triatt_pymodule.cpp).
from typing import Any

import numpy as np
import numpy.typing as npt

PARAMS: list[dict[str, Any]]  # name, default, flag, help: triatt_params.h
STRUCT_FIELDS: list[str]  # struct llama_triatt_params, retired slots included
POLICIES: dict[str, int]  # --triatt-policy names -> the hybrid value

def check(**settings: int) -> None: ...
def select(pos: npt.ArrayLike, score: npt.ArrayLike, **settings: int) -> npt.NDArray[np.bool_]: ...
def calibrate(
    q: npt.ArrayLike, pos: npt.ArrayLike, n_rot: int, neox: bool, freq_base: float, freq_scale: float = ...
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...
def score(
    k: npt.ArrayLike,
    mu_re: npt.ArrayLike,
    mu_im: npt.ArrayLike,
    mag: npt.ArrayLike,
    t_now: float,
    n_rot: int,
    neox: bool,
    freq_base: float,
    freq_scale: float = ...,
    max_log2: int = ...,
) -> npt.NDArray[np.float64]: ...
def f16_to_f32(h: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
